"""What a replay's options cost: the same rig replayed in variants, interleaved, in one run.

    python3 scripts/bench_replay_variants.py --rounds 6

Variants (each a whole replay of the bundled sample rig, 6 cameras x 120 frames at 640x360,
with `drivepercept-tiny` on the default runtime, no report):

* `mp4`: the rig's six MP4 files (the baseline);
* `mcap`: the same rig as one MCAP recording (`simulate --format mcap` of the sample's seed:
  the same frames as JPEG `CompressedImage` messages), read topic by topic (issue 28: within
  10 % of the MP4 rig);
* `mp4 --track`: the MP4 rig with per-camera tracking and the rig's fusion on (issue 29:
  under 5 % of replay frames/s).

Rounds interleave the variants (absolute timings drift 20-30 % on a shared machine; the
ratios within a round do not), in an order that rotates from round to round (a run's place
in its round biases it), and the printed table gives each round's frames/s and each
variant's ratio to the baseline of its round, then the median ratio. Nothing is downloaded;
the MCAP rig is simulated once into a temporary folder.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_videos" / "rig.toml"


def _simulate_mcap(folder: Path) -> Path:
    """The sample rig as an MCAP (its [simulation] table: seed 42, 8 s, 15 fps, 640x360)."""
    cmd = [sys.executable, "-m", "drivepercept", "simulate", "--seed", "42", "--seconds", "8"]
    cmd += ["--fps", "15", "--cameras", "6", "--size", "640x360", "--format", "mcap"]
    subprocess.run([*cmd, "--out", str(folder)], check=True, capture_output=True)
    return folder / "drive.mcap"


def _replay(source: Path, out: Path, *, track: bool, threads: int) -> tuple[float, int]:
    """(frames/s of the run's own statistics, frames) of one replay, in this process."""
    from drivepercept.run import RunOptions, run

    settings = {"sample_hz": 0.0, "torch_threads": threads} if threads else {"sample_hz": 0.0}
    options = RunOptions(
        sources=(str(source),),
        model="drivepercept-tiny",
        out_root=out,
        report_formats=(),
        settings=settings,
        track=track,
    )
    result = run(options)
    return result.stats.throughput_fps, sum(c.frames for c in result.stats.cameras)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 3 (rotation)")
    parser.add_argument("--threads", type=int, default=0, help="torch/ORT threads (0: cores)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        mcap = _simulate_mcap(root / "mcap")
        print(f"sample rig simulated as MCAP in {time.perf_counter() - started:.1f} s: {mcap}")
        variants = {"mp4": (SAMPLE, False), "mcap": (mcap, False), "mp4 --track": (SAMPLE, True)}
        _replay(SAMPLE, root / "warm", track=True, threads=args.threads)  # caches, imports
        fps: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for k in range(args.rounds):
            line = []
            # each round starts one variant later: a run's place in its round biases it (the
            # last runs of a round measured up to 6 % faster than the first here), so every
            # variant takes every place equally often over a multiple of len(variants) rounds
            for name in names[k % len(names) :] + names[: k % len(names)]:
                source, track = variants[name]
                rate, frames = _replay(source, root / f"r{k}", track=track, threads=args.threads)
                fps[name].append(rate)
                line.append(f"{name} {rate:.1f} ({frames} frames)")
            print(f"round {k + 1}: " + ", ".join(line), flush=True)
    print()
    print(f"{'variant':<14} {'frames/s by round':<30} {'ratio to mp4 by round':<28} median")
    for name, rates in fps.items():
        ratios = [r / b for r, b in zip(rates, fps["mp4"], strict=True)]
        print(
            f"{name:<14} {', '.join(f'{r:.1f}' for r in rates):<30} "
            f"{', '.join(f'{x:.3f}' for x in ratios):<28} {statistics.median(ratios):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
