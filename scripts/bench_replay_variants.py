"""What a replay's options cost: the same rig replayed in variants, interleaved, in one run.

    python3 scripts/bench_replay_variants.py --rounds 6
    python3 scripts/bench_replay_variants.py --rounds 18 --variants mp4,track
    python3 scripts/bench_replay_variants.py --rig DRIVE/rig.toml --variants track --rounds 6

Variants (each a whole replay of the bundled sample rig, 6 cameras x 120 frames at 640x360,
or of `--rig`, with `drivepercept-tiny` on the default runtime, no report):

* `mp4`: the rig's six MP4 files (the baseline);
* `mcap`: the same rig as one MCAP recording (`simulate --format mcap` of the sample's seed:
  the same frames as JPEG `CompressedImage` messages), read topic by topic (issue 28: within
  10 % of the MP4 rig);
* `mp4 --track`: the MP4 rig with per-camera tracking and the rig's fusion on (issue 29:
  under 5 % of replay frames/s).

Each run is measured twice: its frames/s (the run's own statistics, first frame to last) and
the process's CPU time per frame (user + system, over the whole `run()` call, so its start-up
is in it: model load and session set-up, the same in every variant). On a machine whose cores
are busy all run long (as here), frames/s go as the inverse of CPU per frame, and CPU time
drifts less than wall time when other tenants share the host.

Rounds interleave the variants (absolute timings drift 20-30 % on a shared machine; the
ratios within a round do not), in an order that rotates from round to round (a run's place
in its round biases it), and the printed table gives each round's frames/s and each
variant's ratio to the baseline of its round, then the median ratio. Nothing is downloaded;
the MCAP rig is simulated once into a temporary folder.
"""

from __future__ import annotations

import argparse
import resource
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


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _replay(source: Path, out: Path, *, track: bool, threads: int) -> tuple[float, float, int]:
    """(frames/s of the run's own statistics, process CPU ms per frame, frames) of one
    replay, in this process."""
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
    cpu = _cpu_s()
    result = run(options)
    cpu = _cpu_s() - cpu
    frames = sum(c.frames for c in result.stats.cameras)
    return result.stats.throughput_fps, 1000.0 * cpu / max(frames, 1), frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 3 (rotation)")
    parser.add_argument("--threads", type=int, default=0, help="torch/ORT threads (0: cores)")
    parser.add_argument(
        "--rig",
        type=Path,
        default=SAMPLE,
        help="the rig replayed (default: the bundled sample; issue 44's --track cost is "
        "measured on a 20 s six-camera `simulate --preset crossing` drive)",
    )
    parser.add_argument(
        "--variants",
        default="mp4,mcap,track",
        help="which to run, comma-separated, of mp4 (always), mcap, track",
    )
    args = parser.parse_args(argv)
    chosen = {"mp4", *(v.strip() for v in args.variants.split(",") if v.strip())}
    if not chosen <= {"mp4", "mcap", "track"}:
        parser.error(f"--variants: unknown {sorted(chosen - {'mp4', 'mcap', 'track'})}")
    if "mcap" in chosen and args.rig != SAMPLE:
        parser.error("--variants mcap: the MCAP is the sample rig's; drop it with --rig")
    rig = args.rig
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        variants = {"mp4": (rig, False)}
        if "mcap" in chosen:
            mcap = _simulate_mcap(root / "mcap")
            print(f"sample rig as MCAP, simulated in {time.perf_counter() - started:.1f} s")
            variants["mcap"] = (mcap, False)
        if "track" in chosen:
            variants["mp4 --track"] = (rig, True)
        _replay(rig, root / "warm", track=True, threads=args.threads)  # caches, imports
        fps: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for k in range(args.rounds):
            line = []
            # each round starts one variant later: a run's place in its round biases it (the
            # last runs of a round measured up to 6 % faster than the first here), so every
            # variant takes every place equally often over a multiple of len(variants) rounds
            for name in names[k % len(names) :] + names[: k % len(names)]:
                source, track = variants[name]
                rate, ms, frames = _replay(
                    source, root / f"r{k}", track=track, threads=args.threads
                )
                fps[name].append(rate)
                cpu[name].append(ms)
                line.append(f"{name} {rate:.1f}/s {ms:.2f} ms CPU ({frames} frames)")
            print(f"round {k + 1}: " + ", ".join(line), flush=True)
    print()
    print("frames/s, and each round's ratio to its mp4 run (higher is faster):")
    _table(fps)
    print("process CPU ms per frame, start-up included, and its ratio (lower is cheaper):")
    _table(cpu)
    return 0


def _table(values: dict[str, list[float]]) -> None:
    for name, series in values.items():
        ratios = [v / b for v, b in zip(series, values["mp4"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"  {name:<12} median {statistics.median(series):7.2f}  ratio median "
            f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
            f"range {min(ratios):.3f}-{max(ratios):.3f}), ratio of means "
            f"{statistics.mean(series) / statistics.mean(values['mp4']):.3f}"
        )
        print(f"  {'':<12} by round: " + ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    raise SystemExit(main())
