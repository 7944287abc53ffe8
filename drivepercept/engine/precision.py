"""Mixed precision that keeps geometry in float32.

Running a whole detector under autocast also runs its anchors, box decoding and NMS in half
precision. That is harmless for a network's features but not for coordinates: fp16 holds
integers exactly only up to 2048 and bf16 only up to 256, so boxes on a 1344x768 input round by
1-16 px (fp16) or 8-128 px (bf16), and torchvision's `batched_nms` shifts boxes by
`label x (max_coord + 1)`, which overflows fp16 to inf for labels from 49 up (NaN overlaps,
nothing suppressed).

So a detector names the submodules whose work is convolutions and matrix products (backbone,
neck, heads: what gains from fp16/bf16) in `Detector.reduced_precision`; each runs inside a
`ReducedPrecision` wrapper, under autocast, and hands float32 back. Everything between and
after them (anchors, decoding, NMS) runs in float32 outside autocast. A detector that names
none (`reduced_precision=None`) runs its whole forward under autocast and must keep its own
decoding in float32, as `drivepercept-tiny` does.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import torch

from drivepercept.models.base import ModelError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def to_float32(value: Any) -> Any:
    """Floating tensors in `value` (nested in dicts, lists and tuples) as float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, OrderedDict):
        return OrderedDict((k, to_float32(v)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: to_float32(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_float32(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_float32(v) for v in value)
    return value


class ReducedPrecision(torch.nn.Module):
    """Runs `inner` under autocast to `dtype` on `device_type` and returns float32."""

    def __init__(self, inner: torch.nn.Module, *, dtype: torch.dtype, device_type: str) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype
        self.device_type = device_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return to_float32(out)


def _parent(module: torch.nn.Module, path: str) -> tuple[torch.nn.Module, str]:
    *parents, leaf = path.split(".")
    owner = module
    for name in parents:
        child = getattr(owner, name, None)
        if not isinstance(child, torch.nn.Module):
            raise ModelError(f"{type(module).__name__} has no submodule {path!r}")
        owner = child.inner if isinstance(child, ReducedPrecision) else child
    return owner, leaf


def set_reduced_precision(
    module: torch.nn.Module, parts: tuple[str, ...], precision: str, device: torch.device
) -> None:
    """Wrap the submodules named by dotted `parts` for `precision`, or unwrap them for fp32.

    Idempotent, and reversible: the engine and the benchmark prepare the same module, maybe
    with different precisions one after the other.

    Raises:
        ModelError: a part names no submodule (a plugin's `reduced_precision` is wrong).
    """
    dtype = DTYPES[precision]
    for path in parts:
        owner, leaf = _parent(module, path)
        current = getattr(owner, leaf, None)
        if not isinstance(current, torch.nn.Module):
            raise ModelError(f"{type(module).__name__} has no submodule {path!r}")
        inner = current.inner if isinstance(current, ReducedPrecision) else current
        wrapped: torch.nn.Module = inner
        if dtype is not torch.float32:
            wrapped = ReducedPrecision(inner, dtype=dtype, device_type=device.type)
        setattr(owner, leaf, wrapped)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Mixed-precision context for "fp16"/"bf16" over a whole forward; nothing for "fp32"."""
    dtype = DTYPES[precision]
    if dtype is torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
