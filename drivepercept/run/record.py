"""The run's record (run.json): built from the options, the pipeline and how the run ended.

Sections (each a JSON object; `drivepercept.rundir.RunRecord` fixes the top level):

- model: name, weights, input_size, classes_kept, runtime_choice {asked, ran, reason, onnx,
  export_s} (which runtime ran the network and why: `models/runtime.py`; asked is null for a
  detector the caller built); at the end, runtime where the detector says what ran it beyond
  torch (ONNX: layout, batch policy, threads, providers per device, IO binding);
- config: the `PipelineConfig` the run used;
- sources: per camera: camera, source (credentials redacted), width, height, fps,
  frame_count (the container's estimate, -1 unknown);
- environment: versions, device, GPU name, CPU threads;
- telemetry: the load sampler's info (rate, GPUs, why GPU metrics are unavailable, samples);
- summary: frames, elapsed_s, throughput_fps, batches, partial_batches, mean_batch_size,
  interrupted, threads_not_stopped, warmup [{batch_size, ms}], in_flight_high_water,
  failed_batches, failed_frames, batch_error (batches the model raised on) and per
  camera frames, dropped, fps, frames_missing_from_source, discarded_at_stop, frames_read,
  frames_decoded, frames_prepared (live decodes and prepares only the frames it uses, where
  the source allows), end_to_end_ms
  {p50, p95, p99, max}; source_spread_ms {p50, p99, max}: how far apart in their own times
  (stamp or pts) the frames of one batch were, which a rig step takes as one instant
  (null without frame times);
- live (live and real-time runs): per camera source, state, connects, failed_attempts,
  last_error,
  downtime_s, outage_s, frames_received, arrival_fps, frames_lost_estimate (outage x the
  camera's own arrival rate), changes [{t_ns, state, detail}];
- sinks: per output: slow, on_failure, frames_written, frames_dropped, queue_high_water,
  failed (one line or null).
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
import torch
import torchvision

from drivepercept import __version__
from drivepercept._threads import wait_policy
from drivepercept.models.base import Detector, RuntimeChoice
from drivepercept.rig import CameraConfig, camera_source
from drivepercept.run.options import Mode, RunOptions
from drivepercept.rundir import RunRecord, redact
from drivepercept.rundir.sections import (
    CameraSummaryRecord,
    CameraTracksRecord,
    LiveCameraRecord,
    ModelRecord,
    SinkRecord,
    SourceRecord,
    StateChangeRecord,
    SummaryRecord,
    TelemetryRecord,
    TrackingRecord,
    WarmupRecord,
)
from drivepercept.sources.readers import FrameReader
from drivepercept.telemetry.counters import RunStats
from drivepercept.types import CameraSnapshot, Pacing, PipelineDescription

if TYPE_CHECKING:
    from drivepercept.tracking.stage import RigTracker


def environment(
    device: str, *, threads: int | None = None, lanes: int = 1, packing: str = ""
) -> dict[str, Any]:
    """Versions and device names; the model's torch threads in all (torch's count now when
    not given), the CPU lanes they are shared among (`engine/lanes.py`) and what was done
    to its convolutions (`engine/prepack.py`)."""
    env: dict[str, Any] = {
        "drivepercept": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "opencv": cv2.__version__,
        "numpy": np.__version__,
        "device": device,
        "cpu_threads": torch.get_num_threads() if threads is None else threads,
        "cpu_lanes": lanes,
        "cpu_prepack": packing,
        "omp_wait_policy": wait_policy(),
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(index)
    return env


def _ms(values: dict[str, float]) -> dict[str, float | None]:
    return {k: None if math.isnan(v) else round(v, 3) for k, v in values.items()}


def stats_summary(stats: RunStats) -> SummaryRecord:
    """The pipeline's own account of the run (exact per-frame figures are in frames.csv)."""
    return SummaryRecord(
        frames=stats.frames,
        elapsed_s=round(stats.elapsed_s, 4),
        throughput_fps=round(stats.throughput_fps, 3),
        batches=stats.batches,
        partial_batches=stats.partial_batches,
        mean_batch_size=round(stats.mean_batch_size, 3),
        interrupted=stats.interrupted,
        threads_not_stopped=tuple(stats.threads_not_stopped),
        warmup=tuple(WarmupRecord(w.batch_size, round(w.ms, 3)) for w in stats.warmup),
        in_flight_high_water=stats.in_flight_high_water,
        failed_batches=stats.failed_batches,
        failed_frames=stats.failed_frames,
        batch_error=stats.batch_error,
        source_spread_ms=(
            None
            if stats.source_spread_ms is None
            else {k: round(v, 3) for k, v in stats.source_spread_ms.items()}
        ),
        cameras={
            c.name: CameraSummaryRecord(
                frames=c.frames,
                dropped=c.dropped,
                fps=round(c.fps, 3),
                frames_missing_from_source=c.short_by,
                frames_undecodable=c.undecodable,
                discarded_at_stop=c.discarded,
                frames_read=c.read,
                frames_decoded=c.decoded,
                frames_prepared=c.prepared,
                end_to_end_ms=_ms(c.latency_ms),
                frames_predicted=c.predicted,
            )
            for c in stats.cameras
        },
    )


