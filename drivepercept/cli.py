"""The `drivepercept` command line.

Every error a user can cause ends in one line on stderr and a non-zero exit code; tracebacks
are for bugs (run with `--debug` to see them for any error).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from drivepercept import __version__
from drivepercept.config import (
    PipelineConfig,
    SimulationConfig,
    load_pipeline_toml,
    parse_size,
)
from drivepercept.errors import ConfigError, DrivePerceptError, one_line

if TYPE_CHECKING:
    from drivepercept.pipeline import LiveView, Pipeline
    from drivepercept.replay import ReplayOptions, ReplayResult
    from drivepercept.report import ReportResult

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
  drivepercept replay sample_videos/rig.toml --model ssdlite320_mobilenet_v3_large --weights none
  drivepercept replay front.mp4 rear.mp4 --model fasterrcnn_mobilenet_v3_large_320_fpn \\
      --weights DEFAULT --device cuda --precision fp16 --save-video
  drivepercept replay --config replay.toml sample_videos/rig.toml

SOURCE is a rig file (rig.toml), a video file or a folder of images; several sources make
one rig, in the order given. The run folder (runs/<name>/) gets detections.jsonl, frames.csv
(stage timestamps per frame) and run.json (config, versions, device, summary). A --config
TOML file takes the same keys as the flags (with underscores); flags override it.
"""

_EVAL_EPILOG = """\
examples:
  drivepercept simulate --out /tmp/heldout --seed 9001 --seconds 4
  drivepercept eval /tmp/heldout --model ssdlite320_mobilenet_v3_large --weights DEFAULT

Ground truth less visible than --min-visibility or lower than --min-height-px pixels is an
"ignore" region: detecting it is not rewarded, missing it is not punished. Writes eval.json
into the run folder next to the replay outputs and prints mAP@[.5:.95], mAP@.5, per-class
and per-camera AP and recall.
"""

_LIVE_EPILOG = """\
examples:
  drivepercept serve-cameras sample_videos/rig.toml --port 8554 &   # simulated cameras
  drivepercept live --camera front=http://127.0.0.1:8554/front.mjpg \\
      --camera back=http://127.0.0.1:8554/back.mjpg --duration 30
  drivepercept live --camera dash=0 --device cuda --precision fp16 --metrics-port 9100
  drivepercept live cameras.toml       # [[camera]] tables with name and source

Each camera keeps only its newest frame (queue of 1, drop_oldest; --queue-capacity 2 allows
one more); every dropped frame is counted. A camera whose stream fails goes to
"reconnecting" and retries with exponential backoff while the others carry on; after
--reconnect-attempts failures in a row it is "failed". Ctrl-C or SIGTERM stops capture,
drains what is in flight and writes every output and the report.
"""

_SERVE_EPILOG = """\
examples:
  drivepercept serve-cameras sample_videos/rig.toml --port 8554
  drivepercept live --camera front=http://127.0.0.1:8554/front.mjpg --duration 20

Each camera is at http://127.0.0.1:PORT/<name>.mjpg (GET / lists them). Runs until Ctrl-C or
SIGTERM.
"""

_REPORT_EPILOG = """\
examples:
  drivepercept report runs/replay-20261130-101500
  drivepercept report runs/fp32 --format json,csv --budget-ms 66
  drivepercept report runs/fp32 --compare runs/fp16

Writes summary.json (schema in drivepercept/report/summary.py), latency.csv (per-stage
statistics), report.html (one self-contained page with plots) and trace.json (open it in
https://ui.perfetto.dev). A run that was killed, or a frames.csv with corrupt lines, still gets
a report of what is there; the problems are named, and the exit code is 1.
"""

_BENCH_EPILOG = """\
examples:
  drivepercept bench sample_videos/rig.toml --model ssdlite320_mobilenet_v3_large --weights none

Measures, on one machine, model and batch: (a) the model alone on pre-made batches (the
ceiling), (b) the full pipeline, (c) a naive one-frame-at-a-time loop; prints frames/s of
each and the ratios pipeline/ceiling and pipeline/naive.
"""

