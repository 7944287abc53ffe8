"""The inference engine: staged batches -> detections in original-frame pixels.

Two named threads:

* `engine` takes batches from the batcher. For each it first starts the host-to-device copy of
  the batch's uint8 staging slot (`non_blocking=True` on a copy stream, so from pinned memory
  it runs on the copy engine), and only then runs the *previous* batch: normalise on the
  device, the model under `inference_mode` (optional fp16/bf16 autocast and channels_last),
  score/class filter and NMS on the device, and one copy of the packed results into a pinned
  output buffer. So the copy of batch n+1 overlaps the compute of batch n. CUDA events order
  the streams (compute waits for its copy event) and time each span.
* `engine-complete` waits for each batch's final event, releases its staging slot (never
  before: the slot is in flight until then), maps boxes back through each frame's letterbox
  and hands the frames' results on. Up to `max_in_flight` batches wait for it.

On the CPU the same steps run in the same order on the same threads, without streams, pinned
memory or events (host clocks time the spans).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from drivepercept.buffers import StagingRing
from drivepercept.config import PipelineConfig
from drivepercept.engine.stages import (
    autocast,
    keep_table,
    postprocess,
    ready_model,
    to_model_input,
)
from drivepercept.models.base import Detector
from drivepercept.queues import put_until_stopped
from drivepercept.types import Batch, Detections, FrameResult, FrameTiming

log = logging.getLogger(__name__)

_POLL_S = 0.1


@dataclass
class _Staged:
    """A batch whose upload has been started."""

    batch: Batch
    device_u8: torch.Tensor
    submit_ns: int
    start: torch.cuda.Event | None = None
    copied: torch.cuda.Event | None = None
    copy_done_ns: int = 0


@dataclass
class _InFlight:
    """A batch whose compute has been queued; results land in `host_out`."""

    staged: _Staged
    host_out: torch.Tensor
    host_counts: torch.Tensor
    done: torch.cuda.Event | None = None
    inferred: torch.cuda.Event | None = None
    compute_started: torch.cuda.Event | None = None
    times_ns: dict[str, int] = field(default_factory=dict)


def _new_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _new_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


class InferenceEngine:
    """Runs a detector over batches from the staging ring; see the module docstring."""

    def __init__(
        self,
        *,
        detector: Detector,
        config: PipelineConfig,
        device: torch.device,
        ring: StagingRing,
        inbox: queue.Queue[Batch | None],
        emit: Callable[[list[FrameResult]], None],
        stop: threading.Event,
        max_batch: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.detector = detector
        self.config = config
        self.device = device
        self.cuda = device.type == "cuda"
        self.ring = ring
        self.inbox = inbox
        self.emit = emit
        self.stop = stop
        self.on_error = on_error
        self.error: BaseException | None = None
        self.batches_done = 0
        self.frames_done = 0
        self.model = ready_model(detector, config, device)
        spec = detector.input
        # Normalisation constants go to the device once (none at all when they are 0 and 1).
        self._mean: tuple[float, ...] | torch.Tensor = spec.mean
        self._std: tuple[float, ...] | torch.Tensor = spec.std
        if any(v != 0.0 for v in spec.mean) or any(v != 1.0 for v in spec.std):
            self._mean = torch.tensor(spec.mean, device=device).view(1, 3, 1, 1)
            self._std = torch.tensor(spec.std, device=device).view(1, 3, 1, 1)
        self.keep = keep_table(detector.keep_labels, len(detector.class_names), device)
        # Output buffers: one per batch that can be in flight, +2 for the ones being
        # submitted and completed. Pinned on CUDA so the device-to-host copy is asynchronous.
        n_out = config.max_in_flight + 2
        k = config.max_detections
        self._out = [
            torch.empty((max_batch, k, 6), dtype=torch.float32, pin_memory=self.cuda)
            for _ in range(n_out)
        ]
        self._counts = [
            torch.empty(max_batch, dtype=torch.int32, pin_memory=self.cuda) for _ in range(n_out)
        ]
        self._copy_stream = _new_stream(device) if self.cuda else None
        self._compute_stream = _new_stream(device) if self.cuda else None
        self._in_flight: queue.Queue[_InFlight | None] = queue.Queue(maxsize=config.max_in_flight)
        # On the CPU a staging slot is free once its float copy is taken, and replay lets the
        # batcher refill it during compute. Live (drop_oldest) keeps it until compute ends:
        # the batcher then takes each camera's newest frame just when the engine is free,
        # instead of a batch that ages a whole inference while it waits.
        self._release_early = config.drop_policy == "block"
        self._submit = threading.Thread(
            target=self._guard(self._run_submit), name="engine", daemon=True
        )
        self._complete = threading.Thread(
            target=self._guard(self._run_complete), name="engine-complete", daemon=True
        )

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return (self._submit, self._complete)

    def start(self) -> None:
        self._submit.start()
        self._complete.start()

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # recorded; the pipeline re-raises it
                if self.error is None:
                    self.error = exc
                if self.on_error is not None:
                    self.on_error(exc)

        return run

    # ------------------------------------------------------------------ engine thread

    def _stream(self, stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[None]:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _upload(self, batch: Batch) -> _Staged:
        rows = self.ring.tensors[batch.slot][: batch.size]
        if not self.cuda:
            return _Staged(batch, rows, time.monotonic_ns(), copy_done_ns=time.monotonic_ns())
        start = _new_event()
        copied = _new_event()
        with self._stream(self._copy_stream):
            start.record()
            submit_ns = time.monotonic_ns()
            device_u8 = rows.to(self.device, non_blocking=True)
            copied.record()
        return _Staged(batch, device_u8, submit_ns, start, copied)

    def _compute(self, staged: _Staged, out_index: int) -> _InFlight:
        cfg = self.config
        host_out, host_counts = self._out[out_index], self._counts[out_index]
        flight = _InFlight(staged, host_out, host_counts)
        with self._stream(self._compute_stream), torch.inference_mode():
            if self.cuda:
                assert self._compute_stream is not None and staged.copied is not None
                self._compute_stream.wait_event(staged.copied)
                # the upload was allocated on the copy stream and is used on this one
                staged.device_u8.record_stream(self._compute_stream)
                flight.compute_started = _new_event()
                flight.compute_started.record()
            else:
                flight.times_ns["compute_start"] = time.monotonic_ns()
            x = to_model_input(
                staged.device_u8, mean=self._mean, std=self._std, channels_last=cfg.channels_last
            )
            if not self.cuda and self._release_early:
                # the float copy is taken: the staging slot can be refilled right away
                self.ring.release(staged.batch.slot)
            with autocast(self.config.precision, self.device):
                outputs = self.model(x)
            if self.cuda:
                flight.inferred = _new_event()
                flight.inferred.record()
            else:
                flight.times_ns["inference_done"] = time.monotonic_ns()
            packed, counts = postprocess(
                outputs,
                score_threshold=cfg.score_threshold,
                iou_threshold=cfg.iou_threshold,
                max_detections=cfg.max_detections,
                keep=self.keep,
            )
            n = staged.batch.size
            host_out[:n].copy_(packed, non_blocking=self.cuda)
            host_counts[:n].copy_(counts, non_blocking=self.cuda)
            if self.cuda:
                flight.done = _new_event()
                flight.done.record()
            else:
                flight.times_ns["postprocessed"] = time.monotonic_ns()
                if not self._release_early:
                    self.ring.release(staged.batch.slot)
        return flight

    def _batches(self) -> Iterator[Batch]:
        while True:
            try:
                batch = self.inbox.get(timeout=_POLL_S)
            except queue.Empty:
                if self.stop.is_set():
                    return
                continue
            if batch is None:
                return
            yield batch

    def _run_submit(self) -> None:
        pending: _Staged | None = None
        count = 0
        try:
            for batch in self._batches():
                staged = self._upload(batch)  # batch n+1's copy starts before batch n's compute
                if not self.cuda:
                    # no copy engine to overlap with: a batch held back would only wait
                    self._hand_on(self._compute(staged, count % len(self._out)))
                    count += 1
                    if self.stop.is_set():
                        break
                    continue
                if pending is not None:
                    self._hand_on(self._compute(pending, count % len(self._out)))
                    count += 1
                pending = staged
                if self.inbox.empty():
                    # nothing to overlap with: waiting for the next batch would only add a
                    # frame period to this one's latency, so run it now
                    self._hand_on(self._compute(pending, count % len(self._out)))
                    count += 1
                    pending = None
                if self.stop.is_set():
                    break
            if pending is not None and not self.stop.is_set():
                self._hand_on(self._compute(pending, count % len(self._out)))
        finally:
            put_until_stopped(self._in_flight, None, self.stop)

    def _hand_on(self, flight: _InFlight) -> None:
        put_until_stopped(self._in_flight, flight, self.stop)

    # ------------------------------------------------------------------ completion thread

    def _run_complete(self) -> None:
        while True:
            try:
                flight = self._in_flight.get(timeout=_POLL_S)
            except queue.Empty:
                if self.stop.is_set() and not self._submit.is_alive():
                    return
                continue
            if flight is None:
                return
            self._finish(flight)

    def _finish(self, flight: _InFlight) -> None:
        staged = flight.staged
        batch = staged.batch
        times = flight.times_ns
        if self.cuda:
            assert flight.done is not None and staged.start is not None
            assert staged.copied is not None and flight.inferred is not None
            assert flight.compute_started is not None
            staged.copied.synchronize()
            self.ring.release(batch.slot)  # the upload is done: the slot may be refilled
            flight.done.synchronize()

            def at(event: torch.cuda.Event) -> int:
                assert staged.start is not None
                return staged.submit_ns + int(staged.start.elapsed_time(event) * 1e6)

            copy_done = at(staged.copied)
            times["compute_start"] = at(flight.compute_started)
            times["inference_done"] = at(flight.inferred)
            times["postprocessed"] = at(flight.done)
        else:
            copy_done = staged.copy_done_ns
        counts = flight.host_counts[: batch.size].tolist()
        packed = flight.host_out[: batch.size].numpy()
        names = self.detector.class_names
        emitted = time.monotonic_ns()
        results = []
        for row, meta in enumerate(batch.frames):
            rows = packed[row, : counts[row]]
            detections = Detections(
                xyxy=meta.letterbox.to_original(rows[:, :4]),
                scores=rows[:, 4].astype(np.float32),
                labels=rows[:, 5].astype(np.int64),
                class_names=names,
            )
            timing = FrameTiming(
                capture_ns=meta.capture_ns,
                decoded_ns=meta.decoded_ns,
                preprocessed_ns=meta.preprocessed_ns,
                queued_ns=meta.queued_ns,
                batched_ns=batch.batched_ns,
                copy_done_ns=copy_done,
                inference_done_ns=times["inference_done"],
                postprocessed_ns=times["postprocessed"],
                emitted_ns=emitted,
                copy_start_ns=staged.submit_ns,
                compute_start_ns=times["compute_start"],
            )
            results.append(
                FrameResult(
                    camera=meta.camera,
                    camera_index=meta.camera_index,
                    frame_index=meta.frame_index,
                    pts_s=meta.pts_s,
                    batch_index=batch.batch_index,
                    batch_size=batch.size,
                    detections=detections,
                    timing=timing,
                    original_bgr=meta.original_bgr,
                )
            )
        self.emit(results)
        self.batches_done += 1
        self.frames_done += len(results)
