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


def schedule_summary(schedule: dict[str, Any] | None) -> dict[str, Any] | None:
    """run.json's schedule as the summary keeps it: settings and per camera figures, and
    per second the share of each camera's frames that were detected."""
    if not schedule:
        return None
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
