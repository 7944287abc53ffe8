"""The report's plots, drawn with matplotlib's object API (no pyplot state, no display needed)
and returned as PNG bytes, to be embedded in the HTML page.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from drivepercept.report.rundata import LoadTable
from drivepercept.telemetry.stats import windowed_rate
from drivepercept.telemetry.timeline import STAGE_SPANS, Timeline

DPI = 100
WIDE = (10.0, 3.6)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


def _figure(
    size: tuple[float, float] = WIDE,
    rows: int = 1,
    cols: int = 1,
    *,
    margins_in: tuple[float, float, float, float] = (0.8, 0.2, 0.6, 0.4),
    space: float = 0.3,
) -> tuple[Figure, Any]:
    """A figure with fixed margins (left, right, bottom, top, in inches): matplotlib's
    automatic layout engines cost about a third of the report's time, and the report is
    written while a stopped run waits to exit."""
    fig = Figure(figsize=size)
    width, height = size
    left, right, bottom, top = margins_in
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=space,
        hspace=space * 1.5,
    )
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _budget(ax: Axes, budget_ms: float, *, vertical: bool) -> None:
    label = f"budget {budget_ms:g} ms"
    line = ax.axvline if vertical else ax.axhline
    line(budget_ms, color="crimson", linestyle="--", linewidth=1.2, label=label)


def _seconds(t_ns: np.ndarray, origin_ns: int) -> np.ndarray:
    return (t_ns.astype(np.int64) - origin_ns) / 1e9


def latency_cdf(tl: Timeline, budget_ms: float) -> bytes:
    """End-to-end latency CDF per camera, budget marked."""
    fig, axes = _figure()
    ax = axes[0][0]
    for i, name in enumerate(tl.cameras):
        values = np.sort(tl.camera(i).end_to_end_ms)
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=name)
    _budget(ax, budget_ms, vertical=True)
    ax.set_xlabel("end-to-end latency (ms, capture to result)")
    ax.set_ylabel("share of frames")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("End-to-end latency distribution (CDF)")
    return _png(fig)


def latency_over_time(tl: Timeline, budget_ms: float) -> bytes:
    fig, axes = _figure()
    ax = axes[0][0]
    origin = tl.origin_ns
    for i, name in enumerate(tl.cameras):
        cam = tl.camera(i)
        order = np.argsort(cam.stamps["capture"])
        x = _seconds(cam.stamps["capture"][order], origin)
        ax.plot(x, cam.end_to_end_ms[order], linewidth=0.9, marker=".", markersize=2, label=name)
    _budget(ax, budget_ms, vertical=False)
    ax.set_xlabel("capture time (s from the first frame)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("Latency over time, per camera")
    return _png(fig)


def stage_breakdown(tl: Timeline) -> bytes:
    """Stacked bars: the median of each stage, and the p99 of each stage."""
    fig, axes = _figure((10.0, 3.4), margins_in=(1.3, 0.9, 1.25, 0.4))
    ax = axes[0][0]
    rows = [("p50 of each stage", 50.0), ("p99 of each stage", 99.0)]
    colors = [f"C{k % 10}" for k in range(len(STAGE_SPANS))]
    for y, (_label, q) in enumerate(rows):
        left = 0.0
        for span, color in zip(STAGE_SPANS, colors, strict=True):
            values = tl.span(span)
            width = float(np.percentile(values, q)) if values.size else 0.0
            ax.barh(
                y, width, left=left, color=color, label=span.name if y == 0 else None, height=0.6
            )
            left += width
        ax.text(left, y, f" {left:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms (the p99 bar sums per-stage p99s: an upper view, not the p99 of the sum)")
    fig.legend(fontsize=7, ncol=5, loc="lower center")
    ax.set_title("Where the time goes: stage breakdown")
    return _png(fig)


def throughput_over_time(tl: Timeline, window_s: float) -> bytes:
    fig, axes = _figure()
    ax = axes[0][0]
    origin, end = tl.origin_ns, tl.end_ns
    total = windowed_rate(tl.stamps["emitted"], origin_ns=origin, end_ns=end, window_s=window_s)
    ax.step(total.start_s, total.rate_per_s, where="post", color="black", label="all cameras")
    for i, name in enumerate(tl.cameras):
        w = windowed_rate(
            tl.stamps["emitted"][tl.camera_index == i],
            origin_ns=origin,
            end_ns=end,
            window_s=window_s,
        )
        ax.step(w.start_s, w.rate_per_s, where="post", linewidth=0.8, label=name)
    width = total.width_s  # the summary's: wider than asked on a long span
    ax.set_xlabel(f"time (s from the first capture; {width:g} s windows of emission time)")
    ax.set_ylabel("frames/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4)
    ax.set_title("Throughput over time")
    return _png(fig)


def gpu_over_time(load: LoadTable, origin_ns: int) -> bytes | None:
    """GPU utilization, memory, power and temperature; None without GPU columns."""
    if load.gpu_count == 0 or not len(load):
        return None
    fig, axes = _figure((10.0, 6.0), rows=2, cols=2, margins_in=(0.8, 0.2, 0.6, 0.7))
    x = _seconds(load.t_ns, origin_ns)
    panels: list[tuple[Any, str, list[tuple[str, str]]]] = [
        (axes[0][0], "utilization (%)", [("util_pct", "SM"), ("mem_util_pct", "memory")]),
        (axes[0][1], "memory used (MB)", [("mem_used_mb", "used")]),
        (axes[1][0], "power (W)", [("power_w", "draw"), ("power_limit_w", "limit")]),
        (axes[1][1], "temperature (C)", [("temperature_c", "GPU")]),
    ]
    for ax, ylabel, fields in panels:
        for g in range(load.gpu_count):
            for field, label in fields:
                values = load.column(f"gpu{g}_{field}")
                if values is not None and not np.all(np.isnan(values)):
                    ax.plot(x, values, linewidth=1.0, label=f"GPU{g} {label}")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("time (s from the first capture)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("GPU load over time (NVML; utilization is averaged over 1/6 s to 1 s)")
    return _png(fig)


def cpu_over_time(load: LoadTable, origin_ns: int) -> bytes | None:
    if not len(load):
        return None
    fig, axes = _figure((10.0, 3.6), cols=2, margins_in=(0.8, 0.2, 0.6, 0.7))
    x = _seconds(load.t_ns, origin_ns)
    ax = axes[0][0]
    for k in range(load.core_count):
        values = load.column(f"cpu{k}_pct")
        if values is not None:
            ax.plot(x, values, linewidth=0.5, alpha=0.5, color="grey")
    for column, label, color in (
        ("system_cpu_pct", "all cores (100 = every core)", "black"),
        ("process_cpu_pct", "this process (100 = one core)", "C0"),
    ):
        values = load.column(column)
        if values is not None:
            ax.plot(x, values, linewidth=1.2, label=label, color=color)
    ax.set_ylabel("CPU (%) - grey: each core")
    ax.set_xlabel("time (s from the first capture)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax2 = axes[0][1]
    rss = load.column("process_rss_mb")
    if rss is not None:
        ax2.plot(x, rss, color="C2")
    ax2.set_ylabel("process RSS (MB)")
    ax2.set_xlabel("time (s from the first capture)")
    ax2.grid(alpha=0.3)
    fig.suptitle("CPU and memory over time")
    return _png(fig)


def batch_fill_plot(size_counts: dict[str, int], cameras: int) -> bytes:
    fig, axes = _figure((5.0, 2.6), margins_in=(0.7, 0.2, 0.6, 0.4))
    ax = axes[0][0]
    sizes = list(range(1, max(cameras, 1) + 1))
    ax.bar(sizes, [size_counts.get(str(s), 0) for s in sizes], color="C0")
    ax.set_xlabel("cameras in the batch")
    ax.set_ylabel("batches")
    ax.set_xticks(sizes)
    ax.set_title("Batch fill")
    return _png(fig)


def sweep_plot(
    series: Mapping[str, Sequence[tuple[int, float, float, float]]],
    *,
    fps_per_camera: float,
    title: str,
) -> bytes:
    """`bench --sweep`: processed frames/s, p99 latency and share dropped against the camera
    count, a line per series (a precision and a batch timeout).

    Args:
        series: label -> (cameras, frames/s, p99 ms, drop share) points; NaN leaves a gap.
        fps_per_camera: the cameras' rate: the frames/s panel marks what they offer.
        title: the figure's title.
    """
    fig, axes = _figure((12.0, 4.0), cols=3, margins_in=(0.7, 0.2, 1.1, 0.6))
    fps_ax, p99_ax, drop_ax = axes[0]
    counts = sorted({p[0] for points in series.values() for p in points})
    if counts:
        fps_ax.plot(
            counts,
            [n * fps_per_camera for n in counts],
            color="black",
            linestyle="--",
            linewidth=1.0,
            label="offered",
        )
    for k, (label, points) in enumerate(series.items()):
        ordered = sorted(points)
        x = [p[0] for p in ordered]
        style = {"color": f"C{k % 10}", "marker": "o", "markersize": 4, "linewidth": 1.2}
        fps_ax.plot(x, [p[1] for p in ordered], label=label, **style)
        p99_ax.plot(x, [p[2] for p in ordered], **style)
        drop_ax.plot(x, [100.0 * p[3] for p in ordered], **style)
    panels = [
        (fps_ax, "processed frames/s (all cameras)"),
        (p99_ax, "p99 end-to-end latency (ms)"),
        (drop_ax, "frames dropped (%)"),
    ]
    for ax, ylabel in panels:
        ax.set_xlabel("cameras")
        ax.set_ylabel(ylabel)
        ax.set_xticks(counts)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    drop_ax.set_ylim(0, max(5.0, drop_ax.get_ylim()[1]))  # no drops: a flat line at 0, not noise
    fig.legend(*fps_ax.get_legend_handles_labels(), fontsize=8, ncol=7, loc="lower center")
    fig.suptitle(title)
    return _png(fig)


def worker_timeline(spans: Sequence[tuple[str, str, float, float, bool]]) -> bytes | None:
    """A fleet's drives on its workers: (worker, drive, start s, duration s, ok) bars, one
    row per worker (grey: a drive that failed). None when there is nothing to draw."""
    if not spans:
        return None
    workers = sorted({s[0] for s in spans})
    fig, axes = _figure((10.0, 0.9 + 0.45 * len(workers)), margins_in=(1.8, 0.2, 0.5, 0.1))
    ax = axes[0][0]
    for worker, drive, start_s, dur_s, ok in spans:
        row = workers.index(worker)
        ax.broken_barh([(start_s, dur_s)], (row - 0.4, 0.8), color="C0" if ok else "0.6")
        ax.text(start_s + dur_s / 2, row, drive, ha="center", va="center", fontsize=7, color="w")
    ax.set_yticks(range(len(workers)), workers, fontsize=8)
    ax.set_xlabel("seconds since the first drive started")
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def deadline_over_time(
    seconds: Sequence[dict[str, Any]],
    schedule: dict[str, Any] | None,
    cameras: Sequence[str],
    budget_ms: float,
) -> bytes:
    """p99 end-to-end latency per second against the budget; with a schedule, below it the
    share of each camera's frames the model saw, per second (`report/deadline.py`)."""
    shares = (schedule or {}).get("per_second") or []
    fig, axes = _figure((WIDE[0], WIDE[1] * (1.6 if shares else 1.0)), rows=2 if shares else 1)
    ax = axes[0][0]
    t = [s["t_s"] for s in seconds]
    ax.plot(t, [s["p99_ms"] for s in seconds], marker="o", markersize=3, label="p99 latency")
    _budget(ax, budget_ms, vertical=False)
    ax.set_ylabel("p99 latency (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Each second of capture: p99 latency" + (" and detected share" if shares else ""))
    if shares:
        low = axes[1][0]
        x = [s["t_s"] for s in shares]
        for i, name in enumerate(cameras):
            y = [s["detected_share"][i] if i < len(s["detected_share"]) else None for s in shares]
            low.plot(x, [np.nan if v is None else 100 * v for v in y], linewidth=1, label=name)
        low.set_ylabel("frames detected (%)")
        low.set_ylim(0, 105)
        low.grid(alpha=0.3)
        low.legend(fontsize=7, ncol=3)
    (axes[-1][0]).set_xlabel("second of capture (from the first frame)")
    return _png(fig)
