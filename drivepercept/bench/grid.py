"""The sweep's grid (`bench --sweep`): precision x batch timeout x cameras, parsed and checked
from the command line's lists before any model, render or camera (this module loads neither
torch nor OpenCV).

fp16 is the GPU's half precision and is refused on a CPU: torch's CPU kernels gain nothing
from it (a stack of convolutions ran 1.6x slower than fp32 on the same machine).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from drivepercept.config import PRECISIONS
from drivepercept.errors import ConfigError
from drivepercept.geometry import MAX_CAMERAS

CPU_PRECISIONS = ("fp32", "bf16")
CUDA_PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_TIMEOUTS_MS = (5.0, 20.0, 50.0)
DEFAULT_CAMERAS = (1, 2, 4)
MAX_TIMEOUT_MS = 60_000.0  # PipelineConfig's own bound


def _listed(
    text: str | None, what: str, example: str, kind: Callable[[str], Any]
) -> tuple[Any, ...] | None:
    """A comma-separated list of `kind`s; None for None (the axis' default)."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ConfigError(
            f"sweep {what} must be a comma-separated list (e.g. {example}), got {text!r}"
        )
    try:
        return tuple(kind(t) for t in items)
    except ValueError:
        whole = "whole " if kind is int else ""
        raise ConfigError(
            f"sweep {what} must be {whole}numbers, comma-separated (e.g. {example}), got {text!r}"
        ) from None


@dataclass(frozen=True)
class SweepGrid:
    """The sweep's three axes (duplicates dropped; timeouts and camera counts ascending).

    Attributes:
        precisions: "fp32", "fp16", "bf16"; None: the device's (`CPU_PRECISIONS` or
            `CUDA_PRECISIONS`, see `resolve`).
        timeouts_ms: batch timeouts, 0 to `MAX_TIMEOUT_MS`.
        cameras: camera counts, 1 to `MAX_CAMERAS`.
    """

    precisions: tuple[str, ...] | None = None
    timeouts_ms: tuple[float, ...] = DEFAULT_TIMEOUTS_MS
    cameras: tuple[int, ...] = DEFAULT_CAMERAS

    def __post_init__(self) -> None:
        if self.precisions == () or not (self.timeouts_ms and self.cameras):
            raise ConfigError(
                "sweep precisions, batch timeouts and cameras: give at least one of each"
            )
        for p in self.precisions or ():
            if p not in PRECISIONS:
                raise ConfigError(
                    f"sweep precision must be one of {', '.join(PRECISIONS)}, got {p!r}"
                )
        for t in self.timeouts_ms:
            if not (math.isfinite(t) and 0.0 <= t <= MAX_TIMEOUT_MS):
                raise ConfigError(
                    f"sweep batch timeout must be between 0 and {MAX_TIMEOUT_MS:g} ms, got {t:g}"
                )
        for n in self.cameras:
            if not 1 <= n <= MAX_CAMERAS:
                raise ConfigError(f"sweep cameras must be between 1 and {MAX_CAMERAS}, got {n}")
        if self.precisions is not None:
            object.__setattr__(self, "precisions", tuple(dict.fromkeys(self.precisions)))
        object.__setattr__(self, "timeouts_ms", tuple(sorted({float(t) for t in self.timeouts_ms})))
        object.__setattr__(self, "cameras", tuple(sorted(set(self.cameras))))

    @classmethod
    def parse(
        cls,
        *,
        precisions: str | None = None,
        timeouts_ms: str | None = None,
        cameras: str | None = None,
    ) -> SweepGrid:
        """The grid from comma-separated lists ("fp32,bf16", "5,20,50", "1,2,4"); None
        keeps an axis' default.

        Raises:
            ConfigError: an empty list, an unknown precision, a timeout < 0 or a camera
                count outside 1..`MAX_CAMERAS`, or something that is not a number.
        """
        return cls(
            precisions=_listed(precisions, "precisions", "fp32,bf16", str.lower),
            timeouts_ms=_listed(timeouts_ms, "batch timeouts", "5,20,50", float)
            or DEFAULT_TIMEOUTS_MS,
            cameras=_listed(cameras, "cameras", "1,2,4", int) or DEFAULT_CAMERAS,
        )

    def resolve(self, device_type: str) -> SweepGrid:
        """This grid for a device of `device_type` ("cpu", "cuda"): its precisions filled in.

        Raises:
            ConfigError: fp16 asked of a device that is not a GPU (see the module docstring).
        """
        cuda = device_type == "cuda"
        if self.precisions is None:
            return dataclasses.replace(self, precisions=CUDA_PRECISIONS if cuda else CPU_PRECISIONS)
        if "fp16" in self.precisions and not cuda:
            raise ConfigError(
                f"sweep precision fp16 needs a CUDA device, got device {device_type} "
                f"(a CPU sweeps {' and '.join(CPU_PRECISIONS)})"
            )
        return self

    def cells(self) -> list[tuple[str, float, int]]:
        """(precision, timeout ms, cameras) of every cell, in the order they are measured."""
        assert self.precisions is not None, "resolve() the grid first"
        return [(p, t, n) for n in self.cameras for p in self.precisions for t in self.timeouts_ms]
