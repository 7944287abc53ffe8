"""Tracking as a pipeline stage: per-camera tracks, then the rig's object list.

`RigTracker` is called on the pipeline's completion thread with each batch's results, after
detection and before the outputs (so it never holds up the engine, whose next batch is
already running). The batch's boxes go through one `ByteTracker` (ByteTrack, each camera's
tracks its own, all of the batch's cameras in one pass) at each frame's own time (its stamp
or pts: frames a live camera dropped make a longer step, not a wrong one); the confirmed
tracks are placed on the ground and joined across cameras by `RigFusion`; the results come
back with `track_ids`, `velocities` and `global_ids` in their `Detections`, and the batch's
`RigStep` goes to `on_step` (objects.jsonl).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from drivepercept.rig import CameraConfig
from drivepercept.tracking.bytetrack import ByteTracker, TrackParams, TrackUpdate
from drivepercept.tracking.fusion import FusionParams, RigFusion
from drivepercept.tracking.places import Observation, cut_by_side
from drivepercept.tracking.track_table import CameraBoxes
from drivepercept.types import Detections, FrameResult
from drivepercept.types.objects import RigStep


def _timed(result: FrameResult) -> bool:
    """Whether a frame has a time: its stamp, else a finite pts."""
    return result.meta.stamp_ns is not None or math.isfinite(result.pts_s)


@dataclass(frozen=True)
class CameraTracks:
    """One camera's tracks over a run: how many, and how long they lasted (seconds)."""

    tracks: int
    lifetime_median_s: float
    lifetime_max_s: float


@dataclass(frozen=True)
class TrackingSummary:
    """What tracking did in a run: per camera its tracks, and the rig's objects."""

    cameras: dict[str, CameraTracks]
    rig_objects: int
    placed: bool  # whether the rig had geometry to place objects (else per camera only)


