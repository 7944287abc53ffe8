"""Detections as JSON Lines: one compact JSON object per camera frame.

A line looks like (wrapped here)::

    {"camera":"front","camera_index":0,"frame_index":12,"pts_s":0.8,"batch_index":2,
     "batch_size":6,"timestamps":{"capture_ns":1200,"emitted_ns":35001200,
     "end_to_end_ms":35.0},"boxes":[[10.5,20.25,110.0,90.75]],"scores":[0.9132],
     "labels":[2],"class_names":["car"]}

Boxes are xyxy in original-frame pixels (2 decimals), scores have 4 decimals, `class_names`
holds the name of each box. A frame of a recorded drive (ROS bag, MCAP) also has `stamp_ns`,
its header stamp exactly (its `pts_s` is the same time in seconds). A frame that was not
detected (a detection interval) has `"predicted":true`: its boxes are its tracks' moved on
by the tracker to its time. The file is strict JSON: a non-finite number is written as null.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivepercept.sinks._lines import LineFile
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import Detections, FrameResult

log = logging.getLogger(__name__)


def _rounded(values: npt.NDArray[Any], decimals: int) -> list[Any]:
    """`values` rounded, as (nested) Python lists; non-finite entries become None."""
    rounded = np.round(values.astype(np.float64), decimals)
    if np.isfinite(rounded).all():
        return list(rounded.tolist())
    flat = [v if math.isfinite(v) else None for v in rounded.ravel().tolist()]
    if rounded.ndim == 1:
        return flat
    width = rounded.shape[1]
    return [flat[i : i + width] for i in range(0, len(flat), width)]


def frame_record(result: FrameResult) -> dict[str, Any]:
    """The JSON object written for one camera frame (see the module docstring)."""
    det = result.detections
    timing = result.timing
    stamp = {} if result.meta.stamp_ns is None else {"stamp_ns": result.meta.stamp_ns}
    return {
        "camera": result.camera,
        "camera_index": result.camera_index,
        "frame_index": result.frame_index,
        "pts_s": result.pts_s if math.isfinite(result.pts_s) else None,
        **stamp,
        "batch_index": result.batch_index,
        "batch_size": result.batch_size,
        "timestamps": {
            "capture_ns": timing.capture_ns,
            "emitted_ns": timing.emitted_ns,
            "end_to_end_ms": round(timing.end_to_end_ms, 3),
        },
        "boxes": _rounded(det.xyxy.reshape(-1, 4), 2),
        "scores": _rounded(det.scores, 4),
        "labels": [int(v) for v in det.labels.tolist()],
        "class_names": det.names,
        **_identities(det),
        **({"predicted": True} if det.predicted else {}),
    }


def _identities(det: Detections) -> dict[str, Any]:
    """What tracking added (`drivepercept.tracking`): per box its track in its camera
    (`track_ids`, -1: none), its motion in pixels per second (`velocities`, d(xyxy)/dt, 1
    decimal; null where unknown) and its object across the rig (`global_ids`, -1: none)."""
    out: dict[str, Any] = {}
    if det.track_ids is not None:
        out["track_ids"] = [int(v) for v in det.track_ids.tolist()]
    if det.velocities is not None:
        out["velocities"] = _rounded(det.velocities.reshape(-1, 4), 1)
    if det.global_ids is not None:
        out["global_ids"] = [int(v) for v in det.global_ids.tolist()]
    return out


class DetectionsJsonlSink(ClosingSink):
    """Writes `frame_record(result)` as one line per camera frame to `path`.

    Lines are buffered and written in whole-line chunks (see `drivepercept.sinks._lines`), so
    the file is valid JSON Lines at every moment and after `close()`, even mid-run.

    Args:
        path: the file to create (truncated if it exists; missing parent folders are made).

    Raises:
        OutputError: the file cannot be created.
    """

    def __init__(self, path: Path | str) -> None:
        self._file = LineFile(Path(path), what="detections file")
        log.debug("writing detections to %s", self._file.path)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def frames_written(self) -> int:
        return self._file.lines

    def write(self, result: FrameResult) -> None:
        """Append one camera frame's detections.

        Raises:
            OutputError: the file cannot be written.
            ValueError: the sink is closed.
        """
        line = json.dumps(frame_record(result), separators=(",", ":"), allow_nan=False)
        self._file.append(line + "\n")

    def close(self) -> None:
        """Write what is buffered and close the file; closing twice is safe."""
        self._file.close()
