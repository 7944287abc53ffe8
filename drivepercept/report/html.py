"""report.html: one self-contained page (inline CSS, plots as data: URIs, no script, no
network access) with the run's config and environment, the summary tables and the plots.

A run folder is something people send each other, so everything read from it is text: every
value reaches the page through `esc`, the one escaping function (table cells, headings and
paragraphs alike). HTML built here from escaped parts is marked `Markup`, which `esc` leaves
as it is; nothing else passes unescaped.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

from drivepercept.report import plots
from drivepercept.report.rundata import RunData
from drivepercept.rundir import RunDir
from drivepercept.telemetry.timeline import STAGE_SPANS

FILES = ", ".join(
    (RunDir.SUMMARY_JSON, RunDir.LATENCY_CSV, RunDir.FRAMES_CSV, RunDir.LOAD_CSV, RunDir.TRACE_JSON)
)

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
.problems { background: #fff3cd; border: 1px solid #e0c36a; padding: 0.6em 1em; }
.note { color: #555; font-size: 0.88em; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


class Markup(str):
    """HTML built here from escaped parts (or fixed text): `esc` leaves it as it is."""


def esc(value: Any) -> Markup:
    """`value` as HTML text: escaped, unless it is `Markup` already."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value)))


def fmt(value: Any, digits: int = 1) -> Markup:
    if value is None:
        return Markup("n/a")
    if isinstance(value, float):
        return Markup(f"{value:.{digits}f}")
    return esc(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, left: int = 1) -> str:
    """An HTML table; the first `left` columns are left-aligned text."""
    head = "".join(
        f'<th class="l">{esc(h)}</th>' if i < left else f"<th>{esc(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="l">{esc(v)}</td>' if i < left else f"<td>{esc(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def image(png: bytes | None, alt: str) -> str:
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _pct(rate: float | None) -> Markup:
    return Markup("n/a" if rate is None else f"{100 * float(rate):.2f}%")


def latency_table(summary: dict[str, Any]) -> str:
    headers = ["camera", "frames", "fps", "mean ms", "p50", "p90", "p95", "p99", "max"]
    headers += ["over budget", "dropped", "index gaps"]
    rows = []
    for name, cam in summary["cameras"].items():
        e = cam["end_to_end_ms"]
        rows.append(
            [
                name,
                cam["frames"],
                fmt(cam["throughput_fps"]),
                *(fmt(e[k]) for k in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms")),
                fmt(e["max_ms"]),
                _pct(cam["deadline"]["miss_rate"]),
                fmt(cam["dropped"]),
                cam["frame_index_gaps"],
            ]
        )
    e = summary["end_to_end_ms"]
    dropped = [c["dropped"] for c in summary["cameras"].values()]
    rows.append(
        [
            "all",
            summary["frames"],
            fmt(summary["throughput_fps"]),
            *(fmt(e[k]) for k in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms")),
            fmt(e["max_ms"]),
            _pct(summary["deadline"]["miss_rate"]),
            fmt(sum(dropped)) if None not in dropped else "n/a",
            sum(c["frame_index_gaps"] for c in summary["cameras"].values()),
        ]
    )
    return table(headers, rows)


def stage_table(summary: dict[str, Any]) -> str:
    rows = []
    for span in STAGE_SPANS:
        s = summary["stages"][span.name]
        rows.append(
            [
                span.name,
                span.what,
                *(fmt(s[k], 2) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")),
            ]
        )
    return table(["stage", "what", "mean ms", "p50", "p95", "p99", "max"], rows, left=2)


def load_section(summary: dict[str, Any], data: RunData) -> str:
    load = summary["load"]
    parts = []
    if load["gpu_unavailable"]:
        parts.append(f"<p><b>GPU metrics unavailable: {esc(load['gpu_unavailable'])}</b></p>")
    rows = [
        ["process CPU % (100 = one core)", *_mm(load["process_cpu_pct"])],
        ["system CPU % (100 = all cores)", *_mm(load["system_cpu_pct"])],
        ["process RSS MB", *_mm(load["process_rss_mb"])],
    ]
    for g in load["gpus"]:
        label = f"GPU{g['index']} {g['name'] or ''}".strip()
        rows += [
            [f"{label} util %", *_mm(g["util_pct"])],
            [f"{label} memory util %", *_mm(g["mem_util_pct"])],
            [f"{label} memory used MB", *_mm(g["mem_used_mb"])],
            [f"{label} power W", *_mm(g["power_w"])],
            [f"{label} temperature C", *_mm(g["temperature_c"])],
            [f"{label} SM clock MHz", *_mm(g["sm_clock_mhz"])],
            [f"{label} clock limits seen", ", ".join(g["throttle_reasons_seen"]) or "none", ""],
        ]
    parts.append(
        f"<p class='note'>{esc(load['samples'])} samples at {fmt(load['rate_hz'])} Hz on the "
        "frames' "
        "clock. NVML utilization is the share of time a kernel ran (or memory was busy), "
        "averaged by the driver over a window of 1/6 s to 1 s depending on the GPU.</p>"
    )
    parts.append(table(["figure", "mean", "max"], rows))
    origin = data.timeline.origin_ns
    if data.load is not None:
        parts.append(image(plots.gpu_over_time(data.load, origin), "GPU load over time"))
        parts.append(image(plots.cpu_over_time(data.load, origin), "CPU load over time"))
    return "\n".join(parts)


def _mm(stats: dict[str, Any]) -> list[str]:
    return [fmt(stats["mean"]), fmt(stats["max"])]


def kv_table(mapping: dict[str, Any] | None) -> str:
    if not mapping:
        return "<p class='note'>not recorded</p>"
    rows = [[k, json.dumps(v) if isinstance(v, (dict, list)) else v] for k, v in mapping.items()]
    return table(["key", "value"], rows, left=2)


def batches_section(summary: dict[str, Any]) -> str:
    b = summary["batches"]
    spread = b["capture_spread_ms"]
    rows = [
        ["batches", b["count"]],
        ["mean cameras per batch", Markup(f"{fmt(b['mean_size'], 2)} of {esc(b['cameras'])}")],
        ["full batches", _pct(b["full_share"])],
        [
            "capture spread p50 / p95 / max ms",
            Markup(" / ".join(fmt(spread[k], 2) for k in ("p50_ms", "p95_ms", "max_ms"))),
        ],
    ]
    source = b.get("source_spread_ms")
    if source:
        rows.append(
            [
                "frame-time spread p50 / p99 / max ms",
                Markup(" / ".join(fmt(source[k], 2) for k in ("p50_ms", "p99_ms", "max_ms"))),
            ]
        )
    return table(["figure", "value"], rows) + image(
        plots.batch_fill_plot(b["size_counts"], b["cameras"]), "batch fill"
    )


def tracking_section(summary: dict[str, Any]) -> str:
    """`--track`: tracks per camera and how long they lasted; the rig's objects."""
    tracking = summary.get("tracking")
    if not tracking:
        return ""
    rows = [
        [
            name,
            fmt(c["tracks"]),
            fmt(c["lifetime_median_s"], 2),
            fmt(c["lifetime_max_s"], 2),
            fmt(c.get("unconfirmed_died")),
        ]
        for name, c in tracking["cameras"].items()
    ]
    rig = (
        f"{fmt(tracking['rig_objects'])} objects across the rig (global ids)"
        if tracking["placed"]
        else "tracked per camera only: the rig has no geometry to place objects"
    )
    cost, cpu = tracking.get("ms_per_frame"), tracking.get("cpu_ms_per_frame")
    if cost is not None:
        rig += f"; the tracking stage took {fmt(cost, 3)} ms per camera frame"
        rig += f" ({fmt(cpu, 3)} ms of its thread's CPU)" if cpu is not None else ""
    head = ["camera", "tracks", "lifetime median s", "lifetime max s", "died unconfirmed"]
    return f"<h2>Tracking</h2><p>{esc(rig)}</p>" + table(head, rows, left=1)


def deadline_section(summary: dict[str, Any], cameras: list[str]) -> str:
    """The report's "Deadline" section: the per-second plot, and with a schedule its
    per-camera table (empty for a run with no frames)."""
    seconds = summary.get("per_second") or []
    if not seconds:
        return ""
    schedule = summary.get("schedule")
    budget = summary["budget_ms"]
    png = plots.deadline_over_time(seconds, schedule, cameras, budget)
    worst = max(seconds[1:] or seconds, key=lambda s: s["p99_ms"])
    text = (
        f"p99 end-to-end latency per second of capture; the worst after the first second: "
        f"{fmt(worst['p99_ms'])} ms at second {worst['t_s']}."
    )
    if not schedule:
        note = "No budget was held (the scheduler is on in live and real-time runs given "
        note += "--budget-ms): every frame the engine took went to the model."
        return f"<h2>Deadline</h2><p>{esc(text)}</p><p class='note'>{esc(note)}</p>" + image(
            png, "p99 latency per second"
        )
    rows = [
        [
            name,
            fmt(c["priority"], 2),
            fmt(c["detected"]),
            fmt(c["predicted"]),
            fmt(100 * c["detected_share"]),
            fmt(c["forced"]),
            fmt(c.get("overdue", 0)),
            fmt(c["longest_gap_ms"]),
        ]
        for name, c in schedule["cameras"].items()
    ]
    head = ["camera", "priority", "detected", "predicted", "detected %", "forced"]
    head += ["overdue", "longest gap ms"]
    held = (
        f"The scheduler held a {schedule['budget_ms']:g} ms budget: per camera and frame, "
        "the model or the tracker's prediction for the frame's capture time. A camera's "
        f"first frame, and one {schedule['max_gap_ms']:g} ms after its last detected one, "
        "went to the model whatever the budget said (forced); the longest gap between "
        "detections leaves out gaps across a break in a camera's frames (over a second "
        "between two of them: a reconnect, a stall). A frame the model was still on at its "
        "deadline was answered by the tracker's prediction then (overdue), the model's boxes "
        "going to the tracks when they came."
    )
    return (
        f"<h2>Deadline</h2><p>{esc(held)}</p>"
        + table(head, rows)
        + f"<p>{esc(text)}</p>"
        + image(png, "p99 latency and detected share per second")
    )


def live_section(summary: dict[str, Any], origin_ns: int) -> str:
    """Live cameras: final state, reconnects, down time and the state changes."""
    cams = {n: c["live"] for n, c in summary["cameras"].items() if c.get("live")}
    if not cams:
        return ""
    rows = []
    for name, live in cams.items():
        changes = "; ".join(
            f"{(c['t_ns'] - origin_ns) / 1e9:+.2f} s {c['state']}"
            + (f" ({c['detail']})" if c.get("detail") else "")
            for c in live["changes"]
        )
        rows.append(
            [
                name,
                live["state"],
                fmt(live["connects"]),
                fmt(live.get("failed_attempts")),
                fmt(live["downtime_s"], 2),
                fmt(live.get("frames_lost_estimate")),
                changes,
            ]
        )
    return "<h2>Cameras</h2>" + table(
        [
            "camera",
            "final state",
            "connects",
            "failed attempts",
            "down s",
            "frames lost in outages (est.)",
            "state changes",
        ],
        rows,
        left=2,
    )


def render_html(data: RunData, summary: dict[str, Any]) -> str:
    """The whole page."""
    tl = data.timeline
    run = summary["run"]
    budget = summary["budget_ms"]
    problems = ""
    if summary["problems"]:
        items = "".join(f"<li>{esc(p)}</li>" for p in summary["problems"])
        problems = (
            f"<div class='problems'><b>Problems with this run folder</b><ul>{items}</ul></div>"
        )
    failed = summary.get("outputs_failed") or {}
    if failed:
        items = "".join(f"<li>{esc(name)}: {esc(why)}</li>" for name, why in failed.items())
        problems += (
            "<div class='problems'><b>Outputs set aside during the run (the others are "
            f"complete)</b><ul>{items}</ul></div>"
        )
    model = run.get("model") or {}
    plots_html = ""
    if len(tl):
        plots_html = "\n".join(
            [
                "<h2>End-to-end latency</h2>",
                image(plots.latency_cdf(tl, budget), "latency CDF per camera"),
                image(plots.latency_over_time(tl, budget), "latency over time per camera"),
                "<h2>Stage breakdown</h2>",
                stage_table(summary),
                image(plots.stage_breakdown(tl), "stage breakdown"),
                "<h2>Throughput</h2>",
                image(plots.throughput_over_time(tl, summary["window_s"]), "throughput over time"),
                "<h2>Batches</h2>",
                batches_section(summary),
            ]
        )
    env = run.get("environment") or {}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>drivepercept report: {esc(data.name)}</title>
<style>{CSS}</style></head><body>
<h1>drivepercept run report: {esc(data.name)}</h1>
<p>status <b>{esc(run.get("status"))}</b> &middot; started {esc(run.get("started"))} &middot;
model <b>{esc(model.get("name"))}</b> &middot; device <b>{
        esc(env.get("gpu") or env.get("device"))
    }</b>
&middot; latency budget <b>{budget:g} ms</b></p>
{problems}
<h2>Summary</h2>
<p>{esc(summary["frames"])} frames from {len(tl.cameras)} cameras in {fmt(summary["span_s"], 2)} s:
<b>{fmt(summary["throughput_fps"])} frames/s</b>; end-to-end p50
<b>{fmt(summary["end_to_end_ms"]["p50_ms"])} ms</b>, p99
<b>{fmt(summary["end_to_end_ms"]["p99_ms"])} ms</b>;
{esc(summary["deadline"]["misses"])} frames over the {budget:g} ms budget
({_pct(summary["deadline"]["miss_rate"])}).</p>
{latency_table(summary)}
{deadline_section(summary, list(tl.cameras))}
{live_section(summary, tl.origin_ns)}
{tracking_section(summary)}
<p class="note">Latency is capture (the frame read from its source) to emission (boxes handed to
the outputs). For a live camera, capture is when the frame arrived in this process, after the
network and the decoder (time inside the camera and on the wire is not visible here); for a
real-time replay, when the file's frame fell due. Percentiles interpolate between ranks.
"dropped" is the pipeline's own count; "index gaps" counts source frames missing between
the processed ones.</p>
{plots_html}
<h2>Load</h2>
{load_section(summary, data)}
<h2>Configuration</h2>
{kv_table(run.get("config"))}
<h2>Model</h2>
{kv_table(model)}
<h2>Environment</h2>
{kv_table(env)}
<h2>Sources</h2>
{
        table(
            ["camera", "source", "size", "fps", "frames"],
            [
                [
                    s.get("camera"),
                    s.get("source"),
                    f"{s.get('width')}x{s.get('height')}",
                    fmt(s.get("fps")),
                    fmt(s.get("frame_count")),
                ]
                for s in (run.get("sources") or [])
                if isinstance(s, dict)
            ],
            left=2,
        )
    }
<p class="note">Files: {esc(FILES)} (open the trace in https://ui.perfetto.dev). Written by
drivepercept {esc(env.get("drivepercept"))}.</p>
</body></html>
"""
