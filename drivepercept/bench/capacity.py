"""`drivepercept bench --mode capacity`: how many live cameras this machine serves.

The answer is the largest number of cameras at `fps` each whose live run (`measure_live`)
keeps the p99 end-to-end latency under the budget, drops at most 1 % of the frames offered,
and keeps up (results at 95 % or more of the cameras' combined rate: the simulated cameras
share the CPU, and a camera server that cannot pace its cameras is a machine that is full).

With a budget to hold (`--budget-ms`; `RunOptions.holds_budget`) each step's live run has
the deadline scheduler on: no frame is dropped for a newer one, and frames the model cannot
answer in time get the tracker's boxes; a step's row then says the share of its frames the
model saw. `--no-schedule` sends every frame the engine takes to the model, newest first.

Cameras: a synthetic drive rendered once at the requested size by the simulator (`CLIPS`
cameras, `CLIP_S` seconds, into a temporary folder), served in real time by the MJPEG camera
server, each clip looped and shared round-robin when more cameras are asked for than there
are clips. The model is loaded once for the whole search.

The search, and why it repeats itself to within one camera:

* doubling: 1, 2, 4, 8, ... cameras until a step fails (or `max_cameras` passes), then
  bisection between the largest pass and the smallest fail. Pass/fail is monotone in the
  camera count up to noise, so this measures about 2 log2(answer) + 1 steps: five or six at
  the counts a 2-core CPU reaches. (Starting from the model-only ceiling would save a step
  but guesses wrong by a factor on a CPU, where decoding and the camera server take a share.)
* a failed step is measured again, and passes if the second try passes: on a shared machine
  the noise (other processes, a slow first connection) only ever makes a step look worse,
  so one unlucky window does not end the doubling early or cut the bisection short.
* each step measures a `duration_s` window (default 10 s) after `warmup_s` (2 s) of
  settling: at 15 fps that is 150 frames per camera, so the p99 rests on at least two
  frames over it, and a frame or two at the window's edges moves the drop share and the
  frame rate by well under their thresholds.

Each step's row shows the load over its window (GPU utilization mean/max and this process's
CPU, see `bench.live`), so a count that stops short of the budget says whether the GPU or the
CPU was the one that filled up.

So only the count at the edge of the budget is in doubt, and a rerun gives the same count or
one next to it. Run time: render (10-20 s on 2 cores) + about 15-20 s per step (connect and
warm up, 12 s measured and settling, drain) x 5-8 steps: 2 to 3 minutes at 640x360.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from drivepercept.bench.common import ResultHeader
from drivepercept.bench.served import (
    CLIPS,
    DEFAULT_WARMUP_S,
    STEP_HEADER,
    LiveStep,
    SyntheticCameras,
)
from drivepercept.errors import ConfigError
from drivepercept.geometry import MAX_CAMERAS
from drivepercept.models.base import Detector
from drivepercept.run.job import load_model
from drivepercept.run.options import RunOptions

MAX_DROP_SHARE = 0.01
MIN_RATE_SHARE = 0.95
DEFAULT_STEP_S = 10.0
DEFAULT_FPS = 30.0


@dataclass(frozen=True)
class Verdict:
    """The pass rule of one step (see the module docstring)."""

    budget_ms: float
    max_drop_share: float = MAX_DROP_SHARE
    min_rate_share: float = MIN_RATE_SHARE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_ms) and self.budget_ms > 0):
            raise ConfigError(f"budget must be > 0 ms, got {self.budget_ms:g}")

    def why_not(self, step: LiveStep) -> str:
        """'' when `step` passes, else what it missed."""
        if step.frames == 0:
            return "no results"
        misses = []
        if not step.p99_ms < self.budget_ms:
            misses.append(f"p99 {step.p99_ms:.0f} >= {self.budget_ms:g} ms")
        if step.drop_share > self.max_drop_share:
            misses.append(f"dropped {step.drop_share:.1%} > {self.max_drop_share:.0%}")
        if step.achieved_fps < self.min_rate_share * step.target_fps:
            misses.append(f"{step.achieved_fps:.1f} of {step.target_fps:g} frames/s")
        return ", ".join(misses)


HEADER = f"{'cameras':>9} {STEP_HEADER}"
LOAD_NOTE = "(GPU %: NVML utilization mean/max; CPU %: this process's mean, 100 = one core)"


@dataclass(frozen=True)
class CapacityStep:
    """One measured step of the search, and its verdict."""

    step: LiveStep
    passed: bool
    why_not: str = ""
    attempt: int = 1  # 2: the re-measure of a failed step

    def line(self) -> str:
        """One row under `HEADER`."""
        cameras = f"{self.step.cameras}{' again' if self.attempt > 1 else ''}"
        verdict = "pass" if self.passed else f"FAIL: {self.why_not}"
        share = self.step.detected_share  # below 1: a budget held by the scheduler
        detected = f"  ({share:.0%} detected)" if share < 1.0 else ""
        return f"{cameras:>9} {self.step.cells()}  {verdict}{detected}"

    def as_dict(self) -> dict[str, Any]:
        return {**self.step.as_dict(), "passed": self.passed, "attempt": self.attempt}


def search_capacity(
    measure: Callable[[int], LiveStep],
    verdict: Verdict,
    *,
    max_cameras: int = MAX_CAMERAS,
    on_step: Callable[[CapacityStep], None] | None = None,
) -> tuple[int, tuple[CapacityStep, ...]]:
    """The largest camera count in 1..`max_cameras` whose step passes (0 if none), by
    doubling then bisection, a failed step measured twice (see the module docstring).

    Returns:
        (the count, every measured step in order).
    """
    if max_cameras < 1:
        raise ConfigError(f"max cameras must be >= 1, got {max_cameras}")
    steps: list[CapacityStep] = []

    def passes(n: int) -> bool:
        for attempt in (1, 2):
            step = measure(n)
            why = verdict.why_not(step)
            steps.append(CapacityStep(step, not why, why, attempt))
            if on_step is not None:
                on_step(steps[-1])
            if not why:
                return True
        return False

    good, bad = 0, max_cameras + 1  # the largest known pass, the smallest known fail
    n = 1
    while True:
        if not passes(n):
            bad = n
            break
        good = n
        if n >= max_cameras:
            break
        n = min(2 * n, max_cameras)
    while bad - good > 1:
        mid = (good + bad) // 2
        if passes(mid):
            good = mid
        else:
            bad = mid
    return good, tuple(steps)


@dataclass(frozen=True)
class CapacityResult(ResultHeader):
    """`bench --mode capacity`: the answer, each step, and what was asked."""

    cameras: int
    steps: tuple[CapacityStep, ...]
    fps: float
    budget_ms: float
    size: tuple[int, int]
    step_s: float
    elapsed_s: float

    def table(self) -> str:
        w, h = self.size
        rows = [
            f"capacity: {w}x{h} cameras at {self.fps:g} fps, p99 < {self.budget_ms:g} ms, "
            f"<= {MAX_DROP_SHARE:.0%} dropped",
            self.describe(),
            *self.speed_lines(),
            HEADER,
            *(s.line() for s in self.steps),
            LOAD_NOTE,
            f"capacity: {self.cameras} camera(s) ({len(self.steps)} steps of "
            f"{self.step_s:g} s measured, {self.elapsed_s:.0f} s in all)",
        ]
        return "\n".join(rows)

    def as_dict(self) -> dict[str, Any]:
        w, h = self.size
        return {
            **super().as_dict(),
            "cameras": self.cameras,
            "fps_per_camera": self.fps,
            "budget_ms": self.budget_ms,
            "max_drop_share": MAX_DROP_SHARE,
            "size": f"{w}x{h}",
            "step_s": self.step_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "steps": [s.as_dict() for s in self.steps],
        }


def capacity(
    options: RunOptions,
    *,
    fps: float | None = None,
    size: tuple[int, int] = (640, 360),
    step_s: float | None = None,
    warmup_s: float = DEFAULT_WARMUP_S,
    max_cameras: int = MAX_CAMERAS,
    detector: Detector | None = None,
    on_step: Callable[[CapacityStep], None] | None = None,
) -> CapacityResult:
    """Find how many simulated live cameras of `size` at `fps` this machine serves within
    `options.report_budget_ms` (see the module docstring).

    Args:
        options: model and settings (its sources are not used: the cameras are rendered).
        fps, size: each camera's frame rate (None: `DEFAULT_FPS`) and frame size.
        step_s: the measured window of each step (None: `DEFAULT_STEP_S`).
        warmup_s: settling time before each window.
        max_cameras: the most cameras tried.
        detector: an already-built detector (else `options.model` is loaded, once).
        on_step: called with each step as it is measured (the CLI prints it).

    Raises:
        ConfigError: a bad fps, size, budget or step duration.
    """
    started = time.monotonic()
    cameras = SyntheticCameras(fps or DEFAULT_FPS, size, step_s or DEFAULT_STEP_S, warmup_s)
    verdict = Verdict(options.report_budget_ms)
    detector = detector or load_model(options)
    with cameras.rendered(CLIPS, detector) as measure:
        found, steps = search_capacity(
            lambda n: measure(options, n), verdict, max_cameras=max_cameras, on_step=on_step
        )
    # after the runs: torch's threads as the engine left them
    return CapacityResult.measured(
        detector,
        options.pipeline(),
        cameras=found,
        steps=steps,
        fps=cameras.fps,
        budget_ms=verdict.budget_ms,
        size=cameras.size,
        step_s=cameras.duration_s,
        elapsed_s=time.monotonic() - started,
    )
