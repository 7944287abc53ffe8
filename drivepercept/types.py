"""Frozen value types passed between the pipeline's stages.

One box convention, written once: `xyxy` in pixels of the original camera frame, pixel edges
(pixel i spans [i, i + 1)). Times are `time.monotonic_ns()` values on the host.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
ImageU8 = npt.NDArray[np.uint8]


class DropPolicy(enum.Enum):
    """What a camera's queue does when it is full.

    BLOCK: the decoder waits (replay: no frame is ever lost).
    DROP_OLDEST: the oldest waiting frame is dropped and counted (live: newest frame wins).
    """

    BLOCK = "block"
    DROP_OLDEST = "drop_oldest"


@dataclass(frozen=True)
class Letterbox:
    """How a frame of `src_size` was fitted into a model input of `dst_size`.

    The frame is scaled by (scale_x, scale_y) (equal for a letterbox, different for a plain
    stretch) and placed at (pad_x, pad_y); the rest of the input is padding.
    """

    src_size: tuple[int, int]  # (width, height) of the original frame
    dst_size: tuple[int, int]  # (width, height) of the model input
    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    def to_original(self, xyxy: npt.NDArray[np.floating[Any]]) -> FloatArray:
        """Boxes (N, 4) in model-input pixels -> original-frame pixels, clipped to the frame."""
        boxes: FloatArray = np.array(xyxy, dtype=np.float32).reshape(-1, 4)
        boxes[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.scale_x
        boxes[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.scale_y
        np.clip(boxes[:, 0::2], 0.0, float(self.src_size[0]), out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0.0, float(self.src_size[1]), out=boxes[:, 1::2])
        return boxes

    def to_input(self, xyxy: npt.NDArray[np.floating[Any]]) -> FloatArray:
        """Boxes (N, 4) in original-frame pixels -> model-input pixels (the inverse)."""
        boxes: FloatArray = np.array(xyxy, dtype=np.float32).reshape(-1, 4)
        boxes[:, 0::2] = boxes[:, 0::2] * self.scale_x + self.pad_x
        boxes[:, 1::2] = boxes[:, 1::2] * self.scale_y + self.pad_y
        return boxes


@dataclass(frozen=True, eq=False)
class Frame:
    """One decoded camera frame, prepared for the model (RGB, model input size, uint8).

    Attributes:
        camera: camera name.
        camera_index: position of the camera in the rig (its slot in a batch).
        frame_index: index of the frame in its source (0-based, counts every decoded frame).
        pts_s: presentation time in the source (seconds from its start).
        capture_ns: monotonic time the frame was read (the pipeline's "photon" time).
        decoded_ns: when decoding finished.
        preprocessed_ns: when it was resized / letterboxed.
        image: (H, W, 3) uint8 RGB at the model's input size.
        letterbox: how to map model-input boxes back to original pixels.
    """

    camera: str
    camera_index: int
    frame_index: int
    pts_s: float
    capture_ns: int
    decoded_ns: int
    preprocessed_ns: int
    image: ImageU8 = field(repr=False)
    letterbox: Letterbox
    original_bgr: ImageU8 | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        want = (self.letterbox.dst_size[1], self.letterbox.dst_size[0], 3)
        if self.image.shape != want or self.image.dtype != np.uint8:
            raise ValueError(
                f"frame image must be uint8 {want}, got {self.image.dtype} {self.image.shape}"
            )

    def __repr__(self) -> str:
        return (
            f"Frame(camera={self.camera!r}, frame_index={self.frame_index}, "
            f"image={self.image.shape})"
        )


@dataclass(frozen=True)
class FrameMeta:
    """A frame's identity and host timestamps (what a batch carries; its model-input pixels
    are in the staging ring). `original_bgr` is kept only when annotated video is wanted."""

    camera: str
    camera_index: int
    frame_index: int
    pts_s: float
    capture_ns: int
    decoded_ns: int
    preprocessed_ns: int
    queued_ns: int
    letterbox: Letterbox
    original_bgr: ImageU8 | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, frame: Frame, *, queued_ns: int) -> FrameMeta:
        return cls(
            camera=frame.camera,
            camera_index=frame.camera_index,
            frame_index=frame.frame_index,
            pts_s=frame.pts_s,
            capture_ns=frame.capture_ns,
            decoded_ns=frame.decoded_ns,
            preprocessed_ns=frame.preprocessed_ns,
            queued_ns=queued_ns,
            letterbox=frame.letterbox,
            original_bgr=frame.original_bgr,
        )


@dataclass(frozen=True)
class Batch:
    """Frames of several cameras staged together in one slot of the staging ring.

    Attributes:
        batch_index: running number of the batch.
        slot: index of the staging-ring slot holding the pixels (row i = frames[i]).
        frames: the frames in the batch, in slot-row order.
        batched_ns: when the batcher sent it.
        complete: every live camera contributed a frame (False: sent on timeout).
    """

    batch_index: int
    slot: int
    frames: tuple[FrameMeta, ...]
    batched_ns: int
    complete: bool

    def __post_init__(self) -> None:
        if not self.frames:
            raise ValueError("a batch holds at least one frame")

    @property
    def size(self) -> int:
        return len(self.frames)

    @property
    def cameras(self) -> tuple[int, ...]:
        """Camera indices present, in row order."""
        return tuple(f.camera_index for f in self.frames)

    @property
    def capture_spread_ns(self) -> int:
        """Largest minus smallest capture time of the frames (cross-camera skew)."""
        captures = [f.capture_ns for f in self.frames]
        return max(captures) - min(captures)


@dataclass(frozen=True, eq=False)
class Detections:
    """Boxes found in one frame: parallel arrays, boxes in original-frame pixels."""

    xyxy: FloatArray  # (N, 4)
    scores: FloatArray  # (N,)
    labels: npt.NDArray[np.int64]  # (N,) indices into class_names
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.scores)
        if self.xyxy.shape != (n, 4):
            raise ValueError(f"xyxy must have shape ({n}, 4), got {self.xyxy.shape}")
        if self.labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {self.labels.shape}")

    @classmethod
    def empty(cls, class_names: tuple[str, ...] = ()) -> Detections:
        return cls(
            np.zeros((0, 4), np.float32),
            np.zeros(0, np.float32),
            np.zeros(0, np.int64),
            class_names,
        )

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> Detections:
        """Numpy-style selection (boolean mask or index array) -> a new Detections."""
        return Detections(self.xyxy[mask], self.scores[mask], self.labels[mask], self.class_names)

    @property
    def names(self) -> list[str]:
        """Class name of each box."""
        return [
            self.class_names[i] if 0 <= i < len(self.class_names) else str(i)
            for i in self.labels.tolist()
        ]

    def __repr__(self) -> str:
        return f"Detections(n={len(self)})"


@dataclass(frozen=True)
class FrameTiming:
    """When each stage handled one frame (monotonic ns; 0 where a stage does not apply).

    Device spans (copy, inference, post-processing) are per batch and shared by its frames;
    on CUDA they come from CUDA events mapped onto the host clock.
    """

    capture_ns: int
    decoded_ns: int
    preprocessed_ns: int
    queued_ns: int
    batched_ns: int
    copy_done_ns: int
    inference_done_ns: int
    postprocessed_ns: int
    emitted_ns: int
    copy_start_ns: int = 0  # when the batch's upload began (device span start)
    compute_start_ns: int = 0  # when the device began computing the batch

    @property
    def end_to_end_ms(self) -> float:
        """Capture to emission."""
        return (self.emitted_ns - self.capture_ns) / 1e6


STAGES: tuple[str, ...] = (
    "capture",
    "decoded",
    "preprocessed",
    "queued",
    "batched",
    "copy_done",
    "inference_done",
    "postprocessed",
    "emitted",
)


@dataclass(frozen=True, eq=False)
class FrameResult:
    """What the pipeline hands to sinks for one camera frame."""

    camera: str
    camera_index: int
    frame_index: int
    pts_s: float
    batch_index: int
    batch_size: int
    detections: Detections
    timing: FrameTiming
    original_bgr: ImageU8 | None = field(default=None, repr=False)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's load at one instant, read through NVML (NaN where the GPU does not report it).

    NVML's utilization figures are averages over the driver's own sampling window (between
    1/6 s and 1 s depending on the GPU), not instantaneous values.
    """

    index: int  # NVML device index
    util_pct: float  # share of time a kernel was running
    mem_util_pct: float  # share of time device memory was read or written
    mem_used_bytes: float
    mem_total_bytes: float
    power_w: float
    power_limit_w: float
    temperature_c: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    pcie_tx_bytes_s: float
    pcie_rx_bytes_s: float
    throttle_reasons: int  # NVML clocks-event bit mask (-1 unknown)


@dataclass(frozen=True)
class LoadSample:
    """Process, system and GPU load at `t_ns` (`time.monotonic_ns()`, the frames' clock)."""

    t_ns: int
    process_cpu_pct: float  # this process, all its threads (100 = one core busy)
    system_cpu_pct: float  # all cores together (100 = every core busy)
    per_core_cpu_pct: tuple[float, ...]
    process_rss_bytes: int
    system_mem_used_bytes: int
    system_mem_total_bytes: int
    gpus: tuple[GpuSample, ...] = ()
