"""Which ONNX Runtime execution providers run a model, by one rule.

On a CPU device: the CPU provider. On a CUDA device: TensorRT's provider when onnxruntime offers
it *and* TensorRT itself is installed (onnxruntime-gpu lists it even without TensorRT, then
fails at session creation), with its engine cache in a folder; then the CUDA provider; the CPU
provider last (ORT places any operator the GPU providers lack there). Both GPU providers run on
the stream they are given (the engine's compute stream), so ORT's kernels are ordered with the
engine's own work without waiting for the device. Without a GPU provider a batch on a GPU runs
on the CPU provider, through host memory.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)

Provider = tuple[str, dict[str, str]]


def tensorrt_installed() -> bool:
    """Whether TensorRT's libraries can be found (its pip package, or libnvinfer)."""
    return importlib.util.find_spec("tensorrt") is not None or bool(
        ctypes.util.find_library("nvinfer")
    )


def choose_providers(
    available: Sequence[str],
    *,
    device_type: str,
    device_index: int = 0,
    stream: int | None = None,
    tensorrt: bool = False,
    trt_cache: Path | None = None,
) -> list[Provider]:
    """The providers, in priority order, with their options (see the module docstring).

    Args:
        available: `onnxruntime.get_available_providers()`.
        device_type: the engine's device type ("cpu", "cuda").
        device_index: the GPU's index.
        stream: the CUDA stream (its handle) the GPU providers run on; None for their own.
        tensorrt: whether TensorRT itself is installed (`tensorrt_installed`).
        trt_cache: TensorRT's engine cache folder; None leaves TensorRT out (it rebuilds
            its engines, minutes each, on every start without one).
    """
    if device_type != "cuda":
        return [(CPU, {})]
    common = {"device_id": str(device_index)}
    if stream is not None:
        common |= {"has_user_compute_stream": "1", "user_compute_stream": str(stream)}
    chosen: list[Provider] = []
    if TENSORRT in available and tensorrt and trt_cache is not None:
        cache = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(trt_cache)}
        chosen.append((TENSORRT, {**common, **cache}))
    if CUDA in available:
        chosen.append((CUDA, dict(common)))
    chosen.append((CPU, {}))
    return chosen


def default_trt_cache(model: Path) -> Path:
    """The TensorRT engine cache when none is given: `<model dir>/<stem>.trt-cache/`."""
    return model.with_name(model.stem + ".trt-cache")


def prepare_cache(folder: Path) -> str | None:
    """Make the cache folder; None when done, else why it could not be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def names(providers: Sequence[Any]) -> list[str]:
    """Provider names from a providers list (names or (name, options) pairs)."""
    return [p if isinstance(p, str) else p[0] for p in providers]
