"""bench_peer's command line: what to run, validated into `Settings`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VIDEOS = ROOT.parent / "shared" / "realvideos"
TOOLS = ("peer", "ours")
MODES = ("replay", "live")


# ---------------------------------------------------------------------- options


@dataclass(frozen=True)
class Settings:
    """What to run (the command line, validated)."""

    videos: Path
    streams: int = 6
    modes: tuple[str, ...] = MODES
    rounds: int = 2
    duration_s: float = 30.0
    replay_frames: int = 0  # 0: the shortest clip's frame count
    imgsz: int = 320
    conf: float = 0.25
    iou: float = 0.7
    max_det: int = 100
    candidates: int = 30
    fps: float = 25.0
    threads: int = 0  # 0: each tool's own choice
    json_path: Path | None = None
    out: Path | None = None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_peer.py",
        description="Ultralytics multi-stream predict vs drivepercept, interleaved "
        "(run with the peer venv's python; see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py --json /tmp/peer.json\n"
        "  PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py --modes live "
        "--duration 20 --rounds 3",
    )
    parser.add_argument("--videos", type=Path, default=DEFAULT_VIDEOS, help="clips folder")
    parser.add_argument("--streams", type=int, default=6, help="streams (the clips, cycled)")
    parser.add_argument("--modes", default="replay,live", help="replay, live or both")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per tool and mode")
    parser.add_argument("--duration", type=float, default=30.0, help="live seconds per round")
    parser.add_argument(
        "--replay-frames", type=int, default=0, help="frames per replay stream (0: shortest clip)"
    )
    parser.add_argument("--imgsz", type=int, default=320, help="square input side, pixels")
    parser.add_argument("--conf", type=float, default=0.25, help="score threshold")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=100, help="detections kept per frame")
    parser.add_argument(
        "--candidates", type=int, default=30, help="anchors per frame scoring above --conf"
    )
    parser.add_argument("--fps", type=float, default=25.0, help="live cameras' frame rate")
    parser.add_argument(
        "--threads", default="auto", help="torch threads: auto (each tool's own) or N for both"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folders here")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """The command line -> `Settings`; argparse exits with status 2 and one line when a
    value is out of range."""
    parser = _parser()
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in str(args.modes).split(",") if m.strip())
    checks = [
        (args.streams >= 1, f"--streams must be >= 1, got {args.streams}"),
        (bool(modes) and set(modes) <= set(MODES), f"--modes: replay, live, got {args.modes!r}"),
        (args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}"),
        (args.duration > 2, f"--duration must be > 2 s, got {args.duration:g}"),
        (args.replay_frames >= 0, f"--replay-frames must be >= 0, got {args.replay_frames}"),
        (
            args.imgsz >= 64 and args.imgsz % 32 == 0,
            f"--imgsz must be a multiple of 32, >= 64, got {args.imgsz}",
        ),
        (0 < args.conf < 1, f"--conf must be in (0, 1), got {args.conf:g}"),
        (0 < args.iou <= 1, f"--iou must be in (0, 1], got {args.iou:g}"),
        (args.max_det >= 1, f"--max-det must be >= 1, got {args.max_det}"),
        (args.candidates >= 1, f"--candidates must be >= 1, got {args.candidates}"),
        (0 < args.fps <= 120, f"--fps must be in (0, 120], got {args.fps:g}"),
        (
            args.threads == "auto" or (str(args.threads).isdigit() and int(args.threads) >= 1),
            f"--threads must be auto or a count >= 1, got {args.threads!r}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    return Settings(
        videos=args.videos,
        streams=args.streams,
        modes=tuple(dict.fromkeys(modes)),
        rounds=args.rounds,
        duration_s=args.duration,
        replay_frames=args.replay_frames,
        imgsz=args.imgsz,
        conf=args.conf,
        iou=args.iou,
        max_det=args.max_det,
        candidates=args.candidates,
        fps=args.fps,
        threads=0 if args.threads == "auto" else int(args.threads),
        json_path=args.json,
        out=args.out,
    )
