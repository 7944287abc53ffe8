"""Places on the ground and their motion, for the rig's fusion (`fusion.py`): a placed
sighting (`Observation`), a sighting moved in time by its object's speed, the weighted mean of
an object's sightings, an object's speed fitted to its latest places, and boxes cut by the
image's side (whose places are rough)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# how far back an object's place is moved for a sighting older than it, and how far a
# sighting is moved to its step's time (seconds): frames of one batch are a few apart
MAX_BACK_S = 0.5
SPEED_PLACES = 20  # an object's speed is fitted to this many latest places (15 fps: 1.3 s)


@dataclass(frozen=True)
class Observation:
    """A confirmed track's box in one camera at this step, placed on the ground."""

    camera: str
    track_id: int
    class_name: str
    xyxy: tuple[float, float, float, float]
    xy: tuple[float, float]
    truncated: bool = False  # cut by the image's side: a rougher place
    t_s: float | None = None  # its frame's time (None: the step's)
    # what its box looks like (`appearance.box_features`, a unit vector; None: not known)
    look: npt.NDArray[np.float32] | None = field(default=None, compare=False, repr=False)


Place = tuple[float, float]  # ego x, y (m); plain floats: the fusion's work is per object


class SpeedFit:
    """The least-squares line through an object's latest places (t, x, y), kept as running
    sums so that each new place costs the same whatever the window. One place is off by a
    metre or so at 20 m, so a speed from two places a frame apart is off by metres per
    second; a line through a second's worth is off by about one."""

    __slots__ = ("_places", "_sums", "_t0", "velocity")

    def __init__(self) -> None:
        self._t0: float | None = None  # times are kept from here (small numbers, exact sums)
        self._places: deque[tuple[float, float, float]] = deque()
        self._sums = [0.0] * 6  # t, x, y, t*t, t*x, t*y
        self.velocity: Place | None = None  # (vx, vy) m/s; None until places span 0.1 s

    @property
    def last_t(self) -> float | None:
        return None if not self._places else self._places[-1][0] + (self._t0 or 0.0)

    def add(self, t_s: float, x: float, y: float) -> None:
        if self._t0 is None:
            self._t0 = t_s
        t = t_s - self._t0
        sums = self._sums
        if len(self._places) == SPEED_PLACES:
            ot, ox, oy = self._places.popleft()
            for k, v in enumerate((ot, ox, oy, ot * ot, ot * ox, ot * oy)):
                sums[k] -= v
        self._places.append((t, x, y))
        for k, v in enumerate((t, x, y, t * t, t * x, t * y)):
            sums[k] += v
        n = len(self._places)
        if n < 3 or self._places[-1][0] - self._places[0][0] < 0.1:
            self.velocity = None
            return
        st, sx, sy, stt, stx, sty = sums
        den = n * stt - st * st
        self.velocity = ((n * stx - st * sx) / den, (n * sty - st * sy) / den)


def time_of(obs: Observation, step_s: float) -> float:
    """A sighting's time: its frame's, else (none given) its step's."""
    return step_s if obs.t_s is None else obs.t_s


def moved(obs: Observation, velocity: Place | None, t_s: float) -> Place:
    """A sighting's place at `t_s`: the frames of one batch (one step) can be frames apart
    (each camera's decoder runs at its own pace), so each is moved by the object's speed
    from its own frame's time to the step's."""
    if velocity is None or obs.t_s is None or obs.t_s == t_s:
        return obs.xy
    dt = min(max(t_s - obs.t_s, -MAX_BACK_S), MAX_BACK_S)
    return (obs.xy[0] + velocity[0] * dt, obs.xy[1] + velocity[1] * dt)


def mean_place(group: Sequence[Observation], velocity: Place | None, t_s: float) -> Place:
    """The sightings' places at `t_s`, averaged; a box cut by the image's side weighs a
    fifth."""
    if len(group) == 1:  # the common case, without the weighing
        return moved(group[0], velocity, t_s)
    x = y = total = 0.0
    for o in group:
        w = 0.2 if o.truncated else 1.0
        ox, oy = moved(o, velocity, t_s)
        x, y, total = x + w * ox, y + w * oy, total + w
    return (x / total, y / total)


def cut_by_side(
    xyxy: npt.NDArray[np.float64], width: float | npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Boxes `(N, 4)` that touch their image's left or right side (`width`: the image's, one
    for all or one per box): their bottom centre is not the object's (the object goes on
    outside the image), so they join on a wider gate and weigh less in the object's place."""
    margin = 2.0
    return np.asarray((xyxy[:, 0] <= margin) | (xyxy[:, 2] >= np.asarray(width) - margin))
