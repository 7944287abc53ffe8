"""The rig fusion's settings (`fusion.RigFusion`): its gates, times and how looks count."""

from __future__ import annotations

import math
from dataclasses import dataclass

from drivepercept.errors import ConfigError


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
        look_gate: where sightings carry their looks (`Observation.look`), a sighting never
            joins an object that looks more unlike it than this (cosine distance, 0 to 2).
        look_match, look_reach: a sighting that looks like an object (distance at most
            `look_match`) joins it, stays with it and merges with it within `look_reach`
            times the gate along the line of sight (its range, from one pixel row, is off
            by tens of metres for a far pedestrian whose feet are hidden; its bearing is not).
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
    look_gate: float = 0.25
    look_match: float = 0.1
    look_reach: float = 3.0

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
        for name in ("look_gate", "look_match"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 2.0):
                raise ConfigError(f"fusion {name} must be in (0, 2], got {value!r}")
        if not (math.isfinite(self.look_reach) and self.look_reach >= 1.0):
            raise ConfigError(f"fusion look_reach must be >= 1, got {self.look_reach!r}")
        for name in ("merge_steps", "swap_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"fusion {name} must be an integer >= 1, got {value!r}")
