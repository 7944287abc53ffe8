"""What the load sampler costs: replay throughput with the `gpu-monitor` thread on vs off.

Runs the same replay (default: the bundled sample rig and model) alternately with the sampler
at --hz and with no sampler, --rounds times each, interleaved so that drift in machine load
hits both alike, and prints every round, the median of each mode and their ratio.

    python scripts/bench_sampler.py                       # sample rig, 10 Hz, 3 rounds
    python scripts/bench_sampler.py --hz 50 --rounds 5 --max-frames 60 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from drivepercept.models import load_detector
from drivepercept.run import RunOptions, run

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default=str(ROOT / "sample_videos" / "rig.toml"))
    parser.add_argument("--model", default="drivepercept-tiny")
    parser.add_argument("--weights", default="DEFAULT")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--hz", type=float, default=10.0, help="sampler rate when on")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-frames", type=int, default=0, help="per camera, 0 = all")
    args = parser.parse_args()

    detector = load_detector(args.model, weights=args.weights)
    base = {"device": args.device, "max_frames": args.max_frames}
    fps: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                options = RunOptions(
                    sources=(args.source,),
                    model=args.model,
                    weights=args.weights,
                    settings={**base, "sample_hz": args.hz if mode == "on" else 0.0},
                    out_root=Path(tmp),
                    name=f"{mode}-{r}",
                    report_formats=(),
                )
                result = run(options, detector=detector)
                fps[mode].append(result.stats.throughput_fps)
                print(
                    f"round {r + 1} sampler {mode:<3} {result.stats.frames} frames "
                    f"{result.stats.elapsed_s:6.2f} s {result.stats.throughput_fps:6.1f} frames/s"
                )
    on, off = statistics.median(fps["on"]), statistics.median(fps["off"])
    print(f"median: sampler on ({args.hz:g} Hz) {on:.1f} frames/s, off {off:.1f} frames/s")
    print(f"on / off: {on / off:.3f}x ({100 * (on / off - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
