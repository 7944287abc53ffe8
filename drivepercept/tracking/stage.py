"""Tracking as a pipeline stage: per-camera tracks, then the rig's object list.

`RigTracker` is called on the pipeline's completion thread with each batch's results, after
detection and before the outputs (so it never holds up the engine, whose next batch is
already running). The batch's boxes go through one `ByteTracker` (ByteTrack, each camera's
tracks its own, all of the batch's cameras in one pass) at each frame's own time (its stamp
or pts: frames a live camera dropped make a longer step, not a wrong one); the confirmed
tracks are placed on the ground and joined across cameras by `RigFusion`; the results come
back with `track_ids`, `velocities` and `global_ids` in their `Detections`, and the batch's
`RigStep` goes to `on_step` (objects.jsonl). A step older than the last one written (live: a
frame the model was late with, behind other cameras' frames answered at their deadline,
`overdue`) updates the objects but writes no line: objects.jsonl stays in time order.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError
from drivepercept.rig import CameraConfig
from drivepercept.tracking.appearance import (
    ColourLooks,
    Features,
    LooksReader,
    LooksRequest,
    read_looks,
)
from drivepercept.tracking.bytetrack import ByteTracker, TrackParams, TrackUpdate
from drivepercept.tracking.fusion import FusionParams, RigFusion
from drivepercept.tracking.places import Observation, cut_by_side
from drivepercept.tracking.track_table import CameraBoxes, IntArray, KindKeys
from drivepercept.tracking.track_types import CameraTracks, TrackingSummary
from drivepercept.types import Detections, FrameResult
from drivepercept.types.objects import RigStep

MAX_HOLD_S = 10.0
REPLAY_HOLD_S = 2.0  # a replay's frames wait at most this long (frame time) for their step
MAX_HELD_FRAMES = 64  # at most this many tracked frames wait for their rig step (each may
# carry its pixels until handed on, the looks' or a video's: not hundreds for a stalled camera)
_DEFAULT_PERIOD_S = 0.1  # a rig step's width before any camera's frame interval is known
_MIN_PERIOD_S = 1e-3  # intervals shorter than this (a repeated stamp) say nothing of the rate
STALE_S = 1.0  # tracks older than this (no detected frame since) predict nothing (`overdue`)
MAX_ANSWERED = 1024  # frames answered early whose boxes are still to come, at most


def _with_ids(
    result: FrameResult,
    track_ids: IntArray | None,
    velocities: npt.NDArray[np.float32] | None,
    global_ids: IntArray | None = None,
) -> FrameResult:
    """The result with these identities (the pipeline stamps when it is handed on)."""
    det = result.detections  # built directly: `dataclasses.replace` costs twice as much
    tracked = Detections(
        det.xyxy,
        det.scores,
        det.labels,
        det.class_names,
        track_ids=track_ids,
        velocities=velocities,
        global_ids=global_ids,
        predicted=det.predicted,
    )
    return FrameResult(result.meta, result.batch_index, result.batch_size, tracked, result.timing)


def _timed(result: FrameResult) -> bool:
    """Whether a frame has a time: its stamp, else a finite pts."""
    return result.meta.stamp_ns is not None or math.isfinite(result.pts_s)


@dataclass(frozen=True)
class _Held:
    """A tracked frame waiting for its rig step (`RigTracker`'s `hold_s`)."""

    t_s: float
    result: FrameResult  # as detected: its ids are added when it is fused
    ids: IntArray
    velocities: npt.NDArray[np.float32]
    observations: list[Observation]


class RigTracker:
    """The tracking stage (see the module docstring). One thread calls it.

    Args:
        cameras: the rig's cameras, in order (their geometry places objects).
        params: the per-camera trackers' settings.
        fusion: the cross-camera join's settings.
        on_step: receives each rig step's objects (only when the rig can place them).
        appearance: tell objects apart by their looks too (`appearance.box_features` of
            each detected frame's boxes, read from its original pixels: the pipeline keeps
            them for the stage, `wants_images`, and drops them after it unless a sink wants
            them). A frame without its pixels (offline re-tracking of boxes) is tracked by
            motion alone.
        looks: where the looks come from (`appearance.LooksReader`; None: the colours,
            `ColourLooks`). One that does not need pixels is asked for every detected frame.
        hold_s: 0 (live): each batch is one rig step, its frames placed at their own
            times. More (replay): rig steps are formed by time, not by batch: a tracked
            frame waits until every camera has delivered a frame at least as new (or until
            it is `hold_s` older than the newest), and the frames released are fused in time
            order, frames less than one frame period apart and one per camera a step. The
            objects then do not depend on which frames the batcher happened to put together;
            with batches in time order nothing waits. `flush` releases what is held.
    """

    def __init__(
        self,
        cameras: Sequence[CameraConfig],
        *,
        params: TrackParams | None = None,
        fusion: FusionParams | None = None,
        on_step: Callable[[RigStep], None] | None = None,
        hold_s: float = 0.0,
        appearance: bool = True,
        looks: LooksReader | None = None,
    ) -> None:
        if not (math.isfinite(hold_s) and 0.0 <= hold_s <= MAX_HOLD_S):
            raise ConfigError(f"hold_s must be in [0, {MAX_HOLD_S:g}] seconds, got {hold_s!r}")
        self.params = params or TrackParams()
        self._tracker = ByteTracker(self.params)
        self._keys = {c.name: k for k, c in enumerate(cameras)}  # camera name -> tracker key
        self._kinds = KindKeys(self.params)  # class names -> their kinds' keys
        self._last_t: dict[str, float] = {}
        self.fusion = RigFusion(cameras, fusion)
        self.on_step = on_step
        self.hold_s = hold_s
        self.appearance = appearance
        self.looks: LooksReader = looks if looks is not None else ColourLooks()
        self._held: list[_Held] = []
        self._step_s = -math.inf  # the time of the last rig step given to on_step
        self._answered: dict[tuple[str, int], float] = {}  # (camera, frame) -> time (`overdue`)
        self._period: dict[str, float] = {}  # each camera's latest frame interval
        self.track_ns = 0  # time spent in the stage (tracking, placing, fusing)
        self.cpu_ns = 0  # the calling thread's CPU time in it (the rest: waiting for cores, GIL)
        self.frames = 0

    @property
    def wants_images(self) -> bool:
        """Whether the stage reads the original pixels of the frames the model saw."""
        return self.appearance and self.looks.needs_pixels

    def _time(self, result: FrameResult) -> float:
        """The frame's time in seconds, strictly after its camera's previous frame's (a
        frame with no usable time, neither stamp nor finite pts, is a tiny step on too)."""
        last = self._last_t.get(result.camera)
        t = result.stamp_ns / 1e9 if _timed(result) else (last or 0.0) + 1e-6
        if last is not None and t <= last:  # a repeated or backwards pts: a tiny step on
            t = last + 1e-6
        if last is not None and t - last >= _MIN_PERIOD_S:
            self._period[result.camera] = t - last
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

    def _predicted(
        self, results: list[FrameResult], frames: list[CameraBoxes]
    ) -> tuple[list[FrameResult], list[CameraBoxes], list[TrackUpdate]]:
        """A batch with frames that were not detected: the detected ones tracked, then each
        other one answered with its camera's tracks moved on to its time (`predict`; a
        camera with no tracks yet gets none), as results, frames and updates in order."""
        detected = [k for k, r in enumerate(results) if not r.detections.predicted]
        tracked = self._track([frames[k] for k in detected])
        updates: list[TrackUpdate | None] = [None] * len(results)
        for k, update in zip(detected, tracked, strict=True):
            updates[k] = update
        results, frames = list(results), list(frames)
        for k, result in enumerate(results):
            if updates[k] is not None:
                continue
            frame = frames[k]
            guess = self._tracker.predict(frame.camera, frame.t_s)
            det = result.detections
            boxes = Detections(
                guess.xyxy.astype(np.float32),
                guess.scores.astype(np.float32),
                guess.labels,
                det.class_names,
                predicted=True,
            )
            results[k] = FrameResult(
                result.meta, result.batch_index, result.batch_size, boxes, result.timing
            )
            frames[k] = CameraBoxes(frame.camera, guess.xyxy, guess.scores, guess.labels, frame.t_s)
            updates[k] = TrackUpdate(guess.track_ids, guess.velocities)
        return results, frames, [u for u in updates if u is not None]

    @contextmanager
    def _clocked(self, frames: int = 0) -> Iterator[None]:
        """The block's wall and thread CPU time added to the stage's, and its `frames`."""
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            self.track_ns += time.perf_counter_ns() - wall
            self.cpu_ns += time.thread_time_ns() - cpu
            self.frames += frames

    def __call__(self, results: list[FrameResult]) -> list[FrameResult]:
        with self._clocked(len(results)):
            return self._call(results)

    def overdue(self, results: list[FrameResult]) -> list[FrameResult]:
        """Frames the model is late with (predicted, empty; live only: a replay's rig steps
        wait for time anyway): each whose camera has tracks to predict from (a detected
        frame within `STALE_S` before it) answered now from them, as a frame the scheduler
        chose not to detect. When their boxes come (`__call__`), they only update the
        tracks: these frames are not answered twice."""
        if self.hold_s:
            return []
        fresh = []
        for r in results:
            key = self._keys.get(r.camera)
            last = None if key is None else self._tracker.last_update_s(key)
            if last is not None and _timed(r) and r.stamp_ns / 1e9 - last <= STALE_S:
                fresh.append(r)
        if not fresh:
            return []
        with self._clocked():  # (their frames are counted when their boxes come)
            out = self._call(fresh)
        for r in fresh:  # (each is timed: its own time, for when its boxes come)
            self._answered[(r.camera, r.frame_index)] = r.stamp_ns / 1e9
        while len(self._answered) > MAX_ANSWERED:  # boxes that never came (a failed batch)
            del self._answered[next(iter(self._answered))]
        return out

    def _looks(self, results: Sequence[FrameResult]) -> list[Features | None]:
        """Each detected frame's boxes' looks (`looks`: by default read from its pixels;
        those under `low_score`: not read), a batch in one call; None: no pixels where the
        reader needs them, a predicted frame, or not looking."""
        out: list[Features | None] = [None] * len(results)
        pixels = self.looks.needs_pixels
        seen = [
            (k, r, (np.asarray(r.detections.scores) >= self.params.low_score).nonzero()[0])
            for k, r in enumerate(results)
            if self.appearance
            and not r.detections.predicted
            and (not pixels or r.original_bgr is not None)
        ]
        asked = [
            LooksRequest(r.camera, r.frame_index, r.original_bgr, r.detections.xyxy[used])
            for _, r, used in seen
        ]
        sizes = [len(r.detections) for _, r, _ in seen]
        read = read_looks(self.looks, asked, [used for _, _, used in seen], sizes)
        for (k, _, _), looks in zip(seen, read, strict=True):
            out[k] = looks
        return out

    def _boxes(self, result: FrameResult, t_s: float, looks: Features | None) -> CameraBoxes:
        """A frame's boxes as the tracker takes them, at `t_s`, with their `looks`."""
        det = result.detections
        return CameraBoxes(
            self._keys.setdefault(result.camera, len(self._keys)),
            np.asarray(det.xyxy, np.float64),
            np.asarray(det.scores, np.float64),
            np.asarray(det.labels),
            t_s,
            looks,
            self._kinds(det.names),
        )

    def _late(self, results: list[FrameResult]) -> list[FrameResult]:
        """The frames not answered yet; the tracks take the boxes of those answered
        (`overdue`) that the model saw, at their own times."""
        answered = [r for r in results if (r.camera, r.frame_index) in self._answered]
        if not answered:
            return results
        late = []  # a frame the model did not see has nothing new for the tracks
        for r in answered:
            t_s = self._answered.pop((r.camera, r.frame_index))
            if not r.detections.predicted:
                boxes = self._boxes(r, t_s, self._looks([r])[0])
                last = self._tracker.last_update_s(boxes.camera)  # (a repeated stamp: on)
                late.append(
                    boxes if last is None or t_s > last else replace(boxes, t_s=last + 1e-6)
                )
        if late:
            self._track(late)
        return [r for r in results if not any(r is x for x in answered)]

    def _call(self, results: list[FrameResult]) -> list[FrameResult]:
        if self._answered:
            results = self._late(results)
            if not results:
                return []
        looks = self._looks(results)
        frames = [self._boxes(r, self._time(r), f) for r, f in zip(results, looks, strict=True)]
        if any(r.detections.predicted for r in results):
            results, frames, updates = self._predicted(results, frames)
        else:
            updates = self._track(frames)
        velocities = [u.velocities.astype(np.float32) for u in updates]
        if not self.fusion.placing:
            return [
                _with_ids(r, u.track_ids, v)
                for r, u, v in zip(results, updates, velocities, strict=True)
            ]
        observations = self._observations(results, frames, updates)
        if self.hold_s == 0.0:  # live: the batch is the step, its observations all at once
            step = [
                _Held(f.t_s, r, u.track_ids, v, [])
                for f, r, u, v in zip(frames, results, updates, velocities, strict=True)
            ]
            return self._fuse(step, observations) if step else []
        by_frame: list[list[Observation]] = [[] for _ in results]
        index = {(r.camera, f.t_s): k for k, (r, f) in enumerate(zip(results, frames, strict=True))}
        for obs in observations:  # every observation has its frame's time
            by_frame[index[(obs.camera, obs.t_s if obs.t_s is not None else -1.0)]].append(obs)
        self._held += [
            _Held(f.t_s, r, u.track_ids, v, o)
            for f, r, u, v, o in zip(frames, results, updates, velocities, by_frame, strict=True)
        ]
        return self._release(final=False)

    def flush(self) -> list[FrameResult]:
        """Every frame still held, fused (the end of a run)."""
        with self._clocked():
            return self._release(final=True)

    def _release(self, *, final: bool) -> list[FrameResult]:
        """The held frames whose rig step is complete, fused in time order. A step starts at
        the earliest held frame and takes the frames less than one frame period after it,
        one per camera; it is complete when no camera can add to it any more (each has a
        frame in it or has delivered one past it), when it is `hold_s` older than the
        newest frame, when too many frames are held, or at the end (`final`)."""
        held = self._held
        held.sort(key=lambda h: h.t_s)
        period = min(self._period.values(), default=_DEFAULT_PERIOD_S)
        newest = max(self._last_t.values(), default=0.0)
        fresh = [c for c, t in self._last_t.items() if t >= newest - self.hold_s]
        out: list[FrameResult] = []
        while held:
            t0 = held[0].t_s
            cams: set[str] = set()
            size = 0
            for h in held:
                if h.t_s - t0 >= period or h.result.camera in cams:
                    break
                cams.add(h.result.camera)
                size += 1
            complete = all(c in cams or self._last_t[c] >= t0 + period for c in fresh)
            overdue = t0 < newest - self.hold_s or len(held) > MAX_HELD_FRAMES
            if not (final or complete or overdue):
                break
            step = held[:size]
            del held[:size]
            out += self._fuse(step)
        return out

    def _fuse(
        self, step: list[_Held], observations: list[Observation] | None = None
    ) -> list[FrameResult]:
        """One rig step of tracked frames: their global ids, and `on_step`'s objects. The
        step's observations are its frames' own, unless given."""
        k = max(range(len(step)), key=lambda i: step[i].t_s)
        newest, t_s = step[k].result, step[k].t_s
        if observations is None:
            observations = [o for h in step for o in h.observations]
        links, objects = self.fusion.step(t_s, observations)
        if self.on_step is not None and t_s >= self._step_s:  # (an older step: no line)
            self._step_s = t_s
            stamp_ns = newest.stamp_ns if _timed(newest) else round(t_s * 1e9)
            self.on_step(RigStep(newest.frame_index, newest.pts_s, stamp_ns, objects))
        out = []
        for h in step:
            camera = h.result.camera
            gids = np.array([links.get((camera, t), -1) for t in h.ids.tolist()], np.int64)
            out.append(_with_ids(h.result, h.ids, h.velocities, gids))
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
        looks: list[npt.NDArray[np.float32] | None] = []
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
            seen = frame.features[keep] if frame.features is not None else None
            looks += [None] * len(keep) if seen is None else [f if f.any() else None for f in seen]
        if not kept:
            return []
        xy = np.concatenate(self.fusion.ground.place_all(kept))
        boxes = np.concatenate([k[1] for k in kept])
        cut: list[bool] = cut_by_side(boxes, np.array(widths, np.float64)).tolist()
        placed: list[bool] = np.isfinite(xy).all(axis=1).astype(np.bool_).tolist()
        rows = zip(
            cameras, ids, names, boxes.tolist(), xy.tolist(), cut, times, looks, placed, strict=True
        )
        return [
            Observation(
                camera, track, name, (box[0], box[1], box[2], box[3]), (x, y), cut_, t, look
            )
            for camera, track, name, box, (x, y), cut_, t, look, ok in rows
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
                unconfirmed_died=self._tracker.died_young(key),
            )
        n = self.frames
        wall, cpu = (self.track_ns / 1e6 / n, self.cpu_ns / 1e6 / n) if n else (0.0, 0.0)
        return TrackingSummary(cameras, self.fusion.objects_made, self.fusion.placing, n, wall, cpu)
