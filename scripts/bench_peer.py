"""Peer benchmark: the same network, streams and machine through Ultralytics' multi-stream
predict and through drivepercept, in one run, interleaved.

The peer is what users pick instead of us: `YOLO(...).predict(source="x.streams",
stream=True)`, Ultralytics' documented multi-stream API. Ultralytics is AGPL and is never a
dependency of drivepercept; it lives in its own virtual environment outside the repository,
which reuses the system torch, OpenCV and numpy and drivepercept's dependencies:

    python3 -m venv --system-site-packages /work/peer-venv
    /work/peer-venv/bin/pip install ultralytics
    PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py --rounds 2 --duration 20

The network is YOLOv8n built from Ultralytics' own config (`YOLO("yolov8n.yaml")`: random
weights, nothing downloaded), at a square input of --imgsz. Freshly built, its output does not
depend on the input (see `settle_norms`), so its batch norms first take their statistics from
a few frames of the clips, then are fused. drivepercept runs that module object, wrapped as
a `Detector`; Ultralytics deep-copies whatever model it is given in every predictor set-up,
so it runs its own copies of the same weights (made from one copy taken before any round).
The `Detector`'s `InputSpec` is Ultralytics' letterbox for these streams (the clips differ
in size, so Ultralytics pads every frame to the full square: bilinear resize, centred, pad
114, RGB, pixels / 255); its forward hands the head's decoded boxes and best-class scores to
drivepercept's own batched post-processing. Both sides keep boxes scoring at least --conf,
best class per box, class-aware NMS at --iou, at most --max-det per frame. The class biases
are shifted once, before anything runs, to put about --candidates anchors per frame above
--conf (Ultralytics initialises them so low that nothing would pass): both sides then filter
and suppress a realistic number of boxes. Replay checks that both find the same number of
boxes in every frame.

Each tool keeps its own process-wide settings: Ultralytics sets torch's intra-op threads
to cpu_count - 1 when it sets up a predictor on a CPU (and `cv2.setNumThreads(0)` when it is
imported); drivepercept runs with torch's and OpenCV's defaults, and its own channels_last
layout. They are put back before each tool's round (`--threads N` forces N on both).

Modes, each run as peer, ours, peer, ours, ... for --rounds rounds:

* replay: every frame of --streams file streams (the clips in --videos, cycled), each cut to
  --replay-frames (default: the shortest clip). Peer: a `.streams` file of the paths with
  `stream_buffer=True` (its reader threads then queue every frame; with the default False a
  reader keeps only its newest frame and a video file is read as fast as it decodes, so most
  frames are skipped), stopped after that many batches. Ours: `Mode.REPLAY` with
  `max_frames`.
* live: --streams cameras served by drivepercept's `CameraServer` (MJPEG over HTTP on
  127.0.0.1, looped) at --fps, read for --duration seconds by each tool in turn. Peer: a
  `.streams` file of the URLs, Ultralytics' defaults (newest frame per stream). Ours:
  `Mode.LIVE` with its defaults.

What is measured, the same way on both sides:

* fps: frames whose results came out after the first batch's, divided by the time from the
  first batch's results to the last results (start-up, warm-up and the first batch excluded).
* latency (live): from the frame's arrival at the client to its results. Ours: frames.csv's
  end_to_end_ms (capture_ns: when the JPEG's last byte was read, before decoding ->
  emitted_ns, results handed to the outputs). Peer: the moment OpenCV's `grab()` returned the
  frame in Ultralytics' reader thread (OpenCV reads and decodes in that call) -> the moment
  the predict generator yields its `Results`. The stamp comes from a wrapper around
  `cv2.VideoCapture` given to Ultralytics' loader module only, matched to the `Results` by
  the frame array it returned; the peer's figure therefore leaves out its JPEG decode
  (printed as "peer JPEG decode", measured on the served frames), a bias in its favour.
  First-batch frames are excluded.
* delivered (live): frames the server wrote to the tool's connections during its round
  (`CameraServer.frames_sent`), so the share each tool processed is comparable.

Exit status: 0 done, 1 a run failed, 2 ultralytics or the clips are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import importlib
import importlib.util
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from drivepercept.models.base import Detector
    from drivepercept.sim.serve import CameraServer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VIDEOS = ROOT.parent / "shared" / "realvideos"
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov")
TOOLS = ("peer", "ours")
MODES = ("replay", "live")
MISSING_PEER = (
    "bench_peer: ultralytics is not importable with {python}; run this script with the peer "
    "venv: python3 -m venv --system-site-packages /work/peer-venv && "
    "/work/peer-venv/bin/pip install ultralytics, then "
    "PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py"
)

log = logging.getLogger("bench_peer")


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


# ---------------------------------------------------------------------- statistics (pure)


def percentile_ms(values_ms: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default); NaN with no values."""
    if not values_ms:
        return math.nan
    return float(np.percentile(np.asarray(values_ms, dtype=np.float64), q))


