"""`run(options)`: sources -> pipeline -> a run folder, for replay, real-time replay and live.

Everything that can fail on bad input (sources, settings, device, model, weights, metrics
port) is checked before the run folder is made, so a failed start leaves no half-made run
behind. Once it exists, the folder is complete however the run ends (complete, interrupted,
failed): run.json says which, and the latency report covers what was processed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivepercept.engine.device import resolve_device
from drivepercept.errors import one_line
from drivepercept.models import WeightsStore, default_input_size, load_detector
from drivepercept.models.base import Detector
from drivepercept.models.onnx import is_onnx
from drivepercept.models.runtime import RuntimeRequest, choose_runtime, for_onnx_file
from drivepercept.pipeline import Pipeline
from drivepercept.report import ReportResult, write_report
from drivepercept.rig import CameraConfig
from drivepercept.run.console import say_dropped
from drivepercept.run.options import Mode, RunOptions, default_onnx_cache
from drivepercept.run.outputs import check_outputs, interrupts_deferred, linger_metrics
from drivepercept.run.record import final_record, first_record, tracking_record
from drivepercept.rundir import RunDir, RunRecord, make_run_dir
from drivepercept.sinks import AnnotatedVideoSink, DetectionsJsonlSink, FrameTimingCsvSink
from drivepercept.sinks.base import Sink
from drivepercept.sinks.display import DisplaySink
from drivepercept.sinks.fanout import OnFailure, SinkPolicy, SinkSet
from drivepercept.sinks.load import LoadCsvSink
from drivepercept.sinks.metrics import MetricsExporter
from drivepercept.sinks.objects import ObjectsJsonlSink
from drivepercept.sources.open import open_cameras, resolve_sources
from drivepercept.sources.readers import FrameReader
from drivepercept.telemetry.counters import CameraStats, RunStats
from drivepercept.types import CameraSnapshot, CameraState, DropPolicy, Pacing, RunProgress

# what `run` hands its progress callback, and what the callback may answer
Progress = Callable[[RunProgress], bool | None]

if TYPE_CHECKING:
    from drivepercept.tracking.stage import RigTracker

log = logging.getLogger(__name__)

# the run's own record of every frame: if it cannot be written, the run stops
ESSENTIAL = SinkPolicy(on_failure=OnFailure.STOP)


@dataclass(frozen=True)
class RunResult:
    """How a run ended, and where its folder is."""

    run_dir: Path
    record: RunRecord
    stats: RunStats
    cameras: tuple[CameraConfig, ...]
    report: ReportResult | None = None
    failed_cameras: tuple[str, ...] = ()  # live cameras that gave up reconnecting
    # why the run counts as failed: every camera failed, or none delivered a frame
    error: str | None = None

    @property
    def short_cameras(self) -> list[CameraStats]:
        """Cameras whose video ended before the frame count its container announced."""
        return [c for c in self.stats.cameras if c.short_by]

    def failure(self) -> str | None:
        """Why the run did not fully succeed, in one line; None when it did. (An interrupted
        run is not a failure: `stats.interrupted` says so.)"""
        if self.error:
            return self.error
        s = self.stats
        if s.failed_batches:
            return (
                f"the model failed on {s.failed_batches} batch(es), {s.failed_frames} frames "
                f"without results (the run went on), the last with {s.batch_error}"
            )
        sinks = self.record.sinks or {}
        failed_outputs = {name: r.failed for name, r in sinks.items() if r.failed}
        if failed_outputs:
            what = "; ".join(f"{name}: {why}" for name, why in failed_outputs.items())
            return f"output(s) failed and were set aside (detection went on): {what}"
        if self.failed_cameras:
            names = ", ".join(self.failed_cameras)
            return f"camera(s) failed for good: {names} (the others ran; see {self.run_dir})"
        # a file's skipped frames are all a failure; a live camera's corrupt frames (a glitch
        # on the wire) are once they outnumber its good ones
        live = self.record.mode == "live"
        damaged = [
            c
            for c in self.stats.cameras
            if c.undecodable and (not live or c.undecodable > c.frames)
        ]
        if damaged:
            what = ", ".join(f"{c.name}: {c.undecodable}" for c in damaged)
            return (
                f"undecodable frames skipped ({what}); every other frame that decodes was "
                f"processed, see {self.run_dir}"
            )
        if self.short_cameras and not self.stats.interrupted:
            what = ", ".join(
                f"{c.name} after {c.frames} frames ({c.short_by} missing)"
                for c in self.short_cameras
            )
            return (
                f"video ended early (truncated?): {what}; every decodable frame was processed, "
                f"see {self.run_dir}"
            )
        return None

    def detections(self) -> Iterator[dict[str, Any]]:
        """The run's detections.jsonl, one dict per camera frame, in emission order."""
        yield from _lines(RunDir(self.run_dir).detections_jsonl)

    def objects(self) -> Iterator[dict[str, Any]]:
        """The run's objects.jsonl (`track`), one dict per rig time step; none without it."""
        path = RunDir(self.run_dir).objects_jsonl
        if path.exists():
            yield from _lines(path)


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _video_policy(mode: Mode) -> SinkPolicy:
    # replay keeps every frame in the video (the pipeline waits for the encoder); live drops
    # the oldest waiting frames instead of holding up detection
    when_full = DropPolicy.BLOCK if mode is Mode.REPLAY else DropPolicy.DROP_OLDEST
    return SinkPolicy(slow=True, when_full=when_full)


