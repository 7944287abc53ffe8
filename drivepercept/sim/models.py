"""3D solids of the synthetic world: vehicles, people, traffic furniture and scenery.

Every solid is a handful of cuboid parts in its own frame (x forward, y left, z up, origin on
the ground at the centre of its footprint). Parts that belong to the labelled object carry
`labelled=True`; poles and scenery do not, so a traffic light's ground-truth box is its
housing, as in COCO, while its pole still occludes what is behind it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Colour = tuple[int, int, int]  # BGR, 0-255


class Category(enum.IntEnum):
    """Labelled classes of the synthetic world (values are the COCO category ids we write)."""

    CAR = 1
    TRUCK = 2
    BUS = 3
    PEDESTRIAN = 4
    CYCLIST = 5
    TRAFFIC_LIGHT = 6
    TRAFFIC_SIGN = 7

    @property
    def label(self) -> str:
        return self.name.lower()


# Vertex i of a cuboid has x = max if bit 0, y = max if bit 1, z = max if bit 2.
CUBOID_FACES = np.array(
    [[0, 2, 6, 4], [1, 3, 7, 5], [0, 1, 5, 4], [2, 3, 7, 6], [0, 1, 3, 2], [4, 5, 7, 6]]
)
CUBOID_NORMALS = np.array(
    [[-1.0, 0, 0], [1.0, 0, 0], [0, -1.0, 0], [0, 1.0, 0], [0, 0, -1.0], [0, 0, 1.0]]
)
NO_LAMP = -1


@dataclass(frozen=True)
class Part:
    """One cuboid of a solid.

    Attributes:
        x_m, y_m: centre of the footprint in the solid's frame.
        z0_m: height of the bottom face.
        size_m: (length along x, width along y, height).
        colour: BGR base colour before lighting.
        labelled: counts towards the object's ground-truth box.
        emissive: lights (lamps) ignore shading.
        swing: walking/pedalling animation; the part moves along x by swing * stride.
        lamp: traffic-light lamp index (0 red, 1 amber, 2 green), NO_LAMP otherwise.
    """

    x_m: float
    y_m: float
    z0_m: float
    size_m: tuple[float, float, float]
    colour: Colour
    labelled: bool = True
    emissive: bool = False
    swing: float = 0.0
    lamp: int = NO_LAMP


@dataclass(frozen=True, eq=False)
class Solid:
    """Parts packed as arrays for vectorised posing and projection.

    Attributes:
        vertices_m: (P, 8, 3) cuboid corners in the solid's frame.
        colours: (P, 3) float BGR.
        labelled, emissive: (P,) bool.
        swing: (P,) float.
        lamp: (P,) int.
        radius_m: radius of a sphere around the origin's vertical axis holding every vertex.
        height_m: top of the highest part.
    """

    vertices_m: FloatArray
    colours: FloatArray
    labelled: npt.NDArray[np.bool_]
    emissive: npt.NDArray[np.bool_]
    swing: FloatArray
    lamp: npt.NDArray[np.int64]
    radius_m: float
    height_m: float

    @classmethod
    def from_parts(cls, parts: Sequence[Part]) -> Solid:
        corners = np.array([[(i >> 0) & 1, (i >> 1) & 1, (i >> 2) & 1] for i in range(8)], float)
        verts = []
        for p in parts:
            lo = np.array([p.x_m - p.size_m[0] / 2, p.y_m - p.size_m[1] / 2, p.z0_m])
            verts.append(lo + corners * np.array(p.size_m))
        vertices = np.array(verts)
        return cls(
            vertices_m=vertices,
            colours=np.array([p.colour for p in parts], dtype=np.float64),
            labelled=np.array([p.labelled for p in parts]),
            emissive=np.array([p.emissive for p in parts]),
            swing=np.array([p.swing for p in parts]),
            lamp=np.array([p.lamp for p in parts], dtype=np.int64),
            radius_m=float(np.linalg.norm(vertices.reshape(-1, 3), axis=1).max()),
            height_m=float(vertices[..., 2].max()),
        )

    @property
    def centre_m(self) -> FloatArray:
        """Centre of the labelled parts' bounding box (all parts if none is labelled)."""
        v = self.vertices_m[self.labelled] if self.labelled.any() else self.vertices_m
        flat = v.reshape(-1, 3)
        return np.asarray((flat.min(axis=0) + flat.max(axis=0)) / 2.0, dtype=np.float64)


