"""Static INT8 quantization of an ONNX detector with ONNX Runtime's own tools.

`quantize_onnx(detector, out, batches)` runs ONNX Runtime's pre-processing (graph
optimisation and shape inference, `quant_pre_process`), calibrates activation ranges
(min/max) on the batches given and writes a QDQ model: weights int8 with one scale per output
channel (one per tensor lost every box of YOLOX-nano's depthwise layers), activations uint8
(signed int8 activations ran 2-3x slower: x86's integer kernels multiply uint8 by int8),
QuantizeLinear/DequantizeLinear pairs around each quantized operator (ONNX Runtime's CPU
provider fuses them into integer kernels). The batches are model inputs already prepared as
the pipeline prepares them (the caller's job: `drivepercept.run.quantize` draws real frames
through `sources.prepare` and the engine's normalisation), so the ranges are those the model
sees at run time.

Only the network is quantized: every node from which a convolution or matrix product is
reachable, and those products. What comes after the last of them (the decoding: grids,
exponentials, sigmoids, concatenations of pixel boxes with 0-1 scores, top-k) stays float: one
int8 scale over a tensor that holds 400-pixel boxes and 0.01 scores would round the scores
away.

The INT8 file gets its own sidecar (`<stem>.toml`), written from the float model as the
backend read it (layout, class names, preparation), so `--model int8.onnx` runs it exactly as
the float file ran.
"""

from __future__ import annotations

import logging
import os
import platform
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drivepercept.choices import QUANT_FORMATS
from drivepercept.errors import ModelError
from drivepercept.models.base import Detector
from drivepercept.models.onnx import build
from drivepercept.models.onnx.layouts import Graph
from drivepercept.models.onnx.session import INSTALL_HINT, OnnxDetector
from drivepercept.models.onnx.sidecar import Sidecar, read_sidecar

log = logging.getLogger(__name__)

# operators that only a quantized graph holds: such a file is refused, not quantized twice
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
    }
)
# the products whose inputs and weights are worth int8; everything upstream of one is quantized
PRODUCTS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
MIN_OPSET = 13  # per-channel weight scales (DequantizeLinear's axis)
# the INT8 graph's form -> ORT's QuantFormat name (the default first)
FORMATS = QUANT_FORMATS  # the choices and ONNX Runtime's name of each (drivepercept.choices)

FloatBatch = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class Quantized:
    """What `quantize_onnx` wrote.

    Attributes:
        onnx: the INT8 model file.
        sidecar: its sidecar TOML (`<stem>.toml`).
        source_bytes, int8_bytes: the sizes of the float and the INT8 file.
        frames: calibration images fed.
        nodes_quantized, nodes_float: nodes of the pre-processed graph quantized and left
            in float (the decoding).
        quant_format: "qdq" or "qoperator" (`FORMATS`).
        per_channel: one weight scale per output channel (else one per tensor).
        reduce_range: weights quantized to 7 bits (`int8_products_saturate`).
    """

    onnx: Path
    sidecar: Path
    source_bytes: int
    int8_bytes: int
    frames: int
    nodes_quantized: int
    nodes_float: int
    quant_format: str = "qdq"
    per_channel: bool = True
    reduce_range: bool = False


