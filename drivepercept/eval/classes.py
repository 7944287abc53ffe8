"""Class rules: what each labelled class becomes among the driving classes.

A model's class names are lower-cased, spaces become underscores, and COCO names are mapped
(person -> pedestrian, bicycle and motorcycle -> cyclist, traffic light -> traffic_light, stop
sign -> traffic_sign). Labelled data maps onto the driving classes by a table per format
(KITTI, nuScenes, MOTChallenge, COCO): each labelled class is a target of a driving class, an
ignore region of one, or dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from drivepercept.errors import ConfigError
from drivepercept.types import COCO_TO_DRIVING, DRIVING_CLASSES

# COCO names as model outputs spell them (lower case, "_" for spaces) -> driving classes
CLASS_ALIASES: Mapping[str, str] = {
    coco.replace(" ", "_"): driving for coco, driving in COCO_TO_DRIVING.items()
}


def canonical_class(name: str) -> str:
    """A model's class name as the ground truth spells it."""
    key = name.strip().lower().replace(" ", "_")
    return CLASS_ALIASES.get(key, key)


@dataclass(frozen=True)
class ClassRule:
    """What a labelled class becomes: a target of a driving class, or an ignore region of one
    (a fair confusion: a detection of that class on it costs nothing)."""

    driving_class: str
    scored: bool = True

    def __post_init__(self) -> None:
        if self.driving_class not in DRIVING_CLASSES:
            raise ConfigError(f"expected one of {DRIVING_CLASSES}, got {self.driving_class!r}")


def _t(name: str) -> ClassRule:
    return ClassRule(name)


def _i(name: str) -> ClassRule:
    return ClassRule(name, scored=False)


# KITTI's own benchmark ignores Van for Car and Person_sitting for Pedestrian; trams look like
# buses. Misc and DontCare are dropped.
KITTI_CLASSES: Mapping[str, ClassRule] = {
    "Car": _t("car"),
    "Van": _i("car"),
    "Truck": _t("truck"),
    "Tram": _i("bus"),
    "Pedestrian": _t("pedestrian"),
    "Person_sitting": _i("pedestrian"),
    "Cyclist": _t("cyclist"),
}
# trailers and construction vehicles pass for trucks; cones and barriers are no driving class
NUSCENES_CLASSES: Mapping[str, ClassRule] = {
    "car": _t("car"),
    "truck": _t("truck"),
    "bus": _t("bus"),
    "pedestrian": _t("pedestrian"),
    "bicycle": _t("cyclist"),
    "motorcycle": _t("cyclist"),
    "trailer": _i("truck"),
    "construction_vehicle": _i("truck"),
}
# MOTChallenge scores pedestrians (class 1, consider == 1) only; its distractors (person on a
# vehicle, static person, distractor, reflection) are ignore regions of pedestrians, as in its
# own benchmark; vehicles are ignore regions of their class (MOT labels them incompletely, so
# they are never targets); non-motorised vehicles and occluders (6, 9-11) are dropped.
MOT_CLASSES: Mapping[int, ClassRule] = {
    1: _t("pedestrian"),
    2: _i("pedestrian"),
    7: _i("pedestrian"),
    8: _i("pedestrian"),
    12: _i("pedestrian"),
    3: _i("car"),
    4: _i("cyclist"),
    5: _i("cyclist"),
}
# a COCO json's table, chosen by its category names: all of them named (or dropped) by one
TABLES: Mapping[str, tuple[Mapping[str, ClassRule], frozenset[str]]] = {
    "kitti": (KITTI_CLASSES, frozenset({"Misc", "DontCare"})),
    "nuscenes": (NUSCENES_CLASSES, frozenset({"traffic_cone", "barrier"})),
}


def class_table(names: Iterable[str]) -> str:
    """kitti or nuscenes when every category name is one of theirs, else coco."""
    names = set(names)
    for table, (rules, dropped) in TABLES.items():
        if names and names <= set(rules) | dropped:
            return table
    return "coco"


def class_rule(table: str, name: str) -> ClassRule | None:
    """A category of a COCO json's table; None: dropped. The coco table maps names as model
    outputs are (`canonical_class`: person -> pedestrian, ...), so our own names map too."""
    if table in TABLES:
        return TABLES[table][0].get(name)
    key = canonical_class(name)
    return _t(key) if key in DRIVING_CLASSES else None