# --------------------------------------------------------------------------- palettes

_PAINT: tuple[Colour, ...] = (
    (235, 235, 235),
    (30, 30, 30),
    (180, 180, 175),
    (110, 110, 110),
    (40, 40, 180),
    (150, 70, 20),
    (40, 90, 30),
    (40, 190, 220),
    (140, 170, 190),
    (20, 20, 110),
    (120, 60, 90),
)
_BUS_PAINT: tuple[Colour, ...] = (
    (30, 200, 240),
    (40, 40, 190),
    (160, 90, 30),
    (230, 230, 230),
    (60, 140, 40),
)
_CLOTHES: tuple[Colour, ...] = (
    (40, 40, 40),
    (200, 200, 200),
    (160, 60, 30),
    (40, 40, 170),
    (50, 130, 60),
    (60, 160, 200),
    (120, 50, 120),
    (90, 90, 140),
    (30, 90, 160),
    (180, 140, 90),
)
_SKIN: tuple[Colour, ...] = ((150, 180, 220), (110, 140, 190), (70, 100, 150), (50, 70, 100))
GLASS: Colour = (70, 55, 45)
TYRE: Colour = (25, 25, 25)
HEADLIGHT: Colour = (200, 235, 245)
TAILLIGHT: Colour = (30, 30, 210)
LAMP_COLOURS: tuple[Colour, ...] = ((40, 40, 255), (0, 190, 255), (120, 255, 60))


def _pick(rng: np.random.Generator, palette: Sequence[Colour]) -> Colour:
    base = palette[int(rng.integers(len(palette)))]
    jitter = rng.integers(-12, 13, size=3)
    return tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(base, jitter, strict=True))  # type: ignore[return-value]


def _wheels(xs: Sequence[float], half_track: float, diameter: float) -> list[Part]:
    return [
        Part(x, side * half_track, 0.0, (diameter, 0.26, diameter), TYRE, labelled=True)
        for x in xs
        for side in (-1.0, 1.0)
    ]


def _lamps(length: float, width: float, z0: float) -> list[Part]:
    """Head lamps on the front face (+x) and tail lamps on the back face (-x)."""
    parts = []
    for side in (-1.0, 1.0):
        y = side * (width / 2 - 0.3)
        parts.append(Part(length / 2 + 0.02, y, z0, (0.04, 0.32, 0.14), HEADLIGHT, emissive=True))
        parts.append(Part(-length / 2 - 0.02, y, z0, (0.04, 0.32, 0.14), TAILLIGHT, emissive=True))
    return parts


def make_car(rng: np.random.Generator) -> Solid:
    """A car: body, glass cabin, roof, four wheels, lamps."""
    length = float(rng.uniform(3.9, 4.9))
    width = float(rng.uniform(1.70, 1.90))
    height = float(rng.uniform(1.40, 1.60))
    paint = _pick(rng, _PAINT)
    body_z0, body_top = 0.28, 0.92
    cabin_len = length * float(rng.uniform(0.45, 0.55))
    parts = [
        Part(0.0, 0.0, body_z0, (length, width, body_top - body_z0), paint),
        Part(
            -0.06 * length,
            0.0,
            body_top,
            (cabin_len, width - 0.14, height - body_top - 0.06),
            GLASS,
        ),
        Part(-0.06 * length, 0.0, height - 0.06, (cabin_len - 0.1, width - 0.2, 0.06), paint),
        *_wheels((0.32 * length, -0.32 * length), width / 2 - 0.12, 0.64),
        *_lamps(length, width, 0.62),
    ]
    return Solid.from_parts(parts)


