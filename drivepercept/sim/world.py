"""The synthetic driving world: the road, the ego vehicle, traffic, people, furniture, scenery.

A world is fully determined by its seed. Every actor moves along the road in road coordinates
(s, d) by a closed-form `Motion`, so the state at any instant is computed directly (no
integration, no dependence on the frame rate) and all cameras see the same instant.

Collision-free by construction: vehicles in one lane share one speed; crossing pedestrians are
timed to clear the ego's lane before it arrives (or to start after it passed), and vehicles or
cyclists that would meet a crossing pedestrian are not spawned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError
from drivepercept.sim import road as rd
from drivepercept.sim.camera import Pose2D
from drivepercept.sim.config import PRESETS
from drivepercept.sim.models import (
    Category,
    Solid,
    make_building,
    make_bus,
    make_car,
    make_cyclist,
    make_pedestrian,
    make_traffic_light,
    make_traffic_sign,
    make_tree,
    make_truck,
)

FloatArray = npt.NDArray[np.float64]

VIEW_RANGE_M = 250.0  # actors farther than this from the ego are not rendered
STRIDE_M = 1.4  # one gait cycle of a walker or a pedal turn


@dataclass(frozen=True)
class Motion:
    """Closed-form motion in road coordinates.

    s(t) = s0 + speed_s * t + wobble * sin(2 pi t / wobble_period)
    d(t) = d0 + speed_d * clip(t - t_start, 0, duration)
    heading = road heading + yaw
    """

    s0_m: float
    d0_m: float
    speed_s_mps: float = 0.0
    speed_d_mps: float = 0.0
    t_start_s: float = 0.0
    duration_s: float = 0.0
    wobble_m: float = 0.0
    wobble_period_s: float = 1.0
    yaw_rad: float = 0.0


@dataclass(frozen=True, eq=False)
class Actor:
    """Something in the world. Labelled actors have a category and a track id > 0."""

    track_id: int
    category: Category | None
    solid: Solid
    motion: Motion
    light_period_s: float = 0.0  # > 0 for traffic lights
    light_offset_s: float = 0.0


@dataclass(frozen=True)
class Lighting:
    """Sun, sky, haze and sensor character of one world (varies with the seed)."""

    name: str
    sun_dir: tuple[float, float, float]  # unit vector towards the sun, world frame
    ambient: float
    diffuse: float
    sky_top: tuple[int, int, int]
    sky_horizon: tuple[int, int, int]
    ground: tuple[int, int, int]
    asphalt: tuple[int, int, int]
    haze: tuple[int, int, int]
    visibility_m: float
    noise_sigma: float
    blur_sigma: float


_PRESETS = (
    # name, sun elevation deg, ambient, diffuse, sky top, sky horizon, haze, visibility
    ("sunny", 50.0, 0.55, 0.50, (200, 140, 70), (235, 210, 180), (225, 215, 200), 900.0),
    ("overcast", 70.0, 0.80, 0.20, (175, 170, 165), (205, 205, 200), (200, 200, 198), 450.0),
    ("dusk", 8.0, 0.45, 0.45, (120, 80, 60), (120, 170, 230), (140, 160, 190), 500.0),
    ("hazy", 35.0, 0.65, 0.35, (190, 170, 150), (215, 215, 210), (210, 210, 208), 300.0),
)


def random_lighting(rng: np.random.Generator) -> Lighting:
    """One of the presets, with a random sun azimuth and sensor noise/blur."""
    name, elev, amb, dif, top, hor, haze, vis = _PRESETS[int(rng.integers(len(_PRESETS)))]
    az = float(rng.uniform(0.0, 2.0 * math.pi))
    e = math.radians(elev)
    sun = (math.cos(e) * math.cos(az), math.cos(e) * math.sin(az), math.sin(e))
    shade = float(rng.uniform(0.85, 1.1))
    grey = int(rng.integers(70, 105))
    return Lighting(
        name=name,
        sun_dir=sun,
        ambient=amb,
        diffuse=dif,
        sky_top=top,
        sky_horizon=hor,
        ground=(int(60 * shade), int(115 * shade), int(95 * shade)),
        asphalt=(grey, grey, grey + 3),
        haze=haze,
        visibility_m=vis * float(rng.uniform(0.8, 1.2)),
        noise_sigma=float(rng.uniform(1.5, 4.0)),
        blur_sigma=float(rng.uniform(0.35, 0.8)),
    )


@dataclass(frozen=True)
class ActorStates:
    """Poses of all actors at one instant (arrays parallel to World.actors)."""

    x_m: FloatArray
    y_m: FloatArray
    heading_rad: FloatArray
    s_m: FloatArray
    gait: FloatArray  # sin of the gait phase, in [-1, 1]
    lit_lamp: npt.NDArray[np.int64]  # traffic-light lamp lit, -1 otherwise


@dataclass(frozen=True, eq=False)
class World:
    """A road, an ego motion, the actors and scenery, and the lighting."""

    road: rd.Road
    ego: Motion
    actors: tuple[Actor, ...]
    scenery: tuple[Actor, ...]
    lighting: Lighting
    crosswalks_s: tuple[float, ...] = ()
    seed: int | None = None
    _motion: dict[str, FloatArray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ids = [a.track_id for a in self.actors]
        if len(set(ids)) != len(ids) or any(i <= 0 for i in ids):
            raise ValueError("labelled actors need unique track ids > 0")
        keys = (
            "s0_m",
            "d0_m",
            "speed_s_mps",
            "speed_d_mps",
            "t_start_s",
            "duration_s",
            "wobble_m",
            "wobble_period_s",
            "yaw_rad",
        )
        table = {k: np.array([getattr(a.motion, k) for a in self.actors], float) for k in keys}
        table["light_period_s"] = np.array([a.light_period_s for a in self.actors], float)
        table["light_offset_s"] = np.array([a.light_offset_s for a in self.actors], float)
        object.__setattr__(self, "_motion", table)

    def ego_pose(self, t_s: float) -> Pose2D:
        """The ego vehicle's pose at time t."""
        s, d, yaw = _evaluate(self.ego, t_s)
        x, y, h = self.road.pose(s, d)
        return Pose2D(float(x), float(y), float(h) + yaw)

    def ego_s(self, t_s: float) -> float:
        return _evaluate(self.ego, t_s)[0]

    def actor_states(self, t_s: float) -> ActorStates:
        """Poses of every actor at time t (vectorised over actors)."""
        m = self._motion
        wobble = m["wobble_m"] * np.sin(2.0 * math.pi * t_s / m["wobble_period_s"])
        s = m["s0_m"] + m["speed_s_mps"] * t_s + wobble
        moved_d = np.clip(t_s - m["t_start_s"], 0.0, m["duration_s"])
        d = m["d0_m"] + m["speed_d_mps"] * moved_d
        x, y, heading = self.road.pose(s, d)
        travelled = np.abs(m["speed_s_mps"]) * t_s + np.abs(m["speed_d_mps"]) * moved_d
        gait = np.sin(2.0 * math.pi * travelled / STRIDE_M)
        lit = np.full(len(self.actors), -1, dtype=np.int64)
        lights = m["light_period_s"] > 0
        if lights.any():
            period = m["light_period_s"][lights]
            phase = np.mod(t_s + m["light_offset_s"][lights], period) / period
            # green 45 %, amber 10 %, red 45 % of the cycle
            lit[lights] = np.where(phase < 0.45, 2, np.where(phase < 0.55, 1, 0))
        return ActorStates(
            x_m=x, y_m=y, heading_rad=heading + m["yaw_rad"], s_m=s, gait=gait, lit_lamp=lit
        )

    def scenery_poses(self) -> list[Pose2D]:
        """Scenery is static: one pose each."""
        poses = []
        for a in self.scenery:
            x, y, h = self.road.pose(a.motion.s0_m, a.motion.d0_m)
            poses.append(Pose2D(float(x), float(y), float(h) + a.motion.yaw_rad))
        return poses


