"""How COCO detectors' classes map onto the driving classes every model reports.

`drivepercept.types.DRIVING_CLASSES` is the one vocabulary of outputs, reports and evaluation:
drivepercept-tiny was trained on it; COCO detectors (YOLOX, torchvision's) are mapped by
`COCO_TO_DRIVING` (person -> pedestrian, bicycle and motorcycle -> cyclist, traffic light ->
traffic_light, stop sign -> traffic_sign; car, truck and bus as they are). Their other
classes are dropped, unless a run asks for all classes (`classes = "all"`), when they are
reported under their COCO names.
"""

from __future__ import annotations

import dataclasses

from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, ModelError
from drivepercept.types import CLASS_CHOICES, COCO_TO_DRIVING, DRIVING_CLASSES


def coco_driving_view(class_names: tuple[str, ...]) -> tuple[frozenset[int], tuple[str, ...]]:
    """(keep_labels, report_as) for a COCO detector: the driving classes kept and renamed.

    Raises:
        ModelError: `class_names` lacks a driving class (names of another dataset).
    """
    keep = frozenset(i for i, name in enumerate(class_names) if name in COCO_TO_DRIVING)
    missing = set(DRIVING_CLASSES) - {COCO_TO_DRIVING[class_names[i]] for i in keep}
    if missing:
        raise ModelError(f"class names lack the driving classes {sorted(missing)}")
    return keep, tuple(COCO_TO_DRIVING.get(name, name) for name in class_names)


def with_classes(detector: Detector, classes: str) -> Detector:
    """The detector reporting its driving classes (as built) or all its classes ("all").

    Raises:
        ConfigError: `classes` is neither "driving" nor "all".
    """
    if classes not in CLASS_CHOICES:
        raise ConfigError(f"classes must be one of {', '.join(CLASS_CHOICES)}, got {classes!r}")
    if classes == "driving" or detector.keep_labels is None:
        return detector
    return dataclasses.replace(detector, keep_labels=None)
