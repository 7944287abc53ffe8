"""Tracking as a pipeline stage: per-camera tracks, then the rig's object list.

`RigTracker` is called on the pipeline's completion thread with each batch's results, after
detection and before the outputs (so it never holds up the engine, whose next batch is
already running). Each camera's boxes go through its own `CameraTracker` (ByteTrack) at the
frame's own time (its stamp or pts: frames a live camera dropped make a longer step, not a
wrong one); the confirmed tracks are placed on the ground and joined across cameras by
`RigFusion`; the results come back with `track_ids`, `velocities` and `global_ids` in their
`Detections`, and the batch's `RigStep` goes to `on_step` (objects.jsonl).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from drivepercept.rig import CameraConfig
from drivepercept.tracking.bytetrack import CameraTracker, TrackParams
from drivepercept.tracking.fusion import FusionParams, Observation, RigFusion
from drivepercept.types import Detections, FrameResult
from drivepercept.types.objects import RigStep


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
        self._trackers = {c.name: CameraTracker(self.params) for c in cameras}
        self._last_t: dict[str, float] = {}
        self.fusion = RigFusion(cameras, fusion)
        self.on_step = on_step

    def _time(self, result: FrameResult) -> float:
        """The frame's time in seconds, strictly after its camera's previous frame's."""
        t = result.stamp_ns / 1e9
        last = self._last_t.get(result.camera)
        if last is not None and t <= last:  # a repeated or backwards pts: a tiny step on
            t = last + 1e-6
        self._last_t[result.camera] = t
        return t

    def __call__(self, results: list[FrameResult]) -> list[FrameResult]:
        tracked: list[tuple[FrameResult, Detections]] = []
        observations: list[Observation] = []
        for result in results:
            det = result.detections
            tracker = self._trackers.setdefault(result.camera, CameraTracker(self.params))
            boxes = np.asarray(det.xyxy, np.float64)
            update = tracker.update(
                boxes, np.asarray(det.scores, np.float64), det.labels, self._time(result)
            )
            ids = np.asarray(update.track_ids, np.int64)
            moves = np.asarray(update.velocities, np.float32)
            tracked.append((result, dataclasses.replace(det, track_ids=ids, velocities=moves)))
            if not self.fusion.placing or not (ids >= 0).any():
                continue
            size = result.meta.letterbox.src_size
            names = det.names
            keep = np.flatnonzero(ids >= 0)  # only confirmed tracks are placed and joined
            kept = boxes[keep]
            xy = self.fusion.place(result.camera, kept, size, [names[k] for k in keep])
            cut = self.fusion.truncated(kept, size)
            for j, k in enumerate(keep.tolist()):
                if not np.isfinite(xy[j]).all():
                    continue
                box = kept[j].tolist()
                observations.append(
                    Observation(
                        camera=result.camera,
                        track_id=int(ids[k]),
                        class_name=names[k],
                        xyxy=(box[0], box[1], box[2], box[3]),
                        xy=(float(xy[j, 0]), float(xy[j, 1])),
                        truncated=bool(cut[j]),
                    )
                )
        if not self.fusion.placing or not results:
            return [dataclasses.replace(r, detections=d) for r, d in tracked]
        newest = max(results, key=lambda r: r.stamp_ns)
        links, objects = self.fusion.step(newest.stamp_ns / 1e9, observations)
        out = []
        for result, det in tracked:
            assert det.track_ids is not None
            gids = np.array(
                [links.get((result.camera, int(t)), -1) for t in det.track_ids.tolist()],
                np.int64,
            )
            out.append(
                dataclasses.replace(result, detections=dataclasses.replace(det, global_ids=gids))
            )
        if self.on_step is not None:
            self.on_step(RigStep(newest.frame_index, newest.pts_s, newest.stamp_ns, objects))
        return out

    def summary(self) -> TrackingSummary:
        """Tracks per camera and their lifetimes, and the rig's objects, so far."""
        cameras = {}
        for name, tracker in self._trackers.items():
            lifetimes = list(tracker.lifetimes_s())
            cameras[name] = CameraTracks(
                tracks=len(lifetimes),
                lifetime_median_s=round(statistics.median(lifetimes), 3) if lifetimes else 0.0,
                lifetime_max_s=round(max(lifetimes), 3) if lifetimes else 0.0,
            )
        return TrackingSummary(cameras, self.fusion.objects_made, self.fusion.placing)
