"""What the pipeline needs from an output writer: the sink protocols.

A sink is called from one thread at a time, in frame order (the completion thread, or its
own `sink-<name>` thread when its policy says it is slow; see `sinks.fanout`), so it need not
be thread-safe; and it must leave valid files however the run ends, which is why it is
closed in a `finally:`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from drivepercept.types import FrameResult, ImageU8, LoadSample


@runtime_checkable
class Sink(Protocol):
    """Receives each camera frame's result; `close()` finishes the output and may be repeated."""

    def write(self, result: FrameResult) -> None:
        """Record one camera frame's result."""

    def close(self) -> None:
        """Finish the output (flush, finalise files); a second call does nothing."""


@runtime_checkable
class ImageSink(Sink, Protocol):
    """A sink that also wants the original frame's pixels (annotated video, display).

    The pipeline calls `write_with_image` instead of `write` for these sinks.
    """

    def write_with_image(self, result: FrameResult, image_bgr: ImageU8) -> None:
        """Record one camera frame's result together with its original BGR image."""


@runtime_checkable
class LoadSink(Protocol):
    """Receives the load sampler's samples, on the `gpu-monitor` thread (so it must be
    thread-safe against `close()` from the pipeline's thread)."""

    def write(self, sample: LoadSample) -> None:
        """Record one load sample."""

    def close(self) -> None:
        """Finish the output; a second call does nothing."""


_C = TypeVar("_C", bound="ClosingSink")


class ClosingSink:
    """Mixin: a sink is a context manager that calls its `close()` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LoadFace(ClosingSink):
    """The load-sink face (`LoadSink`) of a sink that also takes results (MCAP, Rerun): its
    samples go to `write`, on the `gpu-monitor` thread; closing it calls `stop` (no more
    samples), and the sink's own `close()` finishes the output."""

    def __init__(self, write: Callable[[LoadSample], None], stop: Callable[[], None]) -> None:
        self._write, self._stop = write, stop

    def write(self, sample: LoadSample) -> None:
        self._write(sample)

    def close(self) -> None:
        self._stop()
