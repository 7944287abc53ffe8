"""Per-frame stage timestamps as CSV (`frames.csv`), the raw material of latency reports.

Columns: camera, camera_index, frame_index, pts_s, batch_index, batch_size, one `<stamp>_ns`
column per entry of `drivepercept.types.STAMPS`, in that order (monotonic ns, 0 where a stage
does not apply), end_to_end_ms (capture to emission, 3 decimals) and detections (the number
of boxes). Readers go by the header's names, so files with the older column order (device
span starts last) still read.
Rows end with "\\n"; fields are quoted by the csv module where needed.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from drivepercept.sinks._lines import LineFile
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import STAMPS, FrameResult

log = logging.getLogger(__name__)

_STAMP_COLUMNS = tuple(f"{stamp}_ns" for stamp in STAMPS)

FRAMES_CSV_COLUMNS: tuple[str, ...] = (
    "camera",
    "camera_index",
    "frame_index",
    "pts_s",
    "batch_index",
    "batch_size",
    *_STAMP_COLUMNS,
    "end_to_end_ms",
    "detections",
)


def timing_row(result: FrameResult) -> list[str | int | float]:
    """The `frames.csv` row of one camera frame, in `FRAMES_CSV_COLUMNS` order."""
    timing = result.timing
    return [
        result.camera,
        result.camera_index,
        result.frame_index,
        result.pts_s,
        result.batch_index,
        result.batch_size,
        *(timing.stamp(stamp) for stamp in STAMPS),
        round(timing.end_to_end_ms, 3),
        len(result.detections),
    ]


class _Row:
    """What `csv.writer` writes into: it collects one formatted row for the line file."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def take(self) -> str:
        line = "".join(self.parts)
        self.parts.clear()
        return line


class FrameTimingCsvSink(ClosingSink):
    """Writes one `frames.csv` row per camera frame (see the module docstring).

    The header is written at once; rows are buffered and written in whole-row chunks, so the
    file is valid CSV at every moment and after `close()`, even mid-run.

    Args:
        path: the file to create, usually `<run dir>/frames.csv` (truncated if it exists;
            missing parent folders are made).

    Raises:
        OutputError: the file cannot be created or the header cannot be written.
    """

    def __init__(self, path: Path | str) -> None:
        self._file = LineFile(Path(path), what="frame timing file")
        self._row = _Row()
        self._csv = csv.writer(self._row, lineterminator="\n")
        try:
            self._append(FRAMES_CSV_COLUMNS)
            self._file.flush()
        except BaseException:
            self._file.close()
            raise
        log.debug("writing frame timings to %s", self._file.path)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def frames_written(self) -> int:
        return self._file.lines - 1  # the header is not a frame

    def _append(self, row: tuple[str, ...] | list[str | int | float]) -> None:
        self._csv.writerow(row)
        self._file.append(self._row.take())

    def write(self, result: FrameResult) -> None:
        """Append one camera frame's row.

        Raises:
            OutputError: the file cannot be written.
            ValueError: the sink is closed.
        """
        self._append(timing_row(result))

    def close(self) -> None:
        """Write what is buffered and close the file; closing twice is safe."""
        self._file.close()
