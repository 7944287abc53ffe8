"""`drivepercept bench --mode live`: the rig's videos served as live cameras, the live pipeline
over them.

The cameras come from the project's own MJPEG camera server on 127.0.0.1 (`CameraServer` in
`drivepercept.sim.serve`), paced in real time; one measurement (`served.measure_live`) over
a window that opens `warmup_s` after the first result and lasts `duration_s`:

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

from dataclasses import dataclass
from typing import Any

from drivepercept.bench.common import ResultHeader
from drivepercept.bench.served import DEFAULT_WARMUP_S, LiveStep, measure_live
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector
from drivepercept.rig import resolve_cameras
from drivepercept.run.job import load_model
from drivepercept.run.options import RunOptions

DEFAULT_LIVE_DURATION_S = 15.0


@dataclass(frozen=True)
class LiveResult(ResultHeader):
    """`bench --mode live`: one measurement of the rig's cameras served live, and the speed
    options it ran with."""

    step: LiveStep

    def table(self) -> str:
        s = self.step
        return "\n".join(
            [
                f"live: {s.cameras} cameras at {s.fps:g} fps, {self.describe()}, "
                f"{s.window_s:.1f} s measured",
                *self.speed_lines(),
                f"{'frames/s':>9} {'target':>7} {'p50 ms':>8} {'p99 ms':>8} {'dropped':>8}",
                f"{s.achieved_fps:>9.1f} {s.target_fps:>7.1f} {s.p50_ms:>8.1f} "
                f"{s.p99_ms:>8.1f} {s.drop_share:>7.1%}",
                *([s.load.describe()] if s.load else []),
                "(cameras served by the MJPEG camera server on 127.0.0.1, on this machine's CPU)",
            ]
        )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), **self.step.as_dict()}


def live_bench(
    options: RunOptions,
    *,
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
        fps=rate,
        duration_s=duration_s or DEFAULT_LIVE_DURATION_S,
        warmup_s=warmup_s,
        detector=detector,
    )
    # after the run: torch's threads as the engine left them
    return LiveResult.measured(detector, options.pipeline(), step=step)
