"""What the engine carries for one batch between its threads: the staged upload and the
launched compute, and the CUDA streams and events that order and time them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from drivepercept.engine.lanes import Launched
from drivepercept.engine.step import Outputs
from drivepercept.types import Batch


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