def int8_products_saturate(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether ONNX Runtime's int8 kernels on this CPU add u8 x s8 products in pairs into
    saturating 16-bit lanes (x86 with AVX2 but no VNNI: `vpmaddubsw`), where full-range
    weights overflow: there ORT's advice is 7-bit weights (`reduce_range`). Measured on a
    2-core AMD EPYC with AVX2 only: the released YOLOX-nano quantized on 24 frames found
    5 of the 9 cars its float model is sure of in the Udacity stills, 8 of 9 with 7-bit
    weights (an Intel Xeon with VNNI found 7-8 of 9 at full range). x86 whose flags cannot
    be read counts as saturating (7-bit weights run correctly everywhere); other CPUs do
    not saturate (their int8 dot products accumulate in 32 bits)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    try:
        text = cpuinfo.read_text()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def float_model(path: Path, *, input_size: tuple[int, int] | None = None) -> Detector:
    """The float ONNX detector to quantize, as the backend reads it (its preparation is what
    the calibration frames must be prepared with).

    Raises:
        ModelError: not a `.onnx` file, onnxruntime missing, a file the backend refuses, a
            float16 or an already quantized graph (one line each).
    """
    if path.suffix.lower() != ".onnx":
        raise ModelError(f"quantize takes a .onnx model file, got {path}")
    detector = build(path, input_size=input_size)
    module = detector.module
    assert isinstance(module, OnnxDetector)
    already = sorted(module.graph.ops & QUANTIZED_OPS)
    if already:
        raise ModelError(f"{path} is already quantized (it holds {', '.join(already)})")
    if module.input_dtype != np.float32:
        raise ModelError(f"quantize takes a float32 model; {path} takes float16 input")
    return detector


def check_destination(source: Path, out: Path) -> None:
    """Refuses an output that is not a `.onnx` file, is the source itself, or whose folder
    is missing or not writable (before any frame is read).

    Raises:
        ModelError: one line naming the path.
    """
    if out.suffix.lower() != ".onnx":
        raise ModelError(f"quantize output must be a .onnx file, got {out}")
    if out.resolve() == source.resolve():
        raise ModelError(f"quantize output {out} would overwrite the model it quantizes")
    if not out.parent.is_dir():
        raise ModelError(f"quantize output folder {out.parent} does not exist")
    # the mode bits too: root may write anywhere, but a folder marked read-only is not ours
    if not os.access(out.parent, os.W_OK) or not out.parent.stat().st_mode & 0o222:
        raise ModelError(f"quantize output folder {out.parent} is not writable (give --out)")


def quantize_onnx(
    detector: Detector,
    out: Path,
    batches: Iterable[FloatBatch],
    *,
    per_channel: bool = True,
    quant_format: str = "qdq",
    reduce_range: bool | None = None,
) -> Quantized:
    """Writes the INT8 version of an ONNX detector and its sidecar.

    Args:
        detector: the float model, from `float_model`.
        out: the `.onnx` file to write (its folder must exist; not the source itself).
        batches: calibration inputs, (n, 3, H, W) float32 each, prepared and normalised as
            the model's `InputSpec` says; regrouped here to the graph's batch size.
        per_channel: one weight scale per output channel (better for depthwise convolutions).
        quant_format: "qdq" (QuantizeLinear/DequantizeLinear pairs around float operators,
            fused by ORT's CPU provider) or "qoperator" (QLinearConv and other integer
            operators written into the graph); see `FORMATS`.
        reduce_range: 7-bit weights; None: where this CPU's int8 products saturate
            (`int8_products_saturate`), the CPU the model will most likely run on.

    Raises:
        ModelError: a bad destination, onnxruntime's quantization tools missing, no
            calibration images, or a graph the tools cannot quantize (one line each).
    """
    if quant_format not in FORMATS:
        choices = ", ".join(FORMATS)
        raise ModelError(f"quantize format must be one of {choices}, got {quant_format!r}")
    module = detector.module
    assert isinstance(module, OnnxDetector)
    source = module.path
    check_destination(source, out)
    tools = _tools()
    if reduce_range is None:
        reduce_range = int8_products_saturate()
    feeds = _Feeds(batches, module.graph, module.fixed_batch, detector.input.size)
    with tempfile.TemporaryDirectory(prefix="drivepercept-quantize-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        _pre_process(tools, source, prepared)
        keep, skip = _split(prepared)
        try:
            tools.quantize_static(
                str(prepared),
                str(out),
                feeds,
                quant_format=getattr(tools.QuantFormat, FORMATS[quant_format]),
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=tools.QuantType.QUInt8,
                weight_type=tools.QuantType.QInt8,
                nodes_to_exclude=skip,
                calibrate_method=tools.CalibrationMethod.MinMax,
                # ORT keeps every activation of every calibration run until the end (1.3 GB
                # for yolox-nano at 416x256 and 96 frames); its CalibMaxIntermediateOutputs,
                # meant to bound that, drops the runs it collected in 1.32 instead of merging
                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
            )
        except ModelError:
            raise
        except OSError as exc:
            raise ModelError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
        except Exception as exc:  # ORT's tools raise plain exceptions for graphs they refuse
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{source}: onnxruntime cannot quantize it ({first[:160]})") from None
    sidecar = _write_sidecar(detector, source, out)
    return Quantized(
        onnx=out,
        sidecar=sidecar,
        source_bytes=source.stat().st_size,
        int8_bytes=out.stat().st_size,
        frames=feeds.images,
        nodes_quantized=len(keep),
        nodes_float=len(skip),
        quant_format=quant_format,
        per_channel=per_channel,
        reduce_range=reduce_range,
    )


def _tools() -> Any:
    """onnxruntime.quantization, or a one-line error."""
    try:
        from onnxruntime import quantization  # type: ignore[import-untyped]
        from onnxruntime.quantization import (  # type: ignore[import-untyped]  # noqa: F401
            shape_inference,  # quant_pre_process, used through the package
        )
    except ImportError:
        raise ModelError(f"quantizing needs onnxruntime and onnx: {INSTALL_HINT}") from None
    return quantization


def _pre_process(tools: Any, source: Path, out: Path) -> None:
    """ORT's recommended pre-processing (graph optimisation, ONNX shape inference), without
    its symbolic shape inference: that pass is for transformers' shape arithmetic, and where
    it cannot finish (a dynamic-batch YOLOX export) it dumps a file into the working folder.
    A graph the pre-processing refuses is quantized as it is (fewer known shapes)."""
    try:
        tools.shape_inference.quant_pre_process(str(source), str(out), skip_symbolic_shape=True)
    except Exception as exc:  # ORT's tools raise whatever their passes raise
        log.info("quant_pre_process failed, quantizing the graph as it is: %s", exc)
        out.write_bytes(source.read_bytes())
    _at_least_opset(out, MIN_OPSET)


def _at_least_opset(path: Path, opset: int) -> None:
    """Converts an older graph (YOLOX's release is opset 11) to `opset`: per-channel
    DequantizeLinear (its `axis`) needs opset 13."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(path))
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return
    try:
        model = version_converter.convert_version(model, opset)
    except Exception as exc:  # the converter raises plain errors for ops it cannot move
        raise ModelError(
            f"{path.name}: opset {current} cannot be converted to the {opset} that per-channel "
            f"int8 needs ({str(exc).strip()[:120]})"
        ) from None
    onnx.save(model, str(path))


def _split(path: Path) -> tuple[list[str], list[str]]:
    """(nodes to quantize, nodes to keep in float): a node is quantized when it is a product
    (Conv, MatMul, ...) or a product is reachable from it; the rest is the decoding."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    feeds_product = [False] * len(graph.node)
    # nodes are topologically sorted in a valid ONNX graph: walk backwards once
    for i in range(len(graph.node) - 1, -1, -1):
        node = graph.node[i]
        if node.op_type in PRODUCTS:
            feeds_product[i] = True
            continue
        feeds_product[i] = any(
            feeds_product[j] for out in node.output for j in consumers.get(out, ())
        )
    names = [node.name or f"{node.op_type}_{i}" for i, node in enumerate(graph.node)]
    if any(not node.name for node in graph.node):  # ORT excludes nodes by name
        _rename(path, names)
    keep = [n for n, q in zip(names, feeds_product, strict=True) if q]
    skip = [n for n, q in zip(names, feeds_product, strict=True) if not q]
    if not keep:
        raise ModelError(f"{path.name}: no convolution or matrix product to quantize")
    return keep, skip


def _rename(path: Path, names: list[str]) -> None:
    """Gives the graph's unnamed nodes the names `_split` refers to them by."""
    import onnx

    model = onnx.load(str(path))
    for node, name in zip(model.graph.node, names, strict=True):
        node.name = name
    onnx.save(model, str(path))


class _Feeds:
    """ORT's calibration data reader (`get_next()`: one feed dict, None at the end): the
    prepared images regrouped to the graph's batch size (one image a run for a batch-1 or
    dynamic graph; for a fixed batch of N, N a run, the last group filled up from the first
    images), with the input-size input of end-to-end graphs fed as the backend feeds it."""

    def __init__(
        self,
        batches: Iterable[FloatBatch],
        graph: Graph,
        fixed_batch: int | None,
        size: tuple[int, int],
    ) -> None:
        images = [np.ascontiguousarray(b[i], np.float32) for b in batches for i in range(len(b))]
        if not images:
            raise ModelError("no calibration images: the sources gave no frame")
        w, h = size
        want = (3, h, w)
        if images[0].shape != want:
            raise ModelError(f"calibration images must be {want}, got {images[0].shape}")
        self.images = len(images)
        self._graph = graph
        group = fixed_batch or 1
        padded = images + images[: (-len(images)) % group]
        self._runs = [np.stack(padded[i : i + group]) for i in range(0, len(padded), group)]
        self._size = np.array([[w, h]], dtype=np.int64)
        self._next: Iterator[FloatBatch] = iter(self._runs)

    def get_next(self) -> dict[str, Any] | None:
        batch = next(self._next, None)
        if batch is None:
            return None
        feed: dict[str, Any] = {self._graph.image.name: batch}
        sizes = self._graph.size_input
        if sizes is not None:
            feed[sizes.name] = np.tile(self._size, (len(batch), 1))
        return feed

    def rewind(self) -> None:
        self._next = iter(self._runs)


def _write_sidecar(detector: Detector, source: Path, out: Path) -> Path:
    """The INT8 file's sidecar: the layout, class names and preparation as the backend
    resolved them (a names file or a family default made explicit), over the float file's
    sidecar, if any (its batch policy and NMS switch)."""
    module = detector.module
    assert isinstance(module, OnnxDetector)
    return Sidecar.of(detector, module.layout).over(read_sidecar(source)).write(out)
