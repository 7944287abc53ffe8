"""Frozen value types passed between the pipeline's stages.

One box convention, written once: `xyxy` in pixels of the original camera frame, pixel edges
(pixel i spans [i, i + 1)). Times are `time.monotonic_ns()` values on the host.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np
import numpy.typing as npt

# (re-exported: the model-input types live in their own module, imported from here)
from drivepercept.types.detections import Detections as Detections
from drivepercept.types.model_input import CLASS_CHOICES as CLASS_CHOICES
from drivepercept.types.model_input import COCO_TO_DRIVING as COCO_TO_DRIVING
from drivepercept.types.model_input import DRIVING_CLASSES as DRIVING_CLASSES
from drivepercept.types.model_input import RUNTIMES as RUNTIMES
from drivepercept.types.model_input import ColorOrder as ColorOrder
from drivepercept.types.model_input import FloatArray as FloatArray
from drivepercept.types.model_input import InputSpec as InputSpec
from drivepercept.types.model_input import Interpolation as Interpolation
from drivepercept.types.model_input import Letterbox as Letterbox
from drivepercept.types.model_input import PadPlacement as PadPlacement

ImageU8 = npt.NDArray[np.uint8]


class Pacing(enum.Enum):
    """How a run reads its cameras.

    AS_FAST_AS_POSSIBLE: files, every frame, as fast as they decode (replay).
    PACED: files played at their own frame rate, as cameras would deliver them, through
        reconnecting sources (replay --realtime).
    LIVE: the cameras' live sources (devices, streams; a rig camera's `live` source over its
        recorded file), reconnecting.
    """

    AS_FAST_AS_POSSIBLE = "as_fast_as_possible"
    PACED = "paced"
    LIVE = "live"

    @property
    def paced(self) -> bool:
        """Frames come at the sources' pace (and are dropped when the pipeline is behind)."""
        return self is not Pacing.AS_FAST_AS_POSSIBLE


class DropPolicy(enum.Enum):
    """What a camera's queue does when it is full.

    BLOCK: the decoder waits (replay: no frame is ever lost).
    DROP_OLDEST: the oldest waiting frame is dropped and counted (live: newest frame wins).
    """

    BLOCK = "block"
    DROP_OLDEST = "drop_oldest"


class CameraState(enum.Enum):
    """Where a camera is: the same names in run.json, the report, /metrics and the status
    line. A file replays as streaming, then ended; a live camera may also be connecting,
    reconnecting or (after too many failures in a row) failed."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    FAILED = "failed"
    ENDED = "ended"


@dataclass(frozen=True)
class StateChange:
    t_ns: int  # time.monotonic_ns(), the frames' clock
    state: CameraState
    detail: str = ""


@dataclass(frozen=True)
class ReaderStatus:
    """Where a reader is, and (live cameras) how its connection went.

    Attributes:
        state: its camera's state now.
        live: read through the reconnect supervisor (a device, a stream, or a file paced
            in real time), not a plain replayed file.
        connects: connections made (1 for a file).
        failed_attempts: opens that failed, and connections that gave no frame.
        downtime_s: time not streaming before it ended.
        outage_s: down time after it first streamed.
        streaming_s: time streaming.
        changes: the kept state changes, oldest first.
        last_error: why the last attempt or read failed ("" if none did), credentials
            redacted: the reason a run that got nothing from this camera gives.
    """

    state: CameraState
    live: bool = False
    connects: int = 1
    failed_attempts: int = 0
    downtime_s: float = 0.0
    outage_s: float = 0.0
    streaming_s: float = 0.0
    changes: tuple[StateChange, ...] = ()
    last_error: str = ""


@dataclass(frozen=True)
class CameraSnapshot:
    """One camera of a running (or finished) pipeline: what the status line, the metrics
    endpoint, run.json and the run's statistics all read.

    Attributes:
        name: the camera.
        state: its reader's state (a file that stopped being read counts as ended).
        frames: results emitted.
        dropped: frames its queue dropped (live policy).
        fps: results per second over the last second.
        p95_ms: end-to-end p95 over the last second (NaN with no frame in it).
        read: frames read from the source.
        decoded, prepared: of those, frames decoded and prepared for the model (live: only
            the frames used are, where the source allows it; replay: every frame).
        short_by: frames its container announced that could not be decoded.
        undecodable: frames skipped in the middle of its video (damaged), later ones read.
        discarded: read, neither emitted nor dropped: in flight when the run stopped.
        reader: the reader's own status (connects, down time, state changes).
    """

    name: str
    state: CameraState
    frames: int
    dropped: int
    fps: float
    p95_ms: float
    read: int
    short_by: int
    discarded: int
    reader: ReaderStatus
    decoded: int = 0
    undecodable: int = 0
    prepared: int = 0


@dataclass(frozen=True)
class FrameMeta:
    """A frame's identity and host timestamps: made once by its decoder thread and carried
    unchanged (but for `queued_ns`, set when it enters its queue) inside `Frame`, `Batch`
    and `FrameResult`. `original_bgr` is kept only when annotated video is wanted, or (for
    the frames the model sees, until the tracking stage has read them) the boxes' looks."""

    camera: str
    camera_index: int
    frame_index: int  # index in its source (0-based, counts every decoded frame)
    pts_s: float  # presentation time in the source (seconds from its start)
    capture_ns: int  # when the frame was read, or arrived from a live camera ("photon" time)
    decoded_ns: int
    preprocessed_ns: int
    letterbox: Letterbox  # how to map model-input boxes back to original pixels
    queued_ns: int = 0
    original_bgr: ImageU8 | None = field(default=None, repr=False, compare=False)
    # the source's own stamp of the frame (a ROS header stamp, ns), where it has one; then
    # pts_s is this stamp in seconds, so frames of different cameras pair by real time
    stamp_ns: int | None = None


