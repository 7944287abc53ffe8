"""The tracking stage's CPU inside a replay, against the same stage alone over the same frames.

Runs a replay with `--track` (default: the bundled sample rig and model), keeping each batch
as the stage received it (pixels included: a 20 s six-camera drive at 640x360 holds about
1.2 GB), and reads the stage's own figures from the run's record (run.json's
`tracking.cpu_ms_per_frame`, the thread CPU in the stage, and `ms_per_frame`, the wall clock
in it). Then it tracks the kept batches again, in the same process and order, with a new
stage of the run's settings (each rig step's objects serialised as objects.jsonl would have
them), --rounds times, and prints the thread CPU a frame of each. Their ratio is what
running among the pipeline's threads costs the stage (docs/OBJECTS.md, "What it costs":
1.6-2 on the 2-core host).

    python scripts/bench_stage_cpu.py                         # sample rig
    python scripts/bench_stage_cpu.py /tmp/drive/rig.toml --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from drivepercept.run import RunOptions, run
from drivepercept.sinks.objects import step_record
from drivepercept.tracking.stage import REPLAY_HOLD_S, RigTracker
from drivepercept.types import FrameResult
from drivepercept.types.objects import RigStep

ROOT = Path(__file__).resolve().parents[1]


def _serialise(step: RigStep) -> None:
    json.dumps(step_record(step), separators=(",", ":"), allow_nan=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rig", nargs="?", default=str(ROOT / "sample_videos" / "rig.toml"))
    parser.add_argument("--model", default="drivepercept-tiny")
    parser.add_argument("--rounds", type=int, default=3, help="re-trackings of the kept frames")
    parser.add_argument("--max-frames", type=int, default=0, help="per camera, 0 = all")
    args = parser.parse_args()

    kept: list[list[FrameResult]] = []
    call = RigTracker.__call__

    def keeping(self: RigTracker, results: list[FrameResult]) -> list[FrameResult]:
        kept.append(list(results))
        return call(self, results)

    RigTracker.__call__ = keeping  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            options = RunOptions(
                sources=(args.rig,),
                model=args.model,
                settings={"max_frames": args.max_frames, "sample_hz": 0.0},
                out_root=Path(tmp),
                report_formats=(),
                track=True,
            )
            result = run(options)
    finally:
        RigTracker.__call__ = call  # type: ignore[method-assign]
    tracking = result.record.tracking
    if tracking is None or tracking.cpu_ms_per_frame is None or tracking.ms_per_frame is None:
        print(f"the run tracked no frame: {result.error or 'no tracking record'}")
        return 1
    frames = sum(len(batch) for batch in kept)
    inside = tracking.cpu_ms_per_frame
    print(
        f"inside the replay: {frames} frames, {result.stats.throughput_fps:.1f} frames/s; the "
        f"stage {inside:.3f} ms of CPU a frame ({tracking.ms_per_frame:.3f} ms wall)"
    )
    alone = []
    for r in range(args.rounds):  # (the rig's cameras as the run read them)
        stage = RigTracker(result.cameras, hold_s=REPLAY_HOLD_S, on_step=_serialise)
        started = time.thread_time_ns()
        for batch in kept:
            stage(batch)
        stage.flush()
        alone.append((time.thread_time_ns() - started) / 1e6 / frames)
        print(f"alone, round {r + 1}: {alone[-1]:.3f} ms of CPU a frame")
    median = statistics.median(alone)
    print(f"inside / alone: {inside / median:.2f}x ({inside:.3f} / {median:.3f} ms a frame)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