def sources_record(
    cams: Sequence[CameraConfig], readers: Sequence[FrameReader], *, live: bool
) -> tuple[SourceRecord, ...]:
    return tuple(
        SourceRecord(
            camera=c.name,
            source=redact(camera_source(c, live=live)),
            width=r.info.width,
            height=r.info.height,
            fps=r.info.fps,
            frame_count=r.info.frame_count,
            topic=c.topic,
        )
        for c, r in zip(cams, readers, strict=True)
    )


def live_record(
    snapshots: Sequence[CameraSnapshot], cams: Sequence[CameraConfig], *, live: bool
) -> dict[str, LiveCameraRecord] | None:
    """Per live camera: final state, connects, down time, outages, the frames lost in them
    (estimated from the camera's own arrival rate while it streamed) and every state change.
    None when no camera is live (a replay of files)."""
    if not any(s.reader.live or s.reader.changes for s in snapshots):
        return None
    out = {}
    for cam, snap in zip(cams, snapshots, strict=True):
        r = snap.reader
        rate = snap.read / r.streaming_s if r.streaming_s > 0 else 0.0
        out[snap.name] = LiveCameraRecord(
            source=redact(camera_source(cam, live=live)),
            state=snap.state.value,
            connects=r.connects,
            failed_attempts=r.failed_attempts,
            last_error=redact(r.last_error),
            downtime_s=round(r.downtime_s, 3),
            outage_s=round(r.outage_s, 3),
            frames_received=snap.read,
            arrival_fps=round(rate, 3),
            frames_lost_estimate=round(r.outage_s * rate),
            changes=tuple(
                StateChangeRecord(c.t_ns, c.state.value, redact(c.detail)) for c in r.changes
            ),
        )
    return out


def runtime_choice(detector: Detector) -> dict[str, Any]:
    """Which runtime ran the network, asked for what, and why."""
    if detector.runtime_choice is not None:
        return detector.runtime_choice.as_dict()
    ran = "torch" if detector.runtime is None else str(detector.runtime().get("backend"))
    return RuntimeChoice(None, ran, "detector built by the caller").as_dict()


def first_record(
    options: RunOptions,
    detector: Detector,
    described: PipelineDescription,
    cams: Sequence[CameraConfig],
    readers: Sequence[FrameReader],
) -> RunRecord:
    """The record written before the run starts (status "running")."""
    reported, _ = detector.output_classes()
    pacing = options.mode.pacing
    return RunRecord(
        command=options.run_command,
        mode=options.mode.value,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        model=ModelRecord(
            name=detector.name,
            weights=options.weights,
            input_size=detector.input.size,
            classes_kept=tuple(reported) if detector.keep_labels is not None else None,
            runtime_choice=runtime_choice(detector),
        ),
        config=described.config,
        sources=sources_record(cams, readers, live=pacing is Pacing.LIVE),
        environment=environment(
            described.device,
            threads=described.threads,
            lanes=described.lanes,
            packing=described.packing,
        ),
        telemetry=_telemetry(described),
        reconnect=dataclasses.asdict(options.reconnect) if pacing.paced else None,
        duration_s=options.duration_s if pacing.paced else None,
    )


def final_record(
    record: RunRecord,
    described: PipelineDescription,
    snapshots: Sequence[CameraSnapshot],
    cams: Sequence[CameraConfig],
    readers: Sequence[FrameReader],
    stats: RunStats,
    **changes: Any,
) -> RunRecord:
    """The record once the run is over: what only then is known (the pipeline's description
    and its cameras' snapshots, taken after it stopped)."""
    live = Mode(record.mode).pacing is Pacing.LIVE
    model = record.model
    if described.runtime is not None:  # what ran the network (providers found on use)
        model = dataclasses.replace(model, runtime=described.runtime)
    return record.but(
        model=model,
        telemetry=_telemetry(described) or record.telemetry,
        sources=sources_record(cams, readers, live=live),  # live sizes: known once connected
        live=live_record(snapshots, cams, live=live),
        summary=stats_summary(stats),
        sinks={name: SinkRecord.from_json(s) for name, s in described.sinks.items()},
        schedule=described.schedule,
        **changes,
    )


def _telemetry(described: PipelineDescription) -> TelemetryRecord | None:
    """The sampler's findings (None without a sampler)."""
    found = described.telemetry
    return TelemetryRecord.from_json(found) if found is not None else None


def tracking_record(tracker: RigTracker | None) -> TrackingRecord | None:
    """What tracking did (`--track`): tracks per camera and their lifetimes, rig objects."""
    if tracker is None:
        return None
    summary = tracker.summary()
    return TrackingRecord(
        cameras={
            name: CameraTracksRecord(
                tracks=c.tracks,
                lifetime_median_s=c.lifetime_median_s,
                lifetime_max_s=c.lifetime_max_s,
                unconfirmed_died=c.unconfirmed_died,
            )
            for name, c in summary.cameras.items()
        },
        rig_objects=summary.rig_objects,
        placed=summary.placed,
        ms_per_frame=round(summary.ms_per_frame, 4) if summary.frames else None,
        cpu_ms_per_frame=round(summary.cpu_ms_per_frame, 4) if summary.frames else None,
    )
