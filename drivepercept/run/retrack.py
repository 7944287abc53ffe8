"""Tracking again over a run's saved detections, with batches formed as chosen.

A replay's tracks and global ids depend on its boxes and on how its frames were batched
(which frames one rig step holds). `retrack` replays a run's `detections.jsonl` boxes through
the tracking stage (`RigTracker`: per-camera ByteTrack, then the rig's fusion) with batches
made on purpose: `spread_frames=0` puts frame k of every camera into one batch (the
replay's own batching in time order), `spread_frames=s` puts camera c's frame
`k - offset(c)` beside camera 0's frame k, the offsets spread evenly over 0..s frames
across the cameras (what a replay whose decoders ran some frames apart made before its
batches were aligned; a live rig whose cameras lag one another). The same boxes tracked
with different spreads tell what the tracking stage's result owes to the batching, and
tracker changes can be compared on identical input.

The tracker tells objects apart by their looks, read from the frames' pixels, which the
lines do not carry: given `frames` (`drivepercept.run.recorded_frames.RecordedFrames`, the
rig's recordings read again) each detected frame gets its pixels back and is tracked as the
replay tracked it; without, on motion alone.

Used by tests and benchmarks (`scripts/bench_trackers.py`); nothing here reads a video.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from drivepercept.config import detect_due
from drivepercept.errors import ConfigError
from drivepercept.rig import CameraConfig, load_rig
from drivepercept.sinks.objects import step_record
from drivepercept.tracking.appearance import LooksReader
from drivepercept.tracking.bytetrack import TrackParams
from drivepercept.tracking.fusion import FusionParams
from drivepercept.tracking.stage import REPLAY_HOLD_S, RigTracker
from drivepercept.types import (
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    ImageU8,
    Letterbox,
)
from drivepercept.types.objects import RigStep

Line = Mapping[str, Any]
FrameLookup = Callable[[str, float], ImageU8 | None]  # (camera, pts_s) -> the frame
_NO_TIMING = FrameTiming(*([0] * len(fields(FrameTiming))))


@dataclass(frozen=True)
class Retracked:
    """The detection lines with new `track_ids`, `velocities` and `global_ids` (in the
    input's order), the objects.jsonl lines of each rig step, how many detected frames
    had their pixels (`frames`: their boxes' looks read), and the time spent in the tracking
    stage (`stage_ns`: tracking, reading the looks, placing and fusing; not the lines'
    parsing nor the frames' decoding)."""

    detections: list[dict[str, Any]]
    objects: list[dict[str, Any]]
    batches: int
    with_pixels: int = 0
    stage_ns: int = 0


def _offsets(cameras: Sequence[str], spread_frames: int) -> dict[str, int]:
    """Camera -> how many frames behind camera 0 it is batched: 0..spread over the rig."""
    n = len(cameras)
    if n < 2:
        return {c: 0 for c in cameras}
    return {c: round(spread_frames * k / (n - 1)) for k, c in enumerate(cameras)}


def _class_names(lines: Sequence[Line]) -> tuple[str, ...]:
    """The model's class list as far as the lines show it (label index -> name)."""
    names: dict[int, str] = {}
    for line in lines:
        for label, name in zip(line.get("labels", []), line.get("class_names", []), strict=False):
            names.setdefault(int(label), str(name))
    count = max(names, default=-1) + 1
    return tuple(names.get(k, str(k)) for k in range(count))


def _detected(lines: Sequence[Line], cameras: Sequence[str], every: int) -> list[bool]:
    """Which lines keep their boxes with a detection interval of `every` frames: each
    camera's first frame, then every `every`-th of its frames (by frame_index), the cameras
    staggered by their order as the batcher does (`batching.Batcher`). A line that
    was predicted already (a run with an interval) is never taken for a detection."""
    order = {c: k for k, c in enumerate(cameras)}
    position: dict[int, int] = {}
    for camera in cameras:
        rows = [k for k, line in enumerate(lines) if str(line["camera"]) == camera]
        rows.sort(key=lambda k: int(lines[k]["frame_index"]))
        position |= {k: j for j, k in enumerate(rows)}
    out = []
    for k, line in enumerate(lines):
        j = position[k]
        due = detect_due(j, order[str(line["camera"])], every)
        out.append(due and not line.get("predicted", False))
    return out


def _result(
    line: Line,
    cam: CameraConfig,
    classes: tuple[str, ...],
    batch: int,
    detected: bool = True,
    image: ImageU8 | None = None,
) -> FrameResult:
    width, height = cam.size or (0, 0)
    box = Letterbox((width, height), (width, height), 1.0, 1.0, 0.0, 0.0)
    stamp = line.get("stamp_ns")
    meta = FrameMeta(
        camera=str(line["camera"]),
        camera_index=int(line.get("camera_index", 0)),
        frame_index=int(line["frame_index"]),
        pts_s=float(line["pts_s"]),
        capture_ns=0,
        decoded_ns=0,
        preprocessed_ns=0,
        letterbox=box,
        stamp_ns=None if stamp is None else int(stamp),
        original_bgr=image,
    )
    if not detected:  # the tracker answers it
        return FrameResult(meta, batch, 0, Detections.empty(classes, predicted=True), _NO_TIMING)
    xyxy = np.asarray(line.get("boxes", []), np.float32).reshape(-1, 4)
    detections = Detections(
        xyxy,
        np.asarray(line.get("scores", []), np.float32),
        np.asarray(line.get("labels", []), np.int64),
        classes,
    )
    return FrameResult(meta, batch, 0, detections, _NO_TIMING)


def retrack(
    rig: Path | str | Sequence[CameraConfig],
    lines: Iterable[Line],
    *,
    spread_frames: int = 0,
    params: TrackParams | None = None,
    fusion: FusionParams | None = None,
    hold_s: float = REPLAY_HOLD_S,
    detect_every: int = 1,
    frames: FrameLookup | None = None,
    looks: LooksReader | None = None,
) -> Retracked:
    """Track a run's detection lines again, with batches `spread_frames` apart.

    Args:
        rig: the rig file the run was made from (or its cameras): their geometry places
            objects, their sizes tell boxes cut by the image's side.
        lines: the run's detections.jsonl lines (camera, frame_index, pts_s, boxes,
            scores, labels, class_names).
        spread_frames: how many frames apart the cameras' frames of one batch are (>= 0).
        params, fusion: the tracking stage's settings (its defaults otherwise).
        hold_s: `RigTracker`'s: a replay's (rig steps by time), or 0 for live's (each
            batch one step).
        detect_every: keep the boxes of every n-th frame of each camera only (its first
            frame always, the cameras staggered) and let the tracker answer the others
            with its tracks moved on to their time (`"predicted": true` lines): what a
            detection interval costs in accuracy, on the same boxes.
        frames: each detected line's frame, `(camera, pts_s) -> BGR pixels or None`
            (`RecordedFrames`), asked for in each camera's time order: the boxes'
            looks are read from it, as in the replay (None, or no `frames`: motion alone).
        looks: the stage's `LooksReader` (None: the colours, read from `frames`); one that
            needs no pixels gives every detected frame its looks, `frames` or not.

    Raises:
        ConfigError: a negative spread, an interval below 1, a line of a camera the rig
            does not have, or a camera with geometry but no width and height (the lines do
            not carry the image size, and without it every box would count as cut by the
            image's side).
    """
    if isinstance(spread_frames, bool) or not isinstance(spread_frames, int) or spread_frames < 0:
        raise ConfigError(f"spread_frames must be an integer >= 0, got {spread_frames!r}")
    if isinstance(detect_every, bool) or not isinstance(detect_every, int) or detect_every < 1:
        raise ConfigError(f"detect_every must be an integer >= 1, got {detect_every!r}")
    cameras = list(load_rig(rig).cameras) if isinstance(rig, (str, Path)) else list(rig)
    by_name = {c.name: c for c in cameras}
    for cam in cameras:
        if cam.intrinsics is not None and cam.extrinsics is not None and cam.size is None:
            raise ConfigError(
                f"camera {cam.name!r} has geometry but no width and height in the rig: "
                "retrack needs its image size to tell boxes cut by the image's side"
            )
    kept = list(lines)
    classes = _class_names(kept)
    offsets = _offsets([c.name for c in cameras], spread_frames)
    batches: dict[int, list[int]] = {}
    for k, line in enumerate(kept):
        name = str(line["camera"])
        if name not in by_name:
            raise ConfigError(f"a detection line of camera {name!r}, which the rig has not")
        batches.setdefault(int(line["frame_index"]) + offsets[name], []).append(k)
    detected = _detected(kept, [c.name for c in cameras], detect_every)
    steps: list[RigStep] = []
    tracker = RigTracker(
        cameras, params=params, fusion=fusion, on_step=steps.append, hold_s=hold_s, looks=looks
    )
    out: list[dict[str, Any]] = [dict(line) for line in kept]
    row_of = {(str(line["camera"]), int(line["frame_index"])): k for k, line in enumerate(kept)}
    order = {c.name: i for i, c in enumerate(cameras)}

    def fill(tracked: list[FrameResult]) -> None:
        for result in tracked:
            det = result.detections
            line = out[row_of[(result.camera, result.frame_index)]]
            line["batch_index"] = result.batch_index
            if det.predicted:
                line["boxes"] = np.round(det.xyxy.astype(np.float64), 2).tolist()
                line["scores"] = np.round(det.scores.astype(np.float64), 4).tolist()
                line["labels"] = det.labels.tolist()
                line["class_names"] = det.names
                line["predicted"] = True
            line["track_ids"] = [] if det.track_ids is None else det.track_ids.tolist()
            if det.velocities is not None:
                line["velocities"] = [
                    [None if not np.isfinite(v) else round(float(v), 2) for v in row]
                    for row in det.velocities.tolist()
                ]
            if det.global_ids is not None:
                line["global_ids"] = det.global_ids.tolist()
            else:
                line.pop("global_ids", None)

    def pixels(line: Line) -> ImageU8 | None:
        if frames is None:
            return None
        return frames(str(line["camera"]), float(line["pts_s"]))

    with_pixels = 0
    for number, batch in enumerate(sorted(batches)):
        rows = sorted(batches[batch], key=lambda k: order[str(kept[k]["camera"])])
        results = [
            _result(
                kept[k],
                by_name[str(kept[k]["camera"])],
                classes,
                number,
                detected[k],
                pixels(kept[k]) if detected[k] else None,
            )
            for k in rows
        ]
        with_pixels += sum(r.original_bgr is not None for r in results)
        fill(tracker(results))
    fill(tracker.flush())
    return Retracked(
        out, [step_record(s) for s in steps], len(batches), with_pixels, tracker.track_ns
    )
