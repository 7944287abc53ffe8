"""The replay job: recorded cameras -> pipeline -> a run directory.

`runs/<name>/` receives `detections.jsonl` (one line per camera frame), `frames.csv` (stage
timestamps per frame), `load.csv` (GPU / CPU / memory samples), `run.json` (config, versions,
device, sources, telemetry and summary), the latency report (`summary.json`, `latency.csv`,
`report.html`, `trace.json`; see `drivepercept.report`) and, with `save_video`, annotated
videos per camera or one mosaic. The report is written however the run ends: complete,
interrupted or failed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import platform
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torchvision

from drivepercept import __version__
from drivepercept.config import (
    MAX_CAMERAS,
    CameraConfig,
    PipelineConfig,
    ReconnectPolicy,
    load_rig,
)
from drivepercept.engine.device import resolve_device
from drivepercept.errors import ConfigError, OutputError, one_line
from drivepercept.models import load_detector
from drivepercept.models.base import Detector
from drivepercept.pipeline import CameraStats, Pipeline, RunStats
from drivepercept.report import ALL_FORMATS, DEFAULT_BUDGET_MS, ReportResult, write_report
from drivepercept.sinks import (
    LOAD_CSV,
    AnnotatedVideoSink,
    DetectionsJsonlSink,
    FrameTimingCsvSink,
    LoadCsvSink,
    LoadSink,
    Sink,
)
from drivepercept.sinks.display import DisplaySink
from drivepercept.sinks.metrics import CameraSnapshot, MetricsExporter
from drivepercept.sources.live import LiveSource
from drivepercept.sources.readers import FrameReader, open_reader

log = logging.getLogger(__name__)

RUN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReplayOptions:
    """Everything `drivepercept replay` and `drivepercept live` need.

    mode: "replay" (files, every frame, the block policy), "realtime" (files paced at their
    frame rate, as if live) or "live" (devices and streams, from `cameras`).
    """

    sources: tuple[str, ...]
    model: str
    weights: str | None
    pipeline: PipelineConfig
    out_root: Path = Path("runs")
    name: str | None = None
    save_video: bool = False
    mosaic: bool = False
    report_formats: tuple[str, ...] = ALL_FORMATS  # () = no report
    budget_ms: float = DEFAULT_BUDGET_MS
    mode: str = "replay"
    cameras: tuple[CameraConfig, ...] = ()  # live mode: cameras with a source each
    duration_s: float | None = None
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    metrics_port: int | None = None
    metrics_linger_s: float = 0.0  # keep /metrics up this long after the run
    show: bool = False  # a live window (the CLI checks that there is a display)

    def __post_init__(self) -> None:
        if self.mode not in ("replay", "realtime", "live"):
            raise ConfigError(f"mode must be replay, realtime or live, got {self.mode!r}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"duration must be > 0 s, got {self.duration_s:g}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be 0..65535, got {self.metrics_port}")


@dataclass(frozen=True)
class ReplayResult:
    run_dir: Path
    stats: RunStats
    cameras: tuple[CameraConfig, ...]
    report: ReportResult | None = None
    failed_cameras: tuple[str, ...] = ()  # live cameras that gave up reconnecting
    error: str | None = None  # why the run counts as failed (every camera failed)

    @property
    def short_cameras(self) -> list[CameraStats]:
        """Cameras whose video ended before the frame count its container announced."""
        return [c for c in self.stats.cameras if c.short_by]


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", text).strip("_-") or "camera"
    return name[:64]


def resolve_cameras(sources: Sequence[str]) -> tuple[CameraConfig, ...]:
    """Rig files, video files and image folders -> cameras, in the order given."""
    if not sources:
        raise ConfigError("give at least one source: a rig.toml, a video file or an image folder")
    cams: list[CameraConfig] = []
    for source in sources:
        path = Path(source)
        if path.suffix.lower() == ".toml":
            for cam in load_rig(path).cameras:
                if cam.video is None:
                    raise ConfigError(f"camera {cam.name!r} in {path} has no video")
                cams.append(cam)
        else:
            cams.append(
                CameraConfig(name=_safe_name(path.stem if path.suffix else path.name), video=path)
            )
    seen: dict[str, int] = {}
    unique = []
    for cam in cams:
        n = seen.get(cam.name, 0)
        seen[cam.name] = n + 1
        unique.append(cam if n == 0 else dataclasses.replace(cam, name=f"{cam.name}_{n + 1}"))
    if len(unique) > MAX_CAMERAS:
        raise ConfigError(f"at most {MAX_CAMERAS} cameras, got {len(unique)}")
    return tuple(unique)


def resolve_live_cameras(items: Sequence[str]) -> tuple[CameraConfig, ...]:
    """Live cameras from NAME=SOURCE items (SOURCE: device index, /dev/videoN or URL), bare
    sources (named cam1, cam2, ...) and rig files (each camera's `source`, else its `video`).
    """
    if not items:
        raise ConfigError("give at least one camera: --camera NAME=SOURCE or a rig.toml")
    cams: list[CameraConfig] = []
    for item in items:
        if item.lower().endswith(".toml") and "://" not in item:
            for cam in load_rig(item).cameras:
                if cam.source is None and cam.video is None:
                    raise ConfigError(f"camera {cam.name!r} in {item} has no source or video")
                cams.append(cam)
            continue
        name, sep, source = item.partition("=")
        if not sep or "://" in name or "/" in name:
            name, source = f"cam{len(cams) + 1}", item
        if not source:
            raise ConfigError(f"camera {item!r}: expected NAME=SOURCE, the source is empty")
        cams.append(CameraConfig(name=name, source=source))
    names = [c.name for c in cams]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"camera names must be unique, got {dupes} more than once")
    if len(cams) > MAX_CAMERAS:
        raise ConfigError(f"at most {MAX_CAMERAS} cameras, got {len(cams)}")
    return tuple(cams)


def open_readers(cams: Sequence[CameraConfig]) -> list[FrameReader]:
    """Open every camera's source on this thread (clear errors before any thread starts)."""
    readers: list[FrameReader] = []
    try:
        for cam in cams:
            assert cam.video is not None
            readers.append(open_reader(cam.video))
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers


def make_run_dir(root: Path, name: str | None) -> Path:
    """A new folder under root: `name`, or replay-<date>-<time>, made unique with -2, -3..."""
    base = name or time.strftime("replay-%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", base):
        raise ConfigError(f"run name may use letters, digits, '.', '_', '-', got {base!r}")
    for i in range(1, 1000):
        run_dir = root / (base if i == 1 else f"{base}-{i}")
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_dir
        except FileExistsError:
            continue
        except OSError as exc:
            raise OutputError(f"cannot create run folder {run_dir}: {exc.strerror}") from None
    raise OutputError(f"too many runs named {base!r} in {root}")


def environment(device: str) -> dict[str, Any]:
    """Versions and device names for run.json."""
    env: dict[str, Any] = {
        "drivepercept": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "opencv": cv2.__version__,
        "numpy": np.__version__,
        "device": device,
        "cpu_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(index)
    return env


def stats_summary(stats: RunStats) -> dict[str, Any]:
    return {
        "frames": stats.frames,
        "elapsed_s": round(stats.elapsed_s, 4),
        "throughput_fps": round(stats.throughput_fps, 3),
        "batches": stats.batches,
        "partial_batches": stats.partial_batches,
        "mean_batch_size": round(stats.mean_batch_size, 3),
        "interrupted": stats.interrupted,
        "threads_not_stopped": list(stats.threads_not_stopped),
        "warmup": [{"batch_size": w.batch_size, "ms": round(w.ms, 3)} for w in stats.warmup],
        "in_flight_high_water": stats.in_flight_high_water,
        "cameras": {
            c.name: {
                "frames": c.frames,
                "dropped": c.dropped,
                "fps": round(c.fps, 3),
                "frames_missing_from_source": c.short_by,
                "discarded_at_stop": c.discarded,
                "end_to_end_ms": {
                    k: None if math.isnan(v) else round(v, 3) for k, v in c.latency_ms.items()
                },
            }
            for c in stats.cameras
        },
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None


def camera_source(cam: CameraConfig) -> str:
    """What a camera reads: its live source, else its video file."""
    if cam.source is not None:
        return cam.source
    if cam.video is None:
        raise ConfigError(f"camera {cam.name!r} has neither a source nor a video")
    return str(cam.video)


def _close_all(readers: Sequence[FrameReader], sinks: Sequence[Sink | LoadSink]) -> None:
    for r in readers:
        r.close()
    for sink in sinks:
        sink.close()


def _report(run_dir: Path, options: ReplayOptions) -> ReportResult | None:
    if not options.report_formats:
        return None
    started = time.monotonic()
    report = write_report(run_dir, formats=options.report_formats, budget_ms=options.budget_ms)
    log.info("report written in %.2f s", time.monotonic() - started)
    return report


def _open_sources(
    options: ReplayOptions, cams: Sequence[CameraConfig], capture_stop: threading.Event
) -> list[FrameReader]:
    """Replay: every camera opened now. Real-time and live: reconnecting LiveSources (a file
    is opened now all the same, so a bad path fails before the run)."""
    if options.mode == "replay":
        return open_readers(cams)
    readers: list[FrameReader] = []
    try:
        for cam in cams:
            readers.append(
                LiveSource(
                    camera=cam.name,
                    source=camera_source(cam),
                    policy=options.reconnect,
                    stop=capture_stop,
                    realtime=options.mode != "replay",  # a file in a live rig plays live
                )
            )
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers


def _stop_capture(pipeline_ref: list[Pipeline]) -> None:
    if pipeline_ref:
        pipeline_ref[0].stop_capture()


def _camera_snapshots(pipeline: Pipeline) -> dict[str, CameraSnapshot]:
    view = pipeline.live_view()
    dropped = pipeline.queues.dropped()
    out = {}
    for i, d in enumerate(pipeline.decoders):
        reader = d.reader
        if isinstance(reader, LiveSource):
            state = reader.state.value
        else:
            state = "streaming" if d.thread.is_alive() else "ended"
        out[d.camera] = CameraSnapshot(dropped=dropped[i], fps=view.fps[i], state=state)
    return out


def live_record(pipeline: Pipeline) -> dict[str, Any] | None:
    """Per live camera (run.json): final state, connects, down time, outages, the frames lost
    in them (estimated from the camera's own arrival rate while it streamed) and every state
    change. None for a replay of files."""
    now = time.monotonic_ns()
    out = {}
    for d in pipeline.decoders:
        r = d.reader
        if not isinstance(r, LiveSource):
            return None
        changes = r.changes()
        down, outage, streamed = r.totals_s(now)
        rate = d.frames_read / streamed if streamed > 0 else 0.0
        out[d.camera] = {
            "source": r.source,
            "state": r.state.value,
            "connects": r.connects,
            "failed_attempts": r.failed_attempts,
            "downtime_s": round(down, 3),
            "outage_s": round(outage, 3),
            "frames_received": d.frames_read,
            "arrival_fps": round(rate, 3),
            "frames_lost_estimate": round(outage * rate),
            "changes": [
                {"t_ns": c.t_ns, "state": c.state.value, "detail": c.detail} for c in changes
            ],
        }
    return out


def run_replay(
    options: ReplayOptions,
    *,
    progress: Callable[[Pipeline], None] | None = None,
    detector: Detector | None = None,
) -> ReplayResult:
    """Run the sources through the detector; see the module docstring for the outputs.

    Everything that can fail on bad input (sources, device, model, weights, metrics port) is
    checked before the run folder is made, so a failed start leaves no half-made run behind.
    """
    cams = resolve_cameras(options.sources) if options.mode != "live" else options.cameras
    if not cams:
        raise ConfigError("give at least one camera")
    resolve_device(options.pipeline.device)
    capture_stop = threading.Event()
    readers = _open_sources(options, cams, capture_stop)  # before the (slower) model load
    sinks: list[Sink] = []
    load_sinks: list[LoadSink] = []
    exporter: MetricsExporter | None = None
    try:
        det = detector or load_detector(options.model, weights=options.weights)
        pipeline_ref: list[Pipeline] = []
        if options.metrics_port is not None:
            exporter = MetricsExporter(
                port=options.metrics_port,
                cameras=[c.name for c in cams],
                poll=lambda: _camera_snapshots(pipeline_ref[0]) if pipeline_ref else {},
            )
        run_dir = make_run_dir(options.out_root, options.name)
        sinks += [
            DetectionsJsonlSink(run_dir / "detections.jsonl"),
            FrameTimingCsvSink(run_dir / "frames.csv"),
        ]
        if options.pipeline.sample_hz > 0:
            load_sinks.append(LoadCsvSink(run_dir / LOAD_CSV))
        if exporter is not None:
            sinks.append(exporter.frames_sink)
            load_sinks.append(exporter.load_sink)
        if options.show:
            sinks.append(
                DisplaySink([c.name for c in cams], on_quit=lambda: _stop_capture(pipeline_ref))
            )
        if options.save_video:
            fps = {c.name: r.info.fps or 15.0 for c, r in zip(cams, readers, strict=True)}
            sinks.append(
                AnnotatedVideoSink(
                    run_dir / "video", fps=fps, mosaic=options.mosaic, cameras=len(cams)
                )
            )
        pipeline = Pipeline(
            cameras=[(c.name, r) for c, r in zip(cams, readers, strict=True)],
            detector=det,
            config=options.pipeline,
            sinks=sinks,
            keep_original=options.save_video or options.show,
            load_sinks=load_sinks,
            capture_stop=capture_stop,
        )
        pipeline_ref.append(pipeline)
    except BaseException:
        _close_all(readers, [*sinks, *load_sinks])
        if exporter is not None:
            exporter.close()
        raise
    record: dict[str, Any] = {
        "schema_version": RUN_SCHEMA_VERSION,
        "command": "live" if options.mode == "live" else "replay",
        "mode": options.mode,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {
            "name": det.name,
            "weights": options.weights,
            "input_size": list(det.input.size),
            "classes_kept": sorted(det.class_names[i] for i in det.keep_labels)
            if det.keep_labels is not None
            else None,
        },
        "config": dataclasses.asdict(options.pipeline),
        "sources": _sources_record(cams, readers),
        "environment": environment(str(pipeline.device)),
        "telemetry": pipeline.sampler.info.as_dict() if pipeline.sampler is not None else None,
        "status": "running",
    }
    if options.mode != "replay":
        record["reconnect"] = dataclasses.asdict(options.reconnect)
        record["duration_s"] = options.duration_s
    try:
        try:
            _write_json(run_dir / "run.json", record)
            stats = pipeline.run(progress=progress, duration_s=options.duration_s)
        except BaseException as exc:
            pipeline.close()
            record["status"] = "failed"
            record["error"] = one_line(f"{type(exc).__name__}: {exc}")
            record["summary"] = stats_summary(pipeline.stats())
            _final_record(run_dir, record, pipeline, cams, readers)
            try:
                _report(run_dir, options)
            except Exception as report_exc:  # the run's own error is the one to report
                log.error("the report of the failed run could not be written: %s", report_exc)
            raise
        live = live_record(pipeline)
        failed = [n for n, rec in (live or {}).items() if rec["state"] == "failed"]
        record["status"] = "interrupted" if stats.interrupted else "complete"
        if failed and len(failed) == len(cams):
            record["status"] = "failed"
            record["error"] = "every camera failed: " + "; ".join(
                f"{n}: {live[n]['changes'][-1]['detail']}" for n in failed if live
            )
        record["summary"] = stats_summary(stats)
        _final_record(run_dir, record, pipeline, cams, readers)
        report = _report(run_dir, options)
        if exporter is not None and options.metrics_linger_s > 0:
            log.info("keeping %s up for %.1f s", exporter.url, options.metrics_linger_s)
            time.sleep(options.metrics_linger_s)
    finally:
        if exporter is not None:
            exporter.close()
    return ReplayResult(
        run_dir=run_dir,
        stats=stats,
        cameras=cams,
        report=report,
        failed_cameras=tuple(failed),
        error=record.get("error"),
    )


def _sources_record(
    cams: Sequence[CameraConfig], readers: Sequence[FrameReader]
) -> list[dict[str, Any]]:
    return [
        {
            "camera": c.name,
            "source": camera_source(c),
            "width": r.info.width,
            "height": r.info.height,
            "fps": r.info.fps,
            "frame_count": r.info.frame_count,
        }
        for c, r in zip(cams, readers, strict=True)
    ]


def _final_record(
    run_dir: Path,
    record: dict[str, Any],
    pipeline: Pipeline,
    cams: Sequence[CameraConfig],
    readers: Sequence[FrameReader],
) -> None:
    if pipeline.sampler is not None:
        # metrics found unsupported during the run are known only now
        record["telemetry"] = pipeline.sampler.info.as_dict()
        record["telemetry"]["samples"] = pipeline.sampler.samples_taken
    record["sources"] = _sources_record(cams, readers)  # live sizes are known once connected
    live = live_record(pipeline)
    if live is not None:
        record["live"] = live
    _write_json(run_dir / "run.json", record)
