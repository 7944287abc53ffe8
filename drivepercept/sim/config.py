"""What `drivepercept simulate` renders."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from drivepercept.errors import ConfigError
from drivepercept.geometry import check_camera_count, check_fps, check_size, parse_size

__all__ = ["DEFAULT_SECONDS", "FORMATS", "PRESETS", "SimulationConfig", "parse_size"]

# what a simulation writes: an MP4 per camera, or one MCAP file of them all (`sim.mcapclip`)
FORMATS = ("mp4", "mcap")
# the world: "default" (a multi-lane road) or "crossing" (sharp bends, close overtaking traffic:
# objects cross from camera to camera; `sim.crossing`), and the drive length each is made for
PRESETS = ("default", "crossing")
DEFAULT_SECONDS = {"default": 8.0, "crossing": 30.0}


@dataclass(frozen=True)
class SimulationConfig:
    """What `drivepercept simulate` renders: a rig of `cameras` cameras for `seconds` seconds,
    written as `format` ("mp4": a video per camera; "mcap": one MCAP file of the rig), of the
    world `preset` ("default", or "crossing": objects crossing between cameras)."""

    out_dir: Path
    cameras: int = 6
    seconds: float = 8.0
    fps: float = 15.0
    width: int = 640
    height: int = 360
    seed: int = 0
    noise: bool = True
    format: str = "mp4"
    preset: str = "default"

    def __post_init__(self) -> None:
        check_camera_count(self.cameras)
        check_fps(self.fps)
        check_size(self.width, self.height)
        if self.format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.preset not in PRESETS:
            raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        if self.format == "mp4" and (self.width % 2 or self.height % 2):
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