def make_truck(rng: np.random.Generator) -> Solid:
    """A box truck: chassis, cab with windscreen, cargo box, six wheels, lamps."""
    length = float(rng.uniform(6.5, 9.5))
    width = 2.45
    cab_len = 2.2
    cab_h = float(rng.uniform(2.8, 3.1))
    box_h = float(rng.uniform(3.3, 3.9))
    cab_paint = _pick(rng, _PAINT)
    box_paint = _pick(rng, ((225, 225, 225), (200, 200, 190), (60, 60, 160), (150, 100, 40)))
    front = length / 2
    box_len = length - cab_len - 0.3
    parts = [
        Part(0.0, 0.0, 0.45, (length, width - 0.3, 0.45), (40, 40, 40)),
        Part(front - cab_len / 2, 0.0, 0.7, (cab_len, width, cab_h - 0.7), cab_paint),
        Part(front + 0.02, 0.0, 1.8, (0.04, width - 0.3, 0.9), GLASS),
        Part(-front + box_len / 2, 0.0, 0.95, (box_len, width, box_h - 0.95), box_paint),
        *_wheels((front - 1.2, -front + 1.9, -front + 0.9), width / 2 - 0.15, 0.95),
        *_lamps(length, width, 0.75),
    ]
    return Solid.from_parts(parts)


def make_bus(rng: np.random.Generator) -> Solid:
    """A city bus: long body, window bands on all four sides, wheels, lamps."""
    length = float(rng.uniform(10.5, 12.5))
    width = 2.5
    height = float(rng.uniform(3.0, 3.3))
    paint = _pick(rng, _BUS_PAINT)
    band_z0, band_h = 1.25, 1.15
    parts = [
        Part(0.0, 0.0, 0.3, (length, width, height - 0.3), paint),
        Part(0.3, width / 2 + 0.01, band_z0, (length - 1.6, 0.02, band_h), GLASS),
        Part(0.3, -width / 2 - 0.01, band_z0, (length - 1.6, 0.02, band_h), GLASS),
        Part(length / 2 + 0.01, 0.0, 1.0, (0.02, width - 0.3, 1.6), GLASS),
        Part(-length / 2 - 0.01, 0.0, band_z0 + 0.3, (0.02, width - 0.5, 0.8), GLASS),
        *_wheels((length / 2 - 2.6, -length / 2 + 3.0), width / 2 - 0.12, 1.0),
        *_lamps(length, width, 0.6),
    ]
    return Solid.from_parts(parts)


def make_pedestrian(rng: np.random.Generator) -> Solid:
    """A walker: two legs and arms that swing, torso, head."""
    h = float(rng.uniform(1.50, 1.95))
    top = _pick(rng, _CLOTHES)
    trousers = _pick(rng, _CLOTHES)
    skin = _pick(rng, _SKIN)
    leg_h = 0.47 * h
    torso_h = 0.33 * h
    parts = [
        Part(0.0, 0.1, 0.0, (0.16, 0.14, leg_h), trousers, swing=1.0),
        Part(0.0, -0.1, 0.0, (0.16, 0.14, leg_h), trousers, swing=-1.0),
        Part(0.0, 0.0, leg_h, (0.26, 0.42, torso_h), top),
        Part(0.0, 0.27, leg_h + 0.05, (0.11, 0.1, 0.3 * h), top, swing=-0.7),
        Part(0.0, -0.27, leg_h + 0.05, (0.11, 0.1, 0.3 * h), top, swing=0.7),
        Part(0.01, 0.0, leg_h + torso_h, (0.2, 0.18, h - leg_h - torso_h), skin),
    ]
    return Solid.from_parts(parts)


