"""`drivepercept bench --mode ...`: one front door to the benchmarks, and their JSON.

| mode       | measures                                                  | module     |
|------------|-----------------------------------------------------------|------------|
| (default)  | model-only vs replay pipeline vs naive loop, interleaved  | `compare`  |
| `ceiling`  | model-only frames/s and latency per batch size            | `ceiling`  |
| `pipeline` | the replay pipeline alone                                 | `compare`  |
| `naive`    | the naive loop alone                                      | `compare`  |
| `live`     | the rig's videos served live: frames/s, p50/p99, drops    | `live`     |
| `capacity` | the most live cameras within a latency budget             | `capacity` |
| `sweep`    | live figures over precision x batch timeout x cameras     | `sweep`    |

Their shared parts (speed options, the result header, first frames, synthetic cameras, the
live measurement) are `common`'s; this module and `grid` load neither torch nor OpenCV, so a
request is checked before any model, render or camera.

`--json PATH` writes the figures with the machine they were measured on, for comparing
machines; the sweep also draws a plot (`write_bench_plot`), beside the JSON by default.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from drivepercept import __version__
from drivepercept.bench.grid import SweepGrid
from drivepercept.choices import BENCH_MODES as BENCH_MODES
from drivepercept.errors import ConfigError, OutputError
from drivepercept.geometry import check_fps, parse_size

if TYPE_CHECKING:  # the jobs load torch and OpenCV: imported when a benchmark runs
    from drivepercept.run.options import RunOptions

SIMULATED = "simulated"  # a placeholder source: capacity and the sweep render their cameras
JSON_SCHEMA_VERSION = 1
DEFAULT_SIZE = "640x360"


class BenchReport(Protocol):
    """What every benchmark returns: a table for people, a dict for `--json`."""

    def table(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


class BenchStep(Protocol):
    """A capacity step or a sweep cell, shown as it is measured."""

    def line(self) -> str: ...


@dataclass(frozen=True)
class BenchRequest:
    """Which benchmark, and its own knobs (the model and pipeline settings are `RunOptions`).

    Attributes:
        mode: one of `BENCH_MODES`.
        frames_per_camera, rounds: default, pipeline, naive (and ceiling's rounds).
        fps: live (None: the rig's rate), capacity (None: 30) and sweep (None: 15) camera
            frame rate.
        duration_s: live's measured window (None: 15 s), capacity's per step (None: 10 s),
            the sweep's per cell (None: 5 s).
        size: capacity's and the sweep's camera frame size, "WIDTHxHEIGHT" (None:
            `DEFAULT_SIZE`).
        precisions, timeouts_ms, sweep_cameras: the sweep's axes, comma-separated ("fp32,bf16",
            "5,20,50", "1,2,4"; None: the defaults, see `grid.SweepGrid.parse`).
        plot: where the sweep's PNG goes (None: beside `--json`, see `plot_path`).
    """

    mode: str = "default"
    frames_per_camera: int = 30
    rounds: int = 3
    fps: float | None = None
    duration_s: float | None = None
    size: str | None = None
    precisions: str | None = None
    timeouts_ms: str | None = None
    sweep_cameras: str | None = None
    plot: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in BENCH_MODES:
            raise ConfigError(
                f"bench mode must be one of {', '.join(BENCH_MODES)}, got {self.mode!r}"
            )
        if self.fps is not None:
            check_fps(self.fps)
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise ConfigError(f"duration must be > 0 s, got {self.duration_s:g}")
        parse_size(self.size or DEFAULT_SIZE)
        axes = (self.precisions, self.timeouts_ms, self.sweep_cameras, self.plot)
        if self.mode == "sweep":
            self.grid()  # every axis checked before any model, render or camera
        elif any(a is not None for a in axes):
            raise ConfigError(
                f"precisions, batch timeouts, sweep cameras and a plot are the sweep's "
                f"(bench --sweep), not bench --mode {self.mode}'s"
            )

    def grid(self) -> SweepGrid:
        """The sweep's axes (precisions still unresolved: they depend on the device)."""
        return SweepGrid.parse(
            precisions=self.precisions, timeouts_ms=self.timeouts_ms, cameras=self.sweep_cameras
        )

    def plot_path(self, json_path: Path | None) -> Path | None:
        """Where the sweep's plot goes: `plot`, else beside `json_path` (its name, .png);
        None for the other modes, or a sweep with neither."""
        if self.mode != "sweep":
            return None
        return self.plot or (json_path.with_suffix(".png") if json_path is not None else None)


def run_bench(
    options: RunOptions,
    request: BenchRequest,
    *,
    on_step: Callable[[BenchStep], None] | None = None,
) -> BenchReport:
    """Run the benchmark `request` names with `options`' model and settings.

    Args:
        options: sources (a rig; capacity renders its own cameras), model, settings, budget.
        request: the mode and its knobs.
        on_step: capacity's and the sweep's progress, each step or cell as it is measured.

    Raises:
        ConfigError: bad input (a detection interval among them: every bench measures the
            model on every frame); DrivePerceptError from the run itself.
    """
    if options.settings.get("detect_every", 1) != 1:
        raise ConfigError(
            "--detect-every is for replay, live and eval; a bench runs the model on every frame"
        )
    if request.mode == "ceiling":
        from drivepercept.bench.ceiling import ceiling

        return ceiling(options, rounds=request.rounds)
    if request.mode == "live":
        from drivepercept.bench.live import live_bench

        return live_bench(options, fps=request.fps, duration_s=request.duration_s)
    if request.mode == "capacity":
        from drivepercept.bench.capacity import capacity

        return capacity(
            options,
            fps=request.fps,
            size=parse_size(request.size or DEFAULT_SIZE),
            step_s=request.duration_s,
            on_step=on_step,
        )
    if request.mode == "sweep":
        from drivepercept.bench.sweep import sweep

        return sweep(
            options,
            grid=request.grid(),
            fps=request.fps,
            size=parse_size(request.size or DEFAULT_SIZE),
            cell_s=request.duration_s,
            on_cell=on_step,
        )
    from drivepercept.bench.compare import MODES, bench

    modes = MODES if request.mode == "default" else (request.mode,)
    return bench(
        options, frames_per_camera=request.frames_per_camera, rounds=request.rounds, modes=modes
    )


def machine() -> dict[str, Any]:
    """The machine the figures were measured on (no host name: files get shared)."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
    }


def write_bench_json(path: Path, request: BenchRequest, report: BenchReport) -> None:
    """`bench --json PATH`: the request, the machine and the figures, as one JSON object."""
    record = {
        "schema": JSON_SCHEMA_VERSION,
        "drivepercept": __version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mode": request.mode,
        "machine": machine(),
        "results": report.as_dict(),
    }
    try:
        path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_bench_plot(path: Path, report: BenchReport) -> None:
    """The sweep's plot as a PNG at `path` (`BenchRequest.plot_path` says where).

    Raises:
        ConfigError: `report` is not a sweep's; OutputError: the file cannot be written.
    """
    from drivepercept.bench.sweep import SweepResult

    if not isinstance(report, SweepResult):
        raise ConfigError("only bench --sweep draws a plot")
    try:
        path.write_bytes(report.plot_png())
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
