"""Tracker benchmark: our tracker against open-source trackers on the same detections, scored
by the same scorer.

Given a simulated drive (`drivepercept simulate --out DRIVE ...`: its videos, rig.toml and
ground_truth.json with world track ids) and runs of it made with tracking
(`drivepercept eval DRIVE --model drivepercept-tiny --track --out RUNS --name N`), each run's
detections.jsonl is tracked again by every tracker and scored with
`drivepercept.eval.tracking.score_tracking`, exactly as `eval --track` scores the run:

* ours: the run's own `track_ids` and `global_ids`, as they are.
* ours, CameraTracker re-run: our per-camera tracker (`CameraTracker`, today's default
  `TrackParams`) run here on the run's boxes, each camera alone: timed like the peers, and
  a check that today's code gives the run's ids (the run does not record its settings).
* ours re-tracked (--retrack): `retrack(rig.toml, lines, spread_frames=0)` of
  `drivepercept.run.retrack`, the run's boxes through the whole tracking stage again, global
  ids included; each frame's pixels read again from the drive's videos
  (`RecordedFrames`: the boxes' looks, as the run read them) where it has them all, else
  motion alone (a note says which); timed by the stage's own clock (`Retracked.stage_ns`:
  the looks' reading in it, the videos' decoding not).
* the peers, on the same boxes: each camera alone, frames in frame_index order, every box of
  the line (all scores, before any tracking) handed to Roboflow `trackers` (SORT, ByteTrack,
  OC-SORT, BoT-SORT, C-BIoU; Apache-2.0) and supervision's `sv.ByteTrack` as
  `sv.Detections` (boxes, scores, class ids, the box's index in `data`). A peer's ids are
  given back to the input boxes by that index where its output keeps `data`, else by IoU >=
  0.99; boxes it did not output get -1. They get no global ids (the rig's figures are ours
  only). Settings (--peer-settings): "matched" (default): the drive's frame rate, and each
  threshold that means what one of ours means set to ours (`TrackParams`: high and new-track
  scores, association IoUs, confirmation hits, the lost-track time); "defaults": their
  documented defaults but the frame rate; "both". The output lists what each was given.

The peers are benchmark-only dependencies, never drivepercept's: they live in their own
virtual environment outside the repository, which reuses the system numpy, scipy, OpenCV
and drivepercept's dependencies. supervision 0.31 removed `sv.ByteTrack` (deprecated since
0.28), so the venv keeps supervision below 0.31 (`trackers` needs >= 0.26.1):

    python3 -m venv --system-site-packages /work/trackers-venv
    /work/trackers-venv/bin/pip install trackers 'supervision<0.31'
    PYTHONPATH=. /work/trackers-venv/bin/python scripts/bench_trackers.py DRIVE RUNS/N \\
        [RUNS/M ...] [--retrack] [--json OUT.json]

Without the venv, `--peers none` runs ours alone.

Scored, per tracker: TrackEval's HOTA, IDF1, MOTA and ID switches, cameras pooled and per
camera (the rig's figures for trackers with global ids); and the identity measures of
`_bench_trackers.measures`, on CLEAR's own matching: ids per world object, the switches split
into restarts (a new id born that frame; how many after a gap of at most --short-gap-s since
the object was last matched) and take-overs (an existing id), the ids beyond each object's
first by what came before each (after a gap of at most --short-gap-s, of at most 3 s,
longer, or while an earlier id was still matched to the object; and how many were matched
to another object too), and world objects some detector box matched but no tracked box
ever did (any score / at least our high score).
Time: each tracker's update per camera frame, mean and median (ours in the run: not timed
here; its stage's cost is in the run's telemetry).

Exit status: 0 done, 1 an input could not be read or a tracker failed, 2 a peer asked for is
not importable (use the venv above or --peers none).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _bench_trackers.inputs import Drive, Run, read_drive, read_run
from _bench_trackers.report import (
    Row,
    camera_table,
    extra_lines,
    main_table,
    rig_line,
    row_json,
    score,
    settings_lines,
)
from _bench_trackers.runs import (
    PEER_KEYS,
    Tracked,
    iter_specs,
    peer_available,
    peer_version,
    run_ours,
    run_peer,
    run_retrack,
)

from drivepercept.errors import DrivePerceptError
from drivepercept.finite import finite
from drivepercept.tracking.bytetrack import TrackParams

MISSING_PEER = (
    "bench_trackers: {why} with {python}; run this script with the peer venv: python3 -m venv "
    "--system-site-packages /work/trackers-venv && /work/trackers-venv/bin/pip install trackers "
    "'supervision<0.31', then PYTHONPATH=. /work/trackers-venv/bin/python "
    "scripts/bench_trackers.py (or pass --peers none)"
)

EPILOG = """examples:
  PYTHONPATH=. /work/trackers-venv/bin/python scripts/bench_trackers.py /work/dev/c7 \\
      /work/dev/runs/c7base --retrack --json bench.json
  python3 scripts/bench_trackers.py DRIVE RUN --peers none
  ... --peers bytetrack,sv-bytetrack --peer-settings both
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_trackers.py",
        description="Our tracker against open-source trackers on a run's boxes, one scorer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("drive", type=Path, help="the simulated drive (folder or rig.toml)")
    parser.add_argument("runs", type=Path, nargs="+", help="run folders of it (eval --track)")
    parser.add_argument(
        "--peers",
        default="all",
        help=f"comma-separated peers of {', '.join(PEER_KEYS)}; all (default) or none",
    )
    parser.add_argument(
        "--peer-settings", choices=("matched", "defaults", "both"), default="matched"
    )
    parser.add_argument("--retrack", action="store_true", help="add ours re-tracked")
    parser.add_argument(
        "--no-rerun", action="store_true", help="leave out ours, CameraTracker re-run"
    )
    parser.add_argument("--short-gap-s", type=float, default=1.0, help="short restart gap")
    parser.add_argument("--json", type=Path, dest="json_path", help="write every figure here")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in str(args.peers).split(",") if k.strip()]
    if keys == ["all"]:
        keys = list(PEER_KEYS)
    elif keys == ["none"]:
        keys = []
    unknown = [k for k in keys if k not in PEER_KEYS]
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; expected {', '.join(PEER_KEYS)}")
    args.peer_keys = keys
    if not (math.isfinite(args.short_gap_s) and args.short_gap_s >= 0):
        parser.error(f"--short-gap-s must be a number >= 0, got {args.short_gap_s}")
    return args


