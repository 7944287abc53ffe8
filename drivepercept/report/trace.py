"""trace.json: the run in Chrome's trace event format, for https://ui.perfetto.dev (or
chrome://tracing), so overlap between decoding, batching, upload and compute shows at a glance.

One process "pipeline" with one track per thread or stream, in data-flow order:
`decode-<camera>` (decode and preprocess spans per frame, and "blocked" where the camera's
queue was full), `batcher` (one span per batch: its oldest frame queued -> batch sent),
`engine copy stream` (upload per batch), `engine compute stream` (inference and
post-processing per batch), `engine-complete` (emission per batch). A second process "load"
holds counter tracks from load.csv (CPU, GPU utilization, GPU memory, power).
Times are microseconds from the run's first capture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivepercept.report.rundata import LoadTable, RunData
from drivepercept.telemetry.timeline import Timeline

PIPELINE_PID = 1
LOAD_PID = 2
TRACE_SCHEMA_VERSION = 1
MAX_FRAMES = 100_000  # about 50 MB of trace; Perfetto opens it


def _us(ns: int | np.integer[Any], origin_ns: int) -> float:
    return round((int(ns) - origin_ns) / 1e3, 3)


def _meta(pid: int, tid: int | None, kind: str, value: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": kind, "args": {}}
    if tid is not None:
        event["tid"] = tid
    key = "sort_index" if kind.endswith("sort_index") else "name"
    event["args"][key] = value
    return event


def _span(
    name: str, tid: int, start_ns: int, end_ns: int, origin_ns: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "pid": PIPELINE_PID,
        "tid": tid,
        "name": name,
        "ts": _us(start_ns, origin_ns),
        "dur": round(max(0, int(end_ns) - int(start_ns)) / 1e3, 3),
        "args": args,
    }


def track_names(cameras: tuple[str, ...]) -> list[str]:
    """Pipeline track names, by tid - 1."""
    return [
        *(f"decode-{c}" for c in cameras),
        "batcher",
        "engine copy stream",
        "engine compute stream",
        "engine-complete",
    ]


def _frame_events(tl: Timeline, origin: int) -> list[dict[str, Any]]:
    events = []
    s = tl.stamps
    for row in range(len(tl)):
        cam = int(tl.camera_index[row])
        tid = cam + 1
        args = {
            "camera": tl.cameras[cam],
            "frame": int(tl.frame_index[row]),
            "batch": int(tl.batch_index[row]),
        }
        events.append(_span("decode", tid, s["capture"][row], s["decoded"][row], origin, args))
        events.append(
            _span("preprocess", tid, s["decoded"][row], s["preprocessed"][row], origin, args)
        )
        if s["queued"][row] > s["preprocessed"][row]:
            events.append(
                _span("blocked", tid, s["preprocessed"][row], s["queued"][row], origin, args)
            )
    return events


def _batch_events(tl: Timeline, origin: int) -> list[dict[str, Any]]:
    n = len(tl.cameras)
    batcher, copy, compute, complete = n + 1, n + 2, n + 3, n + 4
    s = tl.stamps
    events = []
    batches, first, inverse = np.unique(tl.batch_index, return_index=True, return_inverse=True)
    oldest_queued = np.full(batches.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest_queued, inverse, s["queued"])
    # each batch's rows, grouped once (not a scan of every row per batch)
    by_batch = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
    for k, (batch, row) in enumerate(zip(batches, first, strict=True)):
        members = by_batch[k]
        args = {
            "batch": int(batch),
            "size": int(tl.batch_size[row]),
            "cameras": [tl.cameras[int(c)] for c in tl.camera_index[members]],
        }
        events += [
            _span(f"batch {batch}", batcher, oldest_queued[k], s["batched"][row], origin, args),
            _span("upload", copy, s["copy_start"][row], s["copy_done"][row], origin, args),
            _span(
                "inference",
                compute,
                s["compute_start"][row],
                s["inference_done"][row],
                origin,
                args,
            ),
            _span(
                "postprocess",
                compute,
                s["inference_done"][row],
                s["postprocessed"][row],
                origin,
                args,
            ),
            _span("emit", complete, s["postprocessed"][row], s["emitted"][row], origin, args),
        ]
    return events


def _counter_events(load: LoadTable, origin: int) -> list[dict[str, Any]]:
    series: list[tuple[str, str]] = [
        ("CPU %", "process_cpu_pct"),
        ("CPU %", "system_cpu_pct"),
        ("RSS MB", "process_rss_mb"),
    ]
    for g in range(load.gpu_count):
        series += [
            (f"GPU{g} util %", f"gpu{g}_util_pct"),
            (f"GPU{g} memory MB", f"gpu{g}_mem_used_mb"),
            (f"GPU{g} power W", f"gpu{g}_power_w"),
            (f"GPU{g} temperature C", f"gpu{g}_temperature_c"),
        ]
    events = []
    for i, t in enumerate(load.t_ns):
        if t < origin:
            continue
        by_name: dict[str, dict[str, float]] = {}
        for name, column in series:
            values = load.column(column)
            if values is not None and not np.isnan(values[i]):
                by_name.setdefault(name, {})[column] = round(float(values[i]), 3)
        for name, args in by_name.items():
            events.append(
                {"ph": "C", "pid": LOAD_PID, "name": name, "ts": _us(t, origin), "args": args}
            )
    return events


def build_trace(data: RunData, *, max_frames: int = MAX_FRAMES) -> dict[str, Any]:
    """The trace document (a JSON object with "traceEvents"): the last `max_frames` frames
    (a long live run would make a file no viewer opens; otherData says what was left out)."""
    tl = data.timeline
    left_out = max(0, len(tl) - max_frames)
    if left_out:
        cutoff = np.sort(tl.stamps["emitted"])[left_out]
        tl = tl.select(tl.stamps["emitted"] >= cutoff)
    origin = data.timeline.origin_ns
    events: list[dict[str, Any]] = [
        _meta(PIPELINE_PID, None, "process_name", f"pipeline {data.name}"),
        _meta(PIPELINE_PID, None, "process_sort_index", 0),
        _meta(LOAD_PID, None, "process_name", "load"),
        _meta(LOAD_PID, None, "process_sort_index", 1),
    ]
    for tid, name in enumerate(track_names(tl.cameras), start=1):
        events.append(_meta(PIPELINE_PID, tid, "thread_name", name))
        events.append(_meta(PIPELINE_PID, tid, "thread_sort_index", tid))
    events += _frame_events(tl, origin)
    events += _batch_events(tl, origin)
    if data.load is not None and len(tl):
        events += _counter_events(data.load, origin)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "drivepercept_trace_version": TRACE_SCHEMA_VERSION,
            "run": data.name,
            "origin_monotonic_ns": origin,
            "frames_left_out": left_out,
        },
    }
