"""`drivepercept bench --sweep`: live figures over precision x batch timeout x cameras.

Each cell of the grid is one live measurement (`served.measure_live`) of N synthetic
cameras served in real time at `fps`, with the pipeline at one precision and one batch
timeout: processed frames/s, p50 / p99 end-to-end latency and the share of frames dropped.
The cameras are rendered once, as capacity renders them (`served.SyntheticCameras`: up to `CLIPS`
clips of `CLIP_S` s, looped, shared round-robin). The model is loaded once: the engine sets
the precision up each time it takes the detector (`engine/precision.py`: idempotent and
reversible), so every cell runs the same weights.

Order: camera count by camera count (every precision and timeout at 1 camera, then at 2,
...), so the cells a reader compares with each other are measured close together, under the
same outside load.

Defaults keep a CPU sweep of yolox-nano at 640x360 under 3 minutes: fp32 and bf16, batch
timeouts 5, 20 and 50 ms, 1, 2 and 4 cameras at 15 fps: 18 cells of 5 s after 2 s of
settling, about 8 s a cell with connecting, the engine's warm-up and draining (142 s in all,
rendering included, on the 2-core development machine). On CUDA fp16 joins them. fp16 is the
GPU's half precision and is refused on a CPU (`grid.SweepGrid.resolve`).

The table's header says which speed options were on (`common.SpeedOptions`: channels_last,
compile, CUDA graphs, torch's threads), and each row the load over its window (`bench.live`).

What the timeout changes: the batcher sends a batch when every live camera has a frame or
when the timeout has passed since its oldest frame arrived. With one camera every batch is
full at once, so those cells differ by noise alone; with more, a short timeout sends partial
batches (less waiting, more forward passes), a long one waits for the late cameras.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from drivepercept.bench.common import ResultHeader
from drivepercept.bench.grid import SweepGrid
from drivepercept.bench.served import (
    CLIPS,
    DEFAULT_WARMUP_S,
    STEP_HEADER,
    LiveStep,
    SyntheticCameras,
)
from drivepercept.engine.device import resolve_device
from drivepercept.models.base import Detector
from drivepercept.run.job import load_model
from drivepercept.run.options import RunOptions

DEFAULT_FPS = 15.0
DEFAULT_CELL_S = 5.0
LOAD_NOTE = "(GPU %: NVML utilization mean/max, CPU %: this process's mean, 100 = one core)"

Measure = Callable[[str, float, int], LiveStep]  # (precision, timeout ms, cameras) -> step


HEADER = f"{'precision':>9} {'timeout ms':>10} {'cameras':>7} {STEP_HEADER}"


@dataclass(frozen=True)
class SweepCell:
    """One measured cell: a live step at one precision and batch timeout."""

    precision: str
    batch_timeout_ms: float
    step: LiveStep

    @property
    def label(self) -> str:
        """The cell's line in the plot: "fp32, 20 ms"."""
        return f"{self.precision}, {self.batch_timeout_ms:g} ms"

    def line(self) -> str:
        """One row under `HEADER`."""
        return (
            f"{self.precision:>9} {self.batch_timeout_ms:>10g} {self.step.cameras:>7} "
            f"{self.step.cells()}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "batch_timeout_ms": self.batch_timeout_ms,
            **self.step.as_dict(),
        }


def measure_grid(
    measure: Measure,
    grid: SweepGrid,
    *,
    on_cell: Callable[[SweepCell], None] | None = None,
) -> tuple[SweepCell, ...]:
    """Measure every cell of a resolved `grid`, in `SweepGrid.cells` order.

    Args:
        measure: (precision, batch timeout ms, cameras) -> the live step (`sweep` serves
            rendered cameras; a test passes a fake).
        grid: the axes, `resolve`d for the device.
        on_cell: called with each cell as it is measured (the CLI prints it).
    """
    cells = []
    for precision, timeout_ms, n in grid.cells():
        cell = SweepCell(precision, timeout_ms, measure(precision, timeout_ms, n))
        cells.append(cell)
        if on_cell is not None:
            on_cell(cell)
    return tuple(cells)


