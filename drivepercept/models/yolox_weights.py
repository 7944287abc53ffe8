"""YOLOX as a `Detector` (`build`), with weights the way the ecosystem ships them: the
official `.pth` checkpoints (state-dict names of the YOLOX repository), ONNX exports (batch
norms folded, tensors renamed: mapped by the graph's structure) and `DEFAULT`, the official
release file downloaded once into torch hub's cache (or found in `$DRIVEPERCEPT_WEIGHTS_DIR`).

Every failure a user can cause becomes one `ModelError` line that says what was expected and
what to do.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import torch

from drivepercept.models import _weights
from drivepercept.models.base import Detector, ModelError, WeightsStore
from drivepercept.models.classes import coco_driving_view
from drivepercept.models.yolox import SIZES, YOLOX
from drivepercept.types import ColorOrder, InputSpec, Interpolation, PadPlacement

RELEASE_URL = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0/"
# The variables the CLI reads into a `WeightsStore` (this module reads no environment itself).
WEIGHTS_DIR_ENV = "DRIVEPERCEPT_WEIGHTS_DIR"  # a folder of already-downloaded weights files
MIRROR_ENV = "DRIVEPERCEPT_WEIGHTS_MIRROR"  # a base URL that serves the release files instead
DOWNLOAD_TIMEOUT_S = 30.0


PREFIX = "yolox-"
NAMES: tuple[str, ...] = tuple(PREFIX + size for size in SIZES)
# COCO-80 in the order of YOLOX's label indices
COCO80: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse",
    "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip


def default_input_size(size: str, *, device_type: str | None = None) -> tuple[int, int]:
    """A 16:9-friendly input on the stride-32 grid at about the scale the size was trained
    at: 416x256 for nano and tiny (trained at 416), 640x384 for the others (640).

    Except yolox-nano on a CPU: 512x288, the largest input that keeps six real streams, on
    the CPU's default runtime (ONNX Runtime, `models/runtime.py`), at the frames/s 416x256 had
    on torch, the default runtime before. Measured on the 2-core machine (pipeline frames/s,
    three interleaved rounds): 416x256 on torch 103-110, 512x288 on ORT 105-113, 544x320 on
    ORT 93-96. MOT17-02 pedestrians (visibility >= 0.5, 43) AP@.5 0.503 -> 0.667. The size
    does not depend on the runtime asked for: `--runtime torch` runs the same model, at the
    same size, as the default (slower: it is torch). Other devices and sizes are not
    measured: they keep the rule above.
    """
    if size == "nano" and device_type == "cpu":
        return (512, 288)
    return (416, 256) if SIZES[size].trained_at == 416 else (640, 384)


def input_spec(input_size: tuple[int, int]) -> InputSpec:
    """How YOLOX is trained and evaluated: bilinear resize keeping the aspect ratio, the
    image at the top-left of a canvas filled with 114, BGR pixels 0-255, no mean/std."""
    return InputSpec(
        size=input_size,
        letterbox=True,
        pad_value=114,
        interpolation=Interpolation.BILINEAR,
        pad=PadPlacement.TOP_LEFT,
        channels=ColorOrder.BGR,
        value_range=255.0,
    )


def build(
    name: str,
    weights: str | None,
    *,
    input_size: tuple[int, int] | None = None,
    store: WeightsStore | None = None,
) -> Detector:
    """The registered YOLOX detector `name` (`yolox-nano` ... `yolox-x`), fused, eval mode.

    Args:
        name: `yolox-<size>`.
        weights: None (random), "DEFAULT" (official release) or a `.pth` / `.onnx` path.
        input_size: (width, height), multiples of 32; default `default_input_size`.
        store: where "DEFAULT" looks besides torch hub's cache, and where it downloads from.

    Raises:
        ModelError: unknown size, bad input size, or weights that cannot be had or do not fit.
    """
    size = name.removeprefix(PREFIX)
    if size not in SIZES:
        raise ModelError(f"unknown YOLOX size {name!r}; sizes: {', '.join(NAMES)}")
    wh = input_size or default_input_size(size)
    if wh[0] % 32 or wh[1] % 32:
        raise ModelError(f"{name} input sides must be multiples of 32, got {wh[0]}x{wh[1]}")
    net = YOLOX(SIZES[size], num_classes=len(COCO80))
    load_into(net, weights, store or WeightsStore())
    net.eval()
    keep, report_as = coco_driving_view(COCO80)
    return Detector(
        name=name,
        module=net,
        input=input_spec(wh),
        class_names=COCO80,
        keep_labels=keep,
        report_as=report_as,
        reduced_precision=("backbone", "head"),
    )


def release_file(size: str) -> str:
    """The official checkpoint's file name for a size (`yolox_nano.pth`)."""
    return f"yolox_{size}.pth"


def release_url(size: str, store: WeightsStore) -> str:
    """Where `DEFAULT` downloads the checkpoint: the official release, or the store's mirror."""
    base = store.mirror or RELEASE_URL
    return base.rstrip("/") + "/" + release_file(size)


