"""Rendering speed of the synthetic rig on one core.

Prints camera frames per second (and the real-time factor against a 15 fps camera) for the
default six-camera rig at 640x360 and 1280x720. Rendering only: no encoding, no disk.

    python scripts/bench_render.py [--frames 60] [--repeats 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2

from drivepercept.sim.camera import CameraModel, default_rig_cameras
from drivepercept.sim.render import Renderer
from drivepercept.sim.world import generate_world


def bench(width: int, height: int, *, frames: int, repeats: int, seed: int) -> list[float]:
    """Camera frames per second of each repeat."""
    cams = [CameraModel.from_config(c) for c in default_rig_cameras(6, width=width, height=height)]
    world = generate_world(seed, duration_s=frames / 15.0 + 1.0)
    renderer = Renderer(world, cams)
    renderer.render(0.0)  # warm-up: noise bank, caches
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for k in range(frames):
            renderer.render(k / 15.0, frame_index=k)
        rates.append(frames * len(cams) / (time.perf_counter() - start))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=60, help="rig frames per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cv2.setNumThreads(1)  # one core: OpenCV's blur would otherwise use a thread pool
    print("size        camera-frames/s (median, best)   x real time @15 fps   rig frames/s")
    for width, height in ((640, 360), (1280, 720)):
        rates = bench(width, height, frames=args.frames, repeats=args.repeats, seed=args.seed)
        med, best = statistics.median(rates), max(rates)
        print(
            f"{width}x{height:<6} {med:10.1f} {best:10.1f}            {med / 15.0:8.1f}x"
            f"            {med / 6:8.1f}"
        )


if __name__ == "__main__":
    main()
