"""Output writers: detections (JSON Lines), per-frame timings and load samples (CSV) and
annotated videos.

Every sink has `write(result)` and `close()`, is a context manager, leaves valid files however
the run ends (once closed), and raises `drivepercept.errors.OutputError` when its file cannot be
created. Sinks that draw on the original frame also have `write_with_image(result, image_bgr)`
(`ImageSink`); the run's `SinkSet` calls that one for them, each sink under its policy
(`sinks.fanout`).
"""

from __future__ import annotations

from drivepercept.sinks.annotate import draw_detections
from drivepercept.sinks.base import ImageSink, LoadSink, Sink
from drivepercept.sinks.jsonl import DetectionsJsonlSink, frame_record
from drivepercept.sinks.load import LoadCsvSink, load_csv_columns
from drivepercept.sinks.timing import FRAMES_CSV_COLUMNS, FrameTimingCsvSink, timing_row
from drivepercept.sinks.video import MOSAIC_FILE, AnnotatedVideoSink

__all__ = [
    "FRAMES_CSV_COLUMNS",
    "MOSAIC_FILE",
    "AnnotatedVideoSink",
    "DetectionsJsonlSink",
    "FrameTimingCsvSink",
    "ImageSink",
    "LoadCsvSink",
    "LoadSink",
    "Sink",
    "draw_detections",
    "frame_record",
    "load_csv_columns",
    "timing_row",
]
