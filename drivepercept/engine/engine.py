"""The inference engine: staged batches -> detections in original-frame pixels.

Two named threads:

* `engine` first warms the detector up (one batch at the rig's size and one of a single
  frame, through the same streams and steps as real batches, so that CUDA's lazy loading,
  cuDNN/cuBLAS handles and autotuning are paid before the first real frame; the times go to
  run.json and nowhere else). Then it takes batches from the batcher. For each it first
  starts the host-to-device copy of the batch's uint8 staging slot (`non_blocking=True` on a
  copy stream, so from pinned memory it runs on the copy engine), and only then launches the
  *previous* batch on the compute stream: normalise, the model under `inference_mode`
  (mixed precision and channels_last as configured). So the copy of batch n+1 overlaps the
  compute of batch n. Launching does not wait for the device: up to `max_in_flight`
  batches are launched and not yet finished (a semaphore), and the engine thread only
  queues work.
* `engine-complete` finishes batches in order: on a post-processing stream that waits for
  the batch's model, the score/class filter, one NMS over the whole batch and one copy of the
  packed results into a pinned host buffer (the only places that wait for the device are
  here, on this thread). It frees the staging slot once the upload is done, maps boxes back
  through each frame's letterbox and hands the frames' results on.

With a detection interval a batch's last `Batch.predicted` frames are not for the model
(`results`: empty `Detections` flagged `predicted`, for the tracking stage); a batch of none
goes to `engine-complete` in its turn without touching the device. Each model batch's rows
and compute time go to the deadline scheduler's service clock (`busy.BusyClock`, which also
says when the engine will be free); with a deadline, `overdue.OverdueFrames` has the
completion thread answer a batch's frames by prediction when the model is late with them.
A batch the model (or its post-processing) raises on is set aside, not the run
(`failures.BatchFailures`: its slot given back, its frames counted, the error logged).

CUDA events order the streams (compute waits for its copy, post-processing for its compute)
and time each span. On the CPU the same steps run in the same order on the same threads,
without streams, pinned memory or events (host clocks time the spans). Both threads make the
engine's device their current one, and every device allocation is made for that device, so
`cuda:N` never touches GPU 0.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

import torch

from drivepercept.buffers import StagingRing
from drivepercept.config import PipelineConfig
from drivepercept.engine import flight as flights
from drivepercept.engine.busy import BusyClock, ServiceClock
from drivepercept.engine.device import on_device
from drivepercept.engine.failures import BatchFailures
from drivepercept.engine.flight import InFlight, Staged, new_event, new_stream, tensors
from drivepercept.engine.overdue import OverdueFrames
from drivepercept.engine.results import batch_results
from drivepercept.engine.step import DetectorStep
from drivepercept.models.base import Detector
from drivepercept.queues import put_until_stopped, take_until_stopped
from drivepercept.types import NO_SLOT, Batch, FrameResult, WarmupRun

log = logging.getLogger(__name__)

_POLL_S = 0.1


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
        on_end: Callable[[], None] | None = None,
        service: ServiceClock | None = None,
    ) -> None:
        self.detector = detector
        self.on_end = on_end  # the completion thread's last call (a stage's held results)
        self.config = config
        self.device = device
        self.cuda = device.type == "cuda"
        self.ring = ring
        self.inbox = inbox
        self.emit = emit
        self.stop = stop
        self.on_error = on_error
        self.max_batch = max_batch
        self.error: BaseException | None = None
        self.batches_done = 0
        self.frames_done = 0
        self.warmup: tuple[WarmupRun, ...] = ()
        self.ready = threading.Event()  # set once warmed up (or failed): batches may come
        self.ready_ns = 0  # monotonic time the warm-up ended
        with on_device(device):
            self.step = DetectorStep(detector, config, device, max_batch=max_batch)
            # One output buffer: the completion thread reads it before it post-processes the
            # next batch. Pinned on CUDA so the device-to-host copy is asynchronous.
            k = config.max_detections
            self._out = torch.empty((max_batch, k, 6), dtype=torch.float32, pin_memory=self.cuda)
            self._counts = torch.empty(max_batch, dtype=torch.int32, pin_memory=self.cuda)
            self._copy_stream = new_stream(device) if self.cuda else None
            self._compute_stream = new_stream(device) if self.cuda else None
            self._post_stream = new_stream(device) if self.cuda else None
            if self.cuda:
                # the weights and constants went up on the default stream, which our streams
                # do not wait for: let those copies land before any kernel reads them
                torch.cuda.current_stream(device).synchronize()
        self._no_rows = torch.empty(0, dtype=torch.uint8)  # a batch the model does not see
        self._count_lock = threading.Lock()
        self._now_in_flight = 0
        self.in_flight_high_water = 0
        self.failures = BatchFailures()  # batches the model or post-processing raised on
        self.overdue = OverdueFrames()  # with a deadline, the pipeline's (watches nothing)
        # when the engine takes its next batch; feeds the scheduler's measure of the model
        self.busy = BusyClock(inbox, service)
        # On the CPU a staging slot is free once its float copy is taken: replay refills it
        # during compute. Live (drop_oldest) keeps it until the model is done, so that the
        # batcher takes each camera's newest frame just when the engine is free.
        self._release_early = config.drop_policy == "block"
        # Replay on CPU lanes: each batch handed whole to a free lane (cut over them when none
        # waits behind it), the completion thread waiting for it, so that no lane idles at a
        # batch's end (`Lanes.launch`). Live computes in this thread: batches just in time.
        self._launch_in_lanes = not self.cuda and self._release_early and self.step.lanes.count > 1
        # launched and not yet finished: at most max_in_flight; launched into lanes, one batch
        # per lane and one more queued, so that a lane never waits for the completion thread
        # to post its last batch and the engine to launch the next
        lanes = self.step.lanes.count + 1 if self._launch_in_lanes else 0
        in_flight = max(config.max_in_flight, lanes)
        self.flight_limit = in_flight
        self._flight_slots = threading.Semaphore(in_flight)
        self._in_flight: queue.Queue[InFlight | None] = queue.Queue(maxsize=in_flight + 1)
        self._submit = threading.Thread(
            target=self._guard(self._run_submit), name="engine", daemon=True
        )
        self._complete = threading.Thread(
            target=self._guard(self._run_complete), name="engine-complete", daemon=True
        )

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return (self._submit, self._complete)

    @property
    def completion_thread(self) -> threading.Thread:
        """The thread that hands results on: the run is over when it ends."""
        return self._complete

    def start(self) -> None:
        # new threads take the count any thread set last: the engine's take this one's (or set)
        torch.set_num_threads(self.config.torch_threads or torch.get_num_threads())
        self._submit.start()
        self._complete.start()

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                if self.cuda:
                    torch.cuda.set_device(self.device)  # allocations and handles on our GPU
                fn()
            except BaseException as exc:  # recorded; the pipeline re-raises it
                if self.error is None:
                    self.error = exc
                if self.on_error is not None:
                    self.on_error(exc)
            finally:
                self.ready.set()  # never leave the pipeline waiting for a dead engine

        return run

    # ------------------------------------------------------------------ engine thread

    def _upload(self, rows: torch.Tensor, batch: Batch | None) -> Staged:
        if not self.cuda:
            now = time.monotonic_ns()
            return Staged(batch, rows.shape[0], rows, now, copy_done_ns=now)
        start = new_event()
        copied = new_event(waited_on=True)
        with flights.on_stream(self._copy_stream):
            start.record()
            submit_ns = time.monotonic_ns()
            device_u8 = rows.to(self.device, non_blocking=True)
            copied.record()
        return Staged(batch, rows.shape[0], device_u8, submit_ns, start, copied)

    def _release(self, staged: Staged) -> None:
        if staged.batch is not None and not staged.released:
            staged.released = True
            if staged.batch.slot != NO_SLOT:
                self.ring.release(staged.batch.slot)

    def _batch_failed(self, staged: Staged, exc: Exception) -> None:
        """Set a batch the model raised on aside (see the module docstring).

        Raises:
            StageError: too many batches in a row failed (`BatchFailures`).
        """
        batch = staged.batch
        if batch is None:  # the warm-up: a model that cannot run at all
            raise exc
        if self.cuda and staged.copied is not None:
            with contextlib.suppress(RuntimeError):  # a broken context raises here too
                staged.copied.synchronize()  # the slot is free once its upload is done
        self._release(staged)
        self.failures.failed(batch, exc, answered=self.overdue.finished(batch))

    def _landed(self) -> None:
        """A launched batch is over (done or failed): the next may be launched."""
        with self._count_lock:
            self._now_in_flight -= 1
        self._flight_slots.release()

    def _compute(self, staged: Staged) -> InFlight:
        """Launch normalise + model on the compute stream (returns before the device is done,
        unless the model itself waits for it)."""
        times: dict[str, int] = {}
        with flights.on_stream(self._compute_stream), torch.inference_mode():
            started: torch.cuda.Event | None = None
            if self.cuda:
                assert self._compute_stream is not None and staged.copied is not None
                self._compute_stream.wait_event(staged.copied)
                # the upload was allocated on the copy stream and is used on this one
                staged.device_u8.record_stream(self._compute_stream)
                started = new_event()
                started.record()
            else:
                times["compute_start"] = time.monotonic_ns()
            x = self.step.normalise(staged.device_u8)
            if not self.cuda and self._release_early:
                # the float copy is taken: the staging slot can be refilled right away
                self._release(staged)
            if self._launch_in_lanes and staged.batch is not None:
                # whole to a lane while batches wait behind it; the last (the end, a drain,
                # decoding the slower side) cut over the lanes, not left to one lane alone
                launched = self.step.launch(x, whole=not self.inbox.empty())
                return InFlight(staged, [], launched=launched, times_ns=times)
            outputs = self.step.forward(x)
            inferred: torch.cuda.Event | None = None
            if self.cuda:
                inferred = new_event(waited_on=True)
                inferred.record()
            else:
                times["inference_done"] = time.monotonic_ns()
                if not self._release_early:
                    self._release(staged)
        return InFlight(staged, outputs, inferred=inferred, compute_started=started, times_ns=times)

    def _warm_up(self) -> None:
        """One batch at the rig's size and one of a single frame, through every step and
        stream, waited for; timed, and never counted as frames. On a CPU the full batch's compute
        (not a compile) is `free_at_ns`'s first estimate (live's first batches, BENCHMARKS.md).
        With a deadline (not compiled), every size between, twice: the second pass is the
        estimate (a size's first call pays set-up: six rows 209 ms, then 61; tiny, 2 cores)."""
        width, height = self.detector.input.size
        runs = []
        passes = 2 if self.config.deadline_ms > 0 and not self.config.compile else 1
        sizes = range(self.max_batch, 0, -1) if passes == 2 else dict.fromkeys((self.max_batch, 1))
        for size in [*sizes] * passes:
            with on_device(self.device):
                rows = flights.warmup_rows(size, width, height, pin=self.cuda)
            start = time.perf_counter_ns()
            staged = self._upload(rows, None)
            computed = time.monotonic_ns()
            flight = self._compute(staged)
            steady = not self.cuda and self.step.compiled is None  # no first-run set-up
            if size == self.max_batch and steady:
                self.busy.ema_ns = float(time.monotonic_ns() - computed)
            self._post(flight)
            if steady:  # (a CUDA or compiled first run would inflate every estimate)
                self.busy.served(size, flight.times_ns, provisional=True)
            runs.append(WarmupRun(size, (time.perf_counter_ns() - start) / 1e6))
        self.warmup = tuple(runs)
        log.debug("warm-up: %s", ", ".join(f"batch {r.batch_size}: {r.ms:.1f} ms" for r in runs))

    def _run_submit(self) -> None:
        pending: Staged | None = None
        try:
            if self.config.warmup:
                self._warm_up()
            self.ready_ns = time.monotonic_ns()
            self.ready.set()
            for batch in take_until_stopped(self.inbox, self.stop):
                self.overdue.launched(batch)  # out of the inbox: watched from now
                self.busy.hold(batch.detected)  # taken, not yet computing: it counts
                if not batch.detected:  # every frame predicted: nothing for the model
                    if pending is not None:  # in order: the batch before it first
                        self._launch(pending)
                        pending = None
                    self._pass(batch)
                    continue
                rows = self.ring.tensors[batch.slot][: batch.detected]
                staged = self._upload(rows, batch)  # n+1's copy starts before n's compute
                if not self.cuda:
                    # no copy engine to overlap with: a batch held back would only wait
                    self._launch(staged)
                    if self.stop.is_set():
                        break
                    continue
                if pending is not None:
                    self._launch(pending)
                pending = staged
                if self.inbox.empty():
                    # nothing to overlap with: waiting for the next batch would only add a
                    # frame period to this one's latency, so launch it now
                    self._launch(pending)
                    pending = None
                if self.stop.is_set():
                    break
            if pending is not None and not self.stop.is_set():
                self._launch(pending)
        finally:
            self.step.close()  # the lane threads: nothing computes after this thread
            put_until_stopped(self._in_flight, None, self.stop)

    def _pass(self, batch: Batch) -> None:
        """A batch the model does not see: to the completion thread in its turn, no rows."""
        now = time.monotonic_ns()
        staged = Staged(batch, 0, self._no_rows, now, copy_done_ns=now)
        self._release(staged)
        self.busy.held = False
        times = dict.fromkeys(("compute_start", "inference_done", "postprocessed"), now)
        put_until_stopped(self._in_flight, InFlight(staged, [], times_ns=times), self.stop)

    def _launch(self, staged: Staged) -> None:
        """Compute a staged batch once fewer than `flight_limit` are unfinished."""
        while not self._flight_slots.acquire(timeout=_POLL_S):
            if self.stop.is_set():
                return
        with self._count_lock:
            self._now_in_flight += 1
            self.in_flight_high_water = max(self.in_flight_high_water, self._now_in_flight)
        started = self.busy.began(staged.size)
        try:
            flight = self._compute(staged)
        except Exception as exc:
            self._landed()
            self._batch_failed(staged, exc)
            return
        finally:
            self.busy.ended(time.monotonic_ns() - started)
        put_until_stopped(self._in_flight, flight, self.stop)

    def free_at_ns(self) -> int:
        """When the engine is expected to take its next batch (`busy.BusyClock`)."""
        return self.busy.free_at_ns()

    # ------------------------------------------------------------------ completion thread

    def _run_complete(self) -> None:
        while True:
            try:
                flight = self._in_flight.get(timeout=self.overdue.timeout_s(_POLL_S))
            except queue.Empty:
                self.overdue.answer_due()  # the model is late with a batch's frames
                if self.stop.is_set() and not self._submit.is_alive():
                    break
                continue
            if flight is None:
                break
            self._finish(flight)
        if self.on_end is not None:  # what it raises is recorded by `_guard`
            self.on_end()

    def _post(self, flight: InFlight) -> int:
        """Filter + NMS + pack on the post-processing stream, copy into the pinned host
        buffers, and wait for it all. Frees the staging slot as soon as its upload is done,
        and sleeps (blocking events) while the model runs, so that the two waits inside
        post-processing (the filter's and the NMS's sizes) are short. Returns the copy-done
        time."""
        staged = flight.staged
        n = staged.size
        if flight.launched is not None:  # CPU lanes: their outputs, once all are done
            self.overdue.wait(flight.launched.finished, staged.batch)
            flight.outputs = flight.launched.wait()
            flight.times_ns["inference_done"] = flight.launched.done_ns
        if self.cuda:
            assert staged.copied is not None and flight.inferred is not None
            staged.copied.synchronize()
            self._release(staged)  # the upload is done: the slot may be refilled
            self.overdue.wait(flights.reached(flight.inferred), staged.batch)
            flight.inferred.synchronize()
        with flights.on_stream(self._post_stream), torch.inference_mode():
            if self.cuda:
                assert self._post_stream is not None and flight.inferred is not None
                self._post_stream.wait_event(flight.inferred)
                for t in tensors(flight.outputs):  # made on the compute stream, used here
                    t.record_stream(self._post_stream)
            packed, counts = self.step.postprocess(flight.outputs)
            self._out[:n].copy_(packed, non_blocking=self.cuda)
            self._counts[:n].copy_(counts, non_blocking=self.cuda)
            done = new_event(waited_on=True) if self.cuda else None
            if done is not None:
                done.record()
        if not self.cuda:
            flight.times_ns["postprocessed"] = time.monotonic_ns()
            return staged.copy_done_ns
        assert done is not None and staged.start is not None and staged.copied is not None
        assert flight.compute_started is not None and flight.inferred is not None
        done.synchronize()

        def at(event: torch.cuda.Event) -> int:
            assert staged.start is not None
            return staged.submit_ns + int(staged.start.elapsed_time(event) * 1e6)

        flight.times_ns["compute_start"] = at(flight.compute_started)
        flight.times_ns["inference_done"] = at(flight.inferred)
        flight.times_ns["postprocessed"] = at(done)
        return at(staged.copied)

    def _finish(self, flight: InFlight) -> None:
        staged = flight.staged
        batch = staged.batch
        assert batch is not None
        if staged.size:
            try:
                copy_done = self._post(flight)
            except Exception as exc:
                self._landed()
                self._batch_failed(staged, exc)
                return
            self._landed()  # the device is done with it: the next may be launched
            self.busy.served(staged.size, flight.times_ns)
        else:  # no rows for the model (`_pass`)
            copy_done = staged.copy_done_ns
        results = batch_results(
            batch,
            self._out[: staged.size].numpy(),
            self._counts[: staged.size].tolist(),
            self.step.class_names,
            submit_ns=staged.submit_ns,
            copy_done_ns=copy_done,
            times_ns=flight.times_ns,
            emitted_ns=time.monotonic_ns(),
        )
        self.emit(results)
        self.overdue.finished(batch, flight.times_ns["inference_done"] if staged.size else None)
        self.batches_done += 1
        self.frames_done += len(results)
        if staged.size:  # a batch the model did not see says nothing of it
            self.failures.succeeded()
