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
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torchvision

from drivepercept import __version__
from drivepercept.config import MAX_CAMERAS, CameraConfig, PipelineConfig, load_rig
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
    Sink,
)
from drivepercept.sources.readers import FrameReader, open_reader

log = logging.getLogger(__name__)

RUN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReplayOptions:
    """Everything `drivepercept replay` needs."""

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


@dataclass(frozen=True)
class ReplayResult:
    run_dir: Path
    stats: RunStats
    cameras: tuple[CameraConfig, ...]
    report: ReportResult | None = None

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
        "cameras": {
            c.name: {
                "frames": c.frames,
                "dropped": c.dropped,
                "fps": round(c.fps, 3),
                "frames_missing_from_source": c.short_by,
                "end_to_end_ms": {k: round(v, 3) for k, v in c.latency_ms.items()},
            }
            for c in stats.cameras
        },
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None


def _close_all(readers: Sequence[FrameReader], sinks: Sequence[Sink | LoadCsvSink]) -> None:
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


def run_replay(
    options: ReplayOptions,
    *,
    progress: Callable[[Pipeline], None] | None = None,
    detector: Detector | None = None,
) -> ReplayResult:
    """Replay the sources through the detector; see the module docstring for the outputs.

    Everything that can fail on bad input (sources, device, model, weights) is checked before
    the run folder is made, so a failed start leaves no half-made run behind.
    """
    cams = resolve_cameras(options.sources)
    resolve_device(options.pipeline.device)
    readers = open_readers(cams)  # bad sources fail before the (slower) model load
    sinks: list[Sink] = []
    load_sinks: list[LoadCsvSink] = []
    try:
        det = detector or load_detector(options.model, weights=options.weights)
        run_dir = make_run_dir(options.out_root, options.name)
        sinks += [
            DetectionsJsonlSink(run_dir / "detections.jsonl"),
            FrameTimingCsvSink(run_dir / "frames.csv"),
        ]
        if options.pipeline.sample_hz > 0:
            load_sinks.append(LoadCsvSink(run_dir / LOAD_CSV))
        if options.save_video:
            fps = {c.name: r.info.fps for c, r in zip(cams, readers, strict=True)}
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
            keep_original=options.save_video,
            load_sinks=load_sinks,
        )
    except BaseException:
        _close_all(readers, [*sinks, *load_sinks])
        raise
    sources = [
        {
            "camera": c.name,
            "source": str(c.video),
            "width": r.info.width,
            "height": r.info.height,
            "fps": r.info.fps,
            "frame_count": r.info.frame_count,
        }
        for c, r in zip(cams, readers, strict=True)
    ]
    record: dict[str, Any] = {
        "schema_version": RUN_SCHEMA_VERSION,
        "command": "replay",
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
        "sources": sources,
        "environment": environment(str(pipeline.device)),
        "telemetry": pipeline.sampler.info.as_dict() if pipeline.sampler is not None else None,
        "status": "running",
    }
    try:
        _write_json(run_dir / "run.json", record)
        stats = pipeline.run(progress=progress)
    except BaseException as exc:
        pipeline.close()
        record["status"] = "failed"
        record["error"] = one_line(f"{type(exc).__name__}: {exc}")
        record["summary"] = stats_summary(pipeline.stats())
        _final_record(run_dir, record, pipeline)
        try:
            _report(run_dir, options)
        except Exception as report_exc:  # the run's own error is the one to report
            log.error("the report of the failed run could not be written: %s", report_exc)
        raise
    record["status"] = "interrupted" if stats.interrupted else "complete"
    record["summary"] = stats_summary(stats)
    _final_record(run_dir, record, pipeline)
    report = _report(run_dir, options)
    return ReplayResult(run_dir=run_dir, stats=stats, cameras=cams, report=report)


def _final_record(run_dir: Path, record: dict[str, Any], pipeline: Pipeline) -> None:
    if pipeline.sampler is not None:
        # metrics found unsupported during the run are known only now
        record["telemetry"] = pipeline.sampler.info.as_dict()
        record["telemetry"]["samples"] = pipeline.sampler.samples_taken
    _write_json(run_dir / "run.json", record)
