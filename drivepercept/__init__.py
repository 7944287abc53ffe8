"""drivepercept: real-time multi-camera object detection with honest latency reports."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivepercept._threads import prefer_passive_waits
from drivepercept.errors import ConfigError, DrivePerceptError, OutputError

if TYPE_CHECKING:
    from drivepercept.rig import CameraConfig as CameraConfig
    from drivepercept.rig import RigConfig as RigConfig
    from drivepercept.rig import load_rig as load_rig
    from drivepercept.rig import write_rig as write_rig

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


_RIG_NAMES = ("CameraConfig", "RigConfig", "load_rig", "write_rig")


def __dir__() -> list[str]:
    return sorted({*globals(), *_RIG_NAMES})


def __getattr__(name: str) -> Any:
    """The rig's names, imported from `drivepercept.rig` (and numpy with it) on first use:
    importing the package, as the command line does for `--help`, loads only the standard
    library."""
    if name in _RIG_NAMES:
        return getattr(importlib.import_module("drivepercept.rig"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
