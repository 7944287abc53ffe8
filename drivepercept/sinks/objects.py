"""The rig's objects as JSON Lines: one line per rig time step (`--track`).

A line looks like (wrapped here)::

    {"frame_index":12,"pts_s":0.8,"stamp_ns":800000000,"objects":[{"id":3,"class":"car",
     "x_m":14.2,"y_m":-3.1,"range_m":14.53,"speed_mps":8.4,"boxes":[{"camera":"front",
     "track_id":5,"box":[310.5,180.0,352.25,210.75]},{"camera":"front_right",...}]}]}

`x_m`, `y_m`: where the object stands on the ground in the ego frame (x forward, y left), in
metres; `speed_mps` is null until it has been placed twice. Each `boxes` entry is a camera's
box of it (xyxy, original pixels, 2 decimals) and that camera's track id, as in
detections.jsonl. The file is valid JSON Lines at every moment (`drivepercept.sinks._lines`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drivepercept.sinks._lines import LineFile
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import FrameResult
from drivepercept.types.objects import RigStep


def step_record(step: RigStep) -> dict[str, Any]:
    """The JSON object written for one rig time step (see the module docstring)."""
    return {
        "frame_index": step.frame_index,
        "pts_s": step.pts_s,
        "stamp_ns": step.stamp_ns,
        "objects": [
            {
                "id": o.id,
                "class": o.class_name,
                "x_m": o.x_m,
                "y_m": o.y_m,
                "range_m": o.range_m,
                "speed_mps": o.speed_mps,
                "boxes": [
                    {
                        "camera": s.camera,
                        "track_id": s.track_id,
                        "box": [round(v, 2) for v in s.xyxy],
                    }
                    for s in o.sightings
                ],
            }
            for o in step.objects
        ],
    }


class ObjectsJsonlSink(ClosingSink):
    """Writes `step_record(step)` per rig time step to `path` (called on the completion
    thread, by the tracking stage).

    Raises:
        OutputError: the file cannot be created or written.
    """

    def __init__(self, path: Path | str) -> None:
        self._file = LineFile(Path(path), what="objects file")

    @property
    def steps_written(self) -> int:
        return self._file.lines

    def write(self, result: FrameResult) -> None:
        """Nothing: the objects come through `write_step`. As a sink of the run's `SinkSet`
        this file is closed with the others, after the last batch went through tracking."""

    def write_step(self, step: RigStep) -> None:
        line = json.dumps(step_record(step), separators=(",", ":"), allow_nan=False)
        self._file.append(line + "\n")

    def close(self) -> None:
        """Write what is buffered and close the file; closing twice is safe."""
        self._file.close()
