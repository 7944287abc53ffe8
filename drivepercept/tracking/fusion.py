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

Where the sightings carry their looks (the tracking stage reads each box's colours from its
frame, `appearance`), each object keeps a running mean of them: a sighting never joins,
stays with or merges into an object that looks unlike it, and one that looks alike may be
`look_reach` gates away along its line of sight (a far pedestrian whose feet one camera
does not see is placed 10-25 m too far; most of the split sightings on the crossing drives).
A long vehicle (bus, truck) that looks alike may be up to its length away whatever the
direction: two cameras seeing its two ends place it that far apart (a bus alongside, seen
by the camera behind and the one ahead, 10 m apart).

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

from drivepercept.rig import CameraConfig
from drivepercept.tracking.fusion_params import FusionParams as FusionParams  # (its API)
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
LOOK_MOMENTUM = 0.9  # an object's looks: this much its own, the rest its sightings' now
# a long vehicle's length (m): the cameras seeing its two ends place it up to this far apart
LONG_M = {"bus": 12.0, "truck": 9.0}
Features = npt.NDArray[np.float32]


@dataclass
class _Object:
    id: int
    class_name: str
    xy: Place
    t_s: float
    placed: int = 1
    seen_by: set[str] = field(default_factory=set)  # its cameras in the step being joined
    rough: bool = False  # its place came from boxes cut by the image's side only
    fit: SpeedFit = field(default_factory=lambda: SpeedFit())  # its speed
    look: Features | None = None  # a running mean of its sightings' looks

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


def _length(a: str, b: str) -> float:
    """How far apart two sightings of classes `a` and `b` may be for their length: the
    shorter class's length (0: not both long vehicles)."""
    return min(LONG_M.get(a, 0.0), LONG_M.get(b, 0.0))


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


def _apart(params: FusionParams, a: Place, b: Place, reach: float = 1.0) -> float:
    """How far place `b` is from sighting `a`, in gates (`_axes` at `a`, its length along
    the line of sight times `reach`): 1 is the gate's edge. Plain floats: it runs once per
    linked sighting a step."""
    along, across, ux, uy = _axes(params, a)
    along *= reach
    dx, dy = b[0] - a[0], b[1] - a[1]
    return math.hypot((dx * ux + dy * uy) / along, (dx * uy - dy * ux) / across)


