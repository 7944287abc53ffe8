"""`drivepercept bench --sweep`: live figures over precision x batch timeout x cameras.

Each cell of the grid is one live measurement (`bench_live.measure_live`) of N synthetic
cameras served in real time at `fps`, with the pipeline at one precision and one batch
timeout: processed frames/s, p50 / p99 end-to-end latency and the share of frames dropped.
The cameras are rendered once, as capacity renders them (`bench_capacity`: up to `CLIPS`
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
GPU's half precision and is refused on a CPU: torch's CPU kernels gain nothing from it (a
stack of convolutions ran 1.6x slower than fp32 on the same machine).

The table's header says which speed options were on (`benchmark.SpeedOptions`: channels_last,
compile, CUDA graphs, torch's threads), and each row the load over its window (`bench_live`).

What the timeout changes: the batcher sends a batch when every live camera has a frame or
when the timeout has passed since its oldest frame arrived. With one camera every batch is
full at once, so those cells differ by noise alone; with more, a short timeout sends partial
batches (less waiting, more forward passes), a long one waits for the late cameras.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivepercept.config import PRECISIONS
from drivepercept.errors import ConfigError
from drivepercept.geometry import MAX_CAMERAS, check_fps, check_size
from drivepercept.telemetry.loadwatch import NA

if TYPE_CHECKING:  # torch and OpenCV: loaded when a sweep runs, not when a request is checked
    from drivepercept.models.base import Detector
    from drivepercept.run.bench_live import LiveStep, SimCameras
    from drivepercept.run.benchmark import SpeedOptions
    from drivepercept.run.options import RunOptions

log = logging.getLogger(__name__)

CPU_PRECISIONS = ("fp32", "bf16")
CUDA_PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_TIMEOUTS_MS = (5.0, 20.0, 50.0)
DEFAULT_CAMERAS = (1, 2, 4)
DEFAULT_FPS = 15.0
DEFAULT_CELL_S = 5.0
MAX_TIMEOUT_MS = 60_000.0  # PipelineConfig's own bound
LOAD_NOTE = "(GPU %: NVML utilization mean/max, CPU %: this process's mean, 100 = one core)"

Measure = Callable[[str, float, int], "LiveStep"]  # (precision, timeout ms, cameras) -> step


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


HEADER = (
    f"{'precision':>9} {'timeout ms':>10} {'cameras':>7} {'frames/s':>8} {'target':>7} "
    f"{'p50 ms':>7} {'p99 ms':>7} {'dropped':>8} {'GPU %':>7} {'CPU %':>6}"
)


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
        s = self.step
        gpu, cpu = (s.load.gpu_util_cell, s.load.cpu_cell) if s.load else (NA, NA)
        return (
            f"{self.precision:>9} {self.batch_timeout_ms:>10g} {s.cameras:>7} "
            f"{s.achieved_fps:>8.1f} {s.target_fps:>7.1f} {s.p50_ms:>7.1f} {s.p99_ms:>7.1f} "
            f"{s.drop_share:>8.1%} {gpu:>7} {cpu:>6}"
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
class SweepResult:
    """`bench --sweep`: every cell, and what was asked (`speed.precision` names every
    precision swept: each cell ran one)."""

    cells: tuple[SweepCell, ...]
    grid: SweepGrid
    fps: float
    size: tuple[int, int]
    model: str
    input_size: tuple[int, int]
    device: str
    speed: SpeedOptions
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
        (w, h), (iw, ih) = self.size, self.input_size
        rows = [
            f"sweep: {w}x{h} cameras at {self.fps:g} fps, {self.cell_s:g} s per cell after "
            f"{self.warmup_s:g} s of settling",
            f"model {self.model}, input {iw}x{ih}, device {self.device}",
            self.speed.line(),
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
        (w, h), (iw, ih) = self.size, self.input_size
        return {
            "model": self.model,
            "input_size": f"{iw}x{ih}",
            "device": self.device,
            "size": f"{w}x{h}",
            "fps_per_camera": self.fps,
            "cell_s": self.cell_s,
            "warmup_s": self.warmup_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "speed": self.speed.as_dict(),
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
        (w, h), (iw, ih) = self.size, self.input_size
        title = (
            f"Sweep: {self.model} ({iw}x{ih}) on {self.device}, {w}x{h} cameras at "
            f"{self.fps:g} fps, {self.cell_s:g} s a cell"
        )
        return sweep_plot(series, fps_per_camera=self.fps, title=title)


def sweep(
    options: RunOptions,
    *,
    cameras: SimCameras,
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
        cameras: the camera server and the renderer (`SimCameras.render` is required).
        grid: the axes (None: the defaults for the device).
        fps, size: each camera's frame rate (None: `DEFAULT_FPS`) and frame size.
        cell_s: the measured window of each cell (None: `DEFAULT_CELL_S`).
        warmup_s: settling time before each window (None: bench_live's `DEFAULT_WARMUP_S`).
        detector: an already-built detector (else `options.model` is loaded, once).
        on_cell: called with each cell as it is measured (the CLI prints it).

    Raises:
        ConfigError: a bad fps, size or duration, fp16 on a CPU, or no renderer.
    """
    from drivepercept.engine.device import resolve_device
    from drivepercept.run.bench_capacity import CLIP_S, CLIP_SEED, CLIPS
    from drivepercept.run.bench_live import DEFAULT_WARMUP_S, measure_live
    from drivepercept.run.benchmark import SpeedOptions
    from drivepercept.run.job import load_model

    started = time.monotonic()
    fps = check_fps(fps or DEFAULT_FPS)
    cell_s = cell_s or DEFAULT_CELL_S
    warmup_s = DEFAULT_WARMUP_S if warmup_s is None else warmup_s
    if not (math.isfinite(cell_s) and cell_s > 0 and math.isfinite(warmup_s) and warmup_s >= 0):
        raise ConfigError(
            f"duration must be > 0 s and warm-up >= 0 s, got {cell_s:g}, {warmup_s:g}"
        )
    width, height = check_size(*size)
    config = options.pipeline()
    device = resolve_device(config.device)
    grid = (grid or SweepGrid()).resolve(device.type)
    if cameras.render is None:
        raise ConfigError("bench --sweep needs a clip renderer (SimCameras.render)")
    # the cells run one detector at each precision: it is chosen for the lowest one swept
    # (runtime auto keeps torch where a reduced precision is swept: the export is fp32 only)
    reduced = next((p for p in grid.precisions or () if p != "fp32"), config.precision)
    chosen = dataclasses.replace(options, settings={**options.settings, "precision": reduced})
    detector = detector or load_model(chosen)
    with tempfile.TemporaryDirectory(prefix="drivepercept-sweep-") as tmp:
        clip_count = min(CLIPS, max(grid.cameras))
        log.info("rendering %d clips of %g s at %dx%d", clip_count, CLIP_S, width, height)
        clips = list(
            cameras.render(
                Path(tmp),
                cameras=clip_count,
                seconds=CLIP_S,
                fps=fps,
                width=width,
                height=height,
                seed=CLIP_SEED,
            )
        )

        def measure(precision: str, timeout_ms: float, n: int) -> LiveStep:
            settings = {**options.settings, "precision": precision, "batch_timeout_ms": timeout_ms}
            return measure_live(
                dataclasses.replace(options, settings=settings),
                [(f"cam{k:02d}", clips[k % len(clips)]) for k in range(n)],
                serve=cameras.serve,
                fps=fps,
                duration_s=cell_s,
                warmup_s=warmup_s,
                detector=detector,
            )

        cells = measure_grid(measure, grid, on_cell=on_cell)
    # after the runs: torch's threads as the engine left them; the precision is per cell
    swept = f"{'/'.join(grid.precisions or ())} (per cell)"
    speed = dataclasses.replace(SpeedOptions.of(config, detector=detector), precision=swept)
    return SweepResult(
        cells=cells,
        grid=grid,
        fps=fps,
        size=(width, height),
        model=detector.name,
        input_size=detector.input.size,
        device=str(device),
        speed=speed,
        cell_s=cell_s,
        warmup_s=warmup_s,
        elapsed_s=time.monotonic() - started,
    )
