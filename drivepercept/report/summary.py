"""summary.json and latency.csv: the run's numbers, computed from frames.csv and load.csv.

summary.json (schema "drivepercept.summary", version 1; every duration in ms, every rate in
frames/s, null where there is nothing to measure):

- run: name, status (complete / interrupted / failed / running / unknown), started, command,
  model, config, environment, sources, telemetry (sampler rate, GPUs, why GPU metrics are
  unavailable) -- copied from run.json;
- problems: what was wrong with the folder (killed run, corrupt lines), [] when nothing;
- outputs_failed: {output: its failure} for outputs set aside during the run (run.json's
  `sinks`), {} when none failed;
- budget_ms, window_s: the deadline and the throughput window used (the one asked for, or
  wider where the run's span would hold more than `telemetry.MAX_WINDOWS` of them);
- frames, span_s (first capture to last emission), throughput_fps (frames / span_s);
- end_to_end_ms: {count, mean_ms, p50_ms, p90_ms, p95_ms, p99_ms, max_ms}, capture to emission;
- deadline: {budget_ms, frames, misses, miss_rate} (a frame misses when strictly over budget);
- stages: {stage: latency stats} for the consecutive spans of `telemetry.STAGE_SPANS`, which
  add up to end_to_end_ms frame by frame;
- cameras: {name: {frames, throughput_fps, end_to_end_ms, deadline, stages, dropped (the
  pipeline's count, from run.json; null if unknown), frame_index_gaps (source frames missing
  between the ones processed), frames_missing_from_source, live (live and real-time runs:
  {source, state, connects, failed_attempts (opens that failed and connections that gave no
  frame), last_error (why the last attempt failed), downtime_s, changes: [{t_ns, state,
  detail}]}, else null)}};
- throughput: {window_s, start_s[], total_fps[], cameras: {name: fps[]}} per window of
  emission time;
- batches: {count, cameras, mean_size, full_share, size_counts, capture_spread_ms (latency
  stats of the latest minus earliest capture in each batch), source_spread_ms (the same of
  the frames' own times, stamp or pts: how far apart the instants of one batch are; null
  for a frames.csv without pts_s)};
- load: {samples, rate_hz, gpu_unavailable (reason or null), process_cpu_pct, system_cpu_pct,
  process_rss_mb, gpus: [{index, name, util_pct, mem_util_pct, mem_used_mb, power_w,
  temperature_c, sm_clock_mhz, throttle_reasons_seen}]}; each figure {mean, max};
- tracking: run.json's tracking figures (`--track`), else null;
- per_second: [{t_s, frames, p99_ms, over_budget}] per second of capture time (`deadline`);
- schedule: a run that held its budget: {budget_ms, max_gap_ms, cameras: {name: {priority,
  detected, predicted, detected_share, forced, overdue, longest_gap_ms}}, per_second: [{t_s,
  detected_share: [per camera]}]}, else null.

latency.csv: one row per (scope, stage): scope is "all" or a camera name, stage is
"end_to_end" or a span name; columns count, mean_ms, p50_ms, p90_ms, p95_ms, p99_ms, max_ms.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import numpy as np

from drivepercept.report.deadline import per_second, schedule_summary
from drivepercept.report.rundata import LoadTable, RunData
from drivepercept.rundir import RunDir, RunRecord
from drivepercept.rundir.sections import LiveCameraRecord, TelemetryRecord
from drivepercept.telemetry.sampler import throttle_names
from drivepercept.telemetry.stats import (
    LatencyStats,
    batch_fill,
    capture_spread_ms,
    deadline_misses,
    frame_index_gaps,
    latency_stats,
    rate_fps,
    source_spread_ms,
    window_width_s,
    windowed_rate,
)
from drivepercept.telemetry.timeline import STAGE_SPANS, Timeline

SUMMARY_SCHEMA = "drivepercept.summary"
SUMMARY_SCHEMA_VERSION = 1
DEFAULT_BUDGET_MS = 100.0
DEFAULT_WINDOW_S = 1.0

LATENCY_CSV_COLUMNS = (
    "scope",
    "stage",
    "count",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
)


def _num(value: float, digits: int = 3) -> float | None:
    return None if value is None or math.isnan(value) else round(float(value), digits)


def _stage_stats(timeline: Timeline) -> dict[str, LatencyStats]:
    return {span.name: latency_stats(timeline.span(span)) for span in STAGE_SPANS}


def _deadline(values_ms: Any, budget_ms: float) -> dict[str, Any]:
    d = deadline_misses(values_ms, budget_ms)
    return {
        "budget_ms": budget_ms,
        "frames": d.frames,
        "misses": d.misses,
        "miss_rate": round(d.rate, 6),
    }


def _camera_record(tl: Timeline, index: int, run: RunRecord, budget_ms: float) -> dict[str, Any]:
    cam = tl.camera(index)
    e2e = cam.end_to_end_ms
    recorded = run.summary.cameras.get(tl.cameras[index]) if run.summary else None
    return {
        "frames": len(cam),
        "throughput_fps": _num(rate_fps(len(cam), cam.origin_ns, cam.end_ns)),
        "end_to_end_ms": latency_stats(e2e).as_dict(),
        "deadline": _deadline(e2e, budget_ms),
        "stages": {k: v.as_dict() for k, v in _stage_stats(cam).items()},
        "dropped": recorded.dropped if recorded else None,
        "frame_index_gaps": frame_index_gaps(cam.frame_index),
        "frames_missing_from_source": recorded.frames_missing_from_source if recorded else None,
        "live": _live_camera((run.live or {}).get(tl.cameras[index]), run, tl.cameras[index]),
    }


def _live_camera(
    record: LiveCameraRecord | None, run: RunRecord, camera: str
) -> dict[str, Any] | None:
    """A live camera's final state, reconnects, outages and down time (from run.json)."""
    if record is None:
        return None
    fps = next((s.fps for s in run.sources if s.camera == camera), None)
    return {
        "source": record.source,
        "state": record.state,
        "connects": record.connects,
        "failed_attempts": record.failed_attempts,
        "last_error": record.last_error,
        "downtime_s": record.downtime_s,
        "outage_s": record.outage_s,
        "frames_received": record.frames_received,
        "frames_lost_estimate": record.frames_lost_estimate,
        "changes": [c.to_json() for c in record.changes],
        "fps_nominal": fps,
    }


