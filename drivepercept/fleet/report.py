"""fleet.html: the fleet record (fleet.json) as a page: totals, failures, drives, workers and
a timeline of which worker replayed which drive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivepercept.report.html import CSS, esc, fmt, image, kv_table, table
from drivepercept.report.plots import worker_timeline
from drivepercept.rundir import write_text


def _latency(lat: dict[str, Any] | None, key: str) -> str:
    return fmt((lat or {}).get(key))


def render_fleet_html(record: dict[str, Any]) -> str:
    totals = record["totals"]
    drives = record["drives"]
    first = min((d["started_unix"] for d in drives if d.get("started_unix")), default=0.0)
    spans = [
        (d["worker"], d["drive"], d["started_unix"] - first, d["wall_s"], d["status"] == "complete")
        for d in drives
        if d.get("worker") and not d.get("resumed")
    ]
    lat = totals["latency_ms"]
    acc = totals.get("accuracy") or {}
    summary = {
        "status": record["status"],
        "drives": totals["drives"],
        "complete / failed / lost / cancelled": " / ".join(
            str(totals[k]) for k in ("complete", "failed", "lost", "cancelled")
        ),
        "resumed (not run again)": totals["resumed"],
        "retries": totals["retries"],
        "frames": totals["frames"],
        "wall time (s)": record["wall_s"],
        "throughput (frames/s, this run)": totals["throughput_fps"],
        "latency p50 / p95 / p99 / max (ms, every frame)": " / ".join(
            _latency(lat, k) for k in ("p50", "p95", "p99", "max")
        ),
        "pooled mAP@.5 (labelled drives)": fmt(acc.get("map_50"), 3) if acc else "no labels",
        "workers": record["workers"].get("count"),
    }
    failures = table(
        ["drive", "status", "reason"],
        [(f["drive"], esc(f["status"]), esc(f["error"])) for f in record["failures"]],
        left=3,
    )
    rows = [
        (
            d["drive"],
            esc(d["status"]),
            d["frames"],
            fmt(d["throughput_fps"]),
            _latency(d.get("latency_ms"), "p50"),
            _latency(d.get("latency_ms"), "p99"),
            fmt(d.get("map_50"), 3),
            d["retries"],
            esc(d["worker"] or ("resumed" if d.get("resumed") else "")),
            fmt(d["wall_s"]),
        )
        for d in drives
    ]
    drive_table = table(
        [
            *("drive", "status", "frames", "frames/s", "p50 ms", "p99 ms", "mAP@.5", "retries"),
            "worker",
            "worker s",
        ],
        rows,
    )
    workers = table(
        ["worker", "drives", "busy s", "utilization"],
        [
            (w["worker"], w["drives"], fmt(w["busy_s"]), fmt(100 * (w["utilization"] or 0)) + " %")
            for w in record["per_worker"]
        ],
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>fleet report</title>
<style>{CSS}</style></head><body>
<h1>Fleet report</h1><p class="note">{esc(record["out"])}, started {esc(record["started"])}</p>
<h2>Totals</h2>{kv_table(summary)}
<p class="note">Latency percentiles are those of every frame of the fleet (the drives'
histograms merged); accuracy pools every labelled drive's frames into one data set.</p>
<h2>Failures</h2>{failures if record["failures"] else "<p>none</p>"}
<h2>Drives</h2>{drive_table}
<h2>Workers</h2>{workers}{image(worker_timeline(spans), "drives on workers over time")}
</body></html>
"""


def write_fleet_html(path: Path, record: dict[str, Any]) -> None:
    write_text(path, render_fleet_html(record))
