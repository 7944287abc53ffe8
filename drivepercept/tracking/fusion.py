"""One object list for the rig: per-camera tracks placed on the ground and joined.

Each confirmed track's box has a ground contact point, its bottom centre; with the camera's
intrinsics and mount that pixel's ray meets the ground at a place in the ego frame
(`ground.GroundPlacer`). Tracks of different cameras whose places agree are one
object and share a global id, held over time:

1. a (camera, track) linked to an object before stays linked, unless its place has moved
   away from the object's other sightings (a track that jumped to another object);
2. the others are matched, camera by camera, to the objects that camera does not see yet
   this step: those other cameras see now (their place now), and those seen within
   `keep_s` (their place moved on by their speed: an object handed over from one camera to
   the next). Same kind only (vehicles, people, signs), within a gate that grows with range
   (a pixel spans more ground far away) and is an ellipse: wide along the sighting's line
   of sight (its range comes from one pixel row), narrow across it (its bearing is sure);
   one assignment (Hungarian) per camera;
3. what is left is a new object;
4. two tracks of one camera joined crosswise (each fits the other's object better, against
   the other cameras' places, step after step) change over;
5. two objects that different cameras see at one place, step after step, are one.

Places are compared at one time: a step's frames can be a few frames apart (each camera's
decoder runs at its own pace), so an object's place is moved by its speed to each sighting's
frame time, and its place for the step is the mean of its sightings' places moved to the
step's time. Its speed is the least-squares line through its latest places.

A camera without intrinsics and extrinsics, or whose view never meets the ground (pitched at
the sky), places nothing: its tracks keep their per-camera ids (global id -1), and one log
line says so.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from drivepercept.errors import ConfigError
from drivepercept.rig import CameraConfig
from drivepercept.tracking.ground import GroundPlacer
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

# classes that may be one object when two cameras (or one detector over time) disagree
_KIND = {"car": "vehicle", "truck": "vehicle", "bus": "vehicle", "cyclist": "person"}
_KIND |= {"pedestrian": "person", "person": "person", "bicycle": "person"}
_FAR = 1e9
FloatArray = npt.NDArray[np.float64]
# the gate for a place from a box cut by the image's side (its bottom centre is not the
# object's: only its range is sound, its bearing is off by up to half the object)
ROUGH_GATE = 2.5
# a link holds while its place stays within this many gates of its object's other sightings
KEEP_GATES = 3.0


@dataclass(frozen=True)
class FusionParams:
    """How tracks are joined across cameras (see the module docstring).

    Attributes:
        gate_m: the largest distance between two places of one object near the vehicle,
            along the line of sight (where a place is least sure: it comes from one pixel
            row of the box's bottom).
        gate_per_m: more per metre of range (ground placement error grows with range).
        lateral_m, lateral_per_m: the same across the line of sight, where a place is sure
            (its bearing is the box's centre column): at 30 m, 1.6 m across against 6.1 m
            along. Two sightings of one object in two cameras differ mostly in range (on
            the simulated crossing drives, pedestrians at 20-30 m: 1.1 m along, 0.2 m
            across, medians), so a neighbour beside it is not taken for it.
        keep_s: how long an object no camera sees is kept for a hand-over.
        max_range_m: places farther than this are not used (a pixel spans metres there).
        merge_m, merge_steps: two objects seen by different cameras within `merge_m` (plus
            3 % of their range) of each other for `merge_steps` steps in a row are one.
        swap_gain, swap_steps: two tracks of one camera whose objects fit each other better
            (distances swapped under `swap_gain` of those held; 0: never) for `swap_steps`
            steps in a row change objects.
    """

    gate_m: float = 2.5
    gate_per_m: float = 0.12
    lateral_m: float = 1.0
    lateral_per_m: float = 0.02
    keep_s: float = 1.5
    max_range_m: float = 80.0
    merge_m: float = 1.5
    merge_steps: int = 3
    swap_gain: float = 0.7
    swap_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("gate_m", "keep_s", "max_range_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"fusion {name} must be > 0, got {value!r}")
        if not (math.isfinite(self.lateral_m) and self.lateral_m > 0):
            raise ConfigError(f"fusion lateral_m must be > 0, got {self.lateral_m!r}")
        for name in ("gate_per_m", "lateral_per_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"fusion {name} must be >= 0, got {value!r}")
        if not (0.0 <= self.swap_gain <= 1.0):
            raise ConfigError(f"fusion swap_gain must be in [0, 1], got {self.swap_gain!r}")
        for name in ("merge_steps", "swap_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"fusion {name} must be an integer >= 1, got {value!r}")


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


def _axes(params: FusionParams, xy: Place) -> tuple[float, float, float, float]:
    """The gate at sighting `xy`: (along, across, ux, uy), its half-widths along and across
    its line of sight and that line's direction (the rig's cameras sit within a metre or two
    of the ego origin, so one line of sight from there serves all of them); at the origin
    itself no direction, and a round gate."""
    r = math.hypot(xy[0], xy[1])
    along = _gate(params, xy)
    if r < 1e-6:
        return along, along, 1.0, 0.0
    return along, min(along, params.lateral_m + params.lateral_per_m * r), xy[0] / r, xy[1] / r


def _apart(params: FusionParams, a: Place, b: Place) -> float:
    """How far place `b` is from sighting `a`, in gates (`_axes` at `a`): 1 is the gate's
    edge. Plain floats: it runs once per linked sighting a step."""
    along, across, ux, uy = _axes(params, a)
    dx, dy = b[0] - a[0], b[1] - a[1]
    return math.hypot((dx * ux + dy * uy) / along, (dx * uy - dy * ux) / across)


def _apart_many(params: FusionParams, xy: Place, places: FloatArray) -> FloatArray:
    """`_apart` of each of `places` (K, 2) from sighting `xy`: (K,)."""
    along, across, ux, uy = _axes(params, xy)
    dx, dy = places[:, 0] - xy[0], places[:, 1] - xy[1]
    out: FloatArray = np.hypot((dx * ux + dy * uy) / along, (dx * uy - dy * ux) / across)
    return out


class RigFusion:
    """Joins the cameras' tracks into one object list (see the module docstring). Used by
    one thread (the pipeline's completion thread).

    Args:
        cameras: the rig's cameras; those with intrinsics and extrinsics are placed.
        params: the gates and times.
    """

    def __init__(self, cameras: Sequence[CameraConfig], params: FusionParams | None = None):
        self.params = params or FusionParams()
        self.ground = GroundPlacer(cameras, max_range_m=self.params.max_range_m)
        self._links: dict[tuple[str, int], int] = {}
        self._close: dict[tuple[int, int], int] = {}  # object pairs close for n steps
        self._crossed: dict[tuple[str, int, int], int] = {}  # track pairs better swapped
        self._objects: dict[int, _Object] = {}
        self._next_id = 1
        self.objects_made = 0

    @property
    def placing(self) -> bool:
        """Whether any camera has the geometry to place objects."""
        return self.ground.placing

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
        self._swap(now, t_s)
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
        return _apart(self.params, obs.xy, self._where(gid, now, time_of(obs, t_s))) <= KEEP_GATES

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
                # a place from a box cut by the image's side: its bearing is off too (round)
                round_gate = _gate(self.params, obs.xy) * ROUGH_GATE
                d = np.where(
                    rough | obs.truncated,
                    np.hypot(places[:, 0] - x, places[:, 1] - y) / round_gate,
                    _apart_many(self.params, obs.xy, places),
                )
                ok = (d <= 1.0) & (kinds == _kind(obs.class_name))
                cost[i, ok] = d[ok]
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

    def _swap(self, now: dict[int, list[Observation]], t_s: float) -> None:
        """Two tracks of one camera, each joined to an object other cameras see too, that
        fit each other's object better (their places against the other cameras' sightings:
        the pair's summed distance swapped under `swap_gain` of it held) `swap_steps` steps
        in a row change over: a join decided on one ambiguous step (two people walking
        together far away, placed 1-2 m off along the line of sight) is not held for ever."""
        others: dict[str, list[tuple[Observation, Place]]] = defaultdict(list)
        for gid, group in now.items():  # per sighting: where the other cameras place it
            for o in group if len(group) > 1 else ():
                rest = [other for other in group if other.camera != o.camera]
                velocity = self._objects[gid].velocity
                others[o.camera].append((o, mean_place(rest, velocity, time_of(o, t_s))))
        crossed: dict[tuple[str, int, int], int] = {}
        for camera, sightings in others.items():  # a camera's sightings: one frame, one time
            for (a, pa), (b, pb) in itertools.combinations(sightings, 2):
                if _kind(a.class_name) != _kind(b.class_name):
                    continue
                held = _apart(self.params, a.xy, pa) + _apart(self.params, b.xy, pb)
                swapped = _apart(self.params, a.xy, pb) + _apart(self.params, b.xy, pa)
                if swapped < self.params.swap_gain * held:
                    key = (camera, a.track_id, b.track_id)
                    crossed[key] = self._crossed.get(key, 0) + 1
        self._crossed = {k: n for k, n in crossed.items() if n < self.params.swap_steps}
        changed: set[int] = set()
        for camera, track_a, track_b in (k for k in crossed if k not in self._crossed):
            ga, gb = self._links[(camera, track_a)], self._links[(camera, track_b)]
            if ga in changed or gb in changed:
                continue  # one change a step per object: the other camera's would undo it
            changed |= {ga, gb}
            a = next(o for o in now[ga] if o.camera == camera)
            b = next(o for o in now[gb] if o.camera == camera)
            now[ga][now[ga].index(a)], now[gb][now[gb].index(b)] = b, a
            self._links[(camera, track_a)], self._links[(camera, track_b)] = gb, ga

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
        if t_s >= obj.t_s:  # (a frame answered late, `engine.overdue`, does not move it back)
            obj.xy, obj.t_s = xy, t_s
        obj.placed += 1
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
