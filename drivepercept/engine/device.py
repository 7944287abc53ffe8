"""Choosing the device, checking that it exists, and making it the current one."""

from __future__ import annotations

import contextlib

import torch

from drivepercept.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N' -> a usable device.

    A CUDA device always comes back with its index ('auto' and 'cuda' mean the current
    device, normally 0), so that everything downstream (the pinned-memory allocator, the
    engine threads, the NVML lookup by PCI address) names one and the same GPU.
    """
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r} requested but CUDA is not available here (use --device cpu)"
        )
    device = torch.device(name)
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device {name!r} requested but only {count} CUDA device(s) exist")
    return torch.device("cuda", index)


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Makes a CUDA `device` the current one for the block (nothing for the CPU).

    Pinned host memory is allocated through the current device's context: without this, a
    ring for `cuda:1` allocated before anything touched GPU 1 would create a context (and
    take memory) on GPU 0.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)
