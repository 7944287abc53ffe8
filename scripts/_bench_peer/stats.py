"""bench_peer's figures: pure statistics over what each round measured, and the report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from _bench_peer.options import PEER_OWN, TOOLS

if TYPE_CHECKING:
    from drivepercept.telemetry.timeline import Timeline

# ---------------------------------------------------------------------- statistics (pure)


def percentile_ms(values_ms: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default); NaN with no values."""
    if not values_ms:
        return math.nan
    return float(np.percentile(np.asarray(values_ms, dtype=np.float64), q))


@dataclass(frozen=True)
class RunFigures:
    """A drivepercept run's frames as bench figures: frames, throughput after the first
    batch and the end-to-end latencies of the frames after it."""

    frames: int
    fps: float
    later_ms: tuple[float, ...]


def run_figures(
    batch_index: Sequence[int], emitted_ns: Sequence[int], end_to_end_ms: Sequence[float]
) -> RunFigures:
    """A run's frames (parallel columns, any order) -> `RunFigures`; the first batch's frames
    are left out of the latencies and start the throughput clock, as for the peer."""
    order = sorted(range(len(emitted_ns)), key=lambda i: int(emitted_ns[i]))
    first = min((int(b) for b in batch_index), default=0)
    in_first = sum(1 for b in batch_index if int(b) == first)
    later = tuple(float(end_to_end_ms[i]) for i in order if int(batch_index[i]) != first)
    fps = throughput_fps([int(emitted_ns[i]) for i in order], in_first)
    return RunFigures(len(order), fps, later)


def timeline_figures(timeline: Timeline) -> RunFigures:
    """`run_figures` of a run's timeline (the report's reading of its frames.csv)."""
    return run_figures(
        timeline.batch_index.tolist(),
        timeline.stamps["emitted"].tolist(),
        timeline.end_to_end_ms.tolist(),
    )


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
    """One tool's run in one mode, runtime and round.

    `tool` is "peer" or "ours" on the same threads, or "peer-own": the peer at its own
    default threads (`PEER_OWN`). `threads` is the intra-op threads of the runtime that ran
    the network (torch's, or ONNX Runtime's session; 0: ORT's default, one per physical
    core); torch runs the pre- and post-processing on the same count.
    """

    tool: str
    mode: str
    round: int
    frames: int  # frames with results (all of them, first batch included)
    fps: float
    p50_ms: float = math.nan  # live only
    p99_ms: float = math.nan
    delivered: int = 0  # live: frames the server wrote to this tool's connections
    detections_per_frame: float = math.nan
    threads: int = 0
    wall_s: float = 0.0  # the whole call: set-up, warm-up, run, shut-down
    note: str = ""
    runtime: str = "torch"
    steal_pct: float = math.nan  # the host's CPU time the hypervisor gave other tenants


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
PEER_OWN_LABEL = "peer's own default threads (not like for like)"


def threads_used(rounds: Sequence[RoundResult], tool: str) -> str:
    """The threads `tool` ran on in `rounds`: one count, "a,b" when they differed, "-" with
    no round, "ort" for ONNX Runtime's own default (0)."""
    counts = sorted({r.threads for r in rounds if r.tool == tool})
    return ",".join(str(c) if c else "ort" for c in counts) or "-"


def summarise(rounds: Sequence[RoundResult]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per mode and runtime: best and median of each metric per tool, ours / peer on the same
    threads (the headline) and, where the peer also ran at its own default threads, ours /
    that (above 1 is better for ours in fps, worse in latency); the threads each tool used."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for mode in dict.fromkeys(r.mode for r in rounds):
        out[mode] = {}
        for runtime in dict.fromkeys(r.runtime for r in rounds if r.mode == mode):
            these = [r for r in rounds if r.mode == mode and r.runtime == runtime]
            tools = [t for t in TOOLS if any(r.tool == t for r in these)]
            entry: dict[str, Any] = {"threads": {t: threads_used(these, t) for t in tools}}
            for metric, higher in METRICS:
                if mode == "replay" and metric != "fps":
                    continue
                per_tool = {
                    tool: best_and_median(
                        [getattr(r, metric) for r in these if r.tool == tool],
                        higher_is_better=higher,
                    )
                    for tool in tools
                }
                figures: dict[str, float] = {
                    **{f"{tool}_best": v[0] for tool, v in per_tool.items()},
                    **{f"{tool}_median": v[1] for tool, v in per_tool.items()},
                }
                ours = per_tool.get("ours", (math.nan, math.nan))
                for peer, prefix in (("peer", "ratio"), (PEER_OWN, "own_ratio")):
                    if peer in per_tool:
                        figures[f"{prefix}_best"] = ratio(ours[0], per_tool[peer][0])
                        figures[f"{prefix}_median"] = ratio(ours[1], per_tool[peer][1])
                entry[metric] = figures
            out[mode][runtime] = entry
    return out


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _threads_cell(threads: int) -> str:
    return str(threads) if threads else "ort"


def table(
    rounds: Sequence[RoundResult], summary: dict[str, dict[str, dict[str, Any]]]
) -> list[str]:
    """The stdout report: every round, then per mode and runtime best / median and ours /
    peer on the same threads, then (when it ran) ours / the peer at its own default threads,
    labelled as not like for like. Every line names the runtime and the threads."""
    head = (
        f"{'mode':<7}{'runtime':<12}{'round':>5} {'tool':<9}{'threads':>7}{'frames':>7}"
        f"{'fps':>7}{'p50 ms':>8}{'p99 ms':>8}{'delivered':>10}{'det/frame':>10}{'wall s':>7}"
        f"{'steal %':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rounds:
        lines.append(
            f"{r.mode:<7}{r.runtime:<12}{r.round:>5} {r.tool:<9}{_threads_cell(r.threads):>7}"
            f"{r.frames:>7}{_fmt(r.fps):>7}{_fmt(r.p50_ms):>8}{_fmt(r.p99_ms):>8}"
            f"{r.delivered or '-':>10}{_fmt(r.detections_per_frame, 2):>10}{_fmt(r.wall_s):>7}"
            f"{_fmt(r.steal_pct):>8}" + (f"  {r.note}" if r.note else "")
        )
    lines.append("")
    lines.append(
        f"{'mode':<7}{'runtime':<12}{'metric':<7}{'threads peer/ours':>18}{'peer best':>10}"
        f"{'ours best':>10}{'ours/peer':>10}{'peer med':>9}{'ours med':>9}{'ours/peer':>10}"
    )
    for mode, runtimes in summary.items():
        for runtime, entry in runtimes.items():
            threads = entry["threads"]
            for metric, s in entry.items():
                if metric == "threads":
                    continue
                for peer, prefix, label in (
                    ("peer", "ratio", "same threads"),
                    (PEER_OWN, "own_ratio", PEER_OWN_LABEL),
                ):
                    if f"{prefix}_best" not in s:
                        continue
                    pair = f"{threads.get(peer, '-')}/{threads.get('ours', '-')}"
                    lines.append(
                        f"{mode:<7}{runtime:<12}{metric:<7}{pair:>18}"
                        f"{_fmt(s[f'{peer}_best']):>10}{_fmt(s.get('ours_best', math.nan)):>10}"
                        f"{_fmt(s[f'{prefix}_best'], 2):>10}{_fmt(s[f'{peer}_median']):>9}"
                        f"{_fmt(s.get('ours_median', math.nan)):>9}"
                        f"{_fmt(s[f'{prefix}_median'], 2):>10}  {label}"
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
