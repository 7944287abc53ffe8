"""bench_peer's command line: what to run, validated into `Settings`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VIDEOS = ROOT.parent / "shared" / "realvideos"
PEER_OWN = "peer-own"  # the peer at its own default threads: a second, labelled line
TOOLS = ("peer", "ours", PEER_OWN)
MODES = ("replay", "live")
RUNTIMES = ("torch", "onnxruntime")


def machine_cores() -> int:
    """The threads both tools get by default: the machine's cores."""
    return os.cpu_count() or 1


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
    runtimes: tuple[str, ...] = RUNTIMES
    threads: int = 1  # both tools' intra-op threads (parse_args: the machine's cores)
    peer_default_threads: bool = False  # also the peer at its own default threads
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
        "--duration 20 --rounds 3\n"
        "  PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py --runtime torch "
        "--peer-default-threads",
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
        "--runtime",
        default="both",
        help="what runs the network on both sides: torch, onnxruntime or both (the same "
        "network exported once to ONNX)",
    )
    parser.add_argument(
        "--threads",
        default="cores",
        help="intra-op threads of both tools (torch, or ONNX Runtime): cores (the machine's, "
        f"{machine_cores()} here) or N",
    )
    parser.add_argument(
        "--peer-default-threads",
        action="store_true",
        help="also run the peer at its own default threads (torch: cpu_count - 1; ONNX "
        "Runtime: its default), reported as a second line, not like for like",
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
    runtimes = RUNTIMES if args.runtime == "both" else (str(args.runtime),)
    threads = str(args.threads)
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
            set(runtimes) <= set(RUNTIMES),
            f"--runtime: torch, onnxruntime or both, got {args.runtime!r}",
        ),
        (
            threads == "cores" or (threads.isdigit() and int(threads) >= 1),
            f"--threads must be cores or a count >= 1, got {args.threads!r}",
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
        runtimes=runtimes,
        threads=machine_cores() if threads == "cores" else int(threads),
        peer_default_threads=args.peer_default_threads,
        json_path=args.json,
        out=args.out,
    )