def throughput_fps(emitted_ns: Sequence[int], first_batch: int) -> float:
    """Frames after the first batch over the time from the first batch's results to the last
    results (both tools emit a batch's results together); NaN when that span is empty.

    Args:
        emitted_ns: when each frame's results came out, in emission order.
        first_batch: how many of them belong to the first batch.
    """
    if len(emitted_ns) <= first_batch or first_batch < 1:
        return math.nan
    span_ns = emitted_ns[-1] - emitted_ns[first_batch - 1]
    return (len(emitted_ns) - first_batch) / (span_ns / 1e9) if span_ns > 0 else math.nan


@dataclass(frozen=True)
class RoundResult:
    """One tool's run in one mode and round."""

    tool: str
    mode: str
    round: int
    frames: int  # frames with results (all of them, first batch included)
    fps: float
    p50_ms: float = math.nan  # live only
    p99_ms: float = math.nan
    delivered: int = 0  # live: frames the server wrote to this tool's connections
    detections_per_frame: float = math.nan
    torch_threads: int = 0
    wall_s: float = 0.0  # the whole call: set-up, warm-up, run, shut-down
    note: str = ""


def best_and_median(values: Sequence[float], *, higher_is_better: bool) -> tuple[float, float]:
    """(best, median) of the finite values; NaN, NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    best = max(finite) if higher_is_better else min(finite)
    return best, float(statistics.median(finite))


def ratio(ours: float, peer: float) -> float:
    """ours / peer; NaN when either is not a positive finite number."""
    if not (math.isfinite(ours) and math.isfinite(peer) and peer > 0 and ours >= 0):
        return math.nan
    return ours / peer


METRICS = (("fps", True), ("p50_ms", False), ("p99_ms", False))


def summarise(rounds: Sequence[RoundResult]) -> dict[str, dict[str, Any]]:
    """Per mode: best and median of each metric per tool, and ours / peer of both (above 1 is
    better for ours in fps, worse in latency)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r.mode for r in rounds):
        entry: dict[str, Any] = {}
        for metric, higher in METRICS:
            if mode == "replay" and metric != "fps":
                continue
            per_tool = {
                tool: best_and_median(
                    [getattr(r, metric) for r in rounds if r.mode == mode and r.tool == tool],
                    higher_is_better=higher,
                )
                for tool in TOOLS
            }
            entry[metric] = {
                **{f"{tool}_best": v[0] for tool, v in per_tool.items()},
                **{f"{tool}_median": v[1] for tool, v in per_tool.items()},
                "ratio_best": ratio(per_tool["ours"][0], per_tool["peer"][0]),
                "ratio_median": ratio(per_tool["ours"][1], per_tool["peer"][1]),
            }
        out[mode] = entry
    return out


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def table(rounds: Sequence[RoundResult], summary: dict[str, dict[str, Any]]) -> list[str]:
    """The stdout report: every round, then best / median and the ratios."""
    head = (
        f"{'mode':<7}{'round':>6} {'tool':<5}{'frames':>8}{'fps':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'delivered':>10}{'det/frame':>10}{'threads':>8}{'wall s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rounds:
        lines.append(
            f"{r.mode:<7}{r.round:>6} {r.tool:<5}{r.frames:>8}{_fmt(r.fps):>8}"
            f"{_fmt(r.p50_ms):>9}{_fmt(r.p99_ms):>9}{r.delivered or '-':>10}"
            f"{_fmt(r.detections_per_frame, 2):>10}{r.torch_threads:>8}{_fmt(r.wall_s):>8}"
            + (f"  {r.note}" if r.note else "")
        )
    lines.append("")
    lines.append(
        f"{'mode':<7}{'metric':<8}{'peer best':>10}{'ours best':>10}{'ours/peer':>10}"
        f"{'peer med':>10}{'ours med':>10}{'ours/peer':>10}"
    )
    for mode, entry in summary.items():
        for metric, s in entry.items():
            lines.append(
                f"{mode:<7}{metric:<8}{_fmt(s['peer_best']):>10}{_fmt(s['ours_best']):>10}"
                f"{_fmt(s['ratio_best'], 2):>10}{_fmt(s['peer_median']):>10}"
                f"{_fmt(s['ours_median']):>10}{_fmt(s['ratio_median'], 2):>10}"
            )
    return lines


# ---------------------------------------------------------------------- streams


def clip_paths(videos: Path, streams: int) -> list[Path]:
    """`streams` video files: the clips of `videos` (sorted), cycled."""
    clips = sorted(p for p in videos.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
    if not clips:
        raise FileNotFoundError(f"expected video files in {videos}, found none")
    return [clips[i % len(clips)].resolve() for i in range(streams)]


def decodable_frames(path: Path) -> int:
    """Frames OpenCV actually decodes from `path` (containers may announce more)."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    count = 0
    try:
        while capture.grab():
            count += 1
    finally:
        capture.release()
    return count


def streams_file(folder: Path, sources: Sequence[str]) -> Path:
    """Ultralytics' multi-stream source: a `.streams` text file, one source a line."""
    path = folder / f"bench-{len(sources)}.streams"
    path.write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    return path


# ---------------------------------------------------------------------- the network


class _Ultralytics:
    """The imported peer: the package, its YOLO model and the loader module we stamp."""

    def __init__(self) -> None:
        self.package: Any = importlib.import_module("ultralytics")
        self.loaders: Any = importlib.import_module("ultralytics.data.loaders")
        self.version = str(self.package.__version__)


def build_network(peer: _Ultralytics) -> Any:
    """YOLOv8n from Ultralytics' own config: random weights, not fused yet."""
    return peer.package.YOLO("yolov8n.yaml")


def settle_norms(net: Any, frames: torch.Tensor) -> None:
    """Set every batch norm's running statistics from `frames`, then fuse the norms into the
    convolutions and go to eval mode.

    Freshly built, the norms hold mean 0 and variance 1, and PyTorch's default convolution
    initialisation shrinks activations layer by layer: at the head they are ~0 and the output
    is the same for every frame. With statistics measured on real frames, each layer is
    normalised as in training, and the random network's boxes and scores depend on the input.
    """
    import torch

    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # a plain average over the batches seen
    net.train()
    with torch.no_grad():
        net(frames)
    net.eval()
    net.fuse(verbose=False)


def _head_logits(net: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """(B, N): each anchor's best class logit."""
    import torch

    with torch.inference_mode():
        out = net(batch)
    pred = out[0] if isinstance(out, (tuple, list)) else out  # (B, 4 + classes, N)
    probs = pred[:, 4:].double().clamp(1e-12, 1 - 1e-12)
    best: torch.Tensor = torch.logit(probs).amax(dim=1)
    return best


def calibrate(net: Any, frames: torch.Tensor, *, conf: float, candidates: int) -> dict[str, float]:
    """Shift every class bias of the head by one constant so that about `candidates` anchors
    a frame score above `conf` on `frames` (float (B, 3, S, S), prepared as the model wants).
    Random weights otherwise score every anchor near Ultralytics' initial prior (~1e-4)."""
    import torch

    logits = _head_logits(net, frames)
    anchors = logits.shape[1]
    level = float(torch.quantile(logits.flatten(), 1.0 - min(candidates, anchors) / anchors))
    shift = math.log(conf / (1.0 - conf)) - level
    head = net.model[-1]  # DetectionModel.model: the layers, the Detect head last
    convs = [branch[-1] for branch in head.cv3]
    if not all(isinstance(c, torch.nn.Conv2d) and c.bias is not None for c in convs):
        raise RuntimeError("expected the detection head's class branches to end in a Conv2d")
    with torch.no_grad():
        for c in convs:
            c.bias.add_(shift)
    after = _head_logits(net, frames)
    above = float((after > math.log(conf / (1.0 - conf))).sum(dim=1).double().mean())
    return {"class_bias_shift": shift, "anchors": float(anchors), "candidates_measured": above}


class YoloAsDetector:
    """Builds the drivepercept `Detector` around an Ultralytics detection model."""

    @staticmethod
    def build(net: torch.nn.Module, names: Sequence[str], imgsz: int) -> Detector:
        import torch

        from drivepercept.models.base import Detector
        from drivepercept.types import ColorOrder, InputSpec, Interpolation, PadPlacement

        class _Forward(torch.nn.Module):
            """The head's decoded output -> drivepercept's per-image dicts: boxes (centre and
            size in input pixels) to xyxy, the best class and its probability. Filtering and
            NMS are drivepercept's (engine/stages.py), as for YOLOX."""

            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
                out = self.inner(x)
                pred = out[0] if isinstance(out, (tuple, list)) else out  # (B, 4 + nc, N)
                cx, cy, w, h = pred[:, 0], pred[:, 1], pred[:, 2], pred[:, 3]
                boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), dim=-1)
                scores, labels = pred[:, 4:].max(dim=1)
                return [
                    {"boxes": boxes[i], "scores": scores[i], "labels": labels[i]}
                    for i in range(pred.shape[0])
                ]

        spec = InputSpec(
            size=(imgsz, imgsz),
            letterbox=True,
            pad_value=114,
            interpolation=Interpolation.BILINEAR,  # LetterBox: cv2.resize, INTER_LINEAR
            pad=PadPlacement.CENTER,
            channels=ColorOrder.RGB,
            value_range=1.0,
        )
        return Detector(
            name="ultralytics-yolov8n",
            module=_Forward(net).eval(),
            input=spec,
            class_names=tuple(names),
        )


def calibration_frames(
    paths: Sequence[Path], detector: Detector, *, per_clip: int = 4, step: int = 25
) -> torch.Tensor:
    """`per_clip` frames of each clip, `step` frames apart, prepared as the detector wants,
    as a float batch."""
    import cv2
    import torch

    from drivepercept.sources.prepare import prepare

    rows = []
    for path in dict.fromkeys(paths):
        capture = cv2.VideoCapture(str(path))
        for index in range(per_clip * step):
            ok, frame = capture.read()
            if not ok:
                break
            if index % step == 0:
                rows.append(prepare(np.asarray(frame, np.uint8), detector.input)[0])
        capture.release()
    if not rows:
        raise FileNotFoundError(f"expected decodable videos, got no frame from {paths[0]}")
    batch = torch.from_numpy(np.stack(rows)).permute(0, 3, 1, 2).float() / 255.0
    return batch


# ---------------------------------------------------------------------- process-wide settings


@dataclass
class Globals:
    """The process-wide settings each tool gets: torch intra-op threads and OpenCV threads."""

    torch_threads: int
    cv2_threads: int
    forced_threads: int = 0

    def for_ours(self) -> None:
        import cv2
        import torch

        torch.set_num_threads(self.forced_threads or self.torch_threads)
        cv2.setNumThreads(self.cv2_threads)

    def for_peer(self) -> None:
        import cv2

        cv2.setNumThreads(0)  # what `import ultralytics` does
        # the predictor's set-up sets its own thread count (select_device); --threads
        # overrides it in the on_predict_start callback


# ---------------------------------------------------------------------- peer arrival stamps


class ArrivalStamps:
    """When each frame Ultralytics' reader threads took from OpenCV came in, by array id.

    Thread-safety: reader threads write, the main thread reads; one lock. A frame the
    loader replaced by a newer one is never looked up; entries older than `keep_s` go.
    """

    def __init__(self, keep_s: float = 5.0) -> None:
        self._lock = threading.Lock()
        self._stamps: dict[int, int] = {}
        self._keep_ns = int(keep_s * 1e9)

    def put(self, image: object, arrived_ns: int) -> None:
        with self._lock:
            self._stamps[id(image)] = arrived_ns
            if len(self._stamps) > 4096:
                oldest = arrived_ns - self._keep_ns
                self._stamps = {k: v for k, v in self._stamps.items() if v >= oldest}

    def take(self, image: object) -> int | None:
        with self._lock:
            return self._stamps.pop(id(image), None)


@contextlib.contextmanager
def stamped_loader(peer: _Ultralytics, stamps: ArrivalStamps) -> Iterator[None]:
    """Give Ultralytics' loader module (only it) a `cv2` whose VideoCapture stamps each frame
    when `grab()`/`read()` returns it (OpenCV has then read and decoded it)."""
    import cv2

    class StampedCapture:
        """A `cv2.VideoCapture` by composition (a Python subclass of OpenCV's class crashed
        the process after a few live rounds): the calls LoadStreams makes, stamped."""

        def __init__(self, *args: Any) -> None:
            self._capture = cv2.VideoCapture(*args)
            self._grabbed_ns = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._capture, name)

        def grab(self) -> bool:
            ok = bool(self._capture.grab())
            self._grabbed_ns = time.monotonic_ns()
            return ok

        def retrieve(self, *args: Any) -> tuple[bool, Any]:
            ok, image = self._capture.retrieve(*args)
            if ok and image is not None:
                stamps.put(image, self._grabbed_ns)
            return ok, image

        def read(self, *args: Any) -> tuple[bool, Any]:
            ok, image = self._capture.read(*args)
            if ok and image is not None:
                stamps.put(image, time.monotonic_ns())
            return ok, image

    proxy = types.ModuleType("cv2_stamped")
    proxy.__dict__.update(cv2.__dict__)
    proxy.VideoCapture = StampedCapture  # type: ignore[attr-defined]
    original = peer.loaders.cv2
    peer.loaders.cv2 = proxy
    try:
        yield
    finally:
        peer.loaders.cv2 = original