def _mean_max(values: np.ndarray | None, digits: int = 2) -> dict[str, float | None]:
    if values is None:
        return {"mean": None, "max": None}
    v = values[~np.isnan(values)]
    if v.size == 0:
        return {"mean": None, "max": None}
    return {"mean": _num(float(v.mean()), digits), "max": _num(float(v.max()), digits)}


def load_summary(load: LoadTable | None, telemetry: TelemetryRecord | None) -> dict[str, Any]:
    """Mean and max of each load figure; GPU names from run.json's telemetry record."""
    gpus_info = telemetry.gpus if telemetry is not None else ()
    reason = telemetry.gpu_unavailable if telemetry is not None else None
    rate_hz = telemetry.rate_hz if telemetry is not None else None
    if load is None:
        reason = reason or f"no load samples (the sampler was off, or {RunDir.LOAD_CSV} is missing)"
        return {
            "samples": 0,
            "rate_hz": rate_hz,
            "gpu_unavailable": reason,
            "process_cpu_pct": _mean_max(None),
            "system_cpu_pct": _mean_max(None),
            "process_rss_mb": _mean_max(None),
            "gpus": [],
        }
    gpus = []
    for g in range(load.gpu_count):
        info = gpus_info[g] if g < len(gpus_info) else {}
        throttle = load.column(f"gpu{g}_throttle_reasons")
        seen = 0
        if throttle is not None:
            for value in throttle[~np.isnan(throttle)]:
                seen |= int(value)
        gpus.append(
            {
                "index": info.get("index", g),
                "name": info.get("name"),
                **{
                    f: _mean_max(load.column(f"gpu{g}_{f}"))
                    for f in (
                        "util_pct",
                        "mem_util_pct",
                        "mem_used_mb",
                        "power_w",
                        "temperature_c",
                        "sm_clock_mhz",
                    )
                },
                "throttle_reasons_seen": list(throttle_names(seen)),
            }
        )
    if not gpus and not reason:
        reason = f"{RunDir.LOAD_CSV} has no GPU columns"
    return {
        "samples": len(load),
        "rate_hz": rate_hz,
        "gpu_unavailable": reason,
        "process_cpu_pct": _mean_max(load.column("process_cpu_pct")),
        "system_cpu_pct": _mean_max(load.column("system_cpu_pct")),
        "process_rss_mb": _mean_max(load.column("process_rss_mb")),
        "gpus": gpus,
    }


