"""A detector's output made from a simulated drive's labels (ground_truth.json), as
detection lines: for tests of what is done with boxes (tracking, fusion), on drives whose
truth is known, without running a model."""

from __future__ import annotations

from typing import Any

import numpy as np


def detections_from_labels(gt: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Every object at least 12 px tall and a third visible, its box jittered by 2 % of its
    size, one in ten missed, and a score between 0.5 and 1; a line per labelled image."""
    rng = np.random.default_rng(seed)
    names = {c["id"]: c["name"] for c in gt["categories"]}
    by_image: dict[int, list[dict[str, Any]]] = {}
    for a in gt["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    lines = []
    for k, image in enumerate(sorted(gt["images"], key=lambda im: im["id"])):
        boxes, scores, labels, class_names = [], [], [], []
        for a in by_image.get(image["id"], []):
            x, y, w, h = a["bbox"]
            if a["iscrowd"] or h < 12 or a.get("visibility", 1.0) < 0.33 or rng.random() < 0.1:
                continue
            jitter = rng.normal(0.0, 0.02, 4) * [w, h, w, h]
            boxes.append([x + jitter[0], y + jitter[1], x + w + jitter[2], y + h + jitter[3]])
            scores.append(float(rng.uniform(0.5, 1.0)))
            labels.append(a["category_id"] - 1)
            class_names.append(names[a["category_id"]])
        lines.append(
            {
                "camera": image["camera"],
                "camera_index": k,
                "frame_index": image["frame_index"],
                "pts_s": image["timestamp_s"],
                "boxes": boxes,
                "scores": scores,
                "labels": labels,
                "class_names": class_names,
            }
        )
    return lines