_PIPELINE_KEYS = {f.name for f in dataclasses.fields(PipelineConfig)}
_REPLAY_KEYS = {"model", "weights", "out", "name", "save_video", "mosaic", "budget_ms", "report"}
DEFAULT_MODEL = "drivepercept-tiny"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="rig.toml, video file or image folder (several make one rig)",
    )
    p.add_argument("--rig", help="a rig file (same as giving it as a SOURCE)")
    p.add_argument("--config", type=Path, help="TOML file with the same keys as the flags")
    p.add_argument(
        "--model", help=f"registry name or package.module:factory (default {DEFAULT_MODEL})"
    )
    p.add_argument(
        "--weights",
        help="DEFAULT (the bundled file for drivepercept-tiny, the torchvision download for "
        "COCO models), a local state-dict path, or none (random); default DEFAULT",
    )
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument(
        "--batch-timeout-ms", type=float, help="partial batch after this wait (default 20)"
    )
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16"), help="default fp32")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NHWC memory format for the model (default on)",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a full and a single-frame batch before capture starts, kept out of the "
        "figures (default on)",
    )
    p.add_argument("--score-threshold", type=float, help="default 0.3")
    p.add_argument("--queue-capacity", type=int, help="frames waiting per camera (default 4)")
    p.add_argument("--max-frames", type=int, help="stop each camera after N frames")
    p.add_argument(
        "--sample-hz",
        type=float,
        help="GPU/CPU load samples per second, 0 = off (default 10)",
    )


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
    _add_model_args(rep)
    rep.add_argument(
        "--realtime",
        action="store_true",
        help="pace the videos at their frame rate and use the live policies (latest frame "
        "wins, drops counted): does this model and device keep up with the rig?",
    )
    _add_run_args(rep, default_name="replay-<date>-<time>")
    rep.set_defaults(handler=_cmd_replay)

    liv = sub.add_parser(
        "live",
        help="run detection on live cameras and streams (device index, /dev/video, URL)",
        description="Detect on live cameras: the newest frame of each camera, flat latency, "
        "every drop counted, dead cameras reconnected while the others carry on.",
        epilog=_LIVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(liv)
    liv.add_argument(
        "--camera",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help="a camera: NAME=0, NAME=/dev/video0 or NAME=rtsp://... (repeat for each)",
    )
    _add_run_args(liv, default_name="live-<date>-<time>")
    liv.set_defaults(handler=_cmd_live, realtime=False)

    ev = sub.add_parser(
        "eval",
        help="COCO mAP of a model on a clip with ground truth",
        description="Run the replay pipeline over a clip with ground_truth.json and score it "
        "with COCO metrics (pycocotools).",
        epilog=_EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(ev)
    ev.add_argument(
        "--ground-truth",
        type=Path,
        help="COCO ground truth (default: ground_truth.json beside the rig)",
    )
    ev.add_argument(
        "--min-visibility",
        type=float,
        default=0.3,
        help="ground truth less visible than this is ignored (default 0.3)",
    )
    ev.add_argument(
        "--min-height-px",
        type=float,
        default=12.0,
        help="ground truth lower than this is ignored (default 12)",
    )
    ev.add_argument("--out", type=Path, help="folder for run folders (default runs/)")
    ev.add_argument("--name", help="run folder name (default eval-<date>-<time>)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.set_defaults(handler=_cmd_eval, save_video=None, mosaic=None)

    ben = sub.add_parser(
        "bench",
        help="model ceiling vs pipeline vs naive loop, on one machine",
        description="Benchmark the pipeline against the model alone and a naive loop.",
        epilog=_BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_args(ben)
    ben.add_argument(
        "--frames", type=int, default=30, help="frames per camera for each measurement (default 30)"
    )
    ben.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds; each mode's best is kept (default 3)",
    )
    ben.set_defaults(handler=_cmd_bench)

    srv = sub.add_parser(
        "serve-cameras",
        help="serve videos as live MJPEG-over-HTTP cameras on 127.0.0.1 (for testing live mode)",
        description="Serve each video as a live camera: MJPEG over HTTP, paced in real time, "
        "looping, several clients per camera.",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    srv.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="rig.toml, video files or a folder of videos"
    )
    srv.add_argument("--port", type=int, default=8554, help="TCP port (default 8554; 0 = any)")
    srv.add_argument("--fps", type=float, help="frames per second (default: each file's own)")
    srv.set_defaults(handler=_cmd_serve)

    rpt = sub.add_parser(
        "report",
        help="latency report of a run folder (HTML, JSON, CSV, Perfetto trace), or compare two",
        description="Write the latency report of a run folder, from its frames.csv, load.csv "
        "and run.json, into that folder.",
        epilog=_REPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rpt.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder (runs/<name>)")
    rpt.add_argument(
        "--format",
        dest="report",
        default="html,json,csv,trace",
        help="comma-separated: html, json, csv, trace (default all)",
    )
    rpt.add_argument(
        "--budget-ms",
        type=float,
        default=100.0,
        help="latency budget for deadline misses (default 100)",
    )
    rpt.add_argument(
        "--compare",
        type=Path,
        metavar="RUN_B",
        help="compare RUN_DIR (A) with RUN_B: key figures with ratios B/A, compare-<B>.html",
    )
    rpt.set_defaults(handler=_cmd_report)
    return parser


def _add_run_args(p: argparse.ArgumentParser, *, default_name: str) -> None:
    """Outputs, report, live options: the flags replay and live share."""
    p.add_argument("--out", type=Path, help="folder for run folders (default runs/)")
    p.add_argument("--name", help=f"run folder name (default {default_name})")
    p.add_argument(
        "--save-video",
        action="store_const",
        const=True,
        help="also write annotated videos, one per camera",
    )
    p.add_argument(
        "--mosaic",
        action="store_const",
        const=True,
        help="with --save-video: one tiled video of all cameras instead",
    )
    _add_report_args(p)
    p.add_argument(
        "--no-report",
        action="store_const",
        const="",
        dest="report",
        help="skip the latency report (it can be written later with drivepercept report)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument(
        "--show",
        action="store_true",
        help="a live window: every camera tiled with boxes, fps and latency (q to stop)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics during the run",
    )
    p.add_argument(
        "--metrics-linger-s",
        type=float,
        default=0.0,
        help="keep /metrics up this long after the run, for a last scrape (default 0)",
    )
    p.add_argument(
        "--reconnect-initial-s",
        type=float,
        default=0.25,
        help="live: first wait before reconnecting (doubles up to --reconnect-max-s)",
    )
    p.add_argument("--reconnect-max-s", type=float, default=4.0, help="live: longest wait (4)")
    p.add_argument(
        "--reconnect-attempts",
        type=int,
        default=8,
        help="live: failures in a row before a camera is failed for good, 0 = never (8)",
    )
    p.add_argument(
        "--open-timeout-s",
        type=float,
        default=5.0,
        help="live: how long one connection attempt may take (default 5; a stop waits for "
        "an attempt in progress)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=float,
        default=2.0,
        help="live: a stream silent this long counts as lost (default 2)",
    )


def _add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-ms",
        type=float,
        help="latency budget of the report's deadline-miss rate (default 100)",
    )
    p.add_argument(
        "--report",
        metavar="FORMATS",
        help="report files written at the end: html,json,csv,trace (default all)",
    )


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


def _options(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Sources and settings: the --config file first, then the flags on top."""
    settings: dict[str, Any] = {}
    if args.config is not None:
        raw = load_pipeline_toml(args.config)
        unknown = sorted(set(raw) - _PIPELINE_KEYS - _REPLAY_KEYS - {"sources"})
        if unknown:
            raise ConfigError(f"config file {args.config}: unknown keys {unknown}")
        settings.update(raw)
    for key in (*_PIPELINE_KEYS, *_REPLAY_KEYS):
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    sources = [*settings.pop("sources", []), *(args.sources or [])]
    if args.rig:
        sources.insert(0, args.rig)
    if not sources:
        raise ConfigError("give at least one SOURCE (rig.toml, video file or image folder)")
    return tuple(str(s) for s in sources), settings


def _pipeline_config(settings: dict[str, Any]) -> PipelineConfig:
    try:
        return PipelineConfig(**{k: v for k, v in settings.items() if k in _PIPELINE_KEYS})
    except TypeError as exc:
        raise ConfigError(f"bad pipeline setting: {exc}") from None


def _report_options(settings: dict[str, Any]) -> dict[str, Any]:
    from drivepercept.report import ALL_FORMATS, DEFAULT_BUDGET_MS, parse_formats

    text = settings.get("report")
    formats = ALL_FORMATS if text is None else (parse_formats(text) if text else ())
    budget_ms = float(settings.get("budget_ms", DEFAULT_BUDGET_MS))
    if not budget_ms > 0:
        raise ConfigError(f"--budget-ms must be > 0, got {budget_ms:g}")
    return {"report_formats": formats, "budget_ms": budget_ms}


def _print_report(report: ReportResult) -> None:
    names = ", ".join(p.name for p in report.files)
    print(f"report: {names} in {report.run_dir}")
    s = report.summary
    e2e, deadline = s["end_to_end_ms"], s["deadline"]
    if e2e["count"]:
        print(
            f"end-to-end p50 {e2e['p50_ms']:.1f} ms, p99 {e2e['p99_ms']:.1f} ms; "
            f"{deadline['misses']}/{deadline['frames']} frames over {deadline['budget_ms']:g} ms"
        )
    reason = s["load"]["gpu_unavailable"]
    if reason:
        print(f"GPU metrics unavailable: {reason}")


def status_line(view: LiveView, names: Sequence[str]) -> str:
    """Per-camera fps and p95 latency over the last second, and the load: one line."""
    cams = " ".join(
        f"{name} {fps:.1f}/{'-' if math.isnan(p95) else f'{p95:.0f}'}"
        for name, fps, p95 in zip(names, view.fps, view.p95_ms, strict=True)
    )
    load = view.load
    if load is None:
        tail = ""
    elif load.gpus:
        tail = " | " + " ".join(
            f"GPU{k} {g.util_pct:.0f}% {g.mem_used_bytes / 2**20:.0f} MB"
            for k, g in enumerate(load.gpus)
        )
    else:
        tail = f" | CPU {load.system_cpu_pct:.0f}% of {len(load.per_core_cpu_pct)} cores"
    return f"fps/p95 ms: {cams}{tail}"


class _Progress:
    """Progress on stderr: a bar and, once a second, a status line (per-camera fps and p95
    latency over the last second, GPU or CPU load). Drawn in place on a terminal; with
    `log_status` and no terminal, the status line is logged once a second instead."""

    def __init__(self, *, enabled: bool, log_status: bool = False) -> None:
        self.total: int | None = None
        self.enabled = enabled
        self.log_status = log_status and not enabled
        self.started = time.monotonic()
        self.last_status = 0.0
        self.status = ""
        self.drawn = False

    def __call__(self, pipeline: Pipeline) -> None:
        if not (self.enabled or self.log_status):
            return
        now = time.monotonic()
        if now - self.last_status >= 1.0:
            self.last_status = now
            self.status = status_line(pipeline.live_view(), pipeline.names)
            if self.log_status:
                log.info("%s", self.status)
        if not self.enabled:
            return
        if self.total is None:
            self.total = pipeline.expected_frames()
        done = sum(pipeline.frames_done())
        elapsed = max(now - self.started, 1e-9)
        if self.total and self.total > 0:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"[{bar:<30}] {done}/{self.total} frames"
        else:
            text = f"{done} frames"
        # two lines, redrawn in place: the bar, then the status line; the cursor goes back up
        sys.stderr.write(
            f"\r\x1b[K{text}  {done / elapsed:6.1f} frames/s\n\x1b[K{self.status}\x1b[1A\r"
        )
        sys.stderr.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.enabled and self.drawn:
            sys.stderr.write("\n\n")


def _summary_table(result: ReplayResult) -> str:
    width = max(6, *(len(c.name) for c in result.stats.cameras))
    rows = [
        f"{'camera':<{width}} {'frames':>7} {'fps':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    ]
    for cam in result.stats.cameras:
        lat = cam.latency_ms
        p50, p95, p99 = (
            "-" if math.isnan(lat[k]) else f"{lat[k]:.1f}" for k in ("p50", "p95", "p99")
        )
        rows.append(
            f"{cam.name:<{width}} {cam.frames:>7d} {cam.fps:>7.1f} {p50:>8} {p95:>8} {p99:>8}"
        )
    s = result.stats
    rows.append(
        f"{'all':<{width}} {s.frames:>7d} {s.throughput_fps:>7.1f}   "
        f"({s.batches} batches, {s.partial_batches} partial, mean size "
        f"{s.mean_batch_size:.2f}, device {s.device})"
    )
    return "\n".join(rows)


def _cmd_replay(args: argparse.Namespace) -> int:
    from drivepercept.replay import ReplayOptions, resolve_cameras

    sources, settings = _options(args)
    if args.realtime:
        _live_defaults(settings)
    options = ReplayOptions(
        sources=sources,
        model=settings.get("model", DEFAULT_MODEL),
        weights=settings.get("weights", "DEFAULT"),
        pipeline=_pipeline_config(settings),
        out_root=Path(settings.get("out", "runs")),
        name=settings.get("name"),
        save_video=bool(settings.get("save_video", False)),
        mosaic=bool(settings.get("mosaic", False)),
        mode="realtime" if args.realtime else "replay",
        **_report_options(settings),
        **_live_options(args),
    )
    resolve_cameras(options.sources)  # fail fast on bad sources, before loading a model
    result = _run_with_progress(args, options)
    if result.error:
        print(f"drivepercept {args.command}: error: {result.error}", file=sys.stderr)
        return EXIT_ERROR
    if result.stats.interrupted:
        print("interrupted: outputs hold the frames processed so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    short = result.short_cameras
    if short:
        what = ", ".join(f"{c.name} after {c.frames} frames ({c.short_by} missing)" for c in short)
        print(
            f"drivepercept replay: error: video ended early (truncated?): {what}; every "
            f"decodable frame was processed, see {result.run_dir}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


def _live_defaults(settings: dict[str, Any]) -> None:
    """Live policies: the newest frame of each camera, drops counted, and no batch waiting
    behind the ones in flight (on a CPU, where nothing overlaps, one batch in flight)."""
    from drivepercept.engine.device import resolve_device

    settings.setdefault("drop_policy", "drop_oldest")
    settings.setdefault("queue_capacity", 1)
    cpu = resolve_device(settings.get("device", "auto")).type == "cpu"
    settings.setdefault("max_in_flight", 1 if cpu else 2)
    settings.setdefault("ring_slots", settings["max_in_flight"] + (0 if cpu else 1))


def _live_options(args: argparse.Namespace) -> dict[str, Any]:
    from drivepercept.config import ReconnectPolicy

    if args.metrics_linger_s < 0:
        raise ConfigError(f"--metrics-linger-s must be >= 0, got {args.metrics_linger_s:g}")
    return {
        "show": _can_show(args.show),
        "duration_s": args.duration,
        "metrics_port": args.metrics_port,
        "metrics_linger_s": args.metrics_linger_s,
        "reconnect": ReconnectPolicy(
            initial_s=args.reconnect_initial_s,
            max_s=args.reconnect_max_s,
            max_attempts=args.reconnect_attempts,
            open_timeout_s=args.open_timeout_s,
            read_timeout_s=args.read_timeout_s,
        ),
    }


def _can_show(wanted: bool) -> bool:
    """--show only where there is a display: OpenCV's Qt GUI aborts the whole process when it
    finds none, so without one the run goes on without a window (and says so)."""
    if not wanted:
        return False
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        log.warning("--show: no display (DISPLAY is not set); running without a window")
        return False
    return True


def _run_with_progress(args: argparse.Namespace, options: ReplayOptions) -> ReplayResult:
    """Run with the progress display; SIGTERM stops it like Ctrl-C (drain, then outputs)."""
    from drivepercept.replay import run_replay

    bar = _Progress(enabled=not args.no_progress and sys.stderr.isatty(), log_status=args.verbose)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run_replay(options, progress=bar)
    finally:
        signal.signal(signal.SIGTERM, previous)
    bar.finish()
    print(_summary_table(result))
    print(f"run folder: {result.run_dir}")
    if result.report is not None:
        _print_report(result.report)
    return result


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cmd_live(args: argparse.Namespace) -> int:
    from drivepercept.replay import ReplayOptions, resolve_live_cameras

    args.sources = [*(args.sources or []), *args.camera]
    items, settings = _options(args)
    _live_defaults(settings)
    cams = resolve_live_cameras(items)
    options = ReplayOptions(
        sources=items,
        cameras=cams,
        model=settings.get("model", DEFAULT_MODEL),
        weights=settings.get("weights", "DEFAULT"),
        pipeline=_pipeline_config(settings),
        out_root=Path(settings.get("out", "runs")),
        name=settings.get("name") or time.strftime("live-%Y%m%d-%H%M%S"),
        save_video=bool(settings.get("save_video", False)),
        mosaic=bool(settings.get("mosaic", False)),
        mode="live",
        **_report_options(settings),
        **_live_options(args),
    )
    result = _run_with_progress(args, options)
    if result.error:
        print(f"drivepercept live: error: {result.error}", file=sys.stderr)
        return EXIT_ERROR
    if result.stats.interrupted:
        print("interrupted: outputs hold the frames processed so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.failed_cameras:
        print(
            f"drivepercept live: error: camera(s) failed for good: "
            f"{', '.join(result.failed_cameras)} (the others ran; see {result.run_dir})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


def _cmd_eval(args: argparse.Namespace) -> int:
    from drivepercept.eval import (
        EvalThresholds,
        clip_paths,
        evaluate,
        load_ground_truth,
        read_detections,
        write_report,
    )
    from drivepercept.replay import ReplayOptions, resolve_cameras, run_replay

    thresholds = EvalThresholds(
        min_visibility=args.min_visibility, min_height_px=args.min_height_px
    )
    if len(args.sources or []) + bool(args.rig) != 1:
        raise ConfigError("eval takes exactly one clip (a folder or its rig.toml)")
    rig, gt_path = clip_paths(args.rig or args.sources[0], args.ground_truth)
    args.sources, args.rig = [str(rig)], None
    sources, settings = _options(args)
    # AP integrates over the whole precision-recall curve: keep low-scoring boxes
    settings.setdefault("score_threshold", 0.05)
    if settings.setdefault("drop_policy", "block") != "block":
        raise ConfigError("eval scores every frame: drop_policy must be 'block'")
    cams = resolve_cameras(sources)
    ground_truth = load_ground_truth(gt_path, cameras=[c.name for c in cams])
    options = ReplayOptions(
        sources=sources,
        model=settings.get("model", DEFAULT_MODEL),
        weights=settings.get("weights", "DEFAULT"),
        pipeline=_pipeline_config(settings),
        out_root=Path(settings.get("out", "runs")),
        name=settings.get("name") or time.strftime("eval-%Y%m%d-%H%M%S"),
    )
    bar = _Progress(enabled=not args.no_progress and sys.stderr.isatty())
    result = run_replay(options, progress=bar)
    bar.finish()
    if result.stats.interrupted:
        print("interrupted: no evaluation", file=sys.stderr)
        return EXIT_INTERRUPTED
    # Every ground-truth frame of the replayed cameras (up to --max-frames) is scored: a
    # frame the pipeline did not emit (a truncated video, say) counts as all misses.
    limit = options.pipeline.max_frames
    names = {c.name for c in cams}
    wanted = [
        (str(im["camera"]), int(im["frame_index"]))
        for im in ground_truth["images"]
        if im["camera"] in names and (not limit or int(im["frame_index"]) < limit)
    ]
    report = evaluate(
        ground_truth,
        read_detections(result.run_dir / "detections.jsonl"),
        thresholds=thresholds,
        images=wanted,
    )
    write_report(
        report,
        result.run_dir / "eval.json",
        extra={
            "model": options.model,
            "weights": options.weights,
            "clip": str(rig),
            "ground_truth": str(gt_path),
            "run_dir": str(result.run_dir),
            "device": result.stats.device,
            "pipeline": dataclasses.asdict(options.pipeline),
        },
    )
    print(report.table())
    print(f"run folder: {result.run_dir}")
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    from drivepercept.bench import bench
    from drivepercept.models import load_detector
    from drivepercept.replay import resolve_cameras

    sources, settings = _options(args)
    if args.frames < 1 or args.rounds < 1:
        raise ConfigError(f"--frames and --rounds must be >= 1, got {args.frames}, {args.rounds}")
    cams = resolve_cameras(sources)
    detector = load_detector(
        settings.get("model", DEFAULT_MODEL), weights=settings.get("weights", "DEFAULT")
    )
    result = bench(
        cams,
        detector,
        _pipeline_config(settings),
        frames_per_camera=args.frames,
        rounds=args.rounds,
    )
    print(
        f"model {detector.name}, input {detector.input.size[0]}x{detector.input.size[1]}, "
        f"{len(cams)} cameras"
    )
    print(result.table())
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    import threading

    from drivepercept.sim.serve import CameraServer, cameras_from_sources, serve_forever

    server = CameraServer(cameras_from_sources(args.sources), port=args.port, fps=args.fps)
    server.start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for cam in server.cameras:
        print(f"{cam.name}: {server.url(cam.name)} ({cam.fps:g} fps, {cam.path})", flush=True)
    try:
        serve_forever(server, stop=stop)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.close()
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from drivepercept.report import parse_formats, write_comparison, write_report

    formats = parse_formats(args.report)
    if args.compare is not None:
        comparison = write_comparison(args.run_dir, args.compare, budget_ms=args.budget_ms)
        print(comparison.text)
        print(f"comparison: {comparison.html}")
        problems = comparison.problems
    else:
        report = write_report(args.run_dir, formats=formats, budget_ms=args.budget_ms)
        _print_report(report)
        problems = report.problems
    if problems:
        more = f" (and {len(problems) - 1} more, listed in the report)" if len(problems) > 1 else ""
        print(
            f"drivepercept report: error: the report covers what is there, but {problems[0]}{more}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drivepercept` console script and `python -m drivepercept`."""
    parser = _build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not (args.verbose or args.debug):
        # OpenCV and FFmpeg print their own warnings for every bad or truncated file; our
        # errors already say what went wrong in one line. Set before OpenCV is first used.
        os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
        os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except DrivePerceptError as exc:
        if args.debug:
            raise
        print(f"drivepercept {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"drivepercept {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run() -> NoReturn:
    """The console script: `main()`, then a fast exit.

    Every output is closed by the time `main()` returns; what is left is the interpreter's
    teardown of torch's and OpenCV's native libraries, which takes about a second on the
    development machine (measured: 1.0-1.4 s) and would delay the end of a run stopped with
    Ctrl-C. So the streams and logging are flushed and the process exits at once.
    """
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