_MAX_SOURCE_S = 9.2e9  # seconds that still fit in int64 ns (292 years)


def source_time_ns(stamp_ns: int | None, pts_s: float) -> int | None:
    """A frame's time on its source's clock in ns: its stamp where it has one, else its pts;
    None where the pts is not a finite number a clock could hold."""
    if stamp_ns is not None:
        return stamp_ns
    if not (math.isfinite(pts_s) and abs(pts_s) < _MAX_SOURCE_S):
        return None
    return round(pts_s * 1e9)


class _CarriesMeta:
    """Shortcuts to the `FrameMeta` that a frame or a result carries."""

    meta: FrameMeta

    @property
    def camera(self) -> str:
        return self.meta.camera

    @property
    def camera_index(self) -> int:
        return self.meta.camera_index

    @property
    def frame_index(self) -> int:
        return self.meta.frame_index

    @property
    def pts_s(self) -> float:
        return self.meta.pts_s

    @property
    def original_bgr(self) -> ImageU8 | None:
        return self.meta.original_bgr

    @property
    def stamp_ns(self) -> int:
        """The frame's time in ns on its source's clock: its recorded stamp where the source
        has one, else its pts."""
        stamp = self.meta.stamp_ns
        return stamp if stamp is not None else round(self.meta.pts_s * 1e9)


@dataclass(frozen=True, eq=False)
class Frame(_CarriesMeta):
    """One decoded camera frame, prepared for the model: its `meta` and `image`, (H, W, 3)
    uint8 at the model's input size, in its channel order (`InputSpec.channels`)."""

    meta: FrameMeta
    image: ImageU8 = field(repr=False)

    def __post_init__(self) -> None:
        dst = self.meta.letterbox.dst_size
        want = (dst[1], dst[0], 3)
        if self.image.shape != want or self.image.dtype != np.uint8:
            raise ValueError(
                f"frame image must be uint8 {want}, got {self.image.dtype} {self.image.shape}"
            )

    deferred = False  # prepared already: `into` only copies
    keep_original = False  # `meta_only` decodes nothing

    @property
    def source_ns(self) -> int | None:
        """The frame's time on its source's clock (its stamp, else its pts), None where it
        has neither (a pts that is not a finite number)."""
        return source_time_ns(self.meta.stamp_ns, self.meta.pts_s)

    def into(self, row: ImageU8) -> FrameMeta:
        """Copy the prepared image into a staging row; the frame's meta."""
        np.copyto(row, self.image)
        return self.meta

    def meta_only(self) -> FrameMeta:
        """The frame's meta, its pixels unused (a frame the model does not see)."""
        return self.meta

    @property
    def capture_ns(self) -> int:
        return self.meta.capture_ns

    def __repr__(self) -> str:
        return (
            f"Frame(camera={self.camera!r}, frame_index={self.frame_index}, "
            f"image={self.image.shape})"
        )


