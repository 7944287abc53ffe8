"""Trackers run on a run's boxes, each camera alone, frames in order: the peers (Roboflow
`trackers`, supervision's `sv.ByteTrack`), our own `CameraTracker` again, and the
re-tracking of `drivepercept.run.retrack`. Each gives detection lines with
its `track_ids` (and, ours, `global_ids`), scored like the run's own."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from _bench_trackers.inputs import Drive, Line, by_camera
from drivepercept.eval.tracking import box_iou, match
from drivepercept.rig import CameraConfig, load_rig
from drivepercept.run.recorded_frames import RecordedFrames
from drivepercept.tracking.appearance import DIM, LooksReader, box_features
from drivepercept.tracking.bytetrack import TrackParams
from drivepercept.tracking.camera_tracker import CameraTracker
from drivepercept.tracking.track_table import KindKeys

IntArray = npt.NDArray[np.int64]
INDEX_KEY = "bench_index"  # the input box's index, carried through sv.Detections.data
SAME_BOX_IOU = 0.99  # a peer's output box is an input box at least this alike
LOST_BUFFER_FPS = 30.0  # the trackers' lost_track_buffer counts frames at 30 frames/s


@dataclass(frozen=True)
class Tracked:
    """One tracker's output on a run's boxes.

    Attributes:
        name: the table's row label.
        lines: detection lines with its `track_ids` (and `global_ids` where it makes them).
        objects: objects.jsonl lines (the rig's placed objects), where it makes them.
        settings: what it was given, besides the boxes.
        notes: what to know when reading its figures.
        frame_ns: time of each camera frame's update (empty: not measured here).
    """

    name: str
    lines: list[Line]
    objects: list[Line] = field(default_factory=list)
    settings: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    frame_ns: tuple[int, ...] = ()

    @property
    def frame_ms(self) -> float | None:
        return float(np.mean(self.frame_ns)) / 1e6 if self.frame_ns else None

    @property
    def frame_p50_ms(self) -> float | None:
        return float(np.median(self.frame_ns)) / 1e6 if self.frame_ns else None


def ids_for_inputs(
    n_inputs: int,
    out_ids: Sequence[int] | IntArray,
    *,
    out_index: Sequence[int] | IntArray | None = None,
    in_boxes: object = None,
    out_boxes: object = None,
    min_iou: float = SAME_BOX_IOU,
) -> IntArray:
    """A tracker's ids given back to its input boxes: by the input index its output carries
    (`out_index`), else each output box to the input box it matches one-to-one at IoU >=
    `min_iou`. Inputs it did not output (or output without an id) get -1.

    Raises:
        ValueError: an output index out of range or given twice.
    """
    ids = np.full(n_inputs, -1, np.int64)
    out = np.asarray(out_ids, np.int64).reshape(-1)
    if out_index is not None:
        index = np.asarray(out_index, np.int64).reshape(-1)
        if len(index) != len(out):
            raise ValueError(f"expected {len(out)} output indices, got {len(index)}")
        if len(set(index.tolist())) != len(index) or ((index < 0) | (index >= n_inputs)).any():
            raise ValueError(f"output indices must be distinct in [0, {n_inputs}), got {index}")
        ids[index] = out
        return ids
    a = np.asarray(in_boxes, np.float64).reshape(-1, 4)
    b = np.asarray(out_boxes, np.float64).reshape(-1, 4)
    for r, c in match(box_iou(a, b), min_iou):
        ids[r] = out[c]
    return ids


def relabelled(line: Line, track_ids: Sequence[int] | IntArray) -> Line:
    """`line` with a tracker's `track_ids` and without our tracker's other fields."""
    out = {k: v for k, v in line.items() if k not in ("global_ids", "velocities")}
    out["track_ids"] = [int(t) for t in track_ids]
    return out


def frame_arrays(line: Line) -> tuple[np.ndarray, np.ndarray, IntArray]:
    """A line's boxes (N, 4), scores (N,) and class ids (N,)."""
    boxes = np.asarray(line.get("boxes", []), np.float64).reshape(-1, 4)
    scores = np.asarray(line.get("scores", []), np.float64).reshape(-1)
    labels = np.asarray(line.get("labels", [0] * len(scores)), np.int64).reshape(-1)
    return boxes, scores, labels


# --------------------------------------------------------------------------- peers


def _lost_buffer(p: TrackParams) -> int:
    return round(p.lost_s * LOST_BUFFER_FPS)


@dataclass(frozen=True)
class PeerSpec:
    """One open-source tracker: where it lives, how it is called, and its settings matched
    to ours (`TrackParams`) where one of its parameters means the same."""

    key: str
    label: str
    module: str  # the distribution and module it comes from
    attribute: str  # its class
    method: str  # its per-frame call
    matched: Callable[[TrackParams], dict[str, Any]]
    video_frames: bool = False  # its default camera-motion compensation reads the frames
    notes: tuple[str, ...] = ()


PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        "sort",
        "trackers SORT",
        "trackers",
        "SORTTracker",
        "update",
        lambda p: {
            "track_activation_threshold": p.new_track_score,
            "minimum_consecutive_frames": p.min_hits,
            "minimum_iou_threshold": p.match_iou,
            "lost_track_buffer": _lost_buffer(p),
        },
        notes=("one association over every box, whatever its score",),
    ),
    PeerSpec(
        "bytetrack",
        "trackers ByteTrack",
        "trackers",
        "ByteTrackTracker",
        "update",
        lambda p: {
            "track_activation_threshold": p.new_track_score,
            "high_conf_det_threshold": p.high_score,
            "minimum_iou_threshold": p.match_iou,
            "minimum_consecutive_frames": p.min_hits,
            "lost_track_buffer": _lost_buffer(p),
        },
        notes=(
            "one IoU threshold for both associations; every box below the high "
            "threshold is a low box (no 0.1 floor)",
        ),
    ),
    PeerSpec(
        "ocsort",
        "trackers OC-SORT",
        "trackers",
        "OCSORTTracker",
        "update",
        lambda p: {
            "high_conf_det_threshold": p.high_score,
            "minimum_iou_threshold": p.match_iou,
            "minimum_consecutive_frames": p.min_hits,
            "lost_track_buffer": _lost_buffer(p),
        },
        notes=("boxes below the high threshold are not used at all",),
    ),
    PeerSpec(
        "botsort",
        "trackers BoT-SORT",
        "trackers",
        "BoTSORTTracker",
        "update",
        lambda p: {
            "track_activation_threshold": p.new_track_score,
            "high_conf_det_threshold": p.high_score,
            "minimum_iou_threshold_first_assoc": p.match_iou,
            "minimum_iou_threshold_second_assoc": p.second_match_iou,
            "minimum_iou_threshold_unconfirmed_assoc": p.unconfirmed_match_iou,
            "minimum_consecutive_frames": p.min_hits,
            "lost_track_buffer": _lost_buffer(p),
        },
        video_frames=True,
        notes=(
            "its IoU thresholds apply to IoU x score; camera-motion compensation "
            "(its default, sparse optical flow) on the drive's decoded frames",
        ),
    ),
    PeerSpec(
        "cbiou",
        "trackers C-BIoU",
        "trackers",
        "CBIoUTracker",
        "update",
        lambda p: {
            "track_activation_threshold": p.new_track_score,
            "high_conf_det_threshold": p.high_score,
            "minimum_iou_threshold_first_assoc": p.match_iou,
            "minimum_iou_threshold_second_assoc": p.second_match_iou,
            "minimum_iou_threshold_unconfirmed_assoc": p.unconfirmed_match_iou,
            "minimum_consecutive_frames": p.min_hits,
            "lost_track_buffer": _lost_buffer(p),
        },
        notes=("its IoU thresholds apply to buffered IoU x score",),
    ),
    PeerSpec(
        "sv-bytetrack",
        "supervision sv.ByteTrack",
        "supervision",
        "ByteTrack",
        "update_with_detections",
        lambda p: {
            # its high/low split; it starts tracks from this + 0.1 (ours: new_track_score)
            "track_activation_threshold": round(p.new_track_score - 0.1, 6),
            # a cost: 1 - IoU x score
            "minimum_matching_threshold": round(1.0 - p.match_iou, 6),
            "minimum_consecutive_frames": p.min_hits,
            "lost_track_buffer": _lost_buffer(p),
        },
        notes=(
            "deprecated since supervision 0.28, removed in 0.31 (the venv keeps "
            "supervision<0.31); it outputs only the boxes it tracks",
        ),
    ),
)
PEER_KEYS = tuple(p.key for p in PEERS)


