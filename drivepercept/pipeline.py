"""The one place that wires the stages, owns their threads and shuts them down.

    decode-<camera> (one per camera) -> CameraQueues -> batcher -> StagingRing slot -> engine
    (upload, normalise, model, NMS) -> engine-complete (`handoff`: -> tracking stage) -> sinks
    gpu-monitor (beside them, when sample_hz > 0): GPU / CPU / memory load -> load sinks

Shutdown: one `threading.Event`; every queue operation has a timeout; every thread sends its
sentinel in `finally:`; every thread is joined with a timeout and one that does not stop is
reported. A worker that fails records its exception and sets the event; `run()` re-raises it
as a `PipelineError` with the cause attached. The pipeline is a context manager.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence

import cv2

from drivepercept.batching import PREDICTED_AHEAD, Batcher
from drivepercept.buffers import StagingRing
from drivepercept.config import PipelineConfig
from drivepercept.engine.device import on_device, resolve_device
from drivepercept.engine.engine import InferenceEngine
from drivepercept.engine.overdue import OverdueFrames
from drivepercept.errors import ConfigError, DrivePerceptError, StageError, one_line
from drivepercept.handoff import Handoff, Stage
from drivepercept.heap import FrozenHeap
from drivepercept.models.base import Detector
from drivepercept.queues import CameraQueues
from drivepercept.schedule import DeadlineScheduler
from drivepercept.sinks.base import LoadSink, Sink
from drivepercept.sinks.fanout import OnFailure, SinkPolicy, SinkSet
from drivepercept.sources.decoder import DecoderThread
from drivepercept.sources.readers import FrameReader
from drivepercept.telemetry.counters import CameraFigures, RunCounters, RunStats
from drivepercept.telemetry.sampler import LoadSampler, gpu_refs
from drivepercept.types import (
    Batch,
    CameraSnapshot,
    DropPolicy,
    LoadSample,
    PipelineDescription,
    RunProgress,
)

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 2.0
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class PipelineError(StageError):
    """A pipeline thread failed; the original exception is the __cause__."""


class Pipeline:
    """A multi-camera detection pipeline over already-opened readers.

    Args:
        cameras: (name, reader) per camera, in batch order.
        detector: the model.
        config: pipeline knobs.
        sinks: the result writers: a `SinkSet` with each sink's policy, or plain sinks (then
            each runs on the completion thread and its failure stops the run).
        keep_original: carry each frame's original pixels to the sinks (annotated video).
        load_sinks: load-sample writers, called on the `gpu-monitor` thread.
        capture_stop: the event that stops capture (shared with live sources, whose reconnect
            waits it interrupts); the pipeline makes its own when none is given.
        stage: runs over each batch's results before the sinks (tracking's `RigTracker`).
        priorities: each camera's priority for the deadline scheduler (`config.deadline_ms`;
            default 1 each).
        detect_every: each camera's detection interval (default `config.detect_every`).
    """

    def __init__(
        self,
        *,
        cameras: Sequence[tuple[str, FrameReader]],
        detector: Detector,
        config: PipelineConfig,
        sinks: SinkSet | Sequence[Sink] = (),
        keep_original: bool = False,
        load_sinks: Sequence[LoadSink] = (),
        capture_stop: threading.Event | None = None,
        stage: Stage | None = None,
        priorities: Sequence[float] | None = None,
        detect_every: Sequence[int] | None = None,
    ) -> None:
        if not cameras:
            raise DrivePerceptError("a pipeline needs at least one camera")
        every = tuple(detect_every or [config.detect_every] * len(cameras))
        if max(every) > 1 and stage is None:  # it answers what the model skips
            raise ConfigError(f"detect_every {max(every)} needs a tracking stage")
        if config.deadline_ms and stage is None:
            raise ConfigError("a deadline (deadline_ms) needs a tracking stage")
        self.config, self.detector, self.stage = config, detector, stage
        self.device = resolve_device(config.device)
        self.sinks = (
            sinks
            if isinstance(sinks, SinkSet)
            else SinkSet.of(sinks, SinkPolicy(on_failure=OnFailure.STOP))
        )
        self.sinks.on_stop = self._fail
        self.names = tuple(name for name, _ in cameras)
        self.stop_event = threading.Event()  # everything stops now
        # capture stops, what is in flight drains (duration reached, Ctrl-C, SIGTERM)
        self.capture_stop = capture_stop if capture_stop is not None else threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        policy = DropPolicy(config.drop_policy)
        self.queues = CameraQueues(self.names, capacity=config.queue_capacity, policy=policy)
        width, height = detector.input.size
        with on_device(self.device):  # pinned memory through our GPU's context, not GPU 0's
            pin, size = self.device.type == "cuda", {"height": height, "width": width}
            self.ring = StagingRing(
                slots=config.ring_slots, max_batch=len(cameras), pin_memory=pin, **size
            )
        self.decoders = [
            DecoderThread(
                camera=name,
                camera_index=i,
                reader=reader,
                spec=detector.input,
                queues=self.queues,
                stop=self.capture_stop,
                max_frames=config.max_frames,
                keep_original=keep_original,
                keep_seen=not keep_original and bool(getattr(stage, "wants_images", False)),
                on_error=self._fail,
                defer=policy is DropPolicy.DROP_OLDEST,  # live: most frames are dropped
            )
            for i, (name, reader) in enumerate(cameras)
        ]
        # a deadline: detect or predict, per camera and frame
        self.scheduler = DeadlineScheduler.for_config(self.names, config, priorities)
        self.counters = RunCounters(self.names)
        emit = Handoff(
            stage=stage, scheduler=self.scheduler, sinks=self.sinks, counters=self.counters
        )
        emit.drop_images = self.decoders[0].keep_seen  # pixels kept for the stage alone
        # (with a deadline, batches of frames without rows beyond those of the model's)
        ahead = PREDICTED_AHEAD if self.scheduler is not None else 0
        self._batches: queue.Queue[Batch | None] = queue.Queue(config.ring_slots + ahead)
        self.batcher = Batcher(
            queues=self.queues,
            ring=self.ring,
            out=self._batches,
            timeout_ms=config.batch_timeout_ms,
            stop=self.stop_event,
            on_error=self._fail,
            free_at=lambda: self.engine.free_at_ns(),  # live: batches made just in time
            behind=lambda: self.engine.busy.behind_ns(),  # (and frames aging meanwhile)
            align=policy is DropPolicy.BLOCK,  # replay: batches in time order
            detect_every=every,
            scheduler=self.scheduler,
        )
        self.engine = InferenceEngine(
            detector=detector,
            config=config,
            device=self.device,
            ring=self.ring,
            inbox=self._batches,
            emit=emit,
            stop=self.stop_event,
            max_batch=len(cameras),
            on_error=self._fail,
            on_end=lambda: emit(None),
            service=self.scheduler.service if self.scheduler is not None else None,
        )
        if self.scheduler is not None and callable(getattr(stage, "overdue", None)):
            names = self.engine.step.class_names
            self.engine.overdue = OverdueFrames(
                config.deadline_ms, names, emit.overdue, inbox=self._batches
            )
        self.load_sinks = list(load_sinks)
        self.sampler: LoadSampler | None = None
        if config.sample_hz > 0:
            self.sampler = LoadSampler(
                rate_hz=config.sample_hz,
                gpus=gpu_refs(self.device),
                stop=self.stop_event,
                on_sample=self._on_load_sample,
                on_error=self._fail,
            )
        self._started = False
        self._heap = FrozenHeap()  # `config.freeze_heap`: from capture to close
        self._drain_started = 0.0

    # ------------------------------------------------------------------ wiring

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        decoders = tuple(d.thread for d in self.decoders)
        sampler = (self.sampler.thread,) if self.sampler is not None else ()
        return (*decoders, self.batcher.thread, *self.engine.threads, *sampler)

    def add_load_sink(self, sink: LoadSink) -> None:
        """Add a load-sample writer (before `start`); result writers go to `sinks.add`."""
        if self._started:
            raise RuntimeError("load sinks are added before the pipeline starts")
        self.load_sinks.append(sink)

    def _on_load_sample(self, sample: LoadSample) -> None:
        for sink in self.load_sinks:
            sink.write(sample)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
        # DEBUG: run() re-raises it and the CLI prints it once, as one line
        log.debug("pipeline stage %s failed", threading.current_thread().name, exc_info=exc)
        self.stop_event.set()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        # The decoder threads are the parallelism: OpenCV's own pool inside every resize would
        # only make six decoders and torch fight over the cores.
        cv2.setNumThreads(1)
        if self.sampler is not None:
            self.sampler.start()
        self.sinks.start()
        self.engine.start()
        # Capture starts once the engine is warm: a frame read earlier would wait out the
        # warm-up in its queue (replay) or be dropped (live), and either way its latency
        # would be the warm-up's, not the pipeline's.
        while not self.engine.ready.wait(0.1):
            if self.stop_event.is_set():
                break
        if self.config.freeze_heap:  # no full collection walks the warm process in the run
            self._heap.freeze()
        self.batcher.start()
        for d in self.decoders:
            d.start()

    def __enter__(self) -> Pipeline:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ running

    def frames_done(self) -> list[int]:
        return self.counters.frames()

    def cameras(self, window_s: float = 1.0) -> tuple[CameraSnapshot, ...]:
        """Every camera now: what the status line, /metrics, run.json and `stats` read."""
        return self._snapshots(self.counters.cameras(window_s))

    def _snapshots(self, figures: Sequence[CameraFigures]) -> tuple[CameraSnapshot, ...]:
        dropped = self.queues.dropped()
        corrupt = dict(self.batcher.failed_by_camera)  # frames left out of their batch
        return tuple(
            d.snapshot(
                frames=figures[i].frames,
                fps=figures[i].recent_fps,
                p95_ms=figures[i].recent_p95_ms,
                dropped=dropped[i],
                left_out=corrupt.get(d.camera_index, 0),
            )
            for i, d in enumerate(self.decoders)
        )

    def latest_load(self) -> LoadSample | None:
        """The newest load sample (None without a sampler, or before the first)."""
        return self.sampler.latest if self.sampler is not None else None

    def run(
        self,
        *,
        progress: Callable[[RunProgress], bool | None] | None = None,
        progress_interval_s: float = 0.5,
        duration_s: float | None = None,
    ) -> RunStats:
        """Start (if needed), wait for every camera to end, and return the statistics.

        After `duration_s`, or on Ctrl-C (SIGTERM where the CLI maps it), capture stops and
        the frames already read drain out: the drain ends when the last of them is emitted,
        or at `config.drain_timeout_s` at the latest; then every thread is stopped (within
        JOIN_TIMEOUT_S). On Ctrl-C the result has interrupted=True; either way
        everything emitted is in the sinks. A second Ctrl-C skips the drain. `progress` gets
        a reading every `progress_interval_s` and after the stop; True from it stops capture
        as `duration_s` does.

        Raises:
            PipelineError: a stage failed (the cause is attached).
        """
        self.start()
        started = time.monotonic()
        interrupted = skipped_drain = False
        last_progress = 0.0
        drain_until: float | None = None
        complete = self.engine.completion_thread
        try:
            while complete.is_alive():
                complete.join(timeout=0.1)
                now = time.monotonic()
                if drain_until is None and duration_s and now - started >= duration_s:
                    log.info("duration of %.1f s reached: stopping capture", duration_s)
                    drain_until = self.stop_capture()
                if drain_until is not None and now > drain_until:
                    break
                if progress is not None and now - last_progress >= progress_interval_s:
                    last_progress = now
                    if progress(self.progress()) and drain_until is None:
                        drain_until = self.stop_capture()  # the caller's window is over
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping capture, draining, closing outputs")
            try:
                complete.join(timeout=self.stop_capture() - time.monotonic())
            except KeyboardInterrupt:
                skipped_drain = True
                log.warning("interrupted again: stopping now")
        if (drain_until is not None or interrupted) and not skipped_drain:
            self._log_drain()
        not_stopped = self._shutdown()
        if progress is not None:
            progress(self.progress())
        if self._errors and interrupted:
            for exc in self._errors:  # the interrupt wins, but nothing is swallowed silently
                log.error("while stopping: %s: %s", type(exc).__name__, exc)
        if self._errors and not interrupted:
            first = self._errors[0]
            raise PipelineError(one_line(f"{type(first).__name__}: {first}")) from first
        return self.stats(
            elapsed_s=time.monotonic() - started, interrupted=interrupted, not_stopped=not_stopped
        )

    def stop_capture(self) -> float:
        """Stop reading cameras; what is queued and in flight still completes. Returns when
        (monotonic) draining should be over. Safe from any thread."""
        if not self.capture_stop.is_set():
            self._drain_started = time.monotonic()
        self.capture_stop.set()
        return self._drain_started + self.config.drain_timeout_s

    def _log_drain(self) -> None:
        """Say how the drain went: over, or cut at its bound with frames still inside."""
        if not self.engine.completion_thread.is_alive():
            log.info("drained in %.2f s", time.monotonic() - self._drain_started)
            return
        read, dropped = sum(d.frames_read for d in self.decoders), sum(self.queues.dropped())
        log.warning(
            "the drain bound (drain_timeout_s = %g s) was reached with %d frames still queued "
            "or in flight: they are not in the outputs",
            self.config.drain_timeout_s,
            read - sum(self.frames_done()) - dropped,
        )

    def _shutdown(self) -> tuple[str, ...]:
        """Stop every thread (joined with a shared 2 s budget), then close the sinks."""
        self.capture_stop.set()
        self.stop_event.set()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        not_stopped = []
        for t in self.threads:
            if t.ident is None:
                continue
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                not_stopped.append(t.name)
        if not_stopped:
            log.error("threads did not stop within %.1f s: %s", JOIN_TIMEOUT_S, not_stopped)
        self._close_sinks()
        return (*not_stopped, *self.sinks.not_stopped)

    def _close_sinks(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        # A second Ctrl-C (or SIGTERM) while files are being finished would leave the later
        # ones unflushed: hold the signals until every sink is closed, then let them in.
        main = threading.current_thread() is threading.main_thread()
        hold = main and hasattr(signal, "pthread_sigmask")
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if hold else None
        try:
            self._errors.extend(self.sinks.close())
            for sink in self.load_sinks:
                try:
                    sink.close()
                except Exception as exc:  # one sink failing to close must not lose the others
                    log.error("closing %s failed: %s", type(sink).__name__, exc)
                    self._errors.append(exc)
        finally:
            self._heap.thaw()  # what the run froze may be collected again
            if held is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def close(self) -> None:
        """Stop and join everything (idempotent)."""
        if self._started:
            self._shutdown()
        else:
            self._close_sinks()

    def stats(
        self,
        *,
        elapsed_s: float = 0.0,
        interrupted: bool = False,
        not_stopped: tuple[str, ...] = (),
    ) -> RunStats:
        """Statistics of what has been emitted so far."""
        figures = self.counters.cameras()
        return self.counters.stats(
            self._snapshots(figures),  # one reading: the totals add up
            figures,
            elapsed_s=elapsed_s,
            partial_batches=self.batcher.partial_batches,
            source_spread_ms=self.batcher.source_spread_ms(),
            interrupted=interrupted,
            threads_not_stopped=not_stopped,
            device=str(self.device),
            queue_high_water=tuple(self.queues.high_water()),
            warmup=self.engine.warmup,
            in_flight_high_water=self.engine.in_flight_high_water,
            failed_batches=self.engine.failures.batches,
            failed_frames=self.engine.failures.frames,
            batch_error=self.engine.failures.last,
        )

    def describe(self) -> PipelineDescription:
        """What this pipeline runs on and with (what a job records of it)."""
        step, runtime = self.engine.step, self.detector.runtime
        return PipelineDescription(
            config=dataclasses.asdict(self.config),
            device=str(self.device),
            threads=step.threads,
            lanes=step.lanes.count,
            runtime=runtime() if runtime is not None else None,
            telemetry=self.sampler.describe() if self.sampler is not None else None,
            sinks={name: r.as_dict() for name, r in self.sinks.report().items()},
            packing=step.packing,
            schedule=self.scheduler.figures() if self.scheduler is not None else None,
        )

    def progress(self) -> RunProgress:
        """A reading for progress displays: what `run` hands its callback."""
        expected = [d.expected_frames for d in self.decoders]
        total = -1 if -1 in expected else sum(expected)
        return RunProgress(self.cameras(), self.latest_load(), sum(self.frames_done()), total)
