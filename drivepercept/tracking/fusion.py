"""One object list for the rig: per-camera tracks placed on the ground and joined.

Each confirmed track's box has a ground contact point, its bottom centre; with the camera's
intrinsics and mount (`drivepercept.geometry.ground_points`) that pixel's ray meets the
ground at a place in the ego frame. Tracks of different cameras whose places agree are one
object and share a global id, held over time:

1. a (camera, track) linked to an object before stays linked, unless its place has moved
   away from the object's other sightings (a track that jumped to another object);
2. the others are matched, camera by camera, to the objects that camera does not see yet
   this step: those other cameras see now (their place now), and those seen within
   `keep_s` (their place moved on by their speed: an object handed over from one camera to
   the next). Same kind only (vehicles, people, signs), within a gate that grows with range
   (a pixel spans more ground far away); one assignment (Hungarian) per camera;
3. what is left is a new object.

Places are compared at one time: a step's frames can be a few frames apart (each camera's
decoder runs at its own pace), so an object's place is moved by its speed to each sighting's
frame time, and its place for the step is the mean of its sightings' places moved to the
step's time. Its speed is the least-squares line through its latest places.

A camera without intrinsics and extrinsics, or whose view never meets the ground (pitched at
the sky), places nothing: its tracks keep their per-camera ids (global id -1), and one log
line says so.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from drivepercept.errors import ConfigError
from drivepercept.geometry import Extrinsics, Intrinsics, camera_rotation, ground_points_of_rows
from drivepercept.rig import CameraConfig
from drivepercept.tracking.places import (
    MAX_BACK_S,
    Observation,
    Place,
    SpeedFit,
    mean_place,
    time_of,
)
from drivepercept.types.objects import RigObject, Sighting

log = logging.getLogger(__name__)

# half an object's depth on the ground, by class (m): from the near side a box's bottom shows,
# to the centre (a car: 4.5 m long, 1.8 m wide, seen from any side on average)
HALF_DEPTH_M = {"car": 1.6, "truck": 2.5, "bus": 3.0, "cyclist": 0.6, "pedestrian": 0.25}
# classes that may be one object when two cameras (or one detector over time) disagree
_KIND = {"car": "vehicle", "truck": "vehicle", "bus": "vehicle", "cyclist": "person"}
_KIND |= {"pedestrian": "person", "person": "person", "bicycle": "person"}
_FAR = 1e9
# the gate for a place from a box cut by the image's side (its bottom centre is not the
# object's: only its range is sound, its bearing is off by up to half the object)
ROUGH_GATE = 2.5


@dataclass(frozen=True)
class FusionParams:
    """How tracks are joined across cameras (see the module docstring).

    Attributes:
        gate_m: the largest distance between two places of one object near the vehicle.
        gate_per_m: more per metre of range (ground placement error grows with range).
        keep_s: how long an object no camera sees is kept for a hand-over.
        max_range_m: places farther than this are not used (a pixel spans metres there).
        merge_m, merge_steps: two objects seen by different cameras within `merge_m` (plus
            3 % of their range) of each other for `merge_steps` steps in a row are one.
    """

    gate_m: float = 2.5
    gate_per_m: float = 0.12
    keep_s: float = 1.5
    max_range_m: float = 80.0
    merge_m: float = 1.5
    merge_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("gate_m", "keep_s", "max_range_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"fusion {name} must be > 0, got {value!r}")
        if not (math.isfinite(self.gate_per_m) and self.gate_per_m >= 0):
            raise ConfigError(f"fusion gate_per_m must be >= 0, got {self.gate_per_m!r}")


@dataclass
class _Object:
    id: int
    class_name: str
    xy: Place
    t_s: float
    placed: int = 1
    seen_by: set[str] = field(default_factory=set)
    rough: bool = False  # its place came from boxes cut by the image's side only
    fit: SpeedFit = field(default_factory=lambda: SpeedFit())  # its speed

    @property
    def velocity(self) -> Place | None:
        return self.fit.velocity

    def at(self, t_s: float) -> Place:
        """Its place at `t_s`, moved on by its speed (back, for a sighting a little older
        than its last place)."""
        if self.velocity is None:
            return self.xy
        dt = max(-MAX_BACK_S, t_s - self.t_s)
        return (self.xy[0] + self.velocity[0] * dt, self.xy[1] + self.velocity[1] * dt)


def _kind(class_name: str) -> str:
    return _KIND.get(class_name, class_name)


def _gate(params: FusionParams, xy: Place) -> float:
    return params.gate_m + params.gate_per_m * math.hypot(xy[0], xy[1])


class RigFusion:
    """Joins the cameras' tracks into one object list (see the module docstring). Used by
    one thread (the pipeline's completion thread).

    Args:
        cameras: the rig's cameras; those with intrinsics and extrinsics are placed.
        params: the gates and times.
    """

    def __init__(self, cameras: Sequence[CameraConfig], params: FusionParams | None = None):
        self.params = params or FusionParams()
        self._geometry: dict[str, tuple[Intrinsics, Extrinsics, tuple[int, int] | None]] = {}
        for cam in cameras:
            if cam.intrinsics is not None and cam.extrinsics is not None:
                self._geometry[cam.name] = (cam.intrinsics, cam.extrinsics, cam.size)
        missing = [c.name for c in cameras if c.name not in self._geometry]
        if not self._geometry:
            log.warning(
                "tracking per camera only: the rig has no camera geometry (intrinsics and "
                "extrinsics in rig.toml) to place objects around the vehicle"
            )
        elif missing:
            log.warning(
                "tracking: camera(s) %s have no geometry; their tracks are not joined with "
                "the others", ", ".join(missing)
            )  # fmt: skip
        self._rows: dict[str, npt.NDArray[np.float64]] = {}
        self._links: dict[tuple[str, int], int] = {}
        self._close: dict[tuple[int, int], int] = {}  # object pairs close for n steps
        self._objects: dict[int, _Object] = {}
        self._next_id = 1
        self._never_placed = {name: 0 for name in self._geometry}  # boxes, while none placed
        self._warned: set[str] = set()
        self.objects_made = 0

    @property
    def placing(self) -> bool:
        """Whether any camera has the geometry to place objects."""
        return bool(self._geometry)

    def place(
        self,
        camera: str,
        xyxy: npt.NDArray[np.float64],
        frame_size: tuple[int, int],
        class_names: Sequence[str] = (),
    ) -> npt.NDArray[np.float64]:
        """(N, 2) ground places (ego x, y) of the objects behind boxes; NaN where a box cannot
        be placed (a camera without geometry, a point at or above the horizon, too far).

        A box's bottom centre is where the object's near side meets the ground; its centre
        is about half its depth farther along the camera's line of sight (`HALF_DEPTH_M` of
        its class), so that two cameras seeing different sides place it alike."""
        return self.place_all([(camera, xyxy, frame_size, class_names)])[0]

    def place_all(
        self,
        frames: Sequence[tuple[str, npt.NDArray[np.float64], tuple[int, int], Sequence[str]]],
    ) -> list[npt.NDArray[np.float64]]:
        """`place` for several frames (camera, boxes, frame size, class names) at once: the
        projection of a whole batch's boxes is one set of array operations."""
        parts, rows, scales, depths, counts = [], [], [], [], []
        for camera, xyxy, frame_size, class_names in frames:
            boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
            geometry = self._geometry.get(camera)
            if geometry is None or not len(boxes):
                counts.append(-len(boxes))  # unplaced: NaN rows
                continue
            size = geometry[2]
            if size is not None and size != frame_size and size[0] > 0 and size[1] > 0:
                # the rig's intrinsics are for its size: a frame of another size scales them
                scales.append((size[0] / frame_size[0], size[1] / frame_size[1]))
            else:
                scales.append((1.0, 1.0))
            parts.append(boxes)
            rows.append(self._row(camera))
            names = class_names if len(class_names) else [""] * len(boxes)
            depths += [HALF_DEPTH_M.get(n, 0.0) for n in names]
            counts.append(len(boxes))
        xy_all = np.zeros((0, 2))
        if parts:
            boxes = np.concatenate(parts) if len(parts) > 1 else parts[0]
            placed = [n for n in counts if n > 0]
            # per box: fx, fy, cx, cy, the rotation's 9, the mount's 3; the frame's scale
            row = np.repeat(np.array(rows), placed, axis=0)
            scale = np.repeat(np.array(scales), placed, axis=0)
            uv = np.empty((len(boxes), 2))
            uv[:, 0] = (boxes[:, 0] + boxes[:, 2]) * 0.5
            uv[:, 1] = boxes[:, 3]
            xy_all = ground_points_of_rows(
                uv * scale,
                row[:, :4],
                row[:, 4:13].reshape(-1, 3, 3),
                row[:, 13:16],
                max_range_m=self.params.max_range_m,
            )
            sight = xy_all - row[:, 13:15]
            dist = np.hypot(sight[:, 0], sight[:, 1])
            depth = np.array(depths)
            with np.errstate(invalid="ignore", divide="ignore"):
                xy_all = xy_all + sight * (depth / np.where(dist > 0, dist, np.inf))[:, None]
        out, start = [], 0
        for (camera, *_), count in zip(frames, counts, strict=True):
            if count <= 0:
                out.append(np.full((-count, 2), np.nan))
                continue
            xy = xy_all[start : start + count]
            start += count
            self._check_placing(camera, xy)
            out.append(xy)
        return out

    def _row(self, camera: str) -> npt.NDArray[np.float64]:
        """A placed camera's constants for `ground_points_of_rows`, as one row."""
        row = self._rows.get(camera)
        if row is None:
            intrinsics, extrinsics, _ = self._geometry[camera]
            k = [intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy]
            rotation = camera_rotation(extrinsics).ravel().tolist()
            row = self._rows[camera] = np.array([*k, *rotation, *extrinsics.position_m])
        return row

    def _check_placing(self, camera: str, xy: npt.NDArray[np.float64]) -> None:
        """One line for a camera that has boxes but never places any (its view does not
        meet the ground: pitched at the sky, or mounted below the ground)."""
        if camera in self._warned or camera not in self._never_placed:
            return
        if np.isfinite(xy).all(axis=1).any():
            del self._never_placed[camera]
            return
        self._never_placed[camera] += len(xy)
        if self._never_placed[camera] >= 50:
            self._warned.add(camera)
            log.warning(
                "tracking: camera %s placed none of its last %d boxes on the ground (does "
                "its rig geometry point it at the sky?); its tracks stay per camera",
                camera,
                self._never_placed[camera],
            )

    def step(
        self, t_s: float, observations: Sequence[Observation]
    ) -> tuple[Mapping[tuple[str, int], int], tuple[RigObject, ...]]:
        """Join one step's observations: ({(camera, track_id): global id}, the objects)."""
        for old in [g for g, o in self._objects.items() if t_s - o.t_s > self.params.keep_s]:
            del self._objects[old]
        for o in self._objects.values():
            o.seen_by = set()
        now: dict[int, list[Observation]] = defaultdict(list)
        pending: dict[str, list[Observation]] = defaultdict(list)
        for obs in observations:
            linked = self._links.get((obs.camera, obs.track_id))
            if linked is not None and self._keeps(linked, obs, now, t_s):
                now[linked].append(obs)
                self._objects[linked].seen_by.add(obs.camera)
            else:
                self._links.pop((obs.camera, obs.track_id), None)
                pending[obs.camera].append(obs)
        for camera, group in pending.items():
            self._match(camera, group, now, t_s)
        self._merge(now, t_s)
        objects = tuple(self._update(gid, group, t_s) for gid, group in sorted(now.items()))
        ids = {(o.camera, o.track_id): gid for gid, group in now.items() for o in group}
        if len(self._links) > 2 * len(ids) + 64:  # ended tracks' links to expired objects
            self._links = {k: g for k, g in self._links.items() if g in self._objects}
        return ids, objects

    def _where(self, gid: int, now: Mapping[int, list[Observation]], t_s: float) -> Place:
        """An object's place at `t_s`: the mean of this step's sightings so far, else its
        last place moved on by its speed."""
        seen, obj = now.get(gid), self._objects[gid]
        if seen:
            return mean_place(seen, obj.velocity, t_s)
        return obj.at(t_s)

    def _rough(self, gid: int, now: Mapping[int, list[Observation]]) -> bool:
        """Whether an object's place now rests on boxes cut by the image's side only."""
        seen = now.get(gid)
        return all(o.truncated for o in seen) if seen else self._objects[gid].rough

    def _keeps(
        self, gid: int, obs: Observation, now: Mapping[int, list[Observation]], t_s: float
    ) -> bool:
        obj = self._objects.get(gid)
        if (
            obj is None
            or obs.camera in obj.seen_by
            or _kind(obj.class_name) != _kind(obs.class_name)
        ):
            return False
        x, y = obs.xy
        wx, wy = self._where(gid, now, time_of(obs, t_s))
        return math.hypot(x - wx, y - wy) <= 3 * _gate(self.params, obs.xy)

    def _match(
        self,
        camera: str,
        group: Sequence[Observation],
        now: dict[int, list[Observation]],
        t_s: float,
    ) -> None:
        candidates = [gid for gid, o in self._objects.items() if camera not in o.seen_by]
        cost = np.full((len(group), len(candidates)), _FAR)
        if candidates:
            t_frame = time_of(group[0], t_s)  # one frame per camera in a step
            places = np.array([self._where(gid, now, t_frame) for gid in candidates])
            kinds = np.array([_kind(self._objects[gid].class_name) for gid in candidates])
            rough = np.array([self._rough(gid, now) for gid in candidates])
            for i, obs in enumerate(group):
                x, y = obs.xy
                gate = _gate(self.params, obs.xy) * np.where(rough | obs.truncated, ROUGH_GATE, 1.0)
                d = np.hypot(places[:, 0] - x, places[:, 1] - y)
                ok = (d <= gate) & (kinds == _kind(obs.class_name))
                cost[i, ok] = d[ok] / gate[ok]
        matched: dict[int, int] = {}
        if len(candidates) and len(group):
            rows, cols = linear_sum_assignment(cost)
            matched = {
                int(r): candidates[c] for r, c in zip(rows, cols, strict=True) if cost[r, c] < _FAR
            }
        for i, obs in enumerate(group):
            gid = matched[i] if i in matched else self._new(obs, t_s)
            self._links[(obs.camera, obs.track_id)] = gid
            now[gid].append(obs)
            self._objects[gid].seen_by.add(camera)

    def _merge(self, now: dict[int, list[Observation]], t_s: float) -> None:
        """Two objects that different cameras see at one place, step after step, are one:
        each was made before the other camera's track existed, or while their places
        disagreed (a box cut by the image's side). After `merge_steps` steps in a row within
        `merge_m` (plus 3 % of range) of each other, the younger id joins the older."""
        close: dict[tuple[int, int], int] = {}
        ids = sorted(now)
        places = {gid: self._where(gid, now, t_s) for gid in ids}
        cameras = {gid: {o.camera for o in now[gid]} for gid in ids}
        kinds = {gid: _kind(self._objects[gid].class_name) for gid in ids}
        rough = {gid: self._rough(gid, now) for gid in ids}
        for k, gid in enumerate(ids):
            (x, y), seen, kind = places[gid], cameras[gid], kinds[gid]
            reach = self.params.merge_m + 0.03 * math.hypot(x, y)
            for other in ids[k + 1 :]:
                if kinds[other] != kind or seen & cameras[other]:
                    continue
                ox, oy = places[other]
                wide = ROUGH_GATE if rough[gid] or rough[other] else 1.0
                if math.hypot(x - ox, y - oy) <= reach * wide:
                    close[(gid, other)] = self._close.get((gid, other), 0) + 1
        self._close = close
        for (gid, other), steps in sorted(close.items()):
            if steps < self.params.merge_steps or gid not in now or other not in now:
                continue
            if cameras[gid] & cameras[other]:
                continue
            for o in now[other]:
                self._links[(o.camera, o.track_id)] = gid
            self._objects[gid].seen_by |= cameras[other]
            cameras[gid] |= cameras.pop(other)
            now[gid] += now.pop(other)
            del self._objects[other]

    def _new(self, obs: Observation, t_s: float) -> int:
        gid = self._next_id
        self._next_id += 1
        self.objects_made += 1
        self._objects[gid] = _Object(gid, obs.class_name, obs.xy, time_of(obs, t_s))
        return gid

    def _update(self, gid: int, group: Sequence[Observation], t_s: float) -> RigObject:
        obj = self._objects[gid]
        xy = x, y = mean_place(group, obj.velocity, t_s)
        last = obj.fit.last_t
        if last is None or t_s - last > 0.02:  # places at least 20 ms apart
            obj.fit.add(t_s, x, y)
        obj.xy, obj.t_s, obj.placed = xy, t_s, obj.placed + 1
        obj.rough = all(o.truncated for o in group)
        if len(group) > 1:  # the class most of its sightings say
            names = [o.class_name for o in group]
            obj.class_name = max(names, key=names.count)
        else:
            obj.class_name = group[0].class_name
        speed = None if obj.velocity is None else math.hypot(*obj.velocity)
        return RigObject(
            id=gid,
            class_name=obj.class_name,
            x_m=round(x, 3),
            y_m=round(y, 3),
            range_m=round(math.hypot(x, y), 3),
            speed_mps=None if speed is None else round(speed, 3),
            sightings=tuple(Sighting(o.camera, o.track_id, o.xyxy) for o in group),
        )
