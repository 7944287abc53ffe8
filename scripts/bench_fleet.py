#!/usr/bin/env python3
"""Fleet scaling on this machine: the same drives replayed one after another in one process
(the baseline: no Ray), by a fleet of 1 worker with every CPU, and by a fleet of one worker per
CPU. Interleaved rounds; prints frames/s, the ratios, and Ray's overhead per drive (fleet wall
time minus the baseline's, over the drives), and writes JSON with --json.

    python3 scripts/bench_fleet.py --drives 6 --cameras 6 --seconds 4 --rounds 2 --json f.json

The drives are simulated (different seeds) with the bundled model their rig names, their
labels removed (the fleet scores labelled drives; the baseline does not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivepercept.fleet import FleetOptions, run_fleet
from drivepercept.run import RunOptions, run
from drivepercept.run.job import load_model
from drivepercept.sim.clip import simulate_clip
from drivepercept.sim.config import SimulationConfig


def _baseline(drives: list[Path], out: Path) -> dict[str, Any]:
    """Each drive replayed in turn in this process, the detector built once (as a worker)."""
    t0 = time.monotonic()
    first = RunOptions(sources=(str(drives[0] / "rig.toml"),), report_formats=("json",))
    detector = load_model(first)
    frames = 0
    for i, d in enumerate(drives):
        options = RunOptions(
            sources=(str(d / "rig.toml"),), out_root=out, name=f"d{i}", report_formats=("json",)
        )
        frames += run(options, detector=detector).stats.frames
    return {"wall_s": time.monotonic() - t0, "frames": frames}


def _fleet(drives: list[Path], out: Path, workers: int, cpus: float) -> dict[str, Any]:
    t0 = time.monotonic()
    options = FleetOptions(
        drives=tuple(str(d) for d in drives),
        out=out,
        run={"report_formats": ("json",)},
        workers=workers,
        cpus_per_worker=cpus,
    )
    result = run_fleet(options)
    wall = time.monotonic() - t0
    totals = result.record["totals"]
    assert totals["complete"] == len(drives), result.failure()
    per_drive = [d["wall_s"] - d["elapsed_s"] for d in result.record["drives"]]
    return {
        "wall_s": wall,  # Ray's start and the workers' model loading included
        "frames": totals["frames"],
        "worker_overhead_s": statistics.median(per_drive),  # per drive, inside the worker
        "utilization": [w["utilization"] for w in result.record["per_worker"]],
        "latency_ms": totals["latency_ms"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drives", type=int, default=6)
    ap.add_argument("--cameras", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cpus = os.cpu_count() or 1
    width, height = (int(v) for v in args.size.split("x"))
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    drives = []
    for i in range(args.drives):
        config = SimulationConfig(
            out_dir=root / f"drive{i}",
            cameras=args.cameras,
            seconds=args.seconds,
            fps=15.0,
            width=width,
            height=height,
            seed=1000 + i,
        )
        simulate_clip(config)
        # unlabelled: the fleet would score labelled drives, which the baseline does not
        (config.out_dir / "ground_truth.json").unlink()
        drives.append(config.out_dir)
    layouts: dict[str, Callable[[Path], dict[str, Any]]] = {
        "baseline (one process, no Ray)": lambda out: _baseline(drives, out),
        f"fleet, 1 worker x {cpus} CPUs": lambda out: _fleet(drives, out, 1, float(cpus)),
        f"fleet, {cpus} workers x 1 CPU": lambda out: _fleet(drives, out, cpus, 1.0),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
    for r in range(args.rounds):
        for name, layout in layouts.items():
            results[name].append(layout(root / f"out-{r}-{list(layouts).index(name)}"))
    base = statistics.median(x["frames"] / x["wall_s"] for x in results[next(iter(layouts))])
    base_wall = statistics.median(x["wall_s"] for x in results[next(iter(layouts))])
    print(
        f"{args.drives} drives x {args.cameras} cameras x {args.seconds:g} s at 15 fps, {args.size}"
    )
    print(f"{'layout':<34} {'frames/s (each round)':<24} {'x base':>6} {'Ray s/drive':>11}")
    summary = {}
    for name, runs in results.items():
        fps = [x["frames"] / x["wall_s"] for x in runs]
        med = statistics.median(fps)
        over = (statistics.median(x["wall_s"] for x in runs) - base_wall) / args.drives
        rounds = " / ".join(f"{v:.1f}" for v in fps)
        print(f"{name:<34} {rounds:<24} {med / base:>6.2f} {over:>11.2f}")
        summary[name] = {"runs": runs, "median_fps": med, "ratio": med / base, "overhead_s": over}
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, **summary}, indent=2, default=str
            )
        )


if __name__ == "__main__":
    main()
