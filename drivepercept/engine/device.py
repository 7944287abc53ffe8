"""Choosing the device and checking that it exists."""

from __future__ import annotations

import torch

from drivepercept.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N' -> a usable device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {name!r} requested but CUDA is not available here (use --device cpu)"
        )
    device = torch.device(name)
    index = device.index or 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device {name!r} requested but only {count} CUDA device(s) exist")
    return torch.device("cuda", index)