def _tracker(cams: Sequence[CameraConfig], mode: Mode) -> RigTracker:
    from drivepercept.tracking.stage import REPLAY_HOLD_S, RigTracker  # scipy, when tracking

    # replay: rig steps by frame time, whatever the batches; live: each batch is one step,
    # nothing waits (its batches take each camera's newest frame: less than a period apart)
    return RigTracker(cams, hold_s=REPLAY_HOLD_S if mode is Mode.REPLAY else 0.0)


def _add_viewer_sinks(
    options: RunOptions, cams: Sequence[CameraConfig], pipeline: Pipeline, sink_set: SinkSet
) -> Sink | None:
    """--mcap (a file for Foxglove; every frame in replay, as the video) and --rerun (a
    viewer that may be slow: it never holds up the engine, frames are dropped for it). The
    Rerun sink is returned: the job closes it again after the others, since a viewer that
    hangs keeps its thread past `SinkSet.close` (its own close gives up after a bound)."""
    if options.mcap is not None:
        from drivepercept.sinks.mcap import McapSink

        mcap = McapSink(
            options.mcap,
            cameras=cams,
            images=options.mcap_images,
            ros2=any(c.topic is not None for c in cams),
        )
        sink_set.add(mcap, _video_policy(options.mode), name="mcap")
        pipeline.add_load_sink(mcap.load_sink)
    if options.rerun is not None:
        from drivepercept.sinks.rerun import RerunSink

        viewer = RerunSink(options.rerun, cameras=[c.name for c in cams])
        sink_set.add(viewer, SinkPolicy(slow=True, queue_batches=2), name="rerun")
        pipeline.add_load_sink(viewer.load_sink)
        if viewer.viewer_url:
            log.warning("Rerun web viewer: %s", viewer.viewer_url)
        return viewer
    return None


def load_model(options: RunOptions) -> Detector:
    """The detector `options.model_options` name, with its weights, classes, input size and
    weights store, on the runtime its `runtime` chooses for the device
    (`drivepercept.models.runtime`: auto runs an exportable model on ONNX Runtime on a CPU,
    from the export cache; bf16 there on OpenVINO).

    Raises:
        ConfigError: a bad setting (or a device that is not there).
        ModelError: it cannot be built, its weights cannot be had, or the runtime asked for
            cannot run it (one line).
    """
    config, model = options.pipeline(), options.model_options
    name = options.model_name  # resolved: the rig's model where none was given
    threads = config.torch_threads  # the model's threads, whichever runtime runs it
    device_type = resolve_device(config.device).type
    # a YOLOX model's default input depends on the device (yolox-nano runs larger on a CPU,
    # where the default runtime is faster), never on the runtime: every runtime gives one
    # model the same boxes
    input_size = model.input_size or default_input_size(name, device_type=device_type)
    detector = load_detector(
        name,
        weights=model.weights,
        classes=model.classes,
        input_size=input_size,
        store=WeightsStore(model.weights_dir, model.weights_mirror),
        onnx_layout=model.onnx_layout,
        onnx_batch=model.onnx_batch,
        trt_cache=model.trt_cache,
        threads=threads,
    )
    request = RuntimeRequest(
        runtime=model.runtime,
        device_type=device_type,
        precision=config.precision,
        compile=config.compile,
        cuda_graphs=config.cuda_graphs,
        threads=threads,
        cache=model.onnx_cache or default_onnx_cache({}),
        random_weights=model.weights is None or model.weights.strip().lower() == "none",
    )
    if is_onnx(name):
        return for_onnx_file(detector, request)
    return choose_runtime(detector, request)


