"""An ONNX file run by Intel's OpenVINO runtime on the CPU, behind ONNX Runtime's session calls.

`OpenVinoSession` answers the two calls `OnnxDetector` makes of a CPU session
(`run(None, feeds)` -> outputs in graph order, `get_providers()`), so the detector's layouts,
decoding and batch policy are the same whichever runtime holds the graph. It is the `openvino`
runtime (`models/runtime.py`), for the CPU only (OpenVINO's GPU plugin is Intel's GPUs).

Precision: OpenVINO runs a float graph in bfloat16 by default on a CPU with bf16 units
(AVX-512 BF16, AMX), which changes the boxes; here it runs what the engine's `precision` says:
"fp32" as float32 (its results match ONNX Runtime's within float noise), "bf16" in bfloat16
(refused on a CPU without bf16 units, where it would be emulated and slow). "fp16" is refused.

Each input shape gets its own compiled model (a graph compiled for one batch size runs faster
than one compiled for any: 96 against 77 frames/s, yolox-nano at 416x416, batch 6). The first
shape is compiled when first run (the engine's warm-up). A later batch size (the last batch of
a drive, a batch cut short by the batch timeout) would stall the pipeline for a compile, about
half a second on two cores: it runs instead, padded, on a compiled model of a larger batch,
while its own compiles on a named background thread, to be used from then on. Each thread
that runs a model (the engine's CPU lanes) takes an infer request from a free list, as
OpenVINO's requests are not to be shared between threads.

The calls by which a Core first uses the CPU (`compile_model`, `get_property`) keep the
calling thread's alternate signal stack as it was (`signal_stack`): the CPU plugin installs
one of its own there, and a Core freed on another thread left it installed and freed, so
that the first thread's next signal crashed the process.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from drivepercept.errors import ModelError
from drivepercept.models.onnx.signal_stack import kept_signal_stack

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'drivepercept[openvino]'"
Shapes = tuple[tuple[int, ...], ...]  # the input arrays' shapes, in graph order
PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


def import_openvino() -> Any:
    """The openvino module.

    Raises:
        ModelError: it is not installed.
    """
    try:
        import openvino  # type: ignore[import-untyped]
    except ImportError:
        raise ModelError(f"runtime openvino needs the openvino package: {INSTALL_HINT}") from None
    return openvino


def installed() -> bool:
    """Whether the openvino package can be imported."""
    try:
        import_openvino()
    except ModelError:
        return False
    return True


def cpu_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin runs bfloat16 natively here (False without openvino)."""
    if not installed():
        return False
    with kept_signal_stack():  # a Core's first use of the CPU: see signal_stack
        core = import_openvino().Core()
        return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


