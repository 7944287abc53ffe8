"""Detectors: the plugin protocol, torchvision's COCO detectors and the registry that builds them.

>>> from drivepercept.models import load_detector
>>> detector = load_detector("ssdlite320_mobilenet_v3_large", weights="none")
>>> detector.input.size
(320, 320)
"""

from __future__ import annotations

from drivepercept.models.base import Detector, InputSpec, ModelError, WeightsStore
from drivepercept.models.registry import (
    PLUGIN_FORM,
    available_models,
    default_input_size,
    load_detector,
)

__all__ = [
    "PLUGIN_FORM",
    "Detector",
    "InputSpec",
    "ModelError",
    "WeightsStore",
    "available_models",
    "default_input_size",
    "load_detector",
]