# ---------------------------------------------------------------------- one round of each


@dataclass
class Bench:
    """Everything the rounds share."""

    settings: Settings
    peer: _Ultralytics
    yolo: Any
    detector: Detector
    globals: Globals
    work: Path
    clips: list[Path]
    replay_frames: int
    server: CameraServer | None = None
    live_urls: list[str] = field(default_factory=list)
    # detections per (stream, frame) of the last peer replay, to check ours against
    peer_counts: dict[tuple[int, int], int] = field(default_factory=dict)

    def peer_round(self, mode: str, number: int) -> RoundResult:
        s = self.settings
        self.globals.for_peer()
        # a fresh Ultralytics model object around a fresh copy of the network each round, so
        # that every round starts as in a new process (predictor, callbacks, threads)
        yolo = build_network(self.peer)
        yolo.model = copy.deepcopy(self.yolo.model)
        if s.threads:
            yolo.add_callback("on_predict_start", lambda _p: _set_threads(s.threads))
        live = mode == "live"
        sources = self.live_urls if live else [str(p) for p in self.clips]
        source = streams_file(self.work, sources)
        wanted = len(sources) * self.replay_frames
        stamps = ArrivalStamps()
        sent_before = self._sent()
        counts: dict[tuple[int, int], int] = {}
        emitted: list[int] = []
        latencies: list[float] = []
        detections = 0
        threads = 0
        started = time.monotonic()
        with stamped_loader(self.peer, stamps) if live else contextlib.nullcontext():
            results = yolo.predict(
                source=str(source),
                stream=True,
                imgsz=s.imgsz,
                conf=s.conf,
                iou=s.iou,
                max_det=s.max_det,
                device="cpu",
                stream_buffer=not live,  # replay: every frame; live: the newest
                verbose=False,
            )
            try:
                for result in results:
                    now = time.monotonic_ns()
                    emitted.append(now)
                    detections += len(result.boxes)
                    if not live:  # a batch is one frame of each stream, in stream order
                        k = len(emitted) - 1
                        counts[(k % len(sources), k // len(sources))] = len(result.boxes)
                    arrived = stamps.take(result.orig_img) if live else None
                    if len(emitted) == 1:
                        threads = _get_threads()
                    if arrived is not None and len(emitted) > len(sources):
                        latencies.append((now - arrived) / 1e6)
                    if not live and len(emitted) >= wanted:
                        break
                    if live and len(emitted) > len(sources):
                        first_batch_ns = emitted[len(sources) - 1]
                        if now - first_batch_ns >= s.duration_s * 1e9:
                            break
            finally:
                results.close()
                dataset = getattr(yolo.predictor, "dataset", None)
                if dataset is not None and hasattr(dataset, "close"):
                    dataset.close()
        wall_s = time.monotonic() - started
        if not live:
            self.peer_counts = counts
        after = len(emitted) - len(sources)
        note = ""
        if live and len(latencies) < after:
            note = f"{after - len(latencies)} frames without an arrival stamp"
        if not live and len(emitted) != wanted:
            note = f"expected {wanted} frames, got {len(emitted)}"
        return RoundResult(
            tool="peer",
            mode=mode,
            round=number,
            frames=len(emitted),
            fps=throughput_fps(emitted, len(sources)),
            p50_ms=percentile_ms(latencies, 50) if live else math.nan,
            p99_ms=percentile_ms(latencies, 99) if live else math.nan,
            delivered=self._sent() - sent_before if live else 0,
            detections_per_frame=detections / len(emitted) if emitted else math.nan,
            torch_threads=threads,
            wall_s=wall_s,
            note=note,
        )

    def ours_round(self, mode: str, number: int) -> RoundResult:
        from drivepercept.run import Mode, RunOptions, run

        s = self.settings
        self.globals.for_ours()
        live = mode == "live"
        sources = self.live_urls if live else [str(p) for p in self.clips]
        settings: dict[str, Any] = {
            "device": "cpu",
            "score_threshold": s.conf,
            "iou_threshold": s.iou,
            "max_detections": s.max_det,
        }
        if not live:
            settings["max_frames"] = self.replay_frames
        options = RunOptions(
            sources=tuple(f"cam{i}={src}" for i, src in enumerate(sources)),
            mode=Mode.LIVE if live else Mode.REPLAY,
            model="ultralytics-yolov8n",
            settings=settings,
            out_root=self.work / "runs",
            name=f"{mode}-ours-{number}",
            report_formats=(),
            duration_s=s.duration_s if live else None,
        )
        sent_before = self._sent()
        threads = _get_threads()
        started = time.monotonic()
        result = run(options, detector=self.detector)
        wall_s = time.monotonic() - started
        rows = _frames_csv(result.run_dir / "frames.csv")
        rows.sort(key=lambda r: int(r["emitted_ns"]))
        emitted = [int(r["emitted_ns"]) for r in rows]
        first_batch = min((int(r["batch_index"]) for r in rows), default=0)
        in_first = sum(1 for r in rows if int(r["batch_index"]) == first_batch)
        later = [float(r["end_to_end_ms"]) for r in rows if int(r["batch_index"]) != first_batch]
        failure = result.failure()
        wanted = len(sources) * self.replay_frames
        note = failure or ""
        if not live and len(rows) != wanted:
            note = f"expected {wanted} frames, got {len(rows)}" + (f"; {note}" if note else "")
        if not live and self.peer_counts:
            ours_counts = {
                (int(r["camera_index"]), int(r["frame_index"])): int(r["detections"]) for r in rows
            }
            note = (note + "; " if note else "") + count_agreement(self.peer_counts, ours_counts)
        return RoundResult(
            tool="ours",
            mode=mode,
            round=number,
            frames=len(rows),
            fps=throughput_fps(emitted, in_first),
            p50_ms=percentile_ms(later, 50) if live else math.nan,
            p99_ms=percentile_ms(later, 99) if live else math.nan,
            delivered=self._sent() - sent_before if live else 0,
            detections_per_frame=(
                sum(int(r["detections"]) for r in rows) / len(rows) if rows else math.nan
            ),
            torch_threads=threads,
            wall_s=wall_s,
            note=note,
        )

    def _sent(self) -> int:
        if self.server is None:
            return 0
        return sum(self.server.frames_sent(f"cam{i}") for i in range(len(self.live_urls)))


def count_agreement(peer: dict[tuple[int, int], int], ours: dict[tuple[int, int], int]) -> str:
    """How often both tools found the same number of boxes in the same frame."""
    shared = peer.keys() & ours.keys()
    if not shared:
        return "no frame in common with the peer's replay"
    same = sum(1 for k in shared if peer[k] == ours[k])
    within = sum(1 for k in shared if abs(peer[k] - ours[k]) <= 1)
    return (
        f"boxes per frame as the peer's: equal in {100 * same / len(shared):.0f} %, "
        f"within 1 in {100 * within / len(shared):.0f} % of {len(shared)} frames"
    )


def _set_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def _get_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _frames_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def jpeg_decode_ms(paths: Sequence[Path], *, quality: int = 80) -> float:
    """Median time to decode one served frame (JPEG at the server's quality) with OpenCV:
    the part of the peer's latency its arrival stamp leaves out."""
    import cv2

    times = []
    for path in dict.fromkeys(paths):
        capture = cv2.VideoCapture(str(path))
        ok, frame = capture.read()
        capture.release()
        if not ok:
            continue
        jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])[1]
        for _ in range(20):
            t = time.perf_counter_ns()
            cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
            times.append((time.perf_counter_ns() - t) / 1e6)
    return float(statistics.median(times)) if times else math.nan