class RigTracker:
    """The tracking stage (see the module docstring). One thread calls it.

    Args:
        cameras: the rig's cameras, in order (their geometry places objects).
        params: the per-camera trackers' settings.
        fusion: the cross-camera join's settings.
        on_step: receives each batch's objects (only when the rig can place them).
    """

    def __init__(
        self,
        cameras: Sequence[CameraConfig],
        *,
        params: TrackParams | None = None,
        fusion: FusionParams | None = None,
        on_step: Callable[[RigStep], None] | None = None,
    ) -> None:
        self.params = params or TrackParams()
        self._tracker = ByteTracker(self.params)
        self._keys = {c.name: k for k, c in enumerate(cameras)}  # camera name -> tracker key
        self._last_t: dict[str, float] = {}
        self.fusion = RigFusion(cameras, fusion)
        self.on_step = on_step

    def _time(self, result: FrameResult) -> float:
        """The frame's time in seconds, strictly after its camera's previous frame's (a
        frame with no usable time, neither stamp nor finite pts, is a tiny step on too)."""
        last = self._last_t.get(result.camera)
        t = result.stamp_ns / 1e9 if _timed(result) else (last or 0.0) + 1e-6
        if last is not None and t <= last:  # a repeated or backwards pts: a tiny step on
            t = last + 1e-6
        self._last_t[result.camera] = t
        return t

    def _track(self, frames: list[CameraBoxes]) -> list[TrackUpdate]:
        """The tracker's answer for each frame: a batch holds one frame per camera, but a
        camera that comes twice is tracked in a second pass, after its first frame."""
        updates: list[TrackUpdate] = []
        start = 0
        for k, frame in enumerate(frames):
            if any(f.camera == frame.camera for f in frames[start:k]):
                updates += self._tracker.update(frames[start:k])
                start = k
        return updates + self._tracker.update(frames[start:])

    def __call__(self, results: list[FrameResult]) -> list[FrameResult]:
        frames = [
            CameraBoxes(
                self._keys.setdefault(r.camera, len(self._keys)),
                np.asarray(r.detections.xyxy, np.float64),
                np.asarray(r.detections.scores, np.float64),
                np.asarray(r.detections.labels),
                self._time(r),
            )
            for r in results
        ]
        updates = self._track(frames)
        observations = self._observations(results, frames, updates) if self.fusion.placing else []
        links: Mapping[tuple[str, int], int] | None = None
        if self.fusion.placing and results:
            k = max(range(len(results)), key=lambda i: frames[i].t_s)
            newest = results[k]
            links, objects = self.fusion.step(frames[k].t_s, observations)
            if self.on_step is not None:
                stamp_ns = newest.stamp_ns if _timed(newest) else round(frames[k].t_s * 1e9)
                self.on_step(RigStep(newest.frame_index, newest.pts_s, stamp_ns, objects))
        out = []
        for result, update in zip(results, updates, strict=True):
            ids = update.track_ids
            gids = None
            if links is not None:
                tracks = ids.tolist()
                gids = np.array([links.get((result.camera, t), -1) for t in tracks], np.int64)
            det = result.detections  # built directly: `dataclasses.replace` costs twice as much
            tracked = Detections(
                det.xyxy,
                det.scores,
                det.labels,
                det.class_names,
                track_ids=ids,
                velocities=update.velocities.astype(np.float32),
                global_ids=gids,
            )
            out.append(
                FrameResult(
                    meta=result.meta,
                    batch_index=result.batch_index,
                    batch_size=result.batch_size,
                    detections=tracked,
                    timing=result.timing,
                )
            )
        return out

    def _observations(
        self,
        results: Sequence[FrameResult],
        frames: Sequence[CameraBoxes],
        updates: Sequence[TrackUpdate],
    ) -> list[Observation]:
        """The frames' confirmed tracks placed on the ground (those that can be), all at
        once (only confirmed tracks are placed and joined)."""
        kept = []
        cameras: list[str] = []
        names: list[str] = []
        ids: list[int] = []
        widths: list[int] = []
        times: list[float] = []
        for result, frame, update in zip(results, frames, updates, strict=True):
            keep = (update.track_ids >= 0).nonzero()[0]
            if not len(keep):
                continue
            frame_names = result.detections.names
            kept_names = [frame_names[k] for k in keep.tolist()]
            size = result.meta.letterbox.src_size
            kept.append((result.camera, frame.xyxy[keep], size, kept_names))
            cameras += [result.camera] * len(keep)
            names += kept_names
            ids += update.track_ids[keep].tolist()
            widths += [size[0]] * len(keep)
            times += [frame.t_s] * len(keep)
        if not kept:
            return []
        xy = np.concatenate(self.fusion.ground.place_all(kept))
        boxes = np.concatenate([k[1] for k in kept])
        cut: list[bool] = cut_by_side(boxes, np.array(widths, np.float64)).tolist()
        placed: list[bool] = np.isfinite(xy).all(axis=1).astype(np.bool_).tolist()
        return [
            Observation(camera, track, name, (box[0], box[1], box[2], box[3]), (x, y), cut_, t)
            for camera, track, name, box, (x, y), cut_, t, ok in zip(
                cameras, ids, names, boxes.tolist(), xy.tolist(), cut, times, placed, strict=True
            )
            if ok
        ]

    def summary(self) -> TrackingSummary:
        """Tracks per camera and their lifetimes, and the rig's objects, so far."""
        cameras = {}
        for name, key in self._keys.items():
            lifetimes = list(self._tracker.lifetimes_s(key))
            cameras[name] = CameraTracks(
                tracks=len(lifetimes),
                lifetime_median_s=round(statistics.median(lifetimes), 3) if lifetimes else 0.0,
                lifetime_max_s=round(max(lifetimes), 3) if lifetimes else 0.0,
            )
        return TrackingSummary(cameras, self.fusion.objects_made, self.fusion.placing)