def make_cyclist(rng: np.random.Generator) -> Solid:
    """A bicycle (wheels, frame, bars) with a rider whose legs pedal."""
    frame_c = _pick(rng, _PAINT)
    top = _pick(rng, _CLOTHES)
    trousers = _pick(rng, _CLOTHES)
    skin = _pick(rng, _SKIN)
    parts = [
        Part(0.52, 0.0, 0.0, (0.68, 0.06, 0.68), TYRE),
        Part(-0.52, 0.0, 0.0, (0.68, 0.06, 0.68), TYRE),
        Part(0.0, 0.0, 0.45, (1.0, 0.06, 0.14), frame_c),
        Part(0.45, 0.0, 0.95, (0.08, 0.55, 0.06), (50, 50, 50)),
        Part(0.0, 0.13, 0.3, (0.15, 0.13, 0.62), trousers, swing=0.6),
        Part(0.0, -0.13, 0.3, (0.15, 0.13, 0.62), trousers, swing=-0.6),
        Part(0.05, 0.0, 0.92, (0.34, 0.4, 0.58), top),
        Part(0.15, 0.0, 1.5, (0.2, 0.18, 0.24), skin),
    ]
    return Solid.from_parts(parts)


def make_traffic_light(rng: np.random.Generator, *, pole_height_m: float = 3.0) -> Solid:
    """A pole (unlabelled) with a three-lamp housing facing +x."""
    del rng  # all traffic lights look alike
    parts = [
        Part(0.0, 0.0, 0.0, (0.16, 0.16, pole_height_m), (80, 80, 80), labelled=False),
        Part(0.0, 0.0, pole_height_m, (0.32, 0.36, 0.98), (30, 35, 35)),
    ]
    for lamp in range(3):
        z0 = pole_height_m + 0.68 - lamp * 0.3
        parts.append(
            Part(0.17, 0.0, z0, (0.02, 0.22, 0.22), LAMP_COLOURS[lamp], emissive=True, lamp=lamp)
        )
    return Solid.from_parts(parts)


_SIGN_FACES: tuple[tuple[Colour, Colour], ...] = (
    ((30, 30, 200), (30, 30, 200)),  # stop: red
    ((30, 30, 200), (240, 240, 240)),  # prohibition / speed: red rim, white face
    ((150, 80, 20), (150, 80, 20)),  # information: blue
    ((30, 30, 200), (40, 210, 240)),  # warning: red rim, yellow face
)


def make_traffic_sign(rng: np.random.Generator) -> Solid:
    """A pole (unlabelled) with a square plate facing +x, rim and face in sign colours."""
    rim, face = _SIGN_FACES[int(rng.integers(len(_SIGN_FACES)))]
    size = float(rng.uniform(0.6, 0.8))
    parts = [
        Part(0.0, 0.0, 0.0, (0.08, 0.08, 2.0), (150, 150, 150), labelled=False),
        Part(0.06, 0.0, 2.0, (0.04, size, size), rim),
        Part(0.09, 0.0, 2.0 + 0.12 * size, (0.02, 0.76 * size, 0.76 * size), face),
    ]
    return Solid.from_parts(parts)


def make_building(rng: np.random.Generator, *, length_m: float, depth_m: float) -> Solid:
    """A block (unlabelled) whose +y side faces the road, with a dark window band per floor."""
    height = float(rng.uniform(6.0, 24.0))
    facade = _pick(
        rng,
        (
            (170, 190, 210),
            (120, 130, 150),
            (90, 100, 130),
            (200, 200, 200),
            (60, 80, 120),
            (140, 150, 140),
        ),
    )
    parts = [Part(0.0, 0.0, 0.0, (length_m, depth_m, height), facade, labelled=False)]
    floor = 3.2
    z = 1.0
    while z + 1.3 < height - 0.5:
        parts.append(
            Part(0.0, depth_m / 2 + 0.02, z, (length_m - 1.0, 0.04, 1.3), GLASS, labelled=False)
        )
        z += floor
    return Solid.from_parts(parts)


def make_tree(rng: np.random.Generator) -> Solid:
    """A trunk and a box crown (unlabelled)."""
    crown = float(rng.uniform(2.2, 3.6))
    trunk_h = float(rng.uniform(1.8, 2.8))
    green = _pick(rng, ((40, 110, 50), (30, 90, 60), (50, 130, 80)))
    return Solid.from_parts(
        [
            Part(0.0, 0.0, 0.0, (0.3, 0.3, trunk_h), (40, 60, 90), labelled=False),
            Part(0.0, 0.0, trunk_h, (crown, crown, crown), green, labelled=False),
        ]
    )