def versions(peer: _Ultralytics) -> dict[str, str]:
    import cv2
    import torch
    import torchvision

    return {
        "python": platform.python_version(),
        "ultralytics": peer.version,
        "torch": str(torch.__version__),
        "torchvision": str(torchvision.__version__),
        "opencv": str(cv2.__version__),
        "numpy": str(np.__version__),
        "cpus": str(os.cpu_count()),
    }


# ---------------------------------------------------------------------- main


def bench(settings: Settings, peer: _Ultralytics, globals_: Globals, work: Path) -> dict[str, Any]:
    """Every round, interleaved per mode (peer, ours, peer, ours, ...); the JSON record."""
    from drivepercept.sim.serve import CameraServer

    clips = clip_paths(settings.videos, settings.streams)
    shortest = min(decodable_frames(p) for p in dict.fromkeys(clips))
    replay_frames = settings.replay_frames or shortest
    if replay_frames > shortest:
        raise ValueError(f"--replay-frames must be <= {shortest} (the shortest clip)")
    yolo = build_network(peer)
    net = yolo.model
    names = [yolo.names[i] for i in range(len(yolo.names))]
    detector = YoloAsDetector.build(net, names, settings.imgsz)
    frames = calibration_frames(clips, detector)
    settle_norms(net, frames)
    calibration = calibrate(net, frames, conf=settings.conf, candidates=settings.candidates)
    # Ultralytics deep-copies the model it is given in every predictor set-up, so it never
    # runs the object itself; its rounds copy this copy of the finished network, made before
    # any round, so that what drivepercept sets on `net` (channels_last) stays on ours.
    yolo.model = copy.deepcopy(net)
    params = sum(p.numel() for p in net.parameters())
    log.info("YOLOv8n: %.2f M parameters; calibration %s", params / 1e6, calibration)
    state = Bench(settings, peer, yolo, detector, globals_, work, clips, replay_frames)
    rounds: list[RoundResult] = []
    for mode in settings.modes:
        server_cm: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if mode == "live":
            server_cm = CameraServer(
                [(f"cam{i}", p) for i, p in enumerate(clips)], fps=settings.fps
            )
        with server_cm as server:
            if server is not None:
                state.server = server
                state.live_urls = [server.url(f"cam{i}") for i in range(len(clips))]
            for number in range(1, settings.rounds + 1):
                for tool in TOOLS:
                    load = os.getloadavg()[0]
                    log.info("%s round %d: %s (load %.1f)", mode, number, tool, load)
                    runner = state.peer_round if tool == "peer" else state.ours_round
                    result = runner(mode, number)
                    log.info("  -> %s", result)
                    rounds.append(result)
            state.server = None
    summary = summarise(rounds)
    return {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "versions": versions(peer),
        "network": {"parameters": params, "imgsz": settings.imgsz, **calibration},
        "streams": [str(p) for p in clips],
        "replay_frames_per_stream": replay_frames,
        "torch_threads_default": globals_.torch_threads,
        "peer_jpeg_decode_ms": jpeg_decode_ms(clips),
        "rounds": [asdict(r) for r in rounds],
        "summary": summary,
    }


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    if importlib.util.find_spec("ultralytics") is None:
        print(MISSING_PEER.format(python=sys.executable), file=sys.stderr)
        return 2
    if not settings.videos.is_dir():
        print(f"bench_peer: expected a folder of clips, got {settings.videos}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("drivepercept").setLevel(logging.WARNING)
    import cv2
    import torch

    from drivepercept.errors import DrivePerceptError

    # torch and OpenCV as drivepercept finds them, before Ultralytics changes them (its
    # import sets OpenCV to 0 threads and OMP_NUM_THREADS=1; its CPU set-up, torch's threads)
    globals_ = Globals(
        torch_threads=torch.get_num_threads(),
        cv2_threads=cv2.getNumThreads(),
        forced_threads=settings.threads,
    )
    os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks or events, no network
    peer = _Ultralytics()
    with contextlib.ExitStack() as stack:
        if settings.out is not None:
            settings.out.mkdir(parents=True, exist_ok=True)
            work = settings.out
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-peer-")))
        try:
            record = bench(settings, peer, globals_, work)
        except (DrivePerceptError, FileNotFoundError, ValueError) as exc:
            print(f"bench_peer: error: {exc}", file=sys.stderr)
            return 1
    rounds = [RoundResult(**r) for r in record["rounds"]]
    print(
        f"ultralytics {record['versions']['ultralytics']}, torch {record['versions']['torch']}; "
        f"{len(record['streams'])} streams; replay {record['replay_frames_per_stream']} frames "
        f"a stream; peer JPEG decode (not in its latency) {record['peer_jpeg_decode_ms']:.1f} ms"
    )
    for line in table(rounds, record["summary"]):
        print(line)
    if settings.json_path is not None:
        text = json.dumps(_finite(record), indent=2, allow_nan=False)
        settings.json_path.write_text(text + "\n", encoding="utf-8")
        print(f"written {settings.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