def build_summary(
    data: RunData, *, budget_ms: float = DEFAULT_BUDGET_MS, window_s: float = DEFAULT_WINDOW_S
) -> dict[str, Any]:
    """The summary.json document of a run (see the module docstring)."""
    tl = data.timeline
    run = data.record
    e2e = tl.end_to_end_ms
    origin, end = tl.origin_ns, tl.end_ns
    window_s = window_width_s(max(end - origin, 0), window_s)  # wider on a long span
    total = windowed_rate(tl.stamps["emitted"], origin_ns=origin, end_ns=end, window_s=window_s)
    per_cam_windows = {
        name: windowed_rate(
            tl.stamps["emitted"][tl.camera_index == i],
            origin_ns=origin,
            end_ns=end,
            window_s=window_s,
        ).rate_per_s
        for i, name in enumerate(tl.cameras)
    }
    fill = batch_fill(tl.batch_index, tl.batch_size, cameras=len(tl.cameras))
    return {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "run": {
            "name": data.name,
            "status": data.status,
            "started": run.started or None,
            "command": run.command,
            "model": run.model.to_json() if run.model.name else None,
            "config": run.config or None,
            "environment": run.environment or None,
            "sources": [s.to_json() for s in run.sources] or None,
            "telemetry": run.telemetry.to_json() if run.telemetry else None,
        },
        "problems": list(data.problems),
        "outputs_failed": {
            name: out.failed for name, out in (run.sinks or {}).items() if out.failed
        },
        "budget_ms": budget_ms,
        "window_s": window_s,
        "frames": len(tl),
        "span_s": _num((end - origin) / 1e9, 6),
        "throughput_fps": _num(rate_fps(len(tl), origin, end)),
        "end_to_end_ms": latency_stats(e2e).as_dict(),
        "deadline": _deadline(e2e, budget_ms),
        "stages": {k: v.as_dict() for k, v in _stage_stats(tl).items()},
        "cameras": {
            name: _camera_record(tl, i, run, budget_ms) for i, name in enumerate(tl.cameras)
        },
        "throughput": {
            "window_s": window_s,
            "start_s": [round(float(s), 6) for s in total.start_s],
            "total_fps": [round(float(r), 3) for r in total.rate_per_s],
            "cameras": {k: [round(float(r), 3) for r in v] for k, v in per_cam_windows.items()},
        },
        "batches": {
            "count": fill.batches,
            "cameras": fill.cameras,
            "mean_size": _num(fill.mean_size),
            "full_share": _num(fill.full_share, 6),
            "size_counts": {str(k): v for k, v in fill.size_counts.items()},
            "capture_spread_ms": latency_stats(
                capture_spread_ms(tl.batch_index, tl.stamps["capture"])
            ).as_dict(),
            "source_spread_ms": (
                latency_stats(source_spread_ms(tl.batch_index, tl.source_s)).as_dict()
                if tl.source_s is not None
                else None
            ),
        },
        "load": load_summary(data.load, run.telemetry),
        "tracking": run.tracking.to_json() if run.tracking is not None else None,
        "per_second": per_second(tl, budget_ms),
        "schedule": schedule_summary(run.schedule),
    }


def latency_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """The rows of latency.csv (see the module docstring), from a summary document."""
    rows: list[list[Any]] = []

    def add(scope: str, stage: str, stats: dict[str, Any]) -> None:
        rows.append([scope, stage, *(stats[c] for c in LATENCY_CSV_COLUMNS[2:])])

    add("all", "end_to_end", summary["end_to_end_ms"])
    for stage, stats in summary["stages"].items():
        add("all", stage, stats)
    for name, cam in summary["cameras"].items():
        add(name, "end_to_end", cam["end_to_end_ms"])
        for stage, stats in cam["stages"].items():
            add(name, stage, stats)
    return rows


def latency_csv(summary: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(LATENCY_CSV_COLUMNS)
    for row in latency_rows(summary):
        writer.writerow(["" if v is None else v for v in row])
    return out.getvalue()