def cache_path(size: str) -> Path:
    """Where `DEFAULT` keeps the downloaded checkpoint (torch hub's checkpoint folder)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / release_file(size)


def load_into(net: YOLOX, weights: str | None, store: WeightsStore) -> None:
    """Loads `weights` into a freshly built (unfused) `net` and fuses its batch norms.

    Args:
        net: the network, as `YOLOX(size)` builds it.
        weights: None (random), "DEFAULT", or a path to a `.pth` checkpoint or `.onnx` export.
        store: where "DEFAULT" looks and downloads from.

    Raises:
        ModelError: the weights cannot be had or do not fit this size.
    """
    size = net.size.name
    if weights is None:
        net.fuse()
        return
    path = Path(weights) if weights != "DEFAULT" else find_default(size, store)
    if path.suffix.lower() == ".onnx":
        net.fuse()
        load_onnx(net, path)
    else:
        state = _weights.read_state_dict(str(path), model_name=f"yolox-{size}")
        _weights.apply_state_dict(net, state, source=str(path), model_name=f"yolox-{size}")
        net.fuse()


def find_default(size: str, store: WeightsStore) -> Path:
    """The official weights of `size`: from the store's folder, the hub cache, or downloaded
    into the cache (checked to load and fit before it is kept).

    Raises:
        ModelError: not in the store's folder, or cannot be downloaded.
    """
    folder = store.folder
    if folder is not None:
        for name in (release_file(size), f"yolox_{size}.onnx"):
            if (folder / name).is_file():
                return folder / name
        raise ModelError(
            f"the weights folder {folder} (${WEIGHTS_DIR_ENV}) has neither {release_file(size)} "
            f"nor yolox_{size}.onnx; download {release_url(size, store)} there "
            "or pass --weights PATH"
        )
    cached = cache_path(size)
    if cached.is_file():
        return cached
    _download(size, cached, store)
    return cached


def _download(size: str, dest: Path, store: WeightsStore) -> None:
    """Fetches the release file to a temporary name beside `dest`, checks it is a YOLOX
    checkpoint of this size, and only then renames it into place (a broken or partial
    download never lands in the cache)."""
    url = release_url(size, store)
    advice = f"save it as {dest} or into ${WEIGHTS_DIR_ENV}, or pass --weights PATH (.pth/.onnx)"
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        tmp = Path(name)
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
        ):
            while chunk := response.read(1 << 20):
                out.write(chunk)
        probe = YOLOX(SIZES[size])
        state = _weights.read_state_dict(str(tmp), model_name=f"yolox-{size}")
        _weights.apply_state_dict(probe, state, source=url, model_name=f"yolox-{size}")
        tmp.chmod(0o644)  # a cache file like any other (mkstemp makes it private)
        tmp.replace(dest)
        tmp = None
    except (OSError, urllib.error.URLError, ValueError) as exc:
        why = _weights.short_reason(exc, limit=100)
        raise ModelError(f"cannot download yolox-{size} weights {url} ({why}); {advice}") from None
    except ModelError as exc:
        what = str(exc).replace(str(tmp), "it") if tmp is not None else str(exc)
        raise ModelError(
            f"the file downloaded from {url} is not usable ({what}); {advice}"
        ) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def load_onnx(net: YOLOX, path: Path) -> None:
    """Copies the convolutions of a YOLOX ONNX export into the fused `net`.

    Exports fold batch norms into the convolutions and rename tensors, so names say nothing;
    the structure does: the graph's Conv nodes, in graph (execution) order, must match
    `net.conv_layers()` one for one in shape and groups, with the weights and biases stored
    as initializers.

    Raises:
        ModelError: no onnx package, unreadable file, or another model's structure.
    """
    model = _read_onnx(path)
    what = f"yolox-{net.size.name}"
    from onnx import numpy_helper

    init = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "Conv"]
    layers = net.conv_layers()
    if len(nodes) != len(layers):
        raise ModelError(
            f"{path} is not a {what} export: it has {len(nodes)} convolutions where {what} "
            f"has {len(layers)} (another model or another size?)"
        )
    tensors: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, (node, layer) in enumerate(zip(nodes, layers, strict=True)):
        if len(node.input) != 3 or node.input[1] not in init or node.input[2] not in init:
            raise ModelError(
                f"{path}: convolution #{i} has no stored weight and bias (not an export of "
                f"{what} with batch norms folded)"
            )
        weight = torch.from_numpy(numpy_helper.to_array(init[node.input[1]]).copy())
        bias = torch.from_numpy(numpy_helper.to_array(init[node.input[2]]).copy())
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        if weight.shape != layer.weight.shape or groups != layer.groups:
            raise ModelError(
                f"{path} is not a {what} export: convolution #{i} is {tuple(weight.shape)} "
                f"in {groups} groups where {what} has {tuple(layer.weight.shape)} in "
                f"{layer.groups} (another model or another size?)"
            )
        tensors.append((weight, bias))
    with torch.no_grad():
        for layer, (weight, bias) in zip(layers, tensors, strict=True):
            assert layer.bias is not None
            layer.weight.copy_(weight.float())
            layer.bias.copy_(bias.float())


def _read_onnx(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise ModelError(
            f"reading ONNX weights ({path}) needs the onnx package: "
            "pip install 'drivepercept[onnx]'"
        ) from None
    if not path.exists():
        raise ModelError(f"weights file not found: {path} (expected a YOLOX .onnx export)")
    if not path.is_file():
        raise ModelError(f"weights path is not a file: {path} (expected a YOLOX .onnx export)")
    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf's DecodeError and friends: a truncated or foreign file
        raise ModelError(
            f"{path} is not a readable ONNX file ({_weights.short_reason(exc)}); "
            "expected a YOLOX .onnx export"
        ) from None