def peer_available(spec: PeerSpec) -> str | None:
    """Why `spec` cannot run in this interpreter (None: it can)."""
    if importlib.util.find_spec(spec.module) is None:
        return f"{spec.module} is not importable"
    if not hasattr(importlib.import_module(spec.module), spec.attribute):
        version = importlib.metadata.version(spec.module)
        return f"{spec.module} {version} has no {spec.attribute}"
    return None


def peer_version(spec: PeerSpec) -> str:
    return f"{spec.module} {importlib.metadata.version(spec.module)}"


def _video_frames(camera: str, video: Path | None) -> RecordedFrames | None:
    """A camera's video read forward by the project's own readers, its frames found by the
    lines' times (BoT-SORT's motion compensation; our looks); None where there is no
    video."""
    if video is None or not video.is_file():
        return None
    return RecordedFrames([CameraConfig(name=camera, video=video)])


def run_peer(
    spec: PeerSpec,
    drive: Drive,
    lines: Sequence[Line],
    *,
    settings: str,
    params: TrackParams,
) -> Tracked:
    """`spec` over every camera's lines (a fresh tracker a camera), its ids turned into lines.

    Args:
        settings: "matched" (frame rate and thresholds matched to `params`) or "defaults"
            (its documented defaults but the drive's frame rate).
    """
    module = importlib.import_module(spec.module)
    sv = importlib.import_module("supervision")
    make = getattr(module, spec.attribute)
    out: list[Line] = []
    frame_ns: list[int] = []
    given: dict[str, Any] = {}
    notes = list(spec.notes)
    by_iou = 0  # frames whose output had lost the input index
    for cam, cam_lines in by_camera(lines).items():
        fps = drive.fps.get(cam, 15.0)
        kwargs: dict[str, Any] = {"frame_rate": fps}
        if settings == "matched":
            kwargs |= spec.matched(params)
        given = kwargs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # sv.ByteTrack's deprecation
            tracker = make(**kwargs)
        step = getattr(tracker, spec.method)
        frames = _video_frames(cam, drive.videos.get(cam)) if spec.video_frames else None
        if spec.video_frames and frames is None:
            notes.append(f"{cam}: no video, no motion compensation")
        try:
            for line in cam_lines:
                boxes, scores, labels = frame_arrays(line)
                det = sv.Detections(
                    xyxy=boxes,
                    confidence=scores,
                    class_id=labels,
                    data={INDEX_KEY: np.arange(len(scores))},
                )
                call: dict[str, Any] = {}
                if frames is not None:
                    call["frame"] = frames(cam, float(line.get("pts_s", -1.0)))
                t0 = time.perf_counter_ns()
                result = step(det, **call)
                frame_ns.append(time.perf_counter_ns() - t0)
                ids, by_index = _peer_ids(result, boxes)
                by_iou += not by_index
                out.append(relabelled(line, ids))
        finally:
            if frames is not None:
                frames.close()
    if by_iou:
        notes.append(f"{by_iou} frames' ids given back by IoU >= {SAME_BOX_IOU} (no index kept)")
    return Tracked(
        name=spec.label if settings == "matched" else f"{spec.label} (defaults)",
        lines=out,
        settings={"version": peer_version(spec), **given},
        notes=tuple(notes),
        frame_ns=tuple(frame_ns),
    )