class QueuedFrame(Protocol):
    """What a camera queue holds: a `Frame` prepared on its decoder thread (replay: every
    frame is used, and preparing ahead overlaps the model), or a frame whose decoding and
    preparation are deferred until the batcher takes it (live: most frames are dropped for
    newer ones, and a dropped frame should cost nothing). `into` writes the model input into
    a staging-ring row and returns the frame's meta."""

    @property
    def deferred(self) -> bool: ...

    @property
    def keep_original(self) -> bool: ...  # whether `meta_only` decodes it (annotated video)

    @property
    def camera_index(self) -> int: ...

    @property
    def source_ns(self) -> int | None: ...  # on its source's clock (stamp, else pts), or None

    @property
    def capture_ns(self) -> int: ...

    def into(self, row: ImageU8) -> FrameMeta: ...

    def meta_only(self) -> FrameMeta: ...  # no preparation: the model will not see it


NO_SLOT = -1  # a batch with no staging rows: every frame of it predicted


@dataclass(frozen=True)
class Batch:
    """Frames of several cameras staged together in one slot of the staging ring.

    Attributes:
        batch_index: running number of the batch.
        slot: index of the staging-ring slot holding the pixels (row i = frames[i]).
        frames: the frames in the batch, in slot-row order.
        batched_ns: when the batcher sent it.
        complete: every live camera contributed a frame (False: sent on timeout).
        predicted: how many of the frames, the last ones, the model does not see (a
            detection interval, the deadline scheduler): the tracking stage answers them.
            A batch of predicted frames only may have no staging slot (`NO_SLOT`).
    """

    batch_index: int
    slot: int
    frames: tuple[FrameMeta, ...]
    batched_ns: int
    complete: bool
    predicted: int = 0

    def __post_init__(self) -> None:
        if not self.frames:
            raise ValueError("a batch holds at least one frame")
        if not 0 <= self.predicted <= len(self.frames):
            raise ValueError(f"predicted must be 0..{len(self.frames)}, got {self.predicted}")
        if self.slot == NO_SLOT and self.predicted != len(self.frames):
            raise ValueError("a batch without a staging slot holds predicted frames only")

    @property
    def size(self) -> int:
        return len(self.frames)

    @property
    def detected(self) -> int:
        """How many of the frames, the first ones, the model sees."""
        return len(self.frames) - self.predicted

    @property
    def cameras(self) -> tuple[int, ...]:
        """Camera indices present, in row order."""
        return tuple(f.camera_index for f in self.frames)

    @property
    def capture_spread_ns(self) -> int:
        """Largest minus smallest capture time of the frames (cross-camera skew)."""
        captures = [f.capture_ns for f in self.frames]
        return max(captures) - min(captures)


# Every per-frame timestamp, in the order a frame meets them: the one list that FrameTiming,
# frames.csv and the report's timeline share. Device stamps (copy_start .. postprocessed) are
# per batch; on CUDA they come from CUDA events mapped onto the host clock.
STAMPS: tuple[str, ...] = (
    "capture",
    "decoded",
    "preprocessed",
    "queued",
    "batched",
    "copy_start",
    "copy_done",
    "compute_start",
    "inference_done",
    "postprocessed",
    "emitted",
)


@dataclass(frozen=True)
class FrameTiming:
    """When each stage handled one frame: one `<stamp>_ns` field per entry of `STAMPS`
    (monotonic ns; 0 where a stage does not apply)."""

    capture_ns: int
    decoded_ns: int
    preprocessed_ns: int
    queued_ns: int
    batched_ns: int
    copy_start_ns: int
    copy_done_ns: int
    compute_start_ns: int
    inference_done_ns: int
    postprocessed_ns: int
    emitted_ns: int

    @property
    def end_to_end_ms(self) -> float:
        """Capture to emission."""
        return (self.emitted_ns - self.capture_ns) / 1e6

    def stamp(self, name: str) -> int:
        """The time of stamp `name` (one of `STAMPS`)."""
        value: int = getattr(self, f"{name}_ns")
        return value


assert tuple(f.name for f in fields(FrameTiming)) == tuple(f"{s}_ns" for s in STAMPS)


@dataclass(frozen=True, eq=False)
class FrameResult(_CarriesMeta):
    """What the pipeline hands to sinks for one camera frame."""

    meta: FrameMeta
    batch_index: int
    batch_size: int
    detections: Detections
    timing: FrameTiming


@dataclass(frozen=True)
class WarmupRun:
    """One warm-up batch: its size and how long it took, end to end (milliseconds)."""

    batch_size: int
    ms: float


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


# (re-exported: what callers read of a running pipeline, in its own module)
from drivepercept.types.readings import PipelineDescription as PipelineDescription  # noqa: E402
from drivepercept.types.readings import RunProgress as RunProgress  # noqa: E402
