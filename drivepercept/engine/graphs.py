"""`--cuda-graphs`: the model's forward at the rig's batch size, captured once as a CUDA graph
and replayed.

A small detector's forward is hundreds of small kernels; on a fast GPU, launching them from
Python takes longer than running them. A graph replays all of them with one launch.

When: capture is lazy, on the engine's thread, at the second call with the largest batch
seen so far. The first such call is the warm-up, which pays everything that must not happen
inside a capture: cuDNN's algorithm search, a model's lazily built state (YOLOX's grids),
and with `--compile` the compilation. So in the pipeline the first real full batch is
captured and replayed (with `--no-warmup`, the second).

Partial batches (fewer cameras than the rig: one ended, late, or reconnecting) are padded,
not run eagerly: their rows are copied into the captured input, the rows behind them keep
the previous batch's frames (valid images, whose outputs are cut off), the graph is replayed
and the first rows' outputs are returned. A small detector on a GPU is bound by launches,
not arithmetic, so a padded batch costs about what a full one does, while an eager one would
lose the graph's whole gain; in a live rig with a dead camera every batch is partial. One
captured shape also means one private memory pool and no capture in the middle of a run.
A batch larger than the captured one, or of another image size or dtype, runs eagerly.

The graph writes the same output tensors on every replay, and the engine keeps up to
`max_in_flight` batches' outputs alive until its completion thread has post-processed them,
so each replay's outputs are cloned (on the same stream, in order with the replay) before
they are handed on. The capture uses `capture_error_mode="thread_local"`: the completion
thread goes on waiting for events and post-processing earlier batches while the engine
thread captures, which the default global mode forbids.

A forward that cannot be captured (one that waits for the device, like torchvision's own
NMS, or has data-dependent shapes) logs one warning and runs eagerly from then on.

Not thread-safe: one `GraphedForward` is called by one thread at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from drivepercept.engine.compiled import failure_reason

log = logging.getLogger(__name__)

Outputs = list[dict[str, torch.Tensor]]
# eager runs on the capture stream before the capture (the stream's own cuBLAS/cuDNN state)
_SIDE_WARMUPS = 2


class GraphedForward:
    """`forward` (a float batch -> one dict of tensors per image) replayed as one CUDA graph
    at the full batch size (see the module docstring).

    Args:
        forward: the model call to capture: no host synchronisation, shapes that depend only
            on the input's.
        name: the detector's name, for the warning.
    """

    def __init__(self, forward: Callable[[torch.Tensor], Outputs], *, name: str) -> None:
        self.forward = forward
        self.name = name
        self.failure: str | None = None  # why it runs eagerly, once it does
        self._seen: set[tuple[tuple[int, ...], torch.dtype, str]] = set()
        self._largest = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._input: torch.Tensor | None = None  # the captured input, B rows
        self._outputs: Outputs = []  # what the graph writes, one dict per row

    @property
    def batch_size(self) -> int:
        """The captured batch size (0 while nothing is captured)."""
        return 0 if self._input is None else self._input.shape[0]

    def __call__(self, x: torch.Tensor) -> Outputs:
        if self._input is not None and self._fits(x):
            return self._replay(x)
        if self._graph is None and self.failure is None and self._ready(x):
            try:
                self._capture(x)
            except Exception as exc:
                self._give_up(exc)
            else:
                return self._replay(x)
        return self.forward(x)

    def _fits(self, x: torch.Tensor) -> bool:
        assert self._input is not None
        static = self._input
        return (
            x.shape[0] <= static.shape[0]
            and x.shape[1:] == static.shape[1:]
            and x.dtype == static.dtype
            and x.device == static.device
        )

    def _ready(self, x: torch.Tensor) -> bool:
        """Capture now? A CUDA batch at least as large as any before, run once already."""
        if not (torch.cuda.is_available() and x.is_cuda):
            return False
        key = (tuple(x.shape), x.dtype, str(x.device))
        again = key in self._seen
        self._seen.add(key)
        largest = x.shape[0] >= self._largest
        self._largest = max(self._largest, x.shape[0])
        return again and largest

    def _capture(self, x: torch.Tensor) -> None:
        with torch.cuda.device(x.device):
            static = torch.empty_like(x)  # same strides: channels_last stays channels_last
            static.copy_(x)
            side = torch.cuda.Stream(x.device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(_SIDE_WARMUPS):
                    self.forward(static)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                outputs = self.forward(static)
            torch.cuda.current_stream(x.device).wait_stream(side)
        self._graph, self._input, self._outputs = graph, static, outputs
        log.info("--cuda-graphs: model %s captured at batch %d", self.name, x.shape[0])

    def _replay(self, x: torch.Tensor) -> Outputs:
        assert self._graph is not None and self._input is not None
        n = x.shape[0]
        self._input[:n].copy_(x)  # rows n.. keep earlier frames: padding, cut off below
        self._graph.replay()  # on the current stream, after the copy
        return [{k: v.clone() for k, v in out.items()} for out in self._outputs[:n]]

    def _give_up(self, exc: BaseException) -> None:
        self.failure = failure_reason(exc)
        self._graph, self._input, self._outputs = None, None, []
        log.warning(
            "--cuda-graphs: model %s cannot be captured (%s); running it eagerly",
            self.name,
            self.failure,
        )