class OpenVinoSession:
    """A compiled ONNX graph on OpenVINO's CPU plugin, called like an ORT session.

    Args:
        path: the `.onnx` file.
        threads: inference threads (0: OpenVINO's default, one per physical core).
        precision: "fp32" or "bf16".

    Raises:
        ModelError: openvino missing, a precision it does not run here, or a file it cannot
            read (one line each).
    """

    def __init__(self, path: Path, *, threads: int = 0, precision: str = "fp32") -> None:
        ov = import_openvino()
        if precision not in PRECISIONS:
            raise ModelError(
                f"runtime openvino runs precision fp32 or bf16 on a CPU, got {precision}"
            )
        self._core = ov.Core()
        if precision == "bf16" and not cpu_has_bf16():
            raise ModelError(
                "precision bf16 on openvino needs a CPU with bf16 units (AVX-512 BF16)"
            )
        try:
            self._model = self._core.read_model(str(path))
        except Exception as exc:  # OpenVINO raises RuntimeError with a long trace text
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise ModelError(f"{path}: openvino cannot read it ({first})") from None
        self.path = path
        self.precision = precision
        self.version = str(getattr(ov, "__version__", "")) or None
        self._config: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
            # the cores are shared with the decoder threads: no thread pinned to one
            "ENABLE_CPU_PINNING": False,
        }
        if threads > 0:
            self._config["INFERENCE_NUM_THREADS"] = threads
        self._names = [port.get_any_name() for port in self._model.inputs]
        self._lock = threading.Lock()
        self._compiled: dict[Shapes, Any] = {}
        self._free: dict[Shapes, list[Any]] = {}
        self._compiling: set[Shapes] = set()  # on the background thread, or failed there

    def get_providers(self) -> list[str]:
        """What runs the graph, in ORT's terms (the run record's `providers`)."""
        return [f"OpenVINO CPU ({self.precision})"]

    def run(self, output_names: None, feeds: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        """The graph's outputs for `feeds` (input name -> array), in graph order, as arrays
        of their own (not views of the request's memory).

        Raises:
            ModelError: OpenVINO cannot compile the graph for these shapes.
        """
        del output_names  # always every output, as OnnxDetector asks
        arrays = [np.ascontiguousarray(feeds[name]) for name in self._names]
        shapes = tuple(a.shape for a in arrays)
        runs_as = self._compiled_for(shapes)
        if runs_as != shapes:  # padded to a compiled larger batch, the extra rows dropped
            arrays = [_pad(a, s[0]) for a, s in zip(arrays, runs_as, strict=True)]
        with self._lock:
            free = self._free[runs_as]
            request = free.pop() if free else self._compiled[runs_as].create_infer_request()
        try:
            result = request.infer(arrays, share_inputs=True, share_outputs=False)
            outputs = [result[port] for port in request.model_outputs]
        finally:
            with self._lock:
                self._free[runs_as].append(request)
        if runs_as == shapes:
            return outputs
        return [o[: shapes[0][0]] for o in outputs]

    def _compiled_for(self, shapes: Shapes) -> Shapes:
        """The shapes to run `shapes` as: their own once compiled; else, where a larger
        batch of the same images is compiled, that one (with their own compile started);
        else their own, compiled here."""
        with self._lock:
            if shapes in self._compiled:
                return shapes
            larger = [s for s in self._compiled if _holds(s, shapes)]
            if larger:
                if shapes not in self._compiling:
                    self._compiling.add(shapes)
                    threading.Thread(
                        target=self._compile_behind,
                        args=(shapes,),
                        name="openvino-compile",
                        daemon=True,
                    ).start()
                return min(larger, key=lambda s: s[0][0])
        self._compile(shapes)
        return shapes

    def _compile(self, shapes: Shapes) -> None:
        model = self._model.clone()
        model.reshape({i: list(shape) for i, shape in enumerate(shapes)})
        try:
            with kept_signal_stack():  # (the Core's first compile: see signal_stack)
                compiled = self._core.compile_model(model, "CPU", self._config)
        except Exception as exc:  # OpenVINO raises RuntimeError with a long trace text
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise ModelError(f"{self.path}: openvino cannot compile it ({first})") from None
        with self._lock:
            self._compiled.setdefault(shapes, compiled)
            self._free.setdefault(shapes, [])

    def _compile_behind(self, shapes: Shapes) -> None:
        try:
            self._compile(shapes)
        except ModelError as exc:  # these shapes keep running padded (still in _compiling)
            log.warning("%s", exc)
        else:
            with self._lock:
                self._compiling.discard(shapes)


def _holds(larger: Shapes, shapes: Shapes) -> bool:
    """Whether inputs of `shapes` fit in `larger` by adding rows to the batch (axis 0)."""
    return len(larger) == len(shapes) and all(
        len(a) == len(b) and a[0] >= b[0] and a[1:] == b[1:]
        for a, b in zip(larger, shapes, strict=True)
    )


def _pad(array: np.ndarray[Any, Any], rows: int) -> np.ndarray[Any, Any]:
    """`array` with its last row repeated up to `rows` rows (a valid input, unlike zeros
    for an image-size input)."""
    extra = rows - array.shape[0]
    return np.concatenate([array, np.repeat(array[-1:], extra, axis=0)], axis=0)
