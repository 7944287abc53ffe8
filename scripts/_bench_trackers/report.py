"""Each tracker's output scored (the project's `score_tracking`, and the identity measures),
and the markdown tables and JSON of a run's scores."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _bench_trackers.inputs import Drive, Run, camera_frames
from _bench_trackers.measures import LONG_GAP_S, IdMeasures, measure, pooled
from _bench_trackers.runs import Tracked
from drivepercept.eval.report import TrackingScores
from drivepercept.eval.tracking import score_tracking


@dataclass(frozen=True)
class Row:
    """One tracker's figures on one run."""

    tracked: Tracked
    scores: TrackingScores
    measures: dict[str, IdMeasures]  # per camera
    pooled: IdMeasures

    @property
    def consistent(self) -> bool:
        """Whether the measures' switches are the scorer's (they use CLEAR's matching)."""
        return self.scores.cameras.id_switches == self.pooled.switches


def score(
    tracked: Tracked, drive: Drive, run: Run, *, short_gap_s: float, high_score: float
) -> Row:
    """`tracked` scored as `drivepercept eval --track` scores a run, and measured."""
    scores = score_tracking(
        drive.coco,
        tracked.lines,
        tracked.objects,
        mounts=drive.mounts,
        thresholds=run.thresholds,
        images=drive.images,
    )
    measures = {
        cam: measure(frames, born=born, short_gap_s=short_gap_s, high_score=high_score)
        for cam, (frames, born) in camera_frames(drive, tracked.lines, run.thresholds).items()
    }
    return Row(tracked, scores, measures, pooled(measures.values()))


def _f(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def main_table(rows: Sequence[Row]) -> list[str]:
    """The run's table: a row per tracker, its cameras pooled."""
    m0 = rows[0].pooled if rows else None
    short = f"{m0.short_gap_s:g}" if m0 else "1"
    high = f"{m0.high_score:g}" if m0 else "0.5"
    head = (
        "| tracker | HOTA | IDF1 | MOTA | IDsw | restarts | restarts gap <= "
        f"{short} s | taken over | ids per object | never-id objects (any box / box >= "
        f"{high}) | ms per frame (p50) |"
    )
    out = [head, "|" + "---|" * 11]
    for r in rows:
        c, m = r.scores.cameras, r.pooled
        ms = r.tracked.frame_ms
        timing = "not timed here" if ms is None else f"{ms:.2f} ({r.tracked.frame_p50_ms:.2f})"
        out.append(
            f"| {r.tracked.name} | {_f(c.hota)} | {_f(c.idf1)} | {_f(c.mota)} | "
            f"{c.id_switches} | {m.restarts} | {m.restarts_short} | {m.taken_over} | "
            f"{_f(m.ids_per_object, 2)} ({m.ids_matched}/{m.objects_matched}) | "
            f"{m.never_id} / {m.never_id_high} | {timing} |"
        )
    return out


def camera_table(rows: Sequence[Row]) -> list[str]:
    """HOTA / IDF1 / ID switches of each camera, a row per tracker."""
    cams = sorted({cam for r in rows for cam in r.scores.per_camera})
    out = [
        "| tracker | " + " | ".join(f"{cam} HOTA / IDF1 / IDsw" for cam in cams) + " |",
        "|" + "---|" * (len(cams) + 1),
    ]
    for r in rows:
        cells = []
        for cam in cams:
            m = r.scores.per_camera.get(cam)
            cells.append("-" if m is None else f"{_f(m.hota)} / {_f(m.idf1)} / {m.id_switches}")
        out.append(f"| {r.tracked.name} | " + " | ".join(cells) + " |")
    return out


def settings_lines(rows: Sequence[Row]) -> list[str]:
    """What each tracker was given, and what to know about it."""
    out = []
    for r in rows:
        given = ", ".join(f"{k}={v}" for k, v in r.tracked.settings.items())
        out.append(f"- {r.tracked.name}: {given or 'as the run made it'}")
        out += [f"  - {note}" for note in r.tracked.notes]
        if not r.consistent:
            out.append(
                f"  - measures' switches ({r.pooled.switches}) differ from the scorer's "
                f"({r.scores.cameras.id_switches})"
            )
    return out


def rig_line(rows: Sequence[Row]) -> list[str]:
    """The rig's figures (global ids across cameras), for the trackers that make them."""
    out = []
    for r in rows:
        rig = r.scores.rig
        if rig is not None:
            s = r.scores.same_id
            out.append(
                f"- {r.tracked.name}: rig HOTA {_f(rig.hota)}, IDF1 {_f(rig.idf1)}, "
                f"same global id {_f(s.share)} ({s.same} of {s.pairs} pairs)"
            )
    return out


def extra_lines(rows: Sequence[Row]) -> list[str]:
    """Each tracker's ids beyond one per object, by what came before each."""
    out = []
    for r in rows:
        m = r.pooled
        e = m.extra
        out.append(
            f"- {r.tracked.name}: {e.total} ids beyond one per object: {e.after_short_gap} "
            f"after a gap <= {m.short_gap_s:g} s, {e.after_mid_gap} after up to "
            f"{LONG_GAP_S:g} s, {e.after_long_gap} after longer, {e.overlapping} while an "
            f"earlier id was still on it; {e.shared} of them also matched to another object"
        )
    return out


def row_json(r: Row) -> dict[str, Any]:
    return {
        "tracker": r.tracked.name,
        "settings": dict(r.tracked.settings),
        "notes": list(r.tracked.notes),
        "frame_ms": r.tracked.frame_ms,
        "frame_p50_ms": r.tracked.frame_p50_ms,
        "frames_timed": len(r.tracked.frame_ns),
        "scores": r.scores.to_json(),
        "measures": {
            "cameras": r.pooled.to_json(),
            "per_camera": {cam: m.to_json() for cam, m in r.measures.items()},
        },
        "switches_match_scorer": r.consistent,
    }