def _peer_ids(result: Any, boxes: np.ndarray) -> tuple[IntArray, bool]:
    """A peer's `sv.Detections` output as an id per input box, and whether the index its
    output carried gave them back (else IoU did)."""
    ids = np.asarray(result.tracker_id if result.tracker_id is not None else [], np.int64)
    data = getattr(result, "data", None) or {}
    if INDEX_KEY in data and len(data[INDEX_KEY]) == len(ids):
        return ids_for_inputs(len(boxes), ids, out_index=data[INDEX_KEY]), True
    return ids_for_inputs(len(boxes), ids, in_boxes=boxes, out_boxes=result.xyxy), not len(ids)


# --------------------------------------------------------------------------- ours


def run_ours(drive: Drive, lines: Sequence[Line], params: TrackParams) -> Tracked:
    """Our `CameraTracker` again, each camera alone, on the run's boxes (timed here like the
    peers; its ids should be the run's own when the tracker has not changed since). Its
    boxes' looks are read from the camera's video where the drive has it, as the run read
    them from the frames it decoded (the time to read them is not in the tracker's time)."""
    out: list[Line] = []
    frame_ns: list[int] = []
    looked = 0
    kinds_of = KindKeys(params)  # a box's kind from its class name, as the stage gives it
    for cam, cam_lines in by_camera(lines).items():
        tracker = CameraTracker(params)
        fps = drive.fps.get(cam, 15.0)
        frames = _video_frames(cam, drive.videos.get(cam))
        try:
            for line in cam_lines:
                boxes, scores, labels = frame_arrays(line)
                t_s = float(line.get("pts_s", int(line["frame_index"]) / fps))
                image = frames(cam, t_s) if frames is not None else None
                features = None
                if image is not None:
                    features = np.zeros((len(scores), DIM), np.float32)
                    used = scores >= params.low_score  # (as the tracking stage reads them)
                    features[used] = box_features(image, boxes[used])
                    looked += 1
                names = line.get("class_names")
                kinds = None
                if isinstance(names, list) and len(names) == len(labels):
                    kinds = kinds_of([str(n) for n in names])
                t0 = time.perf_counter_ns()
                update = tracker.update(boxes, scores, labels, t_s, features=features, kinds=kinds)
                frame_ns.append(time.perf_counter_ns() - t0)
                out.append(relabelled(line, update.track_ids.tolist()))
        finally:
            if frames is not None:
                frames.close()
    notes = ["today's tracker code on the run's boxes, per camera, no cross-camera fusion"]
    notes.append(
        f"looks read from the drive's videos for {looked} of {len(out)} frames"
        if looked
        else "no videos: motion alone (the run had the looks)"
    )
    return Tracked(
        name="ours, CameraTracker re-run",
        lines=out,
        settings=dict(vars(params)),
        notes=tuple(notes),
        frame_ns=tuple(frame_ns),
    )


