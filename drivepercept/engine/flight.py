"""What the engine carries for one batch between its threads: the staged upload and the
launched compute, and the CUDA streams and events that order and time them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from drivepercept.engine.lanes import Launched
from drivepercept.engine.step import Outputs
from drivepercept.types import Batch

# how often a deadline run's completion thread looks at the device while it waits (a
# blocking event's `synchronize` takes no timeout): answers 0.5 ms later at worst
_POLL_EVENT_S = 0.0005


@dataclass
class Staged:
    """A batch whose upload has been started (`batch` None: a warm-up batch)."""

    batch: Batch | None
    size: int
    device_u8: torch.Tensor
    submit_ns: int
    start: torch.cuda.Event | None = None
    copied: torch.cuda.Event | None = None
    copy_done_ns: int = 0
    released: bool = False  # its staging slot was given back


@dataclass
class InFlight:
    """A batch whose model has been launched; its outputs may still be being computed."""

    staged: Staged
    outputs: Outputs
    inferred: torch.cuda.Event | None = None
    launched: Launched | None = None  # CPU lanes still computing: `outputs` once waited for
    compute_started: torch.cuda.Event | None = None
    times_ns: dict[str, int] = field(default_factory=dict)


def new_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def new_event(*, waited_on: bool = False) -> torch.cuda.Event:
    # an event the host waits for is blocking: the waiting thread sleeps instead of
    # spinning on a core the decoders need
    return torch.cuda.Event(enable_timing=True, blocking=waited_on)  # type: ignore[no-untyped-call]


def reached(event: torch.cuda.Event) -> Callable[[float], bool]:
    """A wait for `event` with a timeout (a blocking event's `synchronize` has none): called
    with `timeout_s`, whether the device has reached it, polling for up to that long."""

    def within(timeout_s: float) -> bool:
        until = time.monotonic() + timeout_s
        while not event.query():  # type: ignore[no-untyped-call]
            if time.monotonic() >= until:
                return False
            time.sleep(_POLL_EVENT_S)
        return True

    return within


def tensors(outputs: Outputs) -> Iterator[torch.Tensor]:
    for out in outputs:
        yield from (v for v in out.values() if isinstance(v, torch.Tensor))


def warmup_rows(size: int, width: int, height: int, *, pin: bool) -> torch.Tensor:
    """A warm-up batch of staged uint8 rows (size, H, W, 3): a fixed pattern that is not
    constant (an all-zero image may take no box path at all), pinned for a GPU."""
    line = (torch.arange(width * 3, dtype=torch.int32) % 251).to(torch.uint8)
    rows = line.reshape(1, 1, width, 3).expand(size, height, width, 3)
    return rows.pin_memory() if pin else rows.contiguous()


def on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[None]:
    """Work queued on `stream` (CUDA), or as it comes (no stream: the CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
