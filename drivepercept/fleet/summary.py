"""A fleet's record (fleet.json): each drive, the totals and the workers.

Totals are sums over the drives (frames, retries, pipeline time); latency percentiles come
from the drives' histograms merged into one (every frame of the fleet counted once, not an
average of percentiles); accuracy is pooled: every labelled drive's frames scored together,
as one data set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.eval import score_detections
from drivepercept.fleet.drives import Drive
from drivepercept.fleet.options import FleetOptions
from drivepercept.fleet.worker import STATUSES, DriveOutcome
from drivepercept.run.groundtruth import read_ground_truth
from drivepercept.telemetry.counters import histogram_percentiles_ms
from drivepercept.telemetry.stats import LatencyHistogram

FLEET_SCHEMA_VERSION = 1


def _num(value: float, digits: int = 3) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def merged_latency(outcomes: Sequence[DriveOutcome]) -> dict[str, float | None]:
    """p50/p95/p99/max of every frame of the given drives (their histograms merged)."""
    merged = LatencyHistogram()
    for o in outcomes:
        if o.latency:
            merged.merge(o.latency)
    return {k: _num(v) for k, v in histogram_percentiles_ms(merged).items()}


def _relabelled(
    drive: str, coco: Mapping[str, Any], image_base: int, ann_base: int
) -> dict[str, Any]:
    images = [
        {**im, "id": im["id"] + image_base, "camera": f"{drive}/{im['camera']}"}
        for im in coco["images"]
    ]
    anns = [
        {**a, "id": a["id"] + ann_base, "image_id": a["image_id"] + image_base}
        for a in coco["annotations"]
    ]
    return {"images": images, "annotations": anns}


def pooled_accuracy(
    options: FleetOptions, drives: Sequence[Drive], outcomes: Sequence[DriveOutcome]
) -> dict[str, Any] | None:
    """mAP of every complete labelled drive's detections scored as one data set (each
    camera renamed <drive>/<camera>); None when no drive has labels."""
    by_name = {d.name: d for d in drives}
    scored = [o for o in outcomes if o.status == "complete" and o.map_50 is not None]
    if not scored:
        return None
    coco: dict[str, Any] = {"images": [], "annotations": [], "categories": []}
    frames: list[dict[str, Any]] = []
    wanted: list[tuple[str, int]] = []
    limit = int(options.run.get("settings", {}).get("max_frames", 0))
    for o in scored:
        drive = by_name[o.drive]
        truth = read_ground_truth(drive.sources[0], annotations=drive.ground_truth)
        if coco["categories"] and coco["categories"] != list(truth.coco["categories"]):
            raise ConfigError(f"drive {o.drive}: other classes than the other labelled drives")
        coco["categories"] = list(truth.coco["categories"])
        image_base = 1 + max((im["id"] for im in coco["images"]), default=0)
        ann_base = 1 + max((a["id"] for a in coco["annotations"]), default=0)
        part = _relabelled(o.drive, truth.coco, image_base, ann_base)
        coco["images"] += part["images"]
        coco["annotations"] += part["annotations"]
        wanted += [
            (f"{o.drive}/{im['camera']}", int(im["frame_index"]))
            for im in truth.coco["images"]
            if im["camera"] in truth.cameras and (not limit or int(im["frame_index"]) < limit)
        ]
        path = options.folder.drive(o.drive).detections_jsonl
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    frame = json.loads(line)
                    frames.append({**frame, "camera": f"{o.drive}/{frame['camera']}"})
    report = score_detections(coco, frames, images=wanted, by_camera=False)
    return {
        "drives": len(scored),
        "map_50": _num(report.map_50, 6),
        "map_50_95": _num(report.map_50_95, 6),
        "recall_50": _num(report.recall_50, 6),
        "targets": report.targets,
        "images": report.images,
        "scored_at": "each drive's detections as written (the run's score threshold)",
    }


def _drive_row(o: DriveOutcome) -> dict[str, Any]:
    row = o.to_json()
    row.pop("latency")
    row["retries"] = max(o.attempt - 1, 0)
    row["latency_ms"] = merged_latency([o]) if o.latency else None
    return row


def _workers(outcomes: Sequence[DriveOutcome], wall_s: float) -> list[dict[str, Any]]:
    busy: dict[str, list[DriveOutcome]] = {}
    for o in outcomes:
        if o.worker and not o.resumed:
            busy.setdefault(o.worker, []).append(o)
    return [
        {
            "worker": name,
            "drives": len(runs),
            "busy_s": round(sum(o.wall_s for o in runs), 3),
            "utilization": round(sum(o.wall_s for o in runs) / wall_s, 4) if wall_s > 0 else None,
        }
        for name, runs in sorted(busy.items())
    ]


def fleet_record(
    options: FleetOptions,
    drives: Sequence[Drive],
    outcomes: Sequence[DriveOutcome],
    *,
    wall_s: float,
    started: str,
    interrupted: bool,
    workers: Mapping[str, Any],
) -> dict[str, Any]:
    """fleet.json: the drives in the order given, then totals, failures and workers."""
    order = {d.name: i for i, d in enumerate(drives)}
    ordered = sorted(outcomes, key=lambda o: order.get(o.drive, len(order)))
    complete = [o for o in ordered if o.status == "complete"]
    failures = [o for o in ordered if o.status != "complete"]
    frames = sum(o.frames for o in ordered)
    ran = [o for o in ordered if not o.resumed]
    status = "interrupted" if interrupted else "failed" if failures else "complete"
    return {
        "schema_version": FLEET_SCHEMA_VERSION,
        "status": status,
        "started": started,
        "wall_s": round(wall_s, 3),
        "out": str(options.out),
        "workers": dict(workers),
        "drives": [_drive_row(o) for o in ordered],
        "totals": {
            "drives": len(drives),
            **{s: sum(o.status == s for o in ordered) for s in STATUSES},
            "resumed": sum(o.resumed for o in ordered),
            "frames": frames,
            "retries": sum(max(o.attempt - 1, 0) for o in ordered),
            "pipeline_s": round(sum(o.elapsed_s for o in ordered), 4),
            "worker_s": round(sum(o.wall_s for o in ran), 3),
            # frames the fleet processed in this invocation, per second of its wall time
            "throughput_fps": round(sum(o.frames for o in ran) / wall_s, 3) if wall_s > 0 else 0.0,
            "latency_ms": merged_latency(ordered),
            "accuracy": pooled_accuracy(options, drives, complete),
        },
        "failures": [{"drive": o.drive, "status": o.status, "error": o.error} for o in failures],
        "per_worker": _workers(ordered, wall_s),
    }
