"""What `drivepercept simulate` renders."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from drivepercept.errors import ConfigError
from drivepercept.geometry import check_camera_count, check_fps, check_size, parse_size

__all__ = ["SimulationConfig", "parse_size"]


@dataclass(frozen=True)
class SimulationConfig:
    """What `drivepercept simulate` renders: a rig of `cameras` cameras for `seconds` seconds."""

    out_dir: Path
    cameras: int = 6
    seconds: float = 8.0
    fps: float = 15.0
    width: int = 640
    height: int = 360
    seed: int = 0
    noise: bool = True

    def __post_init__(self) -> None:
        check_camera_count(self.cameras)
        check_fps(self.fps)
        check_size(self.width, self.height)
        if self.width % 2 or self.height % 2:
            raise ConfigError(
                f"frame size must have an even width and height for the MP4 encoder, "
                f"got {self.width}x{self.height}"
            )
        if not (math.isfinite(self.seconds) and 0.0 < self.seconds <= 3600.0):
            raise ConfigError(f"seconds must be > 0 and <= 3600, got {self.seconds:g}")
        if self.frame_count < 1:
            raise ConfigError(f"{self.seconds:g} s at {self.fps:g} fps is less than one frame")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be a non-negative 64-bit integer, got {self.seed}")

    @property
    def frame_count(self) -> int:
        """Frames per camera: frame k shows the world at k / fps seconds."""
        return round(self.seconds * self.fps)