def run_retrack(
    drive: Drive,
    lines: Sequence[Line],
    *,
    params: TrackParams | None = None,
    looks: LooksReader | None = None,
    pixels: bool = True,
    name: str = "ours re-tracked",
) -> Tracked:
    """`drivepercept.run.retrack.retrack(rig.toml, lines, spread_frames=0)`: the run's boxes
    tracked again, offline, with global ids and placed objects; each frame's pixels from the
    drive's videos where it has them all (`RecordedFrames`: the looks, as the run read them;
    the ids then are the run's own), else on motion alone. `params` and `looks` go to the
    stage (its defaults: None); `pixels=False` re-tracks on motion alone (or on `looks`
    that need no pixels)."""
    from drivepercept.run.retrack import retrack

    cameras = load_rig(drive.rig_toml).cameras if drive.rig_toml.is_file() else ()
    videos = bool(cameras) and all(c.video is not None and c.video.is_file() for c in cameras)
    videos &= pixels
    kept = [dict(x) for x in lines]
    if videos:  # (every rig camera's: RecordedFrames opens them all)
        with RecordedFrames(cameras) as frames:
            result = retrack(
                drive.rig_toml, kept, spread_frames=0, params=params, frames=frames, looks=looks
            )
    else:
        result = retrack(drive.rig_toml, kept, spread_frames=0, params=params, looks=looks)
    per_frame = result.stage_ns // max(1, len(lines))  # the stage's own time
    if videos:
        seen = (
            f"looks read from the drive's videos for {result.with_pixels} of {len(lines)} "
            "frames (their decoding not in the time, the reading of the looks in it)"
        )
    elif looks is not None and not looks.needs_pixels:
        seen = "no pixels: the looks of the reader given"
    elif not pixels:
        seen = "no pixels asked for: motion alone"
    else:
        seen = "no videos: motion alone (the run had the looks)"
    return Tracked(
        name=name,
        lines=list(result.detections),
        objects=list(result.objects),
        settings={"retrack": "drivepercept.run.retrack.retrack", "spread_frames": 0},
        notes=("the whole rig at once; time per frame is its total over the camera frames", seen),
        frame_ns=(per_frame,) * len(lines),
    )


def iter_specs(keys: Sequence[str]) -> Iterator[PeerSpec]:
    """The peers named, in the table's order."""
    for spec in PEERS:
        if spec.key in keys:
            yield spec