def _apart_many(
    params: FusionParams, xy: Place, places: FloatArray, reach: FloatArray | float = 1.0
) -> FloatArray:
    """`_apart` of each of `places` (K, 2) from sighting `xy`: (K,) (`reach`: one, or one
    per place)."""
    along, across, ux, uy = _axes(params, xy)
    length = along * np.asarray(reach, np.float64)
    dx, dy = places[:, 0] - xy[0], places[:, 1] - xy[1]
    out: FloatArray = np.hypot((dx * ux + dy * uy) / length, (dx * uy - dy * ux) / across)
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
        for gid in now:  # the cameras that saw it: this step's alone
            self._objects[gid].seen_by = set()
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
        unlike = self._looks(obj.look, obs.look)
        if unlike > self.params.look_gate:
            return False
        alike = self._alike(obj.look, obs.look, unlike)
        where = self._where(gid, now, time_of(obs, t_s))
        length = _length(obj.class_name, obs.class_name) if alike else 0.0
        if length > 0 and math.dist(where, obs.xy) <= length:
            return True  # alike, and within a long vehicle's length
        reach = self.params.look_reach if alike else 1.0
        return _apart(self.params, obs.xy, where, reach) <= KEEP_GATES

    @staticmethod
    def _looks(a: Features | None, b: Features | None) -> float:
        """How unlike two looks are (cosine distance); 0 where either is not known."""
        return 0.0 if a is None or b is None else float(1.0 - a @ b)

    @staticmethod
    def _looks_apart(looks: Sequence[Features | None]) -> list[list[float]]:
        """`_looks` of every pair of `looks`, one product for them all (0 where either is
        not known)."""
        known = [look for look in looks if look is not None]
        if not known:
            return [[0.0] * len(looks) for _ in looks]
        stack = np.zeros((len(looks), len(known[0])), np.result_type(*known))
        has = np.array([look is not None for look in looks])
        stack[has] = known
        apart = np.where(has[:, None] & has[None, :], 1.0 - stack @ stack.T, 0.0)
        out: list[list[float]] = apart.tolist()
        return out

    def _alike(self, a: Features | None, b: Features | None, unlike: float) -> bool:
        """Whether two looks are both known and alike (`look_match`; `unlike`: their
        `_looks`): the gate reaches `look_reach` along the line of sight, and a long
        vehicle's length any way (the one test of the three places that join: `_keeps`,
        `_match`, `_merge`)."""
        return a is not None and b is not None and unlike <= self.params.look_match

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
            lengths = np.array([LONG_M.get(self._objects[g].class_name, 0.0) for g in candidates])
            rough = np.array([self._rough(gid, now) for gid in candidates])
            looks = [self._objects[gid].look for gid in candidates]
            known = np.array([look is not None for look in looks])
            dim = next((len(look) for look in looks if look is not None), 0)
            stack = np.array([look if look is not None else np.zeros(dim) for look in looks])
            for i, obs in enumerate(group):
                # its looks against each object's (0: either not known): never one too
                # unlike it; one alike may be farther along its line of sight
                unlike = np.zeros(len(candidates))
                if obs.look is not None and known.any():
                    unlike = np.where(known, 1.0 - stack @ obs.look, 0.0)
                alike = known & (unlike <= self.params.look_match) & (obs.look is not None)
                reach = np.where(alike, self.params.look_reach, 1.0)
                x, y = obs.xy
                # a place from a box cut by the image's side: its bearing is off too (round)
                round_gate = _gate(self.params, obs.xy) * ROUGH_GATE
                near = np.hypot(places[:, 0] - x, places[:, 1] - y)
                d = np.where(
                    rough | obs.truncated,
                    near / round_gate,
                    _apart_many(self.params, obs.xy, places, reach),
                )
                # a long vehicle alike within its length (its two ends), in lengths
                length = np.where(alike, np.minimum(lengths, LONG_M.get(obs.class_name, 0.0)), 0.0)
                within = (length > 0) & (near <= length)
                d[within] = np.minimum(d[within], near[within] / length[within])
                ok = (d <= 1.0) & (kinds == _kind(obs.class_name))
                ok &= unlike <= self.params.look_gate
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
        unlikes = self._looks_apart([self._objects[gid].look for gid in ids])
        for k, gid in enumerate(ids):
            (x, y), seen, kind = places[gid], cameras[gid], kinds[gid]
            reach = self.params.merge_m + 0.03 * math.hypot(x, y)
            for j, other in enumerate(ids[k + 1 :], k + 1):
                if kinds[other] != kind or seen & cameras[other]:
                    continue
                ox, oy = places[other]
                wide = ROUGH_GATE if rough[gid] or rough[other] else 1.0
                a, b = self._objects[gid].look, self._objects[other].look
                unlike = unlikes[k][j]
                if unlike > self.params.look_gate:
                    continue  # two that look unlike each other are two
                alike = self._alike(a, b, unlike)
                names = self._objects[gid].class_name, self._objects[other].class_name
                long = _length(*names) if alike else 0.0
                if math.hypot(x - ox, y - oy) <= max(reach * wide, long) or (
                    alike and _apart(self.params, (x, y), (ox, oy), self.params.look_reach) <= 1.0
                ):
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
        self._objects[gid] = _Object(gid, obs.class_name, obs.xy, time_of(obs, t_s), look=obs.look)
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
        seen = [o.look for o in group if o.look is not None]
        if seen:  # (plain sums: numpy's mean and norm cost more than the sums, per object)
            look = seen[0] if len(seen) == 1 else sum(seen[1:], seen[0])
            if obj.look is not None:
                scale = math.sqrt(float(look @ look)) or 1.0
                look = LOOK_MOMENTUM * obj.look + ((1.0 - LOOK_MOMENTUM) / scale) * look
            obj.look = look / (math.sqrt(float(look @ look)) or 1.0)
        if len(group) > 1:  # the class most of its sightings say; a tie: its own if tied,
            names = [o.class_name for o in group]  # else the first by name (not by camera)
            most = max(map(names.count, names))
            tied = sorted({n for n in names if names.count(n) == most})
            obj.class_name = obj.class_name if obj.class_name in tied else tied[0]
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
