"""Two runs side by side: the key figures with ratios (B / A), as text and as an HTML page.

For questions like fp32 vs fp16, or a 5 ms vs a 20 ms batch timeout, on the same rig.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from drivepercept.report import plots
from drivepercept.report.html import CSS, esc, fmt, image, kv_table, table
from drivepercept.report.rundata import RunData


@dataclass(frozen=True)
class KeyFigure:
    """One compared figure: its label and where it lives in summary.json."""

    label: str
    path: tuple[str | int, ...]


KEY_FIGURES: tuple[KeyFigure, ...] = (
    KeyFigure("frames", ("frames",)),
    KeyFigure("throughput fps", ("throughput_fps",)),
    KeyFigure("end-to-end p50 ms", ("end_to_end_ms", "p50_ms")),
    KeyFigure("end-to-end p95 ms", ("end_to_end_ms", "p95_ms")),
    KeyFigure("end-to-end p99 ms", ("end_to_end_ms", "p99_ms")),
    KeyFigure("end-to-end max ms", ("end_to_end_ms", "max_ms")),
    KeyFigure("deadline miss rate", ("deadline", "miss_rate")),
    KeyFigure("inference p50 ms", ("stages", "inference", "p50_ms")),
    KeyFigure("batch wait p95 ms", ("stages", "batch_wait", "p95_ms")),
    KeyFigure("mean batch size", ("batches", "mean_size")),
    KeyFigure("capture spread p95 ms", ("batches", "capture_spread_ms", "p95_ms")),
    KeyFigure("process CPU % mean", ("load", "process_cpu_pct", "mean")),
    KeyFigure("process RSS MB max", ("load", "process_rss_mb", "max")),
    KeyFigure("GPU util % mean", ("load", "gpus", 0, "util_pct", "mean")),
    KeyFigure("GPU memory MB max", ("load", "gpus", 0, "mem_used_mb", "max")),
    KeyFigure("GPU power W mean", ("load", "gpus", 0, "power_w", "mean")),
)


def lookup(summary: dict[str, Any], path: tuple[str | int, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if isinstance(key, int):
            if not isinstance(value, list) or key >= len(value):
                return None
        elif not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a, None where either is missing or a is 0."""
    if a is None or b is None or a == 0 or math.isnan(a) or math.isnan(b):
        return None
    return b / a


def comparison_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(figure, A, B, B/A) for every key figure either run has."""
    rows = []
    for f in KEY_FIGURES:
        va, vb = lookup(a, f.path), lookup(b, f.path)
        if va is None and vb is None:
            continue
        rows.append((f.label, va, vb, ratio(va, vb)))
    return rows


def _cell(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if abs(value) < 1 and value != 0 else f"{value:.1f}"


def comparison_text(a: dict[str, Any], b: dict[str, Any]) -> str:
    name_a, name_b = a["run"]["name"], b["run"]["name"]
    rows = comparison_rows(a, b)
    width = max(len("figure"), *(len(r[0]) for r in rows))
    col = max(10, len(name_a), len(name_b))
    lines = [
        f"{'figure':<{width}}  {'A ' + name_a:>{col + 2}}  {'B ' + name_b:>{col + 2}}  {'B/A':>7}"
    ]
    for label, va, vb, r in rows:
        rtext = "n/a" if r is None else f"{r:.2f}x"
        lines.append(
            f"{label:<{width}}  {_cell(va):>{col + 2}}  {_cell(vb):>{col + 2}}  {rtext:>7}"
        )
    return "\n".join(lines)


def _overlay_cdf(a: RunData, b: RunData, budget_ms: float) -> bytes:
    fig, axes = plots._figure()
    ax = axes[0][0]
    for label, data in (("A " + a.name, a), ("B " + b.name, b)):
        values = np.sort(data.timeline.end_to_end_ms)
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)
    ax.axvline(budget_ms, color="crimson", linestyle="--", label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("share of frames")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("End-to-end latency, all cameras: A vs B")
    return plots._png(fig)


def _overlay_seconds(sa: dict[str, Any], sb: dict[str, Any], budget_ms: float) -> bytes | None:
    """p99 latency of each second of capture, A and B on one plot (a load that comes and
    goes: where each held the budget); None when neither has seconds."""
    if not (sa.get("per_second") or sb.get("per_second")):
        return None
    fig, axes = plots._figure()
    ax = axes[0][0]
    for label, summary in (("A " + sa["run"]["name"], sa), ("B " + sb["run"]["name"], sb)):
        seconds = summary.get("per_second") or []
        t, p99 = [s["t_s"] for s in seconds], [s["p99_ms"] for s in seconds]
        ax.plot(t, p99, marker="o", markersize=3, label=label)
    ax.axhline(budget_ms, color="crimson", linestyle="--", label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("second of capture (from each run's first frame)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("p99 latency per second: A vs B")
    return plots._png(fig)


def _config_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    ca = a["run"].get("config") or {}
    cb = b["run"].get("config") or {}
    return {
        k: f"{ca.get(k)} -> {cb.get(k)}"
        for k in sorted(set(ca) | set(cb))
        if ca.get(k) != cb.get(k)
    }


def render_comparison(a: RunData, sa: dict[str, Any], b: RunData, sb: dict[str, Any]) -> str:
    budget = float(sa["budget_ms"])
    rows = [
        [label, _cell(va), _cell(vb), "n/a" if r is None else f"{r:.2f}x"]
        for label, va, vb, r in comparison_rows(sa, sb)
    ]
    side = []
    for tag, data, summary in (("A", a, sa), ("B", b, sb)):
        tl = data.timeline
        model = summary["run"].get("model") or {}
        side.append(
            f"<div><h2>{tag}: {esc(data.name)}</h2>"
            f"<p>model {esc(model.get('name'))}, status {esc(summary['run']['status'])}</p>"
            + (image(plots.latency_cdf(tl, budget), f"{tag} latency CDF") if len(tl) else "")
            + (image(plots.stage_breakdown(tl), f"{tag} stage breakdown") if len(tl) else "")
            + "</div>"
        )
    problems = [f"A: {p}" for p in sa["problems"]] + [f"B: {p}" for p in sb["problems"]]
    problems_html = (
        "<div class='problems'><ul>"
        + "".join(f"<li>{esc(p)}</li>" for p in problems)
        + "</ul></div>"
        if problems
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>drivepercept comparison: {esc(a.name)} vs {esc(b.name)}</title>
<style>{CSS}</style></head><body>
<h1>A {esc(a.name)} vs B {esc(b.name)}</h1>
{problems_html}
{table(["figure", "A", "B", "B / A"], rows)}
<h2>Settings that differ</h2>
{kv_table(_config_diff(sa, sb))}
{image(_overlay_cdf(a, b, budget), "latency CDF A vs B")}
{image(_overlay_seconds(sa, sb, budget), "p99 latency per second A vs B")}
<div class="side">{"".join(side)}</div>
<p class="note">Ratios are B / A; budget {fmt(budget, 0)} ms.</p>
</body></html>
"""
