"""The run's timeline: every frame's stage timestamps as columns, and the spans between them.

A `Timeline` is what `frames.csv` holds, as numpy columns: one row per emitted camera frame.
`STAGE_SPANS` cuts each frame's capture-to-emission time into consecutive spans that add up to
the end-to-end latency exactly, so a stage breakdown never leaves time unaccounted for.

Device spans (upload, inference, post-processing) are per batch and shared by its frames; on
CUDA they come from CUDA events mapped onto the host clock by the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from drivepercept.telemetry.stats import FloatArray, IntArray, span_ms
from drivepercept.types import STAMPS


@dataclass(frozen=True)
class Span:
    name: str
    start: str  # stamp name
    end: str
    what: str


STAGE_SPANS: tuple[Span, ...] = (
    Span("decode", "capture", "decoded", "read and decode the frame"),
    Span("preprocess", "decoded", "preprocessed", "resize / letterbox to the model input"),
    Span("enqueue", "preprocessed", "queued", "blocked on the camera's full queue"),
    # live: a frame is decoded and prepared only when the batcher takes it, so that work is
    # in this span, and its decode and preprocess spans are its read and 0
    Span("batch_wait", "queued", "batched", "in the queue until batched (live: + prepare)"),
    Span("engine_wait", "batched", "copy_start", "batch waiting for the engine"),
    Span("upload", "copy_start", "copy_done", "host to device copy"),
    Span("compute_wait", "copy_done", "compute_start", "uploaded, waiting for compute"),
    Span("inference", "compute_start", "inference_done", "normalise + model"),
    Span("postprocess", "inference_done", "postprocessed", "NMS, device to host"),
    Span("emit", "postprocessed", "emitted", "rescale boxes, track (--track), hand on"),
)
assert [s.start for s in STAGE_SPANS[1:]] == [s.end for s in STAGE_SPANS[:-1]]
assert STAGE_SPANS[0].start == "capture" and STAGE_SPANS[-1].end == "emitted"


@dataclass(frozen=True, eq=False)
class Timeline:
    """Per-frame columns of a run (row i is one emitted camera frame).

    `stamps[name]` holds monotonic-clock ns for every name in `STAMPS`.
    """

    cameras: tuple[str, ...]  # names, by camera index
    camera_index: IntArray
    frame_index: IntArray
    batch_index: IntArray
    batch_size: IntArray
    detections: IntArray
    stamps: Mapping[str, IntArray] = field(repr=False)
    # each frame's time on its source's clock, seconds (frames.csv's pts_s: a recording's
    # stamp where it has one); None where the file has no such column
    source_s: FloatArray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = self.camera_index.shape[0]
        for name in ("frame_index", "batch_index", "batch_size", "detections", "source_s"):
            column = getattr(self, name)
            got = (n,) if column is None else column.shape
            if got != (n,):
                raise ValueError(f"Timeline.{name}: expected shape ({n},), got {got}")
        missing = set(STAMPS) - set(self.stamps)
        if missing:
            raise ValueError(f"Timeline.stamps: missing {sorted(missing)}")
        for name in STAMPS:
            if self.stamps[name].shape != (n,):
                raise ValueError(
                    f"Timeline.stamps[{name!r}]: expected shape ({n},), "
                    f"got {self.stamps[name].shape}"
                )
        if n and (self.camera_index.min() < 0 or self.camera_index.max() >= len(self.cameras)):
            raise ValueError(
                f"Timeline.camera_index: expected 0..{len(self.cameras) - 1}, got "
                f"{self.camera_index.min()}..{self.camera_index.max()}"
            )

    def __len__(self) -> int:
        return int(self.camera_index.shape[0])

    def __repr__(self) -> str:
        return f"Timeline(cameras={self.cameras}, frames={len(self)})"

    @property
    def end_to_end_ms(self) -> FloatArray:
        return span_ms(self.stamps["capture"], self.stamps["emitted"])

    def span(self, span: Span) -> FloatArray:
        return span_ms(self.stamps[span.start], self.stamps[span.end])

    def camera(self, index: int) -> Timeline:
        """The rows of one camera."""
        return self.select(self.camera_index == index)

    def select(self, mask: np.ndarray) -> Timeline:
        """The rows where `mask` is true (numpy boolean indexing), as a new Timeline."""
        return Timeline(
            cameras=self.cameras,
            camera_index=self.camera_index[mask],
            frame_index=self.frame_index[mask],
            batch_index=self.batch_index[mask],
            batch_size=self.batch_size[mask],
            detections=self.detections[mask],
            stamps={k: v[mask] for k, v in self.stamps.items()},
            source_s=None if self.source_s is None else self.source_s[mask],
        )

    @property
    def origin_ns(self) -> int:
        """The earliest capture (0 for an empty timeline): the zero of every time axis."""
        return int(self.stamps["capture"].min()) if len(self) else 0

    @property
    def end_ns(self) -> int:
        """The latest emission (0 for an empty timeline)."""
        return int(self.stamps["emitted"].max()) if len(self) else 0


def fill_missing_stamps(stamps: dict[str, IntArray]) -> dict[str, IntArray]:
    """Stamps a frame did not get (0, or a column an older run did not write) take the value
    of the stamp before them, so that span is zero rather than minus the clock."""
    out: dict[str, IntArray] = {}
    previous: IntArray | None = None
    for name in STAMPS:
        col = stamps.get(name)
        if col is None:
            if previous is None:
                raise ValueError(f"timeline has no {name!r} column")
            col = previous.copy()
        elif previous is not None:
            col = np.where(col == 0, previous, col)
        out[name] = np.asarray(col, dtype=np.int64)
        previous = out[name]
    return out