def _evaluate(m: Motion, t_s: float) -> tuple[float, float, float]:
    s = m.s0_m + m.speed_s_mps * t_s + m.wobble_m * math.sin(2 * math.pi * t_s / m.wobble_period_s)
    d = m.d0_m + m.speed_d_mps * min(max(t_s - m.t_start_s, 0.0), m.duration_s)
    return s, d, m.yaw_rad


# --------------------------------------------------------------------------- generation

_EGO_LANE = 1  # the middle of our three lanes
_CONFLICT_MARGIN_S = 1.0  # a vehicle and a crossing pedestrian keep this far apart in time


@dataclass
class _Builder:
    rng: np.random.Generator
    duration_s: float
    ego_speed: float
    reach_m: float = VIEW_RANGE_M + 20.0  # how far from the ego traffic is spawned
    actors: list[Actor] = field(default_factory=list)
    scenery: list[Actor] = field(default_factory=list)
    # (s, d0, speed_d, t_start, duration) of each crossing pedestrian
    blocked: list[tuple[float, float, float, float, float]] = field(default_factory=list)

    def add(self, category: Category, solid: Solid, motion: Motion, **kw: float) -> None:
        self.actors.append(Actor(len(self.actors) + 1, category, solid, motion, **kw))

    def spawn_range(self, speed: float) -> tuple[float, float]:
        """s0 range from which an actor at `speed` is near the ego at some time of the clip."""
        rel = speed - self.ego_speed
        reach = self.reach_m
        lo = -reach - max(0.0, rel) * self.duration_s
        hi = reach + max(0.0, -rel) * self.duration_s
        return lo, hi

    def conflicts(self, s0: float, speed: float, d: float, half_len: float) -> bool:
        """Would an actor on lane offset d at constant speed meet a crossing pedestrian?"""
        for s_c, d0, speed_d, t_start, duration in self.blocked:
            # when the walker is within 1.6 m of the actor's path
            ta = t_start + (d - 1.6 - d0) / speed_d
            tb = t_start + (d + 1.6 - d0) / speed_d
            t_in = max(min(ta, tb), t_start)
            t_out = min(max(ta, tb), t_start + duration)
            if t_in >= t_out:
                continue
            if abs(speed) < 1e-6:
                if abs(s0 - s_c) < half_len + 2.0:
                    return True
                continue
            # when the actor's extent is over the crosswalk (+- 2 m)
            a = (s_c - s0 - (half_len + 2.0)) / speed
            b = (s_c - s0 + (half_len + 2.0)) / speed
            if min(a, b) < t_out + _CONFLICT_MARGIN_S and max(a, b) > t_in - _CONFLICT_MARGIN_S:
                return True
        return False

    def lane_traffic(
        self,
        *,
        d: float,
        speed: float,
        direction: int,
        gap: tuple[float, float],
        mix: tuple[float, float, float],
        keep_clear: tuple[float, float] | None,
        s_range: tuple[float, float] | None = None,
    ) -> None:
        """Vehicles along one lane, all at one speed (so they never collide), starting at s in
        `s_range` (default: wherever they come within `reach_m` of the ego during the clip)."""
        v = direction * speed
        lo, hi = self.spawn_range(v) if s_range is None else s_range
        s = lo + float(self.rng.uniform(0.0, gap[1]))
        yaw = 0.0 if direction > 0 else math.pi
        while s < hi:
            kind = self.rng.choice(3, p=mix)
            solid = (make_car, make_truck, make_bus)[int(kind)](self.rng)
            length = float(np.ptp(solid.vertices_m[..., 0]))
            s += length / 2
            clear = keep_clear is None or not keep_clear[0] < s < keep_clear[1]
            if clear and not self.conflicts(s, v, d, length / 2):
                cat = (Category.CAR, Category.TRUCK, Category.BUS)[int(kind)]
                self.add(cat, solid, Motion(s0_m=s, d0_m=d, speed_s_mps=v, yaw_rad=yaw))
            s += length / 2 + float(self.rng.uniform(*gap))

    def cyclists(
        self, *, d: float, speed: float, direction: int, gap: tuple[float, float] = (40.0, 160.0)
    ) -> None:
        v = direction * speed
        lo, hi = self.spawn_range(v)
        s = lo + float(self.rng.uniform(0.0, 120.0))
        while s < hi:
            if not self.conflicts(s, v, d, 1.0):
                self.add(
                    Category.CYCLIST,
                    make_cyclist(self.rng),
                    Motion(
                        s0_m=s, d0_m=d, speed_s_mps=v, yaw_rad=0.0 if direction > 0 else math.pi
                    ),
                )
            s += float(self.rng.uniform(*gap))

    def walkers(
        self,
        *,
        d_range: tuple[float, float],
        s_lo: float,
        s_hi: float,
        gap: tuple[float, float] = (8.0, 35.0),
    ) -> None:
        """Pedestrians walking along (or standing on) a sidewalk."""
        s = s_lo + float(self.rng.uniform(0.0, 20.0))
        while s < s_hi:
            speed = 0.0 if self.rng.random() < 0.2 else float(self.rng.uniform(0.9, 1.7))
            direction = 1 if self.rng.random() < 0.5 else -1
            d = float(self.rng.uniform(d_range[0] + 0.5, d_range[1] - 0.5))
            yaw = (
                (0.0 if direction > 0 else math.pi)
                if speed
                else float(self.rng.uniform(-math.pi, math.pi))
            )
            self.add(
                Category.PEDESTRIAN,
                make_pedestrian(self.rng),
                Motion(s0_m=s, d0_m=d, speed_s_mps=direction * speed, yaw_rad=yaw),
            )
            s += float(self.rng.uniform(*gap))

    def crossing(self, s_c: float, *, walkers: int = 3) -> None:
        """A crosswalk: lights on both sides and up to `walkers` pedestrians who cross."""
        ego_arrival = s_c / self.ego_speed
        right_d = rd.RIGHT_SIDEWALK_D[1] + 0.3
        left_d = rd.LEFT_SIDEWALK_D[0] - 0.3
        ego_d = rd.forward_lane_d(_EGO_LANE)
        zone = (ego_d - 2.6, ego_d + 2.6)
        for _ in range(int(self.rng.integers(0, walkers + 1))):
            from_left = self.rng.random() < 0.5
            d0, d1 = (left_d + 1.5, right_d - 1.5) if from_left else (right_d - 1.5, left_d + 1.5)
            d0 += float(self.rng.uniform(-0.8, 0.8))
            speed = float(self.rng.uniform(1.0, 1.6))
            sign = 1.0 if d1 > d0 else -1.0
            # times (after the start) at which the walker enters and leaves the ego lane
            enter = (min(abs(z - d0) for z in zone)) / speed
            leave = (max(abs(z - d0) for z in zone)) / speed
            if self.rng.random() < 0.5:
                t0 = ego_arrival - leave - float(self.rng.uniform(1.5, 8.0))
            else:
                t0 = ego_arrival - enter + float(self.rng.uniform(1.0, 6.0))
            duration = abs(d1 - d0) / speed
            s = s_c + float(self.rng.uniform(-1.2, 1.2))
            self.add(
                Category.PEDESTRIAN,
                make_pedestrian(self.rng),
                Motion(
                    s0_m=s,
                    d0_m=d0,
                    speed_d_mps=sign * speed,
                    t_start_s=t0,
                    duration_s=duration,
                    yaw_rad=sign * math.pi / 2,
                ),
            )
            self.blocked.append((s_c, d0, sign * speed, t0, duration))
        period = float(self.rng.uniform(16.0, 30.0))
        offset = float(self.rng.uniform(0.0, period))
        for d, yaw in ((rd.RIGHT_SIDEWALK_D[1] - 0.4, math.pi), (rd.LEFT_SIDEWALK_D[0] + 0.4, 0.0)):
            s = s_c - 4.0 if yaw else s_c + 4.0
            self.add(
                Category.TRAFFIC_LIGHT,
                make_traffic_light(self.rng),
                Motion(s0_m=s, d0_m=d, yaw_rad=yaw),
                light_period_s=period,
                light_offset_s=offset,
            )

    def signs(
        self,
        s_lo: float,
        s_hi: float,
        crosswalks: list[float],
        gap: tuple[float, float] = (50.0, 180.0),
    ) -> None:
        s = s_lo + float(self.rng.uniform(0.0, 80.0))
        while s < s_hi:
            if all(abs(s - c) > 8.0 for c in crosswalks):
                right = self.rng.random() < 0.6
                d = rd.RIGHT_SIDEWALK_D[1] - 0.5 if right else rd.LEFT_SIDEWALK_D[0] + 0.5
                self.add(
                    Category.TRAFFIC_SIGN,
                    make_traffic_sign(self.rng),
                    Motion(s0_m=s, d0_m=d, yaw_rad=math.pi if right else 0.0),
                )
            s += float(self.rng.uniform(*gap))

    def buildings(self, s_lo: float, s_hi: float) -> None:
        for side in (-1, 1):
            edge = rd.RIGHT_SIDEWALK_D[0] if side < 0 else rd.LEFT_SIDEWALK_D[1]
            s = s_lo
            while s < s_hi:
                if self.rng.random() < 0.75:
                    length = float(self.rng.uniform(10.0, 32.0))
                    depth = float(self.rng.uniform(10.0, 20.0))
                    setback = float(self.rng.uniform(2.0, 6.0))
                    d = edge + side * (setback + depth / 2)
                    solid = make_building(self.rng, length_m=length, depth_m=depth)
                    yaw = 0.0 if side < 0 else math.pi
                    self.scenery.append(
                        Actor(0, None, solid, Motion(s0_m=s + length / 2, d0_m=d, yaw_rad=yaw))
                    )
                    s += length + float(self.rng.uniform(3.0, 15.0))
                else:
                    for _ in range(int(self.rng.integers(1, 4))):
                        d = edge + side * float(self.rng.uniform(1.0, 3.5))
                        self.scenery.append(
                            Actor(
                                0,
                                None,
                                make_tree(self.rng),
                                Motion(s0_m=s + float(self.rng.uniform(0, 12)), d0_m=d),
                            )
                        )
                    s += float(self.rng.uniform(12.0, 25.0))


