"""The `drivepercept` command line.

Every error a user can cause ends in one line on stderr and a non-zero exit code; tracebacks
are for bugs (run with `--debug` to see them for any error).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from drivepercept import __version__
from drivepercept.config import SimulationConfig, load_rig, parse_size
from drivepercept.errors import ConfigError, DrivePerceptError

log = logging.getLogger("drivepercept")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: 'drivepercept simulate: error: ...'."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


_SIMULATE_EPILOG = """\
examples:
  drivepercept simulate --out /tmp/rig --cameras 6 --seconds 4 --fps 15 --size 640x360 --seed 7
  drivepercept simulate --out /tmp/wide --cameras 8 --size 1280x720 --seed 3

The folder gets <camera>.mp4 per camera, ground_truth.json (COCO with camera, frame index,
timestamp, track id and visibility per box) and rig.toml. The same seed gives the same
ground truth, byte for byte.
"""

_REPLAY_EPILOG = """\
examples:
  drivepercept replay sample_videos/rig.toml
"""


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="drivepercept",
        description="Real-time multi-camera object detection with honest latency reports.",
    )
    parser.add_argument("--version", action="version", version=f"drivepercept {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    sim = sub.add_parser(
        "simulate",
        help="render a synthetic multi-camera drive with exact ground truth",
        description="Render a synthetic drive seen by a synchronized camera rig.",
        epilog=_SIMULATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument("--out", required=True, type=Path, help="output folder (created)")
    sim.add_argument(
        "--cameras", type=int, default=6, help="camera count, 1-12 (6 = nuScenes layout; default 6)"
    )
    sim.add_argument("--seconds", type=float, default=8.0, help="clip length (default 8)")
    sim.add_argument("--fps", type=float, default=15.0, help="frames per second (default 15)")
    sim.add_argument("--size", default="640x360", help="WIDTHxHEIGHT, even (default 640x360)")
    sim.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    sim.add_argument(
        "--no-noise",
        action="store_true",
        help="skip sensor noise and blur (exact flat-shaded pixels)",
    )
    sim.set_defaults(handler=_cmd_simulate)

    rep = sub.add_parser(
        "replay",
        help="run detection over a recorded multi-camera drive",
        description="Replay a recorded rig (rig.toml) through the detection pipeline.",
        epilog=_REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("rig", type=Path, help="rig file (rig.toml)")
    rep.set_defaults(handler=_cmd_replay)
    return parser


def _cmd_simulate(args: argparse.Namespace) -> int:
    from drivepercept.sim.clip import simulate_clip

    width, height = parse_size(args.size)
    config = SimulationConfig(
        out_dir=args.out,
        cameras=args.cameras,
        seconds=args.seconds,
        fps=args.fps,
        width=width,
        height=height,
        seed=args.seed,
        noise=not args.no_noise,
    )
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0 or done == total:
            last[0] = now
            log.info("rendered %d/%d frames", done, total)

    result = simulate_clip(config, progress=progress)
    per_cam_fps = result.frames / result.elapsed_s if result.elapsed_s > 0 else 0.0
    print(
        f"wrote {len(result.videos)} videos x {result.frames} frames, "
        f"{result.annotations} boxes, to {result.out_dir} "
        f"in {result.elapsed_s:.1f} s ({per_cam_fps:.1f} rig frames/s)"
    )
    if result.interrupted:
        print("interrupted: the files hold the frames rendered so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _cmd_replay(args: argparse.Namespace) -> int:
    import cv2

    rig = load_rig(args.rig)
    for cam in rig.cameras:
        if cam.video is None:
            raise ConfigError(f"camera {cam.name!r} in {args.rig} has no video")
        cap = cv2.VideoCapture(str(cam.video))
        try:
            if not cap.isOpened():
                raise ConfigError(f"camera {cam.name!r}: cannot open video {cam.video}")
            frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            fps = cap.get(cv2.CAP_PROP_FPS)
            width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
            height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        finally:
            cap.release()
        print(f"{cam.name:>12}: {cam.video.name} {width}x{height} {fps:g} fps {frames} frames")
    print(
        "replay: rig checked; pipeline not built yet (detection arrives with the replay pipeline)"
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drivepercept` console script and `python -m drivepercept`."""
    parser = _build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except DrivePerceptError as exc:
        if args.debug:
            raise
        print(f"drivepercept {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"drivepercept {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
