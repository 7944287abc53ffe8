"""Writing the robotics formats: ROS 2 messages and Foxglove schemas in MCAP files.

`messages` holds the message types written (ROS 2 `sensor_msgs`, `vision_msgs`; Foxglove's
`ImageAnnotations`, `CompressedImage` and plain JSON series), `mcapfile`
the one MCAP writer that the `--mcap` sink and `simulate --format mcap` share. Reading bags and
MCAP files is a source's job (`drivepercept.sources.recordings`). The third-party packages are
the `[ros]` extra, imported when a file is written: the base install runs without them.
"""

from __future__ import annotations

from drivepercept.errors import ConfigError

ROS_EXTRA = "pip install 'drivepercept[ros]'"


def missing_ros_extra(what: str, exc: ImportError) -> ConfigError:
    """The one-line error for a bag or MCAP feature used without the `[ros]` extra."""
    return ConfigError(f"{what} needs the ROS/MCAP packages ({exc.name} is missing): {ROS_EXTRA}")
