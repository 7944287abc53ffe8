"""The quantize job: an ONNX detector and real frames -> its static INT8 version
(`drivepercept quantize`; the work is `drivepercept.models.onnx.quantize`).

Calibration frames are drawn from the sources by the readers and the one source resolver
every mode uses, spread over each camera's clip, and prepared by the pipeline's own code: the
decoder threads' `prepare` (resize, letterbox, channel order) and the engine's normalisation
(`DetectorStep.normalise`), so the activation ranges are measured on what the model sees at
run time. After writing the file, the job runs both models on the same frames through the
engine's step (model, score filter, NMS) and says how fast each ran and how many of the float
model's boxes the INT8 model still finds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import box_iou

from drivepercept.config import PipelineConfig
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ConfigError
from drivepercept.geometry import parse_input_size
from drivepercept.models.onnx import build
from drivepercept.models.onnx.quantize import FORMATS as FORMATS  # the CLI's --format choices
from drivepercept.models.onnx.quantize import (
    Quantized,
    check_destination,
    float_model,
    quantize_onnx,
)
from drivepercept.rig import camera_source, resolve_cameras
from drivepercept.sources.prepare import prepare
from drivepercept.sources.readers import open_reader
from drivepercept.types import ImageU8, InputSpec

DEFAULT_FRAMES = 96
CHECK_BATCH = 6  # the speed and agreement check's batch: a six-camera rig's
CHECK_SCORE = 0.5  # float boxes at least this sure are the ones INT8 must still find
CHECK_IOU = 0.5
SPEED_ROUNDS = 3


@dataclass(frozen=True)
class QuantizeResult:
    """What `quantize_model` did.

    Attributes:
        quantized: the files written and their sizes.
        cameras: the cameras the calibration frames came from.
        seconds: wall time of drawing, calibrating and writing.
        fps_float, fps_int8: frames/s of the model, score filter and NMS (no video
            decoding) at batch `check_batch`, best of `SPEED_ROUNDS` interleaved rounds; 0
            when not measured.
        check_batch: the batch of that check (`CHECK_BATCH`, or a fixed-batch graph's).
        boxes_float, boxes_found: the float model's boxes scoring >= `CHECK_SCORE` on the
            check frames, and how many of them an INT8 box of the same class overlaps at
            IoU >= `CHECK_IOU`.
    """

    quantized: Quantized
    cameras: tuple[str, ...]
    seconds: float
    fps_float: float = 0.0
    fps_int8: float = 0.0
    check_batch: int = 0
    boxes_float: int = 0
    boxes_found: int = 0

    def lines(self) -> list[str]:
        """The command's report, a few lines."""
        q = self.quantized
        ratio = q.int8_bytes / q.source_bytes if q.source_bytes else 0.0
        out = [
            f"wrote {q.onnx} and {q.sidecar} in {self.seconds:.1f} s",
            f"calibrated on {q.frames} frames from {len(self.cameras)} camera(s): "
            f"{', '.join(self.cameras)}",
            f"nodes: {q.nodes_quantized} quantized (int8 {FORMATS[q.quant_format]}, "
            f"{'7-bit weights: this CPU has no VNNI, ' if q.reduce_range else ''}weight "
            f"scales per {'channel' if q.per_channel else 'tensor'}), {q.nodes_float} kept "
            "float (the decoding)",
            f"size: {_mb(q.source_bytes)} -> {_mb(q.int8_bytes)} ({ratio:.2f}x)",
        ]
        if self.fps_float > 0 and self.fps_int8 > 0:
            out.append(
                f"speed (CPU, model + NMS, batch {self.check_batch}, best of {SPEED_ROUNDS}): "
                f"{self.fps_float:.1f} -> {self.fps_int8:.1f} frames/s "
                f"({self.fps_int8 / self.fps_float:.2f}x); bench measures the pipeline"
            )
        if self.boxes_float:
            share = self.boxes_found / self.boxes_float
            out.append(
                f"agreement on the calibration frames: {self.boxes_found} of {self.boxes_float} "
                f"float boxes (score >= {CHECK_SCORE}) found by INT8 at IoU >= {CHECK_IOU} "
                f"({share:.0%}); eval measures accuracy"
            )
        return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def quantize_model(
    model: str | Path,
    *,
    sources: Sequence[str],
    out: str | Path | None = None,
    frames: int = DEFAULT_FRAMES,
    input_size: str | tuple[int, int] | None = None,
    check: bool = True,
    quant_format: str = "qdq",
    per_channel: bool = True,
) -> QuantizeResult:
    """Quantizes an ONNX detector to static INT8, calibrated on `frames` real frames.

    Args:
        model: the float `.onnx` file (its sidecar beside it, if any).
        sources: rig files, videos, image folders (`resolve_cameras`).
        out: the INT8 `.onnx` file (default `<stem>_int8.onnx` beside the model); its
            sidecar goes beside it.
        frames: calibration frames, spread over the cameras and over each clip.
        input_size: "WxH" for graphs whose input size is dynamic.
        check: also measure speed and agreement on the calibration frames.
        quant_format, per_channel: the INT8 graph's form ("qdq" or "qoperator") and its
            weight scales (one per output channel, or one per tensor); `quantize_onnx`.

    Raises:
        ConfigError, ModelError, SourceError: bad arguments, a model that cannot be
            quantized, sources that cannot be read or give no frame (one line each).
    """
    if frames <= 0:
        raise ConfigError(f"--frames must be a positive number of frames, got {frames}")
    started = time.perf_counter()
    size = parse_input_size(input_size)
    detector = float_model(Path(model), input_size=size)
    target = Path(out) if out is not None else default_out(Path(model))
    check_destination(Path(model), target)
    cams = resolve_cameras(tuple(sources))
    images = calibration_images([camera_source(c) for c in cams], detector.input, frames)
    cpu = torch.device("cpu")
    config = PipelineConfig(device="cpu", channels_last=False)
    step = DetectorStep(detector, config, cpu)
    with torch.inference_mode():
        batches = [
            step.normalise(torch.from_numpy(images[i : i + CHECK_BATCH])).numpy()
            for i in range(0, len(images), CHECK_BATCH)
        ]
    done = quantize_onnx(
        detector, target, batches, per_channel=per_channel, quant_format=quant_format
    )
    seconds = time.perf_counter() - started
    result = QuantizeResult(done, tuple(c.name for c in cams), seconds)
    if not check:
        return result
    int8 = DetectorStep(build(done.onnx, input_size=size), config, cpu)
    fixed = getattr(detector.module, "fixed_batch", None)
    group = fixed if fixed is not None and fixed > 1 else CHECK_BATCH
    if fixed is not None and fixed > 1:  # a fixed batch of N takes N images, no fewer
        images = images[: len(images) // fixed * fixed]
    return _checked(result, step, int8, images, group) if len(images) else result


def default_out(model: Path) -> Path:
    """`dir/model.onnx` -> `dir/model_int8.onnx`."""
    return model.with_name(f"{model.stem}_int8.onnx")


def calibration_images(sources: Sequence[str], spec: InputSpec, frames: int) -> ImageU8:
    """`frames` frames, (n, H, W, 3) uint8 prepared for `spec` as the decoder threads prepare
    them: an even share from each source, evenly spaced over its clip (every k-th frame,
    k = frames in the clip / share), fewer where a clip is shorter.

    Raises:
        SourceError: a source that cannot be opened.
        ConfigError: no frame at all could be read.
    """
    share = math.ceil(frames / len(sources))
    prepared: list[ImageU8] = []
    for source in sources:
        reader = open_reader(source)
        try:
            count = reader.info.frame_count
            stride = max(1, count // share) if count > 0 else 1
            taken, index = 0, 0
            while taken < share and len(prepared) < frames:
                got = reader.read()
                if got is None:
                    break
                if index % stride == 0:
                    prepared.append(prepare(got.image_bgr, spec)[0])
                    taken += 1
                index += 1
        finally:
            reader.close()
    if not prepared:
        raise ConfigError(f"no calibration frames could be read from {', '.join(sources)}")
    return np.stack(prepared)


def _checked(
    result: QuantizeResult, fp32: DetectorStep, int8: DetectorStep, images: ImageU8, group: int
) -> QuantizeResult:
    """Speed (interleaved rounds on one batch of `group`) and agreement (every calibration
    frame, `group` at a time)."""
    batch = torch.from_numpy(images[:group])
    best = {"float": math.inf, "int8": math.inf}
    fp32(batch), int8(batch)  # warm-up: ORT's first run allocates
    for _ in range(SPEED_ROUNDS):
        for name, step in (("float", fp32), ("int8", int8)):
            t0 = time.perf_counter()
            step(batch)
            best[name] = min(best[name], time.perf_counter() - t0)
    n = len(batch)
    wanted = found = 0
    for i in range(0, len(images), group):
        chunk = torch.from_numpy(images[i : i + group])
        (a, a_n), (b, b_n) = fp32(chunk), int8(chunk)
        for k in range(len(chunk)):
            ref, got = a[k, : int(a_n[k])], b[k, : int(b_n[k])]
            ref = ref[ref[:, 4] >= CHECK_SCORE]
            wanted += len(ref)
            found += _matched(ref, got)
    return QuantizeResult(
        result.quantized,
        result.cameras,
        result.seconds,
        fps_float=n / best["float"],
        fps_int8=n / best["int8"],
        check_batch=n,
        boxes_float=wanted,
        boxes_found=found,
    )


def _matched(ref: torch.Tensor, got: torch.Tensor) -> int:
    """Reference boxes (x1, y1, x2, y2, score, label rows) overlapped at IoU >= CHECK_IOU by
    a box of the same label in `got`."""
    if not len(ref) or not len(got):
        return 0
    iou = box_iou(ref[:, :4], got[:, :4])
    same = ref[:, 5:6] == got[:, 5].unsqueeze(0)
    return int(((iou >= CHECK_IOU) & same).any(dim=1).sum())
