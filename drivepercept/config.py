"""Pipeline settings (drop policies, device, precision, ring and queue sizes) and the reconnect
policy of live cameras: frozen, validated, with the names the CLI flags and TOML keys use."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass

from drivepercept.errors import ConfigError
from drivepercept.geometry import MAX_DETECT_EVERY as MAX_DETECT_EVERY
from drivepercept.geometry import check_detect_every

PRECISIONS = ("fp32", "fp16", "bf16")
MAX_BUDGET_MS = 60_000.0  # a deadline longer than a minute is not a deadline


def detect_due(k: int, camera: int, every: int) -> bool:
    """Whether camera `camera`'s k-th frame (from 0) is one the model sees with a detection
    interval of `every`: its first, then those with (k + camera) a multiple of `every` (the
    cameras staggered). The batcher and `run.retrack` both schedule by it."""
    return k == 0 or (k + camera) % every == 0


# what each kind of setting takes: (said as, accepted types); settings files use it too
SETTING_KINDS: dict[str, tuple[str, type]] = {
    "float": ("a number", numbers.Real),
    "int": ("an integer", numbers.Integral),
    "bool": ("true or false", bool),
    "str": ("a string", str),
}


def _check_types(settings: object) -> None:
    """ConfigError naming the first field of a settings dataclass with a value of the wrong
    type (a TOML file or a Python caller can give anything; 2 is a fine float, True is not)."""
    assert dataclasses.is_dataclass(settings)
    for f in dataclasses.fields(settings):
        what, kind = SETTING_KINDS[str(f.type)]
        value = getattr(settings, f.name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ConfigError(f"{f.name} must be {what}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):  # TOML has inf and nan
            raise ConfigError(f"{f.name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class PipelineConfig:
    """Knobs of the replay pipeline (TOML keys and CLI flags have the same names).

    Attributes:
        batch_timeout_ms: a batch is sent when every live camera has a frame or when this
            much time passed since its first frame arrived.
        queue_capacity: frames waiting per camera between its decoder and the batcher.
        drop_policy: "block" (replay: never lose a frame) or "drop_oldest" (live).
        device: "auto", "cpu", "cuda" or "cuda:N".
        precision: "fp32", "fp16" or "bf16" (autocast; fp16/bf16 need CUDA for speed).
        channels_last: run the model on NHWC memory layout (faster convolutions on GPUs with
            fp16/bf16, and for MobileNet-style models on CPUs too: 35 vs 55 ms a frame for
            ssdlite at batch 1 on the 2-core development machine).
        score_threshold, iou_threshold, max_detections: post-processing.
        ring_slots: staging buffers (>= max_in_flight; one more lets the next batch be staged
            while the last is in flight).
        max_in_flight: batches submitted to the device and not yet completed (replay on CPU
            lanes keeps at least one more than its lanes: each lane takes whole batches).
        max_frames: stop each camera after this many frames (0 = all).
        sample_hz: load samples (GPU through NVML, CPU, memory) per second; 0 = no sampler.
        warmup: run one full batch and one single frame through the engine before capture
            starts (CUDA lazy loading, cuDNN/cuBLAS set-up), kept out of every figure.
        drain_timeout_s: after capture stops (duration, Ctrl-C, SIGTERM), the longest the
            frames already read (queued, batched, on the device) may take to come out; the
            drain ends as soon as they are out, so this is only a bound.
        compile: run the model through `torch.compile` (compiled in the warm-up; a model
            that cannot be compiled runs eagerly after one warning; `engine/compiled.py`).
        cuda_graphs: replay the model's forward at the rig's batch size as one CUDA graph
            (CUDA only; `engine/graphs.py`).
        torch_threads: torch's intra-op threads for the model (process-wide, set when the
            engine starts); 0 leaves torch's default (one per core).
        cpu_lanes: on a CPU, run each batch as this many sub-batches at once, each on its
            share of the torch threads (`engine/lanes.py`); 0 = one lane per torch thread (at
            most the rig's batch), 1 = one batch with every operation spread over the threads.
            Replay gives each lane whole batches instead. ONNX Runtime's models run in lanes
            too (a session per lane's threads); ignored on a GPU, with OpenVINO, with compile
            and with CUDA graphs.
        cpu_prepack: on a CPU in float32, run the torch model's convolutions with their
            weights laid out for oneDNN once, each checked against the eager one on a sample
            batch when the engine is set up (`engine/prepack.py`; YOLOv8n 1.14x, tiny 1.3x).
            Ignored on a GPU, for ONNX models, with compile and in bf16/fp16.
        detect_every: the model sees each camera's first frame and every n-th one after it
            (the cameras staggered, so that batches share the work; a camera whose frames stopped
            for over a second is detected again first); the tracking stage answers the
            frames between with its tracks moved on to their time (`Detections.predicted`).
            1: every frame is detected. Needs a tracking stage. With a deadline it is the
            most often a camera is detected (at most one frame in n).
        deadline_ms: the deadline scheduler's target (`schedule`): the p99 capture-to-result
            latency it holds by deciding, per camera and frame, detect or predict, with every
            frame answered (none dropped for a newer one); 0: off. Live and real-time runs
            only (drop_oldest); needs a tracking stage.
        max_detect_gap_ms: with a deadline, the longest a camera may go between detected
            frames (capture times): past it, its next frame is detected whatever the budget
            says (the starvation bound).
        freeze_heap: after the warm-up, before capture starts, collect the garbage once and
            freeze the objects left (`gc.freeze`: the model's, the libraries'), so that
            Python's cyclic collector never walks them again during the run; unfrozen when
            the pipeline closes. A full collection of a loaded process (about 350 thousand
            objects) took 150-190 ms on the 2-core machine, more than a latency budget, and
            under 1 ms frozen. Live and real-time runs set it (`Mode.policies`); it is
            process-wide, so a library caller running other work beside chooses.
    """

    batch_timeout_ms: float = 20.0
    queue_capacity: int = 4
    drop_policy: str = "block"
    device: str = "auto"
    precision: str = "fp32"
    channels_last: bool = True
    score_threshold: float = 0.3
    iou_threshold: float = 0.5
    max_detections: int = 100
    ring_slots: int = 4
    max_in_flight: int = 2
    max_frames: int = 0
    sample_hz: float = 10.0
    warmup: bool = True
    drain_timeout_s: float = 10.0
    compile: bool = False
    cuda_graphs: bool = False
    torch_threads: int = 0
    cpu_lanes: int = 0
    cpu_prepack: bool = True
    detect_every: int = 1
    deadline_ms: float = 0.0
    max_detect_gap_ms: float = 1000.0
    freeze_heap: bool = False

    def __post_init__(self) -> None:
        _check_types(self)
        if not (math.isfinite(self.batch_timeout_ms) and 0.0 <= self.batch_timeout_ms <= 60_000):
            raise ConfigError(
                f"batch_timeout_ms must be between 0 and 60000, got {self.batch_timeout_ms:g}"
            )
        if not 1 <= self.queue_capacity <= 1024:
            raise ConfigError(f"queue_capacity must be 1..1024, got {self.queue_capacity}")
        if self.drop_policy not in ("block", "drop_oldest"):
            raise ConfigError(
                f"drop_policy must be 'block' or 'drop_oldest', got {self.drop_policy!r}"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ConfigError(f"score_threshold must be in [0, 1], got {self.score_threshold}")
        if not 0.0 < self.iou_threshold <= 1.0:
            raise ConfigError(f"iou_threshold must be in (0, 1], got {self.iou_threshold}")
        if not 1 <= self.max_detections <= 10_000:
            raise ConfigError(f"max_detections must be 1..10000, got {self.max_detections}")
        if not 1 <= self.max_in_flight <= 16:
            raise ConfigError(f"max_in_flight must be 1..16, got {self.max_in_flight}")
        if self.ring_slots < self.max_in_flight:
            raise ConfigError(
                f"ring_slots must be at least max_in_flight = {self.max_in_flight}, "
                f"got {self.ring_slots}"
            )
        if self.max_frames < 0:
            raise ConfigError(f"max_frames must be >= 0, got {self.max_frames}")
        if not (math.isfinite(self.sample_hz) and 0.0 <= self.sample_hz <= 1000.0):
            raise ConfigError(f"sample_hz must be between 0 and 1000, got {self.sample_hz:g}")
        if not (math.isfinite(self.drain_timeout_s) and 0.0 <= self.drain_timeout_s <= 3600.0):
            raise ConfigError(
                f"drain_timeout_s must be between 0 and 3600, got {self.drain_timeout_s:g}"
            )
        if not 0 <= self.torch_threads <= 1024:
            raise ConfigError(
                f"torch_threads must be 0 (torch's default) to 1024, got {self.torch_threads}"
            )
        if not 0 <= self.cpu_lanes <= 1024:
            raise ConfigError(f"cpu_lanes must be 0 (automatic) to 1024, got {self.cpu_lanes}")
        check_detect_every(self.detect_every, "")
        if not (math.isfinite(self.deadline_ms) and 0.0 <= self.deadline_ms <= MAX_BUDGET_MS):
            raise ConfigError(
                f"deadline_ms must be a number of ms in (0, {MAX_BUDGET_MS:g}], or 0 for no "
                f"deadline, got {self.deadline_ms:g}"
            )
        if self.deadline_ms and self.drop_policy != "drop_oldest":
            raise ConfigError(
                "deadline_ms (a latency budget) is for live and real-time runs (drop_policy "
                "drop_oldest): a replay as fast as it goes has no deadline"
            )
        if not (math.isfinite(self.max_detect_gap_ms) and 0.0 < self.max_detect_gap_ms <= 60_000):
            raise ConfigError(
                f"max_detect_gap_ms must be in (0, 60000], got {self.max_detect_gap_ms:g}"
            )
        if self.cuda_graphs and self.device == "cpu":
            # 'auto' that finds no GPU is refused where the device is resolved (DetectorStep)
            raise ConfigError("cuda_graphs needs a CUDA device, got device 'cpu'")


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a live camera retries after a failed open or read (exponential backoff).

    Attributes:
        initial_s: the first wait before a retry.
        max_s: the longest wait between retries (the wait doubles up to it).
        max_attempts: failed attempts in a row before the camera is `failed` for good
            (0 = retry forever).
        open_timeout_s: how long one open of a network stream may take.
        read_timeout_s: how long one read may block before the stream counts as lost (an
            MJPEG camera: how long one whole frame may take to arrive).
        max_part_mb: the largest MJPEG part (one JPEG frame) accepted, in MiB; a larger
            one ends the connection with the reason.
    """

    initial_s: float = 0.25
    max_s: float = 4.0
    max_attempts: int = 8
    open_timeout_s: float = 5.0
    read_timeout_s: float = 2.0
    max_part_mb: float = 8.0

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("initial_s", "max_s", "open_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 3600.0):
                raise ConfigError(f"reconnect {name} must be in (0, 3600] s, got {value:g}")
        if not (math.isfinite(self.max_part_mb) and 0.0 < self.max_part_mb <= 1024.0):
            raise ConfigError(f"max_part_mb must be in (0, 1024] MiB, got {self.max_part_mb:g}")
        if self.max_s < self.initial_s:
            raise ConfigError(
                f"reconnect max_s ({self.max_s:g}) must be >= initial_s ({self.initial_s:g})"
            )
        if not 0 <= self.max_attempts <= 1_000_000:
            raise ConfigError(f"reconnect max_attempts must be >= 0, got {self.max_attempts}")

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1, 2, ...): initial, doubled, capped."""
        return float(min(self.max_s, self.initial_s * 2.0 ** max(0, attempt - 1)))
