"""A still for docs/OBJECTS.md: one object seen by two cameras, with the same id in both.

Reads a tracked replay's run folder (detections per camera frame, annotated per-camera videos),
picks the frame and object (of the class asked for, car by default) that two cameras see whole,
with the largest box area times score in the weaker view, and writes those two annotated frames
side by side as a PNG, scaled to at most --max-width pixels wide.

    drivepercept simulate --out /tmp/still_drive --preset crossing --seed 42 --seconds 6
    drivepercept replay /tmp/still_drive/rig.toml --model drivepercept-tiny --track \\
        --save-video --out /tmp/runs --name still
    python scripts/make_objects_still.py /tmp/runs/still    # docs/images/objects_two_cameras.png
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from drivepercept.rundir import RunDir

log = logging.getLogger("make_objects_still")

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "objects_two_cameras.png"


@dataclass(frozen=True)
class Sighting:
    """One box of an object in one camera frame; `ordinal` is the frame's place in that camera's
    annotated video (its n-th written frame)."""

    camera: str
    frame_index: int
    ordinal: int
    box: tuple[float, float, float, float]
    score: float

    @property
    def area(self) -> float:
        x1, y1, x2, y2 = self.box
        return max(0.0, x2 - x1) * max(0.0, y2 - y1)


@dataclass(frozen=True)
class Pick:
    frame_index: int
    global_id: int
    left: Sighting
    right: Sighting


def read_frames(run: RunDir) -> list[dict[str, Any]]:
    with run.detections_jsonl.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _whole(sighting: Sighting, size: tuple[int, int], margin: float = 2.0) -> bool:
    x1, y1, x2, y2 = sighting.box
    return x1 > margin and y1 > margin and x2 < size[0] - margin and y2 < size[1] - margin


def best_pair(
    frames: list[dict[str, Any]], *, class_name: str, sizes: dict[str, tuple[int, int]]
) -> Pick | None:
    """The frame and object of `class_name` seen by two cameras, whole in both where any is
    (no box on its image's edge; `sizes`: (width, height) per camera), with the largest box area
    times score in the weaker of the two views.

    The two are ordered so that the camera where the object sits farther right comes first:
    side by side, the object is then near the seam in both halves.
    """
    ordinals: dict[str, int] = defaultdict(int)
    seen: dict[tuple[int, int], list[Sighting]] = defaultdict(list)  # (frame, id) -> sightings
    for frame in frames:
        camera, frame_index = frame["camera"], frame["frame_index"]
        ordinal = ordinals[camera]
        ordinals[camera] += 1
        ids = frame.get("global_ids") or []
        rows = zip(frame["boxes"], frame["class_names"], frame["scores"], ids, strict=False)
        for box, name, score, global_id in rows:
            if global_id >= 0 and name == class_name and camera in sizes:
                x1, y1, x2, y2 = (float(v) for v in box)
                sighting = Sighting(camera, frame_index, ordinal, (x1, y1, x2, y2), score)
                seen[(frame_index, global_id)].append(sighting)
    best: tuple[tuple[bool, float], Pick] | None = None
    for (frame_index, global_id), sightings in seen.items():
        by_camera = {s.camera: s for s in sorted(sightings, key=lambda s: s.area)}
        if len(by_camera) < 2:
            continue
        a, b = sorted(by_camera.values(), key=lambda s: s.area * s.score)[-2:]
        left, right = sorted((a, b), key=lambda s: -(s.box[0] + s.box[2]))
        whole = _whole(a, sizes[a.camera]) and _whole(b, sizes[b.camera])
        score = (whole, min(a.area * a.score, b.area * b.score))
        if best is None or score > best[0]:
            best = (score, Pick(frame_index, global_id, left, right))
    return None if best is None else best[1]


def video_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of a video, None where it cannot be opened."""
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            return None
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        return width, int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    finally:
        capture.release()


def read_video_frame(path: Path, ordinal: int) -> np.ndarray:
    """The `ordinal`-th frame (from 0) of a video, read in order (exact for mp4v)."""
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise SystemExit(f"cannot open {path}")
    try:
        for _ in range(ordinal + 1):
            ok, image = capture.read()
            if not ok:
                raise SystemExit(f"{path} ends before frame {ordinal}")
        return np.asarray(image, dtype=np.uint8)
    finally:
        capture.release()


def side_by_side(left: np.ndarray, right: np.ndarray, *, max_width: int) -> np.ndarray:
    """The two frames at one height, with a thin dark seam, at most `max_width` wide."""
    height = min(left.shape[0], right.shape[0])

    def fit(image: np.ndarray) -> np.ndarray:
        if image.shape[0] == height:
            return image
        width = round(image.shape[1] * height / image.shape[0])
        return np.asarray(cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA))

    seam = np.full((height, 4, 3), 24, np.uint8)
    joined = np.asarray(cv2.hconcat([fit(left), seam, fit(right)]))
    if joined.shape[1] > max_width:
        new_h = round(joined.shape[0] * max_width / joined.shape[1])
        joined = np.asarray(cv2.resize(joined, (max_width, new_h), interpolation=cv2.INTER_AREA))
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run folder of a --track --save-video replay")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG to write")
    parser.add_argument("--class-name", default="car", help="class of the shared object")
    parser.add_argument("--max-width", type=int, default=1600, help="pixels")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    run = RunDir(args.run)
    frames = read_frames(run)
    sizes = {
        camera: size
        for camera in {f["camera"] for f in frames}
        if (size := video_size(run.video_dir / f"{camera}.mp4")) is not None
    }
    pick = best_pair(frames, class_name=args.class_name, sizes=sizes)
    if pick is None:
        log.error(
            "no %s with one global id in two cameras with videos in %s", args.class_name, args.run
        )
        return 1
    images = [
        read_video_frame(run.video_dir / f"{s.camera}.mp4", s.ordinal)
        for s in (pick.left, pick.right)
    ]
    still = side_by_side(*images, max_width=args.max_width)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(args.out), still, [cv2.IMWRITE_PNG_COMPRESSION, 9]):
        log.error("cannot write %s", args.out)
        return 1
    log.info(
        "%s: frame %d, object #%d in %s and %s, %dx%d, %d KB",
        args.out,
        pick.frame_index,
        pick.global_id,
        pick.left.camera,
        pick.right.camera,
        still.shape[1],
        still.shape[0],
        args.out.stat().st_size // 1024,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