@dataclass(frozen=True)
class SweepResult(ResultHeader):
    """`bench --sweep`: every cell, and what was asked (`speed.precision` names every
    precision swept: each cell ran one)."""

    cells: tuple[SweepCell, ...]
    grid: SweepGrid
    fps: float
    size: tuple[int, int]
    cell_s: float
    warmup_s: float
    elapsed_s: float

    def best(self) -> list[SweepCell]:
        """Per camera count, the cell with the most frames/s (a tie: the lower p99)."""

        def rank(cell: SweepCell) -> tuple[float, float]:
            p99 = cell.step.p99_ms
            return (cell.step.achieved_fps, -p99 if math.isfinite(p99) else -math.inf)

        best: dict[int, SweepCell] = {}
        for cell in self.cells:
            top = best.get(cell.step.cameras)
            if top is None or rank(cell) > rank(top):
                best[cell.step.cameras] = cell
        return [best[n] for n in sorted(best)]

    def table(self) -> str:
        w, h = self.size
        rows = [
            f"sweep: {w}x{h} cameras at {self.fps:g} fps, {self.cell_s:g} s per cell after "
            f"{self.warmup_s:g} s of settling",
            self.describe(),
            *self.speed_lines(),
            HEADER,
            *(c.line() for c in self.cells),
            *(
                f"most frames/s at {c.step.cameras} camera(s): {c.label} "
                f"({c.step.achieved_fps:.1f} frames/s, p99 {c.step.p99_ms:.0f} ms)"
                for c in self.best()
            ),
            f"sweep: {len(self.cells)} cells measured, {self.elapsed_s:.0f} s in all",
            LOAD_NOTE,
        ]
        return "\n".join(rows)

    def as_dict(self) -> dict[str, Any]:
        w, h = self.size
        return {
            **super().as_dict(),
            "size": f"{w}x{h}",
            "fps_per_camera": self.fps,
            "cell_s": self.cell_s,
            "warmup_s": self.warmup_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "grid": {
                "precisions": list(self.grid.precisions or ()),
                "batch_timeouts_ms": list(self.grid.timeouts_ms),
                "cameras": list(self.grid.cameras),
            },
            "cells": [c.as_dict() for c in self.cells],
        }

    def plot_png(self) -> bytes:
        """Frames/s, p99 and drops against the camera count, a line per precision and
        timeout (`drivepercept.report.plots.sweep_plot`)."""
        from drivepercept.report.plots import sweep_plot

        series: dict[str, list[tuple[int, float, float, float]]] = {}
        for c in self.cells:
            s = c.step
            series.setdefault(c.label, []).append(
                (s.cameras, s.achieved_fps, s.p99_ms, s.drop_share)
            )
        w, h = self.size
        title = (
            f"Sweep: {self.model} ({self.input_text}) on {self.device}, {w}x{h} cameras at "
            f"{self.fps:g} fps, {self.cell_s:g} s a cell"
        )
        return sweep_plot(series, fps_per_camera=self.fps, title=title)


def sweep(
    options: RunOptions,
    *,
    grid: SweepGrid | None = None,
    fps: float | None = None,
    size: tuple[int, int] = (640, 360),
    cell_s: float | None = None,
    warmup_s: float | None = None,
    detector: Detector | None = None,
    on_cell: Callable[[SweepCell], None] | None = None,
) -> SweepResult:
    """Measure live cameras over `grid` (see the module docstring).

    Args:
        options: model and settings (its sources are not used: the cameras are rendered;
            its precision and batch timeout are replaced cell by cell).
        grid: the axes (None: the defaults for the device).
        fps, size: each camera's frame rate (None: `DEFAULT_FPS`) and frame size.
        cell_s: the measured window of each cell (None: `DEFAULT_CELL_S`).
        warmup_s: settling time before each window (None: `served.DEFAULT_WARMUP_S`).
        detector: an already-built detector (else `options.model` is loaded, once).
        on_cell: called with each cell as it is measured (the CLI prints it).

    Raises:
        ConfigError: a bad fps, size or duration, or fp16 on a CPU.
    """
    started = time.monotonic()
    settle_s = DEFAULT_WARMUP_S if warmup_s is None else warmup_s
    cameras = SyntheticCameras(fps or DEFAULT_FPS, size, cell_s or DEFAULT_CELL_S, settle_s)
    config = options.pipeline()
    device = resolve_device(config.device)
    grid = (grid or SweepGrid()).resolve(device.type)
    # the cells run one detector at each precision: it is chosen for the lowest one swept
    # (runtime auto keeps torch where a reduced precision is swept: the export is fp32 only)
    reduced = next((p for p in grid.precisions or () if p != "fp32"), config.precision)
    chosen = dataclasses.replace(options, settings={**options.settings, "precision": reduced})
    detector = detector or load_model(chosen)
    with cameras.rendered(min(CLIPS, max(grid.cameras)), detector) as measure:

        def cell(precision: str, timeout_ms: float, n: int) -> LiveStep:
            settings = {**options.settings, "precision": precision, "batch_timeout_ms": timeout_ms}
            return measure(dataclasses.replace(options, settings=settings), n)

        cells = measure_grid(cell, grid, on_cell=on_cell)
    # after the runs: torch's threads as the engine left them; the precision is per cell
    swept = f"{'/'.join(grid.precisions or ())} (per cell)"
    result = SweepResult.measured(
        detector,
        config,
        cells=cells,
        grid=grid,
        fps=cameras.fps,
        size=cameras.size,
        cell_s=cameras.duration_s,
        warmup_s=cameras.warmup_s,
        elapsed_s=time.monotonic() - started,
    )
    speed = result.speed and dataclasses.replace(result.speed, precision=swept)
    return dataclasses.replace(result, speed=speed)