def run(
    options: RunOptions,
    *,
    progress: Progress | None = None,
    detector: Detector | None = None,
    sinks: Sequence[tuple[Sink, SinkPolicy]] = (),
) -> RunResult:
    """Run the sources through the detector into a new run folder.

    Args:
        options: what to run.
        progress: called every half second with a reading of the run (`RunProgress`: a
            progress display); True from it stops capture, as the run's duration does.
        detector: an already-built detector (else `options.model` is loaded).
        sinks: more result writers, each with its policy, beside the run folder's own.

    Raises:
        DrivePerceptError: bad input (one clear line), or a failed stage (`PipelineError`).
    """
    pacing = options.mode.pacing
    cams = resolve_sources(options.sources, live=pacing is Pacing.LIVE, topics=options.topics)
    check_outputs(options, cams)  # an output over an input: refused before anything opens
    config = options.pipeline()
    priorities = options.camera_priorities(cams)  # a name of no camera: said before opening
    resolve_device(config.device)  # a missing GPU is said before any model is loaded
    capture_stop = threading.Event()
    readers = open_cameras(
        cams,
        pacing=pacing,
        policy=options.reconnect,
        stop=capture_stop,
        max_gap_s=options.max_gap_s,
    )
    names = [c.name for c in cams]
    sink_set = SinkSet()
    exporter: MetricsExporter | None = None
    pipeline: Pipeline | None = None
    viewer: Sink | None = None
    try:
        det = detector or load_model(options)
        every = [c.detect_every or config.detect_every for c in cams]  # the rig's first
        track = options.track or max(every) > 1 or bool(config.deadline_ms)
        if track and not options.track:  # its tracks answer the frames the model skips
            why = f"a {config.deadline_ms:g} ms budget to hold" if config.deadline_ms else ""
            why = why or f"detect every {'/'.join(str(e) for e in dict.fromkeys(every))} frames"
            log.warning("%s: tracking is on (it answers the frames the model skips)", why)
        tracker = _tracker(cams, options.mode) if track else None
        pipeline = Pipeline(
            cameras=list(zip(names, readers, strict=True)),
            detector=det,
            config=config,
            sinks=sink_set,
            keep_original=options.save_video
            or options.show
            or options.mcap_images
            or options.rerun is not None,
            capture_stop=capture_stop,
            stage=tracker,
            priorities=priorities,
            detect_every=every,
        )
        if options.metrics_port is not None:
            exporter = MetricsExporter(
                port=options.metrics_port, cameras=names, poll=pipeline.cameras
            )
            sink_set.add(exporter.frames_sink, name="metrics")
            pipeline.add_load_sink(exporter.load_sink)
        viewer = _add_viewer_sinks(options, cams, pipeline, sink_set)  # bad path: no folder
        run_dir = make_run_dir(options.out_root, options.name, prefix=options.mode.value)
        sink_set.add(DetectionsJsonlSink(run_dir.detections_jsonl), ESSENTIAL, name="detections")
        sink_set.add(FrameTimingCsvSink(run_dir.frames_csv), ESSENTIAL, name="frames")
        if tracker is not None and tracker.fusion.placing:
            objects = ObjectsJsonlSink(run_dir.objects_jsonl)
            sink_set.add(objects, ESSENTIAL, name="objects")
            tracker.on_step = objects.write_step
        if config.sample_hz > 0:
            pipeline.add_load_sink(LoadCsvSink(run_dir.load_csv))
        if options.show:
            display = DisplaySink(names, on_quit=pipeline.stop_capture)
            sink_set.add(display, SinkPolicy(slow=True, queue_batches=2), name="display")
        if options.save_video:
            fps = {c.name: r.info.fps or 15.0 for c, r in zip(cams, readers, strict=True)}
            video = AnnotatedVideoSink(
                run_dir.video_dir, fps=fps, mosaic=options.mosaic, cameras=len(cams)
            )
            sink_set.add(video, _video_policy(options.mode), name="video")
        for sink, policy in sinks:
            sink_set.add(sink, policy)
    except BaseException:
        for r in readers:
            r.close()
        if pipeline is not None:
            pipeline.close()
        else:
            sink_set.close()
        if exporter is not None:
            exporter.close()
        if viewer is not None:
            viewer.close()
        raise
    try:
        return _run(options, pipeline, det, run_dir, cams, readers, progress, tracker)
    finally:
        if exporter is not None:
            exporter.close()
        if viewer is not None:
            viewer.close()


