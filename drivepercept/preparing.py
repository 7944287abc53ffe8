"""The batcher's frame preparation: each taken frame written into its staging row
(`QueuedFrame.into`), or only its meta for a frame the model will not see. A frame prepared
on its decoder thread is copied; a deferred one (live cameras hand theirs over undecoded) is
decoded and resized there, the frames of a batch in parallel on `prepare` threads, one per
camera at once (OpenCV releases the GIL), so a batch of six is ready in about the time of one
on six cores. A frame that cannot be prepared (a corrupt JPEG, one refused before decoding,
an OpenCV error) is left out of its batch and counted per camera, and is not its camera's
end; a camera of bad frames logs a few lines, not one a frame."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from drivepercept.errors import RepeatedWarning, one_line
from drivepercept.types import FrameMeta, ImageU8, QueuedFrame

log = logging.getLogger("drivepercept.batching")  # (its warnings keep the batcher's name)


class FramePreparer:
    """Prepares the batcher's frames (see the module docstring); used by its thread only."""

    def __init__(self, cameras: Sequence[str]) -> None:
        self.cameras = tuple(cameras)
        self.failed_frames = 0  # deferred frames that could not be prepared (corrupt)
        self.failed_by_camera: dict[int, int] = {}  # the same, per camera index
        self._failed_warning: dict[int, RepeatedWarning] = {}  # per camera index
        self._pool: ThreadPoolExecutor | None = None
        self.ema_ns = 0.0  # how long preparing a batch of deferred frames takes

    def close(self) -> None:
        """Stop the preparing threads and say the last counts of the warnings."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for warning in self._failed_warning.values():
            warning.close()

    def metas_only(self, taken: list[tuple[QueuedFrame, int]]) -> list[FrameMeta]:
        """The metas of frames the model will not see (no row, no preparation; frames kept
        for an annotated video are decoded, in parallel as in `fill`); a frame that cannot
        even say its size is left out, as in `fill`."""
        frames, metas = [f for f, _ in taken], []
        decode = len(frames) > 1 and any(f.keep_original for f in frames)
        found = self._pool_of().map(_meta_only, frames) if decode else map(_meta_only, frames)
        for meta, (frame, queued_ns) in zip(found, taken, strict=True):
            if isinstance(meta, str):
                self._failed(frame.camera_index, meta)
                continue
            metas.append(dataclasses.replace(meta, queued_ns=queued_ns))
        return metas

    def _pool_of(self) -> ThreadPoolExecutor:
        if self._pool is None:
            workers = min(len(self.cameras), os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="prepare")
        return self._pool

    def fill(self, rows: np.ndarray, taken: list[tuple[QueuedFrame, int]]) -> list[FrameMeta]:
        """Write the taken frames into consecutive rows of a slot; their metas, stamped with
        when each was queued. Deferred frames are prepared in parallel."""
        if not any(frame.deferred for frame, _ in taken):
            return [
                dataclasses.replace(frame.into(rows[k]), queued_ns=queued_ns)
                for k, (frame, queued_ns) in enumerate(taken)
            ]
        started = time.monotonic_ns()
        done = list(self._pool_of().map(_prepare, [f for f, _ in taken], list(rows[: len(taken)])))
        took, ema = time.monotonic_ns() - started, self.ema_ns
        self.ema_ns = took if ema == 0 else 0.5 * (ema + took)
        metas: list[FrameMeta] = []
        for k, (meta, (frame, queued_ns)) in enumerate(zip(done, taken, strict=True)):
            if isinstance(meta, str):
                self._failed(frame.camera_index, meta)
                continue
            if len(metas) != k:  # a frame before this one failed: close the gap
                np.copyto(rows[len(metas)], rows[k])
            metas.append(dataclasses.replace(meta, queued_ns=queued_ns))
        return metas

    def _failed(self, index: int, why: str) -> None:
        """A deferred frame of camera `index` that could not be prepared: counted, and said
        (the first few, then once in a while with the count)."""
        self.failed_frames += 1
        self.failed_by_camera[index] = self.failed_by_camera.get(index, 0) + 1
        if index not in self._failed_warning:
            self._failed_warning[index] = RepeatedWarning(log)
        name = self.cameras[index] if index < len(self.cameras) else index
        self._failed_warning[index].warn("camera %s: a frame was left out: %s", name, why)


def _meta_only(frame: QueuedFrame) -> FrameMeta | str:
    """`frame.meta_only()`, or why it could not say its size (as `_prepare`)."""
    try:
        return frame.meta_only()
    except Exception as exc:
        return one_line(str(exc)) or type(exc).__name__


def _prepare(frame: QueuedFrame, row: ImageU8) -> FrameMeta | str:
    """The frame prepared into `row`: its meta, or why it could not be (one corrupt frame,
    or one that OpenCV raises on, is not its camera's end)."""
    try:
        return frame.into(row)
    except Exception as exc:
        return one_line(str(exc)) or type(exc).__name__
