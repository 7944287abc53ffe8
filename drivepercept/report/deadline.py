"""The deadline section of a report: how the run held its latency budget, second by second.

`per_second` (summary.json's `per_second`, every run): the frames answered in each second
of capture time, their p99 end-to-end latency and how many were over the budget, so that a
load that comes and goes shows where the budget was held and where not (and a run without
the scheduler, `--no-schedule`, can be set beside one with it). `schedule` (a run that held
its budget, run.json's `schedule`): the scheduler's decisions, per camera the frames
detected and predicted and the longest gap between detections, and per second the detected
share. The HTML report draws both (`html.deadline_section`, `plots.deadline_over_time`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from drivepercept.telemetry.timeline import Timeline

MAX_SECONDS = 3600  # seconds a summary lists (the first hour of a longer run)


def per_second(tl: Timeline, budget_ms: float) -> list[dict[str, Any]]:
    """Each second of capture time (from the run's first frame): frames, p99 end-to-end
    latency (ms) and frames over `budget_ms`; seconds without frames are left out."""
    if not len(tl):
        return []
    capture = tl.stamps["capture"].astype(np.int64)
    second = ((capture - capture.min()) // 1_000_000_000).astype(np.int64)
    e2e = np.asarray(tl.end_to_end_ms, np.float64)
    rows = []
    for s in np.unique(second)[:MAX_SECONDS].tolist():
        values = e2e[second == s]
        rows.append(
            {
                "t_s": int(s),
                "frames": int(values.size),
                "p99_ms": round(float(np.percentile(values, 99)), 3),
                "over_budget": int((values > budget_ms).sum()),
            }
        )
    return rows


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sound(schedule: object) -> bool:
    """Whether run.json's schedule has the shape the scheduler writes (a damaged or hand-made
    one is left out of the report, not a traceback)."""
    if not isinstance(schedule, dict):
        return False
    if not (_number(schedule.get("budget_ms")) and _number(schedule.get("max_gap_ms"))):
        return False
    cameras, timeline = schedule.get("cameras"), schedule.get("timeline") or []
    fields = ("priority", "detected", "predicted", "detected_share", "forced", "longest_gap_ms")
    if not isinstance(cameras, dict) or not isinstance(timeline, list):
        return False
    if not all(
        isinstance(c, dict) and all(_number(c.get(f)) for f in fields) for c in cameras.values()
    ):
        return False
    return all(
        isinstance(e, dict)
        and _number(e.get("t_s"))
        and all(
            isinstance(e.get(k), list) and all(map(_number, e[k]))
            for k in ("detected", "predicted")
        )
        and len(e["detected"]) == len(e["predicted"]) == len(cameras)
        for e in timeline
    )


def schedule_summary(schedule: dict[str, Any] | None) -> dict[str, Any] | None:
    """run.json's schedule as the summary keeps it: settings and per camera figures, and
    per second the share of each camera's frames that were detected; None without one, or
    for one that is damaged (`_sound`)."""
    if not _sound(schedule):
        return None
    assert schedule is not None
    shares = []
    for entry in schedule.get("timeline") or []:
        det, pred = entry.get("detected") or [], entry.get("predicted") or []
        total = [d + p for d, p in zip(det, pred, strict=False)]
        shares.append(
            {
                "t_s": entry.get("t_s"),
                "detected_share": [
                    round(d / t, 4) if t else None for d, t in zip(det, total, strict=True)
                ],
            }
        )
    keep = ("budget_ms", "max_gap_ms", "cameras")
    return {**{k: schedule.get(k) for k in keep}, "per_second": shares}