def trackers_for(
    run: Run, drive: Drive, args: argparse.Namespace, params: TrackParams
) -> list[Tracked]:
    """Every tracker's output on `run`, in the table's order."""
    out = [
        Tracked(
            name="ours",
            lines=run.lines,
            objects=run.objects,
            notes=("the run's own track and global ids",),
        )
    ]
    if not args.no_rerun:
        out.append(run_ours(drive, run.lines, params))
    if args.retrack:
        out.append(run_retrack(drive, run.lines))
    modes = ("matched", "defaults") if args.peer_settings == "both" else (args.peer_settings,)
    for mode in modes:
        for spec in iter_specs(args.peer_keys):
            out.append(run_peer(spec, drive, run.lines, settings=mode, params=params))
    return out


def bench_run(
    run: Run, drive: Drive, args: argparse.Namespace, params: TrackParams
) -> tuple[list[Row], list[str]]:
    """A run's rows, and its report's lines."""
    rows = []
    for tracked in trackers_for(run, drive, args, params):
        t0 = time.perf_counter()
        rows.append(score(tracked, drive, run, short_gap_s=args.short_gap_s, high_score=0.5))
        logging.info("scored %s in %.1f s", tracked.name, time.perf_counter() - t0)
    frames = len(run.lines)
    lines = [
        f"## {run.name} ({frames} camera frames, {len(drive.cameras)} cameras)",
        "",
        *main_table(rows),
        "",
        *camera_table(rows),
        "",
        "Ids beyond one per object (cameras pooled):",
        *extra_lines(rows),
        "",
        "Settings:",
        *settings_lines(rows),
    ]
    rig = rig_line(rows)
    if rig:
        lines += ["", "Rig (global ids across cameras):", *rig]
    return rows, lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("drivepercept").setLevel(logging.WARNING)
    specs = list(iter_specs(args.peer_keys))
    for spec in specs:
        why = peer_available(spec)
        if why is not None:
            print(MISSING_PEER.format(why=why, python=sys.executable), file=sys.stderr)
            return 2
    params = TrackParams()
    try:
        drive = read_drive(args.drive)
        runs = [read_run(path) for path in args.runs]
    except (DrivePerceptError, OSError, ValueError) as exc:
        print(f"bench_trackers: error: {exc}", file=sys.stderr)
        return 1
    versions = {spec.module: peer_version(spec) for spec in specs}
    print(f"# Trackers on {drive.path} ({', '.join(versions.values()) or 'no peers'})")
    print(
        "ours' settings are not recorded in a run; today's TrackParams: "
        + ", ".join(f"{k}={v}" for k, v in vars(params).items())
    )
    record: dict[str, Any] = {
        "drive": str(drive.path),
        "versions": versions,
        "our_params": dict(vars(params)),
        "short_gap_s": args.short_gap_s,
        "runs": [],
    }
    for run in runs:
        try:
            rows, lines = bench_run(run, drive, args, params)
        except (DrivePerceptError, ValueError) as exc:
            print(f"bench_trackers: error: {run.path}: {exc}", file=sys.stderr)
            return 1
        print("\n" + "\n".join(lines))
        record["runs"].append(
            {
                "run": str(run.path),
                "camera_frames": len(run.lines),
                "trackers": [row_json(r) for r in rows],
            }
        )
    if args.json_path is not None:
        text = json.dumps(finite(record), indent=2, allow_nan=False)
        args.json_path.write_text(text + "\n", encoding="utf-8")
        print(f"\nwritten {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
