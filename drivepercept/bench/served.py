"""The live measurement of served cameras, shared by `live`, `capacity` and `sweep`.

`measure_live`: videos served as live cameras by the simulator's MJPEG camera server, the
live job over them, measured over a window (a `LiveStep`). `SyntheticCameras`: cameras
rendered once by the simulator, N of them served and measured (capacity's steps, the
sweep's cells).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from drivepercept.engine.device import resolve_device
from drivepercept.errors import ConfigError
from drivepercept.geometry import check_fps, check_size
from drivepercept.models.base import Detector
from drivepercept.run.job import load_model, run
from drivepercept.run.options import Mode, RunOptions
from drivepercept.rundir import RunDir
from drivepercept.sim.clip import simulate_clip
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.serve import CameraServer
from drivepercept.telemetry.loadwatch import NA, LoadFigures, watch_load
from drivepercept.telemetry.sampler import gpu_refs
from drivepercept.telemetry.stats import latency_stats
from drivepercept.types import RunProgress

log = logging.getLogger(__name__)

CLIPS = 4  # distinct rendered cameras; more cameras share them round-robin
CLIP_S = 3.0  # each clip is looped by the server
CLIP_SEED = 14

DEFAULT_WARMUP_S = 2.0
_START_ALLOWANCE_S = 60.0  # for a first result (connect, warm-up): a busy 2-core machine is slow
STEP_HEADER = (
    f"{'frames/s':>8} {'target':>7} {'p50 ms':>7} {'p99 ms':>7} {'dropped':>8} "
    f"{'GPU %':>7} {'CPU %':>6}"
)


@dataclass(frozen=True)
class LiveStep:
    """One live measurement of `cameras` cameras at `fps` each (see `measure_live`)."""

    cameras: int
    fps: float  # asked of each camera
    window_s: float
    frames: int  # emitted in the window
    dropped: int  # dropped by the pipeline or skipped by the server, in the window
    p50_ms: float
    p99_ms: float
    load: LoadFigures | None = None  # over the window
    detected_share: float = 1.0  # of the frames in the window, those the model saw

    @property
    def target_fps(self) -> float:
        return self.cameras * self.fps

    @property
    def achieved_fps(self) -> float:
        return self.frames / self.window_s if self.window_s > 0 else 0.0

    @property
    def drop_share(self) -> float:
        offered = self.frames + self.dropped
        return self.dropped / offered if offered else 1.0

    def cells(self) -> str:
        """The `STEP_HEADER` columns of a table row (capacity's steps, the sweep's cells)."""
        gpu, cpu = (self.load.gpu_util_cell, self.load.cpu_cell) if self.load else (NA, NA)
        return (
            f"{self.achieved_fps:>8.1f} {self.target_fps:>7.1f} {self.p50_ms:>7.1f} "
            f"{self.p99_ms:>7.1f} {self.drop_share:>8.1%} {gpu:>7} {cpu:>6}"
        )

    def as_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 3)

        return {
            "cameras": self.cameras,
            "fps_per_camera": self.fps,
            "target_fps": num(self.target_fps),
            "achieved_fps": num(self.achieved_fps),
            "window_s": num(self.window_s),
            "frames": self.frames,
            "dropped": self.dropped,
            "drop_share": num(self.drop_share),
            "p50_ms": num(self.p50_ms),
            "p99_ms": num(self.p99_ms),
            "detected_share": num(self.detected_share),
            "load": self.load.as_dict() if self.load else None,
        }


class _Count(NamedTuple):
    t_ns: int
    frames: int
    dropped: int


class _Window:
    """Opens the window `warmup_s` after the first result and stops capture `duration_s`
    later. Called by the pipeline's run loop (the thread that called `run`) every half
    second, so the window is known to within that; the rates divide by its measured length."""

    def __init__(
        self, service: CameraServer, names: Sequence[str], *, warmup_s: float, duration_s: float
    ) -> None:
        self._service, self._names = service, names
        self._warmup_ns, self._duration_ns = int(warmup_s * 1e9), int(duration_s * 1e9)
        self.first_ns: int | None = None
        self.start: _Count | None = None
        self.end: _Count | None = None

    def _count(self, progress: RunProgress, now_ns: int) -> _Count:
        snaps = progress.cameras
        skipped = sum(self._service.frames_skipped(n) for n in self._names)
        return _Count(now_ns, sum(s.frames for s in snaps), sum(s.dropped for s in snaps) + skipped)

    def __call__(self, progress: RunProgress) -> bool:
        """True (stop capture) once the window has closed."""
        now = time.monotonic_ns()
        if self.end is not None:
            return True
        if self.first_ns is None:
            if any(s.frames for s in progress.cameras):
                self.first_ns = now
        elif self.start is None:
            if now - self.first_ns >= self._warmup_ns:
                self.start = self._count(progress, now)
        elif now - self.start.t_ns >= self._duration_ns:
            self.end = self._count(progress, now)
        return self.end is not None

    def step(self, fps: float, run_dir: RunDir, load: LoadFigures | None) -> LiveStep:
        """The window's figures; a window that never closed (no results, or not enough of
        them before the safety stop) is a step with no frames."""
        cameras, start, end, nan = len(self._names), self.start, self.end, float("nan")
        if start is None or end is None:
            return LiveStep(cameras, fps, 0.0, 0, 0, nan, nan, load)
        latency, predicted = [], 0
        with run_dir.detections_jsonl.open(encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                stamps = record["timestamps"]
                if start.t_ns <= int(stamps["capture_ns"]) < end.t_ns:
                    latency.append(float(stamps["end_to_end_ms"]))
                    predicted += 1 if record.get("predicted") else 0
        stats, window_s = latency_stats(latency), (end.t_ns - start.t_ns) / 1e9
        frames, dropped = end.frames - start.frames, end.dropped - start.dropped
        share = 1.0 - predicted / len(latency) if latency else nan
        return LiveStep(
            cameras, fps, window_s, frames, dropped, stats.p50_ms, stats.p99_ms, load, share
        )


def _check_window(duration_s: float, warmup_s: float) -> None:
    if not (math.isfinite(duration_s) and duration_s > 0 and 0 <= warmup_s < math.inf):
        raise ConfigError(
            f"duration must be > 0 s and warm-up >= 0 s, got {duration_s:g}, {warmup_s:g}"
        )


def measure_live(
    options: RunOptions,
    videos: Sequence[tuple[str, Path]],
    *,
    fps: float,
    duration_s: float,
    warmup_s: float = DEFAULT_WARMUP_S,
    detector: Detector | None = None,
    out_root: Path | None = None,
) -> LiveStep:
    """Serve `videos` as live cameras at `fps` (the simulator's `CameraServer` on 127.0.0.1)
    and run the live job over their URLs (`run` in `Mode.LIVE`, in this process), measured
    over a window that opens `warmup_s` after the first result (connecting, warm-up and the
    first frames are not what a running rig sees) and lasts `duration_s`, after which capture
    stops. The figures (frames/s, p50 / p99, dropped, load) are as `bench.live` says.

    Args:
        options: model and settings (its sources, mode and outputs are replaced).
        videos: (camera name, video file) pairs; a video may serve several cameras.
        detector: an already-built detector (else `options.model` is loaded).
        out_root: where the run folder goes (a temporary folder, removed, when None).

    Raises:
        ConfigError: a bad fps, duration or warm-up.
    """
    check_fps(fps)
    _check_window(duration_s, warmup_s)
    detector = detector or load_model(options)
    config = options.pipeline()
    gpus = gpu_refs(resolve_device(config.device))
    with tempfile.TemporaryDirectory(prefix="drivepercept-bench-") as tmp:
        with CameraServer(videos, fps=fps) as service:
            names = [name for name, _ in videos]
            window = _Window(service, names, warmup_s=warmup_s, duration_s=duration_s)
            step_options = dataclasses.replace(
                options,
                sources=tuple(f"{name}={service.url(name)}" for name in names),
                # the sampler below watches at the run's rate instead (one sampler)
                settings={**options.settings, "sample_hz": 0.0},
                mode=Mode.LIVE,
                out_root=out_root or Path(tmp),
                name=f"bench-live-{len(names)}x{fps:g}fps-{time.strftime('%H%M%S')}",
                duration_s=_START_ALLOWANCE_S + warmup_s + duration_s,  # a safety stop
                report_formats=(),
                save_video=False,
                show=False,
                metrics_port=None,
                command="bench --mode live",
            )
            with watch_load(gpus, rate_hz=config.sample_hz) as load:
                result = run(step_options, detector=detector, progress=window)
        start, end = window.start, window.end
        figures = load.figures([(start.t_ns, end.t_ns)] if start and end else [])
        return window.step(fps, RunDir(result.run_dir), figures)


@dataclass(frozen=True)
class SyntheticCameras:
    """Cameras of a synthetic drive rendered by the simulator (`CLIP_S` s clips, looped) and
    served live at `fps` each, frames of `size`; each measurement of them lasts `duration_s`
    after `warmup_s` of settling (capacity's steps, the sweep's cells).

    Raises:
        ConfigError: a bad fps, size, duration or warm-up.
    """

    fps: float
    size: tuple[int, int]
    duration_s: float
    warmup_s: float = DEFAULT_WARMUP_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "fps", check_fps(self.fps))
        object.__setattr__(self, "size", check_size(*self.size))
        _check_window(self.duration_s, self.warmup_s)

    @contextmanager
    def rendered(
        self, clips: int, detector: Detector
    ) -> Iterator[Callable[[RunOptions, int], LiveStep]]:
        """`clips` cameras rendered into a temporary folder (removed on exit), and the
        measurement of N cameras served from them ("cam00", "cam01", ..., the clips shared
        round-robin) with an options' settings and `detector`."""
        width, height = self.size
        with tempfile.TemporaryDirectory(prefix="drivepercept-clips-") as tmp:
            log.info("rendering %d clips of %g s at %dx%d", clips, CLIP_S, width, height)
            config = SimulationConfig(
                out_dir=Path(tmp),
                cameras=clips,
                seconds=CLIP_S,
                fps=self.fps,
                width=width,
                height=height,
                seed=CLIP_SEED,
            )
            videos = simulate_clip(config).videos

            def measure(options: RunOptions, cameras: int) -> LiveStep:
                served = [(f"cam{k:02d}", videos[k % len(videos)]) for k in range(cameras)]
                return measure_live(
                    options,
                    served,
                    fps=self.fps,
                    duration_s=self.duration_s,
                    warmup_s=self.warmup_s,
                    detector=detector,
                )

            yield measure
