"""drivepercept: real-time multi-camera object detection with honest latency reports."""

from __future__ import annotations

from drivepercept._threads import prefer_passive_waits
from drivepercept.errors import ConfigError, DrivePerceptError, OutputError
from drivepercept.rig import CameraConfig, RigConfig, load_rig, write_rig

# before anything of ours imports torch (these imports do not): see drivepercept/_threads.py
prefer_passive_waits()

__version__ = "0.1.0"

__all__ = [
    "CameraConfig",
    "ConfigError",
    "DrivePerceptError",
    "OutputError",
    "RigConfig",
    "__version__",
    "load_rig",
    "write_rig",
]
