"""bench_peer's figures: pure statistics over what each round measured, and the report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from _bench_peer.options import TOOLS

# ---------------------------------------------------------------------- statistics (pure)


def percentile_ms(values_ms: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default); NaN with no values."""
    if not values_ms:
        return math.nan
    return float(np.percentile(np.asarray(values_ms, dtype=np.float64), q))


@dataclass(frozen=True)
class RunFigures:
    """A drivepercept run's frames.csv as bench figures: frames, throughput after the first
    batch and the end-to-end latencies of the frames after it."""

    frames: int
    fps: float
    later_ms: tuple[float, ...]


def run_figures(rows: Sequence[dict[str, str]]) -> RunFigures:
    """frames.csv rows (any order) -> `RunFigures`; the first batch's frames are left out of
    the latencies and start the throughput clock, as for the peer."""
    rows = sorted(rows, key=lambda r: int(r["emitted_ns"]))
    first = min((int(r["batch_index"]) for r in rows), default=0)
    in_first = sum(1 for r in rows if int(r["batch_index"]) == first)
    later = tuple(float(r["end_to_end_ms"]) for r in rows if int(r["batch_index"]) != first)
    fps = throughput_fps([int(r["emitted_ns"]) for r in rows], in_first)
    return RunFigures(len(rows), fps, later)


def throughput_fps(emitted_ns: Sequence[int], first_batch: int) -> float:
    """Frames after the first batch over the time from the first batch's results to the last
    results (both tools emit a batch's results together); NaN when that span is empty.

    Args:
        emitted_ns: when each frame's results came out, in emission order.
        first_batch: how many of them belong to the first batch.
    """
    if len(emitted_ns) <= first_batch or first_batch < 1:
        return math.nan
    span_ns = emitted_ns[-1] - emitted_ns[first_batch - 1]
    return (len(emitted_ns) - first_batch) / (span_ns / 1e9) if span_ns > 0 else math.nan


@dataclass(frozen=True)
class RoundResult:
    """One tool's run in one mode and round."""

    tool: str
    mode: str
    round: int
    frames: int  # frames with results (all of them, first batch included)
    fps: float
    p50_ms: float = math.nan  # live only
    p99_ms: float = math.nan
    delivered: int = 0  # live: frames the server wrote to this tool's connections
    detections_per_frame: float = math.nan
    torch_threads: int = 0
    wall_s: float = 0.0  # the whole call: set-up, warm-up, run, shut-down
    note: str = ""


def best_and_median(values: Sequence[float], *, higher_is_better: bool) -> tuple[float, float]:
    """(best, median) of the finite values; NaN, NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    best = max(finite) if higher_is_better else min(finite)
    return best, float(statistics.median(finite))


def ratio(ours: float, peer: float) -> float:
    """ours / peer; NaN when either is not a positive finite number."""
    if not (math.isfinite(ours) and math.isfinite(peer) and peer > 0 and ours >= 0):
        return math.nan
    return ours / peer


METRICS = (("fps", True), ("p50_ms", False), ("p99_ms", False))


def summarise(rounds: Sequence[RoundResult]) -> dict[str, dict[str, Any]]:
    """Per mode: best and median of each metric per tool, and ours / peer of both (above 1 is
    better for ours in fps, worse in latency)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r.mode for r in rounds):
        entry: dict[str, Any] = {}
        for metric, higher in METRICS:
            if mode == "replay" and metric != "fps":
                continue
            per_tool = {
                tool: best_and_median(
                    [getattr(r, metric) for r in rounds if r.mode == mode and r.tool == tool],
                    higher_is_better=higher,
                )
                for tool in TOOLS
            }
            entry[metric] = {
                **{f"{tool}_best": v[0] for tool, v in per_tool.items()},
                **{f"{tool}_median": v[1] for tool, v in per_tool.items()},
                "ratio_best": ratio(per_tool["ours"][0], per_tool["peer"][0]),
                "ratio_median": ratio(per_tool["ours"][1], per_tool["peer"][1]),
            }
        out[mode] = entry
    return out


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def table(rounds: Sequence[RoundResult], summary: dict[str, dict[str, Any]]) -> list[str]:
    """The stdout report: every round, then best / median and the ratios."""
    head = (
        f"{'mode':<7}{'round':>6} {'tool':<5}{'frames':>8}{'fps':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'delivered':>10}{'det/frame':>10}{'threads':>8}{'wall s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rounds:
        lines.append(
            f"{r.mode:<7}{r.round:>6} {r.tool:<5}{r.frames:>8}{_fmt(r.fps):>8}"
            f"{_fmt(r.p50_ms):>9}{_fmt(r.p99_ms):>9}{r.delivered or '-':>10}"
            f"{_fmt(r.detections_per_frame, 2):>10}{r.torch_threads:>8}{_fmt(r.wall_s):>8}"
            + (f"  {r.note}" if r.note else "")
        )
    lines.append("")
    lines.append(
        f"{'mode':<7}{'metric':<8}{'peer best':>10}{'ours best':>10}{'ours/peer':>10}"
        f"{'peer med':>10}{'ours med':>10}{'ours/peer':>10}"
    )
    for mode, entry in summary.items():
        for metric, s in entry.items():
            lines.append(
                f"{mode:<7}{metric:<8}{_fmt(s['peer_best']):>10}{_fmt(s['ours_best']):>10}"
                f"{_fmt(s['ratio_best'], 2):>10}{_fmt(s['peer_median']):>10}"
                f"{_fmt(s['ours_median']):>10}{_fmt(s['ratio_median'], 2):>10}"
            )
    return lines


def count_agreement(peer: dict[tuple[int, int], int], ours: dict[tuple[int, int], int]) -> str:
    """How often both tools found the same number of boxes in the same frame."""
    shared = peer.keys() & ours.keys()
    if not shared:
        return "no frame in common with the peer's replay"
    same = sum(1 for k in shared if peer[k] == ours[k])
    within = sum(1 for k in shared if abs(peer[k] - ours[k]) <= 1)
    return (
        f"boxes per frame as the peer's: equal in {100 * same / len(shared):.0f} %, "
        f"within 1 in {100 * within / len(shared):.0f} % of {len(shared)} frames"
    )