def _run(
    options: RunOptions,
    pipeline: Pipeline,
    detector: Detector,
    run_dir: RunDir,
    cams: tuple[CameraConfig, ...],
    readers: Sequence[FrameReader],
    progress: Progress | None,
    tracker: RigTracker | None = None,
) -> RunResult:
    try:
        record = first_record(options, detector, pipeline.describe(), cams, readers)
    except BaseException:
        pipeline.close()
        raise
    try:
        run_dir.write_record(record)
        if "html" in options.report_formats:  # its writer loads while the run goes on
            threading.Thread(target=_import_report_writer, name="report-import").start()
        stats = pipeline.run(progress=progress, duration_s=options.duration_s)
    except BaseException as exc:
        pipeline.close()
        # a repeated Ctrl-C (or SIGTERM) that cut the stop short is still an interruption
        stopped = isinstance(exc, KeyboardInterrupt)
        why = None if stopped else one_line(f"{type(exc).__name__}: {exc}")
        status = "interrupted" if stopped else "failed"
        stats = pipeline.stats(interrupted=stopped)
        described, snapshots = pipeline.describe(), pipeline.cameras()
        record = final_record(
            record,
            described,
            snapshots,
            cams,
            readers,
            stats,
            status=status,
            error=why,
            tracking=tracking_record(tracker),
        )
        try:
            with interrupts_deferred():
                run_dir.write_record(record)
                _report(run_dir, options)
        except Exception as report_exc:  # the run's own error is the one to report
            log.error("the record or report of the failed run was not written: %s", report_exc)
        except KeyboardInterrupt:
            pass  # the one being handled already ends the run
        raise
    snapshots = pipeline.cameras()
    if options.holds_budget:
        say_dropped(snapshots, record.config.get("queue_capacity"))
    failed = tuple(s.name for s in snapshots if s.state is CameraState.FAILED)
    status = "interrupted" if stats.interrupted else "complete"
    error: str | None = None
    if failed and len(failed) == len(cams):
        status = "failed"
        error = "every camera failed: " + "; ".join(_why(s) for s in snapshots)
    elif not stats.interrupted and not any(c.frames for c in stats.cameras):
        # nothing worked is not a success: say why each camera gave nothing (a live camera
        # that kept failing to open until --duration ended, a video with no frame)
        status = "failed"
        error = "no camera delivered a frame: " + "; ".join(_why(s) for s in snapshots)
    record = final_record(
        record,
        pipeline.describe(),
        snapshots,
        cams,
        readers,
        stats,
        status=status,
        error=error,
        tracking=tracking_record(tracker),
    )
    with interrupts_deferred():  # a Ctrl-C now takes effect once the files are whole
        run_dir.write_record(record)
        report = _report(run_dir, options)
    if options.metrics_port is not None:
        linger_metrics(options.metrics_linger_s)  # a Ctrl-C ends it, not the run
    return RunResult(
        run_dir=run_dir.path,
        record=record,
        stats=stats,
        cameras=cams,
        report=report,
        failed_cameras=failed,
        error=error,
    )


def _why(snap: CameraSnapshot) -> str:
    """One camera's reason for giving nothing: its last failure (HTTP 404, connection
    refused, ...), else its last state change, else its state."""
    last = snap.reader.changes[-1].detail if snap.reader.changes else ""
    return f"{snap.name}: {snap.reader.last_error or last or snap.state.value}"


def _import_report_writer() -> None:
    """Matplotlib's import (0.9 s on the 2-vCPU host) during the run, not after it: a Ctrl-C's
    outputs close that much sooner. A broken install is the writer's to say, not this."""
    with contextlib.suppress(Exception):
        importlib.import_module("drivepercept.report.html")


def _report(run_dir: RunDir, options: RunOptions) -> ReportResult | None:
    if not options.report_formats:
        return None
    started = time.monotonic()
    report = write_report(
        run_dir.path, formats=options.report_formats, budget_ms=options.report_budget_ms
    )
    log.info("report written in %.2f s", time.monotonic() - started)
    return report
