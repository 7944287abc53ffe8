"""How the CPU's cores should be shared: model-only and replay-pipeline frames/s per layout.

A layout is torch's intra-op thread count and how its OpenMP threads wait at the end of a
parallel region (see drivepercept/_threads.py):

    spin, all cores       torch imported before drivepercept: libgomp's default wait
    passive, all cores    what drivepercept sets up (OMP_WAIT_POLICY=PASSIVE)
    spin 10k, all cores   a short spin (GOMP_SPINCOUNT=10000), then sleep
    spin, 1 thread
    passive, 1 thread

Each layout runs in its own process (libgomp reads its settings once, when torch loads), the
rounds interleaved (layout a, b, c, d, a, b, ...) so that drift in machine load hits all
alike, and each process measures `bench`'s model-only and pipeline modes once on the same
sources. Printed: every round, then each layout's median frames/s, the pipeline's share of
the model-only ceiling, and the model-only figure relative to the first layout.

    python scripts/bench_cpu_layout.py                                  # sample rig
    python scripts/bench_cpu_layout.py cam0.mp4 cam1.mp4 --model yolox-nano --weights x.onnx \\
        --frames 221 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Layout:
    name: str
    spin: bool  # libgomp's default wait (torch loaded first), else PASSIVE
    threads: int  # 0: torch's default, one per core
    spin_count: int | None = None  # GOMP_SPINCOUNT: how long a waiting thread spins


LAYOUTS = (
    Layout("spin, all cores", True, 0),
    Layout("passive, all cores", False, 0),
    Layout("spin 10k, all cores", True, 0, 10_000),
    Layout("spin, 1 thread", True, 1),
    Layout("passive, 1 thread", False, 1),
)

# The child: torch first (so drivepercept leaves libgomp's default) or drivepercept first.
CHILD = """
import json, sys
if {spin!r}:
    import torch
import drivepercept
from drivepercept._threads import wait_policy
from drivepercept.run import RunOptions
from drivepercept.bench.compare import bench
options = RunOptions(sources=tuple({sources!r}), model={model!r}, weights={weights!r},
                     settings={{"device": "cpu", "torch_threads": {threads!r}}})
result = bench(options, frames_per_camera={frames!r}, rounds=1, modes=("model-only", "pipeline"))
import torch
print(json.dumps({{"policy": wait_policy(), "threads": torch.get_num_threads(),
                  **{{line.mode: line.fps for line in result.lines}}}}))
"""


def measure(layout: Layout, args: argparse.Namespace) -> dict[str, float | str]:
    """One process, one round of model-only and pipeline under `layout`."""
    code = CHILD.format(
        spin=layout.spin,
        sources=args.sources,
        model=args.model,
        weights=args.weights,
        threads=layout.threads,
        frames=args.frames,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if layout.spin_count is not None:
        env["GOMP_SPINCOUNT"] = str(layout.spin_count)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench_cpu_layout: layout {layout.name!r} failed: {tail}")
    figures: dict[str, float | str] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", default=[str(ROOT / "sample_videos" / "rig.toml")])
    parser.add_argument("--model", default=None, help="(default: the rig's)")
    parser.add_argument("--weights", default=None)
    parser.add_argument("--frames", type=int, default=60, help="frames per camera")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.frames < 1 or args.rounds < 1:
        parser.error("--frames and --rounds must be >= 1")

    fps: dict[str, dict[str, list[float]]] = {
        x.name: {"model-only": [], "pipeline": []} for x in LAYOUTS
    }
    for number in range(1, args.rounds + 1):
        for layout in LAYOUTS:
            got = measure(layout, args)
            for mode in ("model-only", "pipeline"):
                fps[layout.name][mode].append(float(got[mode]))
            print(
                f"round {number} {layout.name:<20} (OMP_WAIT_POLICY {got['policy']}, "
                f"{got['threads']} threads): model-only {float(got['model-only']):6.1f}, "
                f"pipeline {float(got['pipeline']):6.1f} frames/s",
                flush=True,
            )
    print(f"\nmedian of {args.rounds} rounds, frames/s:")
    header = ("layout", "model-only", "pipeline", "pipe/model", "model vs 1st")
    print(f"{header[0]:<20} {header[1]:>10} {header[2]:>9} {header[3]:>10} {header[4]:>12}")
    first = statistics.median(fps[LAYOUTS[0].name]["model-only"])
    for layout in LAYOUTS:
        model = statistics.median(fps[layout.name]["model-only"])
        pipe = statistics.median(fps[layout.name]["pipeline"])
        print(
            f"{layout.name:<20} {model:>10.1f} {pipe:>9.1f} {pipe / model:>9.2f}x "
            f"{model / first:>11.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