def generate_world(seed: int, *, duration_s: float, preset: str = "default") -> World:
    """A random world for a clip of `duration_s` seconds starting at t = 0.

    The same seed, duration and preset always give the same world. `preset` "default" is a
    straight-ish multi-lane road; "crossing" (`drivepercept.sim.crossing`) is a drive through
    sharp bends among close overtaking traffic, so objects cross from camera to camera.
    """
    if preset == "crossing":
        from drivepercept.sim.crossing import generate_crossing_world  # (it builds on this module)

        return generate_crossing_world(seed, duration_s=duration_s)
    if preset != "default":
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    rng = np.random.default_rng(seed)
    lighting = random_lighting(rng)
    ego_speed = float(rng.uniform(9.0, 14.0))
    ego_end = ego_speed * duration_s
    reach = VIEW_RANGE_M + 60.0
    road = rd.Road.generate(rng, s_min_m=-reach, s_max_m=ego_end + reach)
    b = _Builder(rng=rng, duration_s=duration_s, ego_speed=ego_speed)

    crosswalks: list[float] = []
    s = float(rng.uniform(30.0, 140.0))
    while s < ego_end + VIEW_RANGE_M:
        crosswalks.append(s)
        b.crossing(s)
        s += float(rng.uniform(150.0, 350.0))

    mix_fast = (0.8, 0.1, 0.1)
    mix_slow = (0.45, 0.35, 0.2)
    fast = ego_speed + float(rng.uniform(3.0, 6.0))
    slow = max(3.0, ego_speed - float(rng.uniform(3.0, 6.0)))
    b.lane_traffic(
        d=rd.forward_lane_d(0),
        speed=fast,
        direction=1,
        gap=(25.0, 90.0),
        mix=mix_fast,
        keep_clear=None,
    )
    # The ego's own lane moves at the ego's speed; keep a few metres clear around the ego.
    b.lane_traffic(
        d=rd.forward_lane_d(_EGO_LANE),
        speed=ego_speed,
        direction=1,
        gap=(18.0, 70.0),
        mix=mix_fast,
        keep_clear=(-12.0, 16.0),
    )
    b.lane_traffic(
        d=rd.forward_lane_d(2),
        speed=slow,
        direction=1,
        gap=(20.0, 80.0),
        mix=mix_slow,
        keep_clear=None,
    )
    for lane in range(rd.ONCOMING_LANES):
        b.lane_traffic(
            d=rd.oncoming_lane_d(lane),
            speed=float(rng.uniform(9.0, 15.0)),
            direction=-1,
            gap=(30.0, 110.0),
            mix=mix_fast if lane == 0 else mix_slow,
            keep_clear=None,
        )
    b.cyclists(d=sum(rd.RIGHT_BIKE_D) / 2, speed=float(rng.uniform(4.0, 7.0)), direction=1)
    b.cyclists(d=sum(rd.LEFT_BIKE_D) / 2, speed=float(rng.uniform(4.0, 7.0)), direction=-1)

    s_lo, s_hi = -reach, ego_end + reach
    b.walkers(d_range=rd.RIGHT_SIDEWALK_D, s_lo=s_lo, s_hi=s_hi)
    b.walkers(d_range=rd.LEFT_SIDEWALK_D, s_lo=s_lo, s_hi=s_hi)
    b.signs(s_lo, s_hi, crosswalks)
    b.buildings(s_lo, s_hi)

    ego = Motion(s0_m=0.0, d0_m=rd.forward_lane_d(_EGO_LANE), speed_s_mps=ego_speed)
    return World(
        road=road,
        ego=ego,
        actors=tuple(b.actors),
        scenery=tuple(b.scenery),
        lighting=lighting,
        crosswalks_s=tuple(crosswalks),
        seed=seed,
    )
