"""CPU lanes: on a CPU, a batch is cut into sub-batches that run at once, one per lane,
instead of every operation being spread over all the cores.

torch's intra-op parallelism splits each operation over its threads and waits for all of them
at the end of it; a detector of a few million parameters at a few hundred pixels is hundreds
of small operations, so the cores spend much of a batch waking up, waiting for each other and
waiting for the one Python thread that dispatches the next operation. Running independent
sub-batches in parallel keeps every core on its own work. Measured on the 2-core machine with
a YOLOv8n-size network at 320x320, batch 6 (docs/BENCHMARKS.md, "CPU lanes"): one batch with
torch on 2 threads 120-130 ms (46-50 frames/s); two lanes of 3 frames, one torch thread each,
100-102 ms (59-60 frames/s). Lower latency and more throughput at once.

Each lane is a named, owned thread (`engine-lane_<n>`; the calling thread runs the first
sub-batch itself). Thread-local torch state is per thread: the caller's inference mode is set
again in each lane, the model call itself enters autocast there, and torch's intra-op thread
count (per thread too, and the default of threads started later) is set in each lane thread
when it starts, and in the calling thread for each call, given back when it returns.

ONNX Runtime's network runs in lanes too, each lane's runs in a session on the lane's share
of the threads (`OnnxDetector.use_lanes`). Lanes are off (one lane) on a GPU, for a runtime
that cannot be run from several threads at once (OpenVINO here), with torch.compile (each
sub-batch size would be compiled anew) and with CUDA graphs. A one-frame batch (a partial
live batch, the benchmark's naive loop) runs in the calling thread on all the model's torch
threads (ORT's: on a lane's session); a batch of fewer frames than lanes but more than one
runs in fewer lanes, each on its share of the threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for

import torch

Outputs = list[dict[str, torch.Tensor]]


def plan_lanes(
    requested: int,
    *,
    device: torch.device,
    threads: int,
    max_batch: int,
    eligible: bool = True,
) -> int:
    """How many lanes a batch runs in.

    Args:
        requested: the configured count; 0 is automatic (one lane per torch thread).
        device: the engine's device: lanes are a CPU layout.
        threads: the torch threads the model has in all (configured, else torch's count).
        max_batch: the largest batch: more lanes than frames would idle.
        eligible: False where lanes do not apply (another runtime, compile, CUDA graphs).
    """
    if device.type != "cpu" or not eligible or max_batch < 2:
        return 1
    wanted = requested if requested > 0 else threads
    return max(1, min(wanted, max_batch))


def threads_per_lane(threads: int, lanes: int) -> int:
    """torch's intra-op threads in each lane: the threads shared out, at least one."""
    return max(1, threads // lanes)


class Lanes:
    """Runs a model call over a batch as `count` sub-batches at once.

    `map(fn, x)` splits `x` along its first dimension into up to `count` near-equal parts,
    runs `fn` on the first in the calling thread and on the others in the lane threads, and
    returns the per-image outputs in batch order. The calling thread runs on one lane's share
    of torch's threads during the call (a lone frame on `total`) and has its own count back
    after it. An exception in any lane is raised in the
    caller once every lane has finished (no lane is left running on a batch that failed).
    Not re-entrant: one caller (the engine thread, or the benchmark) at a time.

    `launch(fn, x)` hands the whole batch to the next free lane thread and returns at once: a
    `Launched` whose `wait()` gives the outputs. With as many batches launched as lanes (and
    one more queued), every lane works on a batch of its own: no lane waits at a batch's end
    for the slowest, nor while the engine thread takes and normalises the next batch, and each
    lane runs the larger batch, which costs less per frame than a part of it (one thread,
    bench_peer's YOLOv8n at 320, packed, two runs: median 38-42 ms a frame at batch 6
    against 41-45 at batch 3).
    Throughput for latency: each batch takes a lane's time for all its frames (the engine's
    unpaced replay path, `InferenceEngine`, while batches wait behind; `whole=False` cuts a
    batch over the lanes instead, for the last one; live splits its batches with `map`).
    """

    def __init__(
        self, count: int, *, threads: int = 1, total: int = 1, name: str = "engine-lane"
    ) -> None:
        if count < 1 or threads < 1:
            raise ValueError(f"expected at least 1 lane and 1 thread, got {count}, {threads}")
        self.count = count
        self.threads = threads  # torch's intra-op threads in each lane
        self.total = max(total, threads)  # the model's threads in all: a one-frame batch's
        # torch's count where the lanes were made: given back when they close, as the last
        # count set is the default of the threads started after (a later run's engine)
        self._given = torch.get_num_threads()
        # one thread per lane: `map` runs its first part in the caller and leaves one idle,
        # `launch` runs every part in them
        self._pool = (
            ThreadPoolExecutor(
                max_workers=count,
                thread_name_prefix=name,
                initializer=torch.set_num_threads,
                initargs=(threads,),
            )
            if count > 1
            else None
        )

    def map(self, fn: Callable[[torch.Tensor], Outputs], x: torch.Tensor) -> Outputs:
        if self._pool is None:
            return fn(x)
        # the calling thread computes a lane itself (a lone frame: on all the model's
        # threads); torch's count is per thread, set for the call and given back (0.1 us)
        before = torch.get_num_threads()
        torch.set_num_threads(self.total if x.shape[0] < 2 else self.threads)
        try:
            return fn(x) if x.shape[0] < 2 else self._split(fn, x)
        finally:
            torch.set_num_threads(before)

    def launch(
        self, fn: Callable[[torch.Tensor], Outputs], x: torch.Tensor, *, whole: bool = True
    ) -> Launched:
        """`x` to the lane threads without waiting (see the class docstring): whole to the
        next free lane, or (`whole=False`) cut into one part per lane, for a batch whose
        latency counts more than its cost per frame (the last one, nothing behind it). One
        lane: computed here, as `map` does."""
        if self._pool is None:
            return Launched.done(self.map(fn, x))
        inference = torch.is_inference_mode_enabled()

        def lane(batch: torch.Tensor) -> tuple[Outputs, int]:
            with torch.inference_mode(inference):
                return fn(batch), time.monotonic_ns()

        parts = [x] if whole else self._parts(x)
        return Launched([self._pool.submit(lane, p) for p in parts])

    def _parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [p for p in torch.tensor_split(x, min(self.count, x.shape[0])) if p.shape[0]]

    def _split(self, fn: Callable[[torch.Tensor], Outputs], x: torch.Tensor) -> Outputs:
        assert self._pool is not None
        parts = self._parts(x)
        inference = torch.is_inference_mode_enabled()

        def lane(part: torch.Tensor) -> Outputs:
            with torch.inference_mode(inference):
                return fn(part)

        futures: list[Future[Outputs]] = [self._pool.submit(lane, p) for p in parts[1:]]
        try:
            outputs = fn(parts[0])
        finally:
            done = [f.exception() for f in futures]  # waits for every lane
        for error in done:
            if error is not None:
                raise error
        for future in futures:
            outputs = outputs + future.result()
        return outputs

    def close(self) -> None:
        """Stop the lane threads (after the parts already handed to them); idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            torch.set_num_threads(self._given)


class Launched:
    """A batch's parts handed to the lanes: `wait()` gives their outputs in batch order,
    once every part is done (an exception in any part is raised then, after all have
    finished); `done_ns` is when the last part finished (monotonic)."""

    def __init__(self, futures: list[Future[tuple[Outputs, int]]]) -> None:
        self._futures = futures
        self._outputs: Outputs | None = None
        self.done_ns = 0

    @classmethod
    def done(cls, outputs: Outputs) -> Launched:
        launched = cls([])
        launched._outputs, launched.done_ns = outputs, time.monotonic_ns()
        return launched

    def finished(self, timeout_s: float) -> bool:
        """Whether every part is done, waiting up to `timeout_s` for it."""
        return self._outputs is not None or not wait_for(self._futures, timeout_s).not_done

    def wait(self) -> Outputs:
        if self._outputs is None:
            errors = [f.exception() for f in self._futures]  # waits for every part
            for error in errors:
                if error is not None:
                    raise error
            outputs: Outputs = []
            for future in self._futures:
                part, finished = future.result()
                outputs = outputs + part
                self.done_ns = max(self.done_ns, finished)
            self._outputs = outputs
        return self._outputs
