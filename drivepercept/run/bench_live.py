"""`drivepercept bench --mode live`: videos served as live cameras, the live pipeline over them.

The cameras come from the project's own MJPEG camera server on 127.0.0.1 (`CameraServer` in
`drivepercept.sim.serve`), paced in real time. The caller hands it in as a `SimCameras`:
`run/` sits beside `sim/` in the layers (ARCHITECTURE.md), not above it, so the front end (the
CLI, a test) passes the server and the clip renderer in; this module only needs their shape.

One measurement (`measure_live`): serve the videos at `fps`, run the live job (`run` in
`Mode.LIVE`, in this process, with its own policies: newest frame wins, every drop counted)
over their URLs, and measure over a window that opens `warmup_s` after the first result
(connecting, the engine's warm-up and the first frames are not what a running rig sees) and
lasts `duration_s`, after which capture stops:

* frames/s: results emitted in the window, over the window;
* p50 / p99 end-to-end latency (capture to emission) of the frames captured in the window,
  from the run folder's frames.csv;
* dropped: frames the pipeline dropped (a newer one came first) plus frames the server
  skipped because its client was not reading, over all frames offered in the window;
* load: GPU utilization and memory (NVML) and this process's CPU over the window, from one
  `gpu-monitor` sampler at the pipeline's `sample_hz` beside the run (the run's own sampler
  is off, so the run pays for one sampler, as any live run does; `telemetry.loadwatch`).

The simulated cameras decode and JPEG-encode on the same CPU as the pipeline (a real camera
does that on its own chip), so on a small machine these figures are pessimistic.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from drivepercept.engine.device import resolve_device
from drivepercept.errors import ConfigError
from drivepercept.geometry import check_fps
from drivepercept.models.base import Detector
from drivepercept.pipeline import Pipeline
from drivepercept.rig import resolve_cameras
from drivepercept.run.benchmark import SpeedOptions
from drivepercept.run.job import load_model, run
from drivepercept.run.options import Mode, RunOptions
from drivepercept.rundir import RunDir
from drivepercept.telemetry.loadwatch import LoadFigures, watch_load
from drivepercept.telemetry.sampler import gpu_refs
from drivepercept.telemetry.stats import latency_stats

DEFAULT_WARMUP_S = 2.0
DEFAULT_LIVE_DURATION_S = 15.0
# how long the cameras may take to deliver a first result (connect, model warm-up) before
# the step gives up; a loaded 2-core machine needs a few seconds
_START_ALLOWANCE_S = 60.0


class CameraService(Protocol):
    """A running camera server: `drivepercept.sim.serve.CameraServer` has this shape."""

    def url(self, name: str) -> str: ...

    def frames_skipped(self, name: str) -> int: ...


class ServeCameras(Protocol):
    """Starts a camera server for (name, video) pairs at `fps` (the `CameraServer` class)."""

    def __call__(
        self, cameras: Sequence[tuple[str, Path]], *, fps: float | None = ...
    ) -> AbstractContextManager[CameraService]: ...


class RenderClips(Protocol):
    """Renders a synthetic drive into `out_dir` and returns its videos, one per camera (the
    simulator: `simulate_clip(SimulationConfig(out_dir=out_dir, **kw)).videos`)."""

    def __call__(
        self,
        out_dir: Path,
        *,
        cameras: int,
        seconds: float,
        fps: float,
        width: int,
        height: int,
        seed: int,
    ) -> Sequence[Path]: ...


@dataclass(frozen=True)
class SimCameras:
    """What the live benchmarks take from the simulator (see the module docstring)."""

    serve: ServeCameras
    render: RenderClips | None = None


@dataclass(frozen=True)
class LiveStep:
    """One live measurement of `cameras` cameras at `fps` each (see the module docstring)."""

    cameras: int
    fps: float  # asked of each camera
    window_s: float
    frames: int  # emitted in the window
    dropped: int  # dropped by the pipeline or skipped by the server, in the window
    p50_ms: float
    p99_ms: float
    load: LoadFigures | None = None  # over the window

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
            "load": self.load.as_dict() if self.load else None,
        }


@dataclass(frozen=True)
class _Count:
    t_ns: int
    frames: int
    dropped: int


class _Window:
    """Opens the window `warmup_s` after the first result and stops capture `duration_s`
    later. Called by the pipeline's run loop (the thread that called `run`) every half
    second, so the window is known to within that; the rates divide by its measured length."""

    def __init__(
        self, service: CameraService, names: Sequence[str], *, warmup_s: float, duration_s: float
    ) -> None:
        self._service, self._names = service, names
        self._warmup_ns, self._duration_ns = int(warmup_s * 1e9), int(duration_s * 1e9)
        self.first_ns: int | None = None
        self.start: _Count | None = None
        self.end: _Count | None = None

    def _count(self, pipeline: Pipeline, now_ns: int) -> _Count:
        snaps = pipeline.cameras()
        skipped = sum(self._service.frames_skipped(n) for n in self._names)
        return _Count(now_ns, sum(s.frames for s in snaps), sum(s.dropped for s in snaps) + skipped)

    def __call__(self, pipeline: Pipeline) -> None:
        now = time.monotonic_ns()
        if self.end is not None:
            return
        if self.first_ns is None:
            if any(s.frames for s in pipeline.cameras()):
                self.first_ns = now
        elif self.start is None:
            if now - self.first_ns >= self._warmup_ns:
                self.start = self._count(pipeline, now)
        elif now - self.start.t_ns >= self._duration_ns:
            self.end = self._count(pipeline, now)
            pipeline.stop_capture()


def measure_live(
    options: RunOptions,
    videos: Sequence[tuple[str, Path]],
    *,
    serve: ServeCameras,
    fps: float,
    duration_s: float,
    warmup_s: float = DEFAULT_WARMUP_S,
    detector: Detector | None = None,
    out_root: Path | None = None,
) -> LiveStep:
    """Serve `videos` as live cameras at `fps` and measure the live pipeline over them.

    Args:
        options: model and settings (its sources, mode and outputs are replaced).
        videos: (camera name, video file) pairs; a video may serve several cameras.
        serve: starts the camera server (see `SimCameras`).
        fps: each camera's frame rate.
        duration_s: the measured window.
        warmup_s: from the first result to the window's start.
        detector: an already-built detector (else `options.model` is loaded).
        out_root: where the run folder goes (a temporary folder, removed, when None).

    Raises:
        ConfigError: a bad fps, duration or warm-up.
    """
    check_fps(fps)
    if not (math.isfinite(duration_s) and duration_s > 0 and warmup_s >= 0):
        raise ConfigError(
            f"duration must be > 0 s and warm-up >= 0 s, got {duration_s:g}, {warmup_s:g}"
        )
    detector = detector or load_model(options)
    config = options.pipeline()
    gpus = gpu_refs(resolve_device(config.device))
    with tempfile.TemporaryDirectory(prefix="drivepercept-bench-") as tmp:
        with serve(videos, fps=fps) as service:
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
        return _step(len(names), fps, start, end, RunDir(result.run_dir), figures)


def _step(
    cameras: int,
    fps: float,
    start: _Count | None,
    end: _Count | None,
    run_dir: RunDir,
    load: LoadFigures | None = None,
) -> LiveStep:
    """The window's figures; a window that never closed (no results, or not enough of them
    before the safety stop) is a step with no frames."""
    nan = float("nan")
    if start is None or end is None:
        return LiveStep(cameras, fps, 0.0, 0, 0, nan, nan, load)
    latency = []
    with run_dir.frames_csv.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if start.t_ns <= int(row["capture_ns"]) < end.t_ns:
                latency.append(float(row["end_to_end_ms"]))
    stats = latency_stats(latency)
    return LiveStep(
        cameras=cameras,
        fps=fps,
        window_s=(end.t_ns - start.t_ns) / 1e9,
        frames=end.frames - start.frames,
        dropped=end.dropped - start.dropped,
        p50_ms=stats.p50_ms,
        p99_ms=stats.p99_ms,
        load=load,
    )


@dataclass(frozen=True)
class LiveResult:
    """`bench --mode live`: one measurement of the rig's cameras served live, and the speed
    options it ran with."""

    step: LiveStep
    model: str
    input_size: tuple[int, int]
    device: str
    speed: SpeedOptions | None = None

    def table(self) -> str:
        s, (w, h) = self.step, self.input_size
        return "\n".join(
            [
                f"live: {s.cameras} cameras at {s.fps:g} fps, model {self.model}, input "
                f"{w}x{h}, device {self.device}, {s.window_s:.1f} s measured",
                *([self.speed.line()] if self.speed else []),
                f"{'frames/s':>9} {'target':>7} {'p50 ms':>8} {'p99 ms':>8} {'dropped':>8}",
                f"{s.achieved_fps:>9.1f} {s.target_fps:>7.1f} {s.p50_ms:>8.1f} "
                f"{s.p99_ms:>8.1f} {s.drop_share:>7.1%}",
                *([s.load.describe()] if s.load else []),
                "(cameras served by the MJPEG camera server on 127.0.0.1, on this machine's CPU)",
            ]
        )

    def as_dict(self) -> dict[str, Any]:
        w, h = self.input_size
        return {
            "model": self.model,
            "input_size": f"{w}x{h}",
            "device": self.device,
            "speed": self.speed.as_dict() if self.speed else None,
            **self.step.as_dict(),
        }


def live_bench(
    options: RunOptions,
    *,
    cameras: SimCameras,
    fps: float | None = None,
    duration_s: float | None = None,
    warmup_s: float = DEFAULT_WARMUP_S,
    detector: Detector | None = None,
) -> LiveResult:
    """The rig's videos (`options.sources`) served live at `fps` (None: the first camera's
    own rate, else 15) and measured for `duration_s` (None: `DEFAULT_LIVE_DURATION_S`; see
    `measure_live`).

    Raises:
        ConfigError: a source is not a video file, or a bad fps or duration.
    """
    cams = resolve_cameras(options.sources)
    videos = []
    for cam in cams:
        if cam.video is None or not cam.video.is_file():
            raise ConfigError(
                f"bench --mode live serves video files as cameras; camera {cam.name!r} is "
                f"{cam.source or cam.video}"
            )
        videos.append((cam.name, cam.video))
    rate = fps if fps is not None else (cams[0].fps or 15.0)
    detector = detector or load_model(options)
    step = measure_live(
        options,
        videos,
        serve=cameras.serve,
        fps=rate,
        duration_s=duration_s or DEFAULT_LIVE_DURATION_S,
        warmup_s=warmup_s,
        detector=detector,
    )
    config = options.pipeline()
    device = resolve_device(config.device)
    # after the run: torch's threads as the engine left them
    speed = SpeedOptions.of(config, detector=detector)
    return LiveResult(step, detector.name, detector.input.size, str(device), speed)
