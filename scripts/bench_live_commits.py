"""Live mode of two checkouts against the same served cameras, interleaved: did a change make
live faster?

Both checkouts run `drivepercept live` in a child process of their own over the same MJPEG
cameras (the clips of --videos, cycled to --streams cameras, served at --fps by this checkout's
camera server in this process), with bench_peer's YOLOv8n-size network (Ultralytics'
`yolov8n.yaml`, norms settled and class biases calibrated on the clips, pickled once and loaded
by both through the `_bench_peer.plugin` model plugin), rounds interleaved (old, new, old, new,
...) so that drift in machine load hits both alike. Printed: every round (processed frames/s,
p50 and p99 end-to-end latency, the first batch left out as in bench_peer), then each side's
median and the new / old ratios.

Ultralytics must import in the interpreter (it builds the network and unpickles it), so run it
from the peer's virtual environment (docs/BENCHMARKS.md, "Peer comparison"):

    git worktree add /tmp/before <commit>
    PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_live_commits.py /tmp/before \\
        --rounds 3 --duration 30 --json live-commits.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

from _bench_peer.stats import percentile_ms, timeline_figures  # noqa: E402

from drivepercept.report import load_run  # noqa: E402

log = logging.getLogger("bench_live_commits")

# The children's environment, taken before Ultralytics is imported: importing it sets
# OMP_NUM_THREADS=1 (and more) in os.environ, which would hold every child to one thread.
BASE_ENV = dict(os.environ)

# bench_peer's post-processing: Ultralytics' defaults
POSTPROCESS = {"score_threshold": 0.25, "iou_threshold": 0.7, "max_detections": 100}


@dataclass(frozen=True)
class Round:
    side: str  # "old" or "new"
    round: int
    frames: int
    fps: float
    p50_ms: float
    p99_ms: float
    wall_s: float


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path, help="the checkout to compare against (a git worktree)")
    p.add_argument("--new", type=Path, default=ROOT, help="the other checkout (default: this)")
    p.add_argument(
        "--also",
        type=Path,
        action="append",
        default=[],
        help="a further checkout, measured in the same rounds (repeatable)",
    )
    p.add_argument("--videos", type=Path, default=ROOT.parent / "shared" / "realvideos")
    p.add_argument("--streams", type=int, default=6)
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of capture a round")
    p.add_argument(
        "--server-warmup-s",
        type=float,
        default=20.0,
        help="let the server make its first pass of each clip before round 1",
    )
    p.add_argument("--json", type=Path, help="write the rounds and medians here")
    return p


def build_weights(clips: list[Path], imgsz: int, path: Path) -> dict[str, float]:
    """bench_peer's network, settled and calibrated on the clips, saved for the plugin."""
    from _bench_peer import plugin
    from _bench_peer.network import _Ultralytics, calibrated_network

    yolo, detector, calibration = calibrated_network(
        _Ultralytics(), clips, imgsz, conf=POSTPROCESS["score_threshold"], candidates=30
    )
    plugin.save(path, yolo.model, detector.class_names, imgsz)
    return calibration


def live_round(
    side: str,
    checkout: Path,
    number: int,
    urls: list[str],
    weights: Path,
    work: Path,
    duration_s: float,
) -> Round:
    config = work / "live.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in POSTPROCESS.items()) + 'device = "cpu"\n')
    name = f"{side}-{number}"
    argv = [
        sys.executable,
        "-m",
        "drivepercept",
        "live",
        *[f"cam{i}={u}" for i, u in enumerate(urls)],
        "--config",
        str(config),
        "--model",
        "_bench_peer.plugin:yolov8n",
        "--weights",
        str(weights),
        "--duration",
        str(duration_s),
        "--out",
        str(work / "runs"),
        "--name",
        name,
        "--no-progress",
        "--no-report",
    ]
    env = {**BASE_ENV, "PYTHONPATH": os.pathsep.join([str(checkout), str(SCRIPTS)])}
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=checkout, capture_output=True, text=True)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{side} round {number} exited {done.returncode}: "
            f"{done.stderr.strip().splitlines()[-1:]}"
        )
    figures = timeline_figures(load_run(work / "runs" / name).timeline)
    later = figures.later_ms
    return Round(
        side,
        number,
        figures.frames,
        figures.fps,
        percentile_ms(later, 50),
        percentile_ms(later, 99),
        wall_s,
    )


def which_drivepercept(checkout: Path) -> str:
    """The package a child of `checkout` imports (PYTHONPATH must win over the install)."""
    env = {**BASE_ENV, "PYTHONPATH": str(checkout)}
    code = "import drivepercept, pathlib; print(pathlib.Path(drivepercept.__file__).parent)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=checkout, capture_output=True, text=True
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from _bench_peer.streams import clip_paths

    from drivepercept.sim.serve import CameraServer

    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    checkouts.update({f"also{i}": c.resolve() for i, c in enumerate(args.also, 1)})
    for side, checkout in checkouts.items():
        found = which_drivepercept(checkout)
        if Path(found) != checkout / "drivepercept":
            print(
                f"error: the {side} child imports drivepercept from {found!r}, "
                f"expected {checkout / 'drivepercept'}",
                file=sys.stderr,
            )
            return 2
    clips = clip_paths(args.videos, args.streams)
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="bench-live-commits-") as tmp:
        work = Path(tmp)
        weights = work / "yolov8n-bench.pt"
        calibration = build_weights(clips, args.imgsz, weights)
        log.info("network calibrated: %s", calibration)
        cameras = [(f"cam{i}", p) for i, p in enumerate(clips)]
        with CameraServer(cameras, fps=args.fps) as server:
            urls = [server.url(name) for name, _ in cameras]
            time.sleep(args.server_warmup_s)
            for number in range(1, args.rounds + 1):
                for side, checkout in checkouts.items():
                    log.info("round %d: %s (load %.1f)", number, side, os.getloadavg()[0])
                    result = live_round(side, checkout, number, urls, weights, work, args.duration)
                    log.info("  -> %s", result)
                    rounds.append(result)
    medians = {
        side: {
            key: statistics.median(getattr(r, key) for r in rounds if r.side == side)
            for key in ("fps", "p50_ms", "p99_ms")
        }
        for side in checkouts
    }
    print(f"{'side':<5} {'round':>5} {'frames':>7} {'fps':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for r in rounds:
        print(
            f"{r.side:<5} {r.round:>5} {r.frames:>7} {r.fps:>7.1f} {r.p50_ms:>8.0f} "
            f"{r.p99_ms:>8.0f}"
        )
    old = medians["old"]
    for side, m in medians.items():
        print(
            f"median {side} ({checkouts[side]}): {m['fps']:.1f} fps, p50 {m['p50_ms']:.0f} ms, "
            f"p99 {m['p99_ms']:.0f} ms"
        )
    for side, m in medians.items():
        if side != "old":
            print(
                f"{side} / old: fps {m['fps'] / old['fps']:.2f}x, "
                f"p50 {m['p50_ms'] / old['p50_ms']:.2f}x, p99 {m['p99_ms'] / old['p99_ms']:.2f}x"
            )
    if args.json:
        record: dict[str, Any] = {
            "checkouts": {k: str(v) for k, v in checkouts.items()},
            "streams": [str(p) for p in clips],
            "fps": args.fps,
            "imgsz": args.imgsz,
            "duration_s": args.duration,
            "calibration": calibration,
            "rounds": [asdict(r) for r in rounds],
            "medians": medians,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
