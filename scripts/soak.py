"""Soak: served cameras read live for a long time with the default model, checked for leaks.

Serves the bundled sample clips as live MJPEG cameras (`drivepercept.sim.serve.CameraServer`,
looped, on 127.0.0.1), runs the live pipeline over their URLs in this process through the
Python API (`drivepercept.run.run`, `Mode.LIVE`, the default model), samples the process
every few seconds from a `soak-sampler` thread, and then checks:

* threads: no leak. The Python threads after the run are exactly those before it, by name
  (the camera server's own are in both; its per-client handlers, which end when our client
  leaves, are waited out); the OS threads (psutil: also torch's and FFmpeg's native
  workers) are the same number too. The baseline is taken with the model loaded and run
  once, so torch's intra-op worker, which lives as long as the process by design, is in
  it; the run itself keeps no thread.
* memory: RSS growth from the end of warm-up (the first minute, or the first 10 % of a
  shorter run) to the last sample of the run is under --rss-limit-mb.
* latency: p99 end to end (capture -> emitted, frames.csv) of the last window (a minute, or a
  third of a shorter run) is within --latency-ratio of the first window's.
* accounting, per camera: every frame the server wrote to our client is accounted for.

      served  =  read + unread
      read    =  processed + dropped + discarded   (the pipeline's own counters)

  served is what the server's handler wrote to the socket (`CameraServer.frames_sent`). read
  is what the decoder thread took from FFmpeg (run.json live.frames_received); processed,
  dropped and discarded (read, neither emitted nor dropped: in flight at a hard stop) are
  the run's per-camera statistics. unread is what was written to the socket but never
  read: frames in the loopback socket buffers and FFmpeg's input buffer when capture
  stopped (or when a connection broke: those are the frames lost in an outage; frames the
  camera made while no connection was up were never served and are counted apart, as the
  product's outage estimate). The check is 0 <= unread <= tolerance x connections: each
  connection's end may strand up to `tolerance` frames in its buffers. The sampler also
  measures served - read while the run goes, so the backlog in transit is in the output.

Exit status 0 when every criterion passes, 1 when one fails, 2 when the run cannot start.

    python3 scripts/soak.py --duration 600 --out /tmp/soak      # the soak: 10 minutes
    python3 scripts/soak.py --duration 90 --out /tmp/soak90     # a quick look
"""

from __future__ import annotations

import argparse
import collections
import csv
import itertools
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

if TYPE_CHECKING:
    from drivepercept.models.base import Detector
    from drivepercept.pipeline import Pipeline
    from drivepercept.sim.serve import CameraServer

ROOT = Path(__file__).resolve().parents[1]
RIG = ROOT / "sample_videos" / "rig.toml"
SHARED_ONNX = ROOT.parent / "shared" / "models" / "yolox_nano" / "yolox_nano.onnx"
MB = 1024 * 1024
CLIENTS_GONE_S = 5.0  # how long the server's client handlers may take to notice we left

log = logging.getLogger("soak")


# ---------------------------------------------------------------------- pure pieces


@dataclass(frozen=True)
class Criterion:
    """One pass/fail check: what was measured against what was allowed."""

    name: str
    value: str
    limit: str
    passed: bool


@dataclass(frozen=True)
class LatencyWindows:
    """p99 end-to-end latency of the first and of the last `window_s` of capture time."""

    window_s: float
    first_p99_ms: float
    last_p99_ms: float
    first_frames: int
    last_frames: int

    @property
    def ratio(self) -> float:
        if not self.first_p99_ms > 0:
            return math.nan
        return self.last_p99_ms / self.first_p99_ms


def window_s_for(span_s: float, window_s: float) -> float:
    """The latency window: `window_s`, or a third of a run too short for two whole windows
    apart from each other (so the first and the last window never overlap)."""
    return min(window_s, span_s / 3.0) if span_s > 0 else window_s


def latency_windows(
    capture_ns: Sequence[int], end_to_end_ms: Sequence[float], *, window_s: float
) -> LatencyWindows:
    """p99 of the frames captured in the first and in the last window of the capture span
    (the span runs from the first to the last capture of any camera).

    Raises:
        ValueError: no frames, or the two sequences differ in length.
    """
    if len(capture_ns) != len(end_to_end_ms) or not capture_ns:
        raise ValueError(
            f"expected as many latencies as capture times (> 0), got {len(end_to_end_ms)} "
            f"and {len(capture_ns)}"
        )
    t = np.asarray(capture_ns, dtype=np.int64)
    e2e = np.asarray(end_to_end_ms, dtype=np.float64)
    rel_s = (t - t.min()) / 1e9
    span_s = float(rel_s.max())
    w = window_s_for(span_s, window_s)
    first = e2e[rel_s < w]
    last = e2e[rel_s > span_s - w]
    return LatencyWindows(
        window_s=w,
        first_p99_ms=float(np.percentile(first, 99)) if first.size else math.nan,
        last_p99_ms=float(np.percentile(last, 99)) if last.size else math.nan,
        first_frames=int(first.size),
        last_frames=int(last.size),
    )


@dataclass(frozen=True)
class RssGrowth:
    """RSS when warm-up ended and at the last sample of the run, in MB."""

    warmup_s: float
    after_warmup_mb: float
    end_mb: float
    max_mb: float

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.after_warmup_mb


def warmup_s_for(duration_s: float, warmup_s: float | None = None) -> float:
    """The memory warm-up: as given, else the first minute, or the first 10 % of a run
    shorter than 10 minutes."""
    if warmup_s is not None:
        return warmup_s
    return 60.0 if duration_s >= 600.0 else 0.1 * duration_s


def rss_growth(samples: Sequence[tuple[float, float]], *, warmup_s: float) -> RssGrowth:
    """(t_s, rss_mb) samples in time order -> the RSS at the first sample at or after
    `warmup_s` and at the last one.

    Raises:
        ValueError: no sample at or after the warm-up.
    """
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if not after:
        last = samples[-1][0] if samples else None
        raise ValueError(f"expected a sample at or after {warmup_s:g} s, the last is at {last}")
    return RssGrowth(
        warmup_s=warmup_s,
        after_warmup_mb=after[0][1],
        end_mb=after[-1][1],
        max_mb=max(rss for _, rss in samples),
    )


@dataclass(frozen=True)
class Accounting:
    """Where one camera's served frames went (see the module docstring)."""

    camera: str
    served: int  # written by the server to our client's socket(s)
    read: int  # taken from FFmpeg by the decoder thread
    processed: int
    dropped: int
    discarded: int
    connects: int
    tolerance: int  # frames one connection may leave unread in its buffers

    @property
    def unread(self) -> int:
        """Served, never read: in socket / FFmpeg buffers at the stop or at a broken link."""
        return self.served - self.read

    @property
    def pipeline_balanced(self) -> bool:
        """read = processed + dropped + discarded: the pipeline lost no frame it read."""
        return self.read == self.processed + self.dropped + self.discarded

    @property
    def allowed_unread(self) -> int:
        return self.tolerance * max(1, self.connects)

    @property
    def passed(self) -> bool:
        return self.pipeline_balanced and 0 <= self.unread <= self.allowed_unread


@dataclass(frozen=True)
class ThreadCheck:
    """Thread counts around the run: Python threads by name, and the OS's count."""

    before_names: tuple[str, ...]
    after_names: tuple[str, ...]
    before_os: int
    after_os: int
    during_max_py: int
    during_max_os: int

    @property
    def leaked(self) -> list[str]:
        """Python threads alive after the run that were not before it."""
        extra = collections.Counter(self.after_names) - collections.Counter(self.before_names)
        return sorted(extra.elements())

    @property
    def gone(self) -> list[str]:
        """Python threads alive before the run that are not after it."""
        missing = collections.Counter(self.before_names) - collections.Counter(self.after_names)
        return sorted(missing.elements())

    @property
    def passed(self) -> bool:
        return not self.leaked and not self.gone and self.after_os == self.before_os


def criteria(
    *,
    threads: ThreadCheck,
    rss: RssGrowth,
    latency: LatencyWindows,
    accounting: Sequence[Accounting],
    rss_limit_mb: float,
    latency_ratio: float,
    run_status: str,
    threads_not_stopped: Sequence[str],
) -> list[Criterion]:
    """Every pass/fail check of a soak, in the order they are printed."""
    out = [
        Criterion("run completed", run_status, "complete", run_status == "complete"),
        Criterion(
            "pipeline threads stopped",
            ", ".join(threads_not_stopped) or "all",
            "all",
            not threads_not_stopped,
        ),
        Criterion(
            "no thread leak (python)",
            f"before {len(threads.before_names)}, after {len(threads.after_names)}"
            + (f", new {threads.leaked}" if threads.leaked else "")
            + (f", gone {threads.gone}" if threads.gone else ""),
            "after == before",
            not threads.leaked and not threads.gone,
        ),
        Criterion(
            "no thread leak (os)",
            f"before {threads.before_os}, after {threads.after_os}",
            "after == before",
            threads.after_os == threads.before_os,
        ),
        Criterion(
            "rss growth after warm-up",
            f"{rss.growth_mb:+.1f} MB ({rss.after_warmup_mb:.1f} -> {rss.end_mb:.1f})",
            f"< {rss_limit_mb:g} MB",
            rss.growth_mb < rss_limit_mb,
        ),
        Criterion(
            "p99 latency last / first window",
            f"{latency.ratio:.3f} ({latency.last_p99_ms:.1f} / {latency.first_p99_ms:.1f} ms, "
            f"{latency.window_s:.0f} s windows)",
            f"<= {latency_ratio:g}",
            latency.ratio <= latency_ratio,  # NaN fails
        ),
    ]
    for a in accounting:
        out.append(
            Criterion(
                f"frames accounted for: {a.camera}",
                f"served {a.served} = processed {a.processed} + dropped {a.dropped} "
                f"+ discarded {a.discarded} + unread {a.unread}",
                f"read balanced, 0 <= unread <= {a.allowed_unread}",
                a.passed,
            )
        )
    return out


def camera_pairs(videos: Sequence[tuple[str, Path]], count: int) -> list[tuple[str, Path]]:
    """`count` (name, video) cameras from the given clips, reusing them in turn when there are
    fewer (a reused clip's camera is named <name>-2, <name>-3, ...)."""
    if not videos or count < 1:
        raise ValueError(f"expected >= 1 clip and >= 1 camera, got {len(videos)} and {count}")
    out = []
    for k, (name, path) in zip(range(count), itertools.cycle(videos)):
        lap = k // len(videos)
        out.append((name if lap == 0 else f"{name}-{lap + 1}", path))
    return out


def read_latencies(frames_csv: Path) -> tuple[list[int], list[float]]:
    """(capture_ns, end_to_end_ms) of every row of a run's frames.csv."""
    capture, e2e = [], []
    with frames_csv.open(newline="") as fh:
        for row in csv.DictReader(fh):
            capture.append(int(row["capture_ns"]))
            e2e.append(float(row["end_to_end_ms"]))
    return capture, e2e


# ---------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class CameraSample:
    name: str
    served: int
    read: int
    processed: int
    dropped: int
    state: str

    @property
    def in_transit(self) -> int:
        """Served and not read yet at this sample (read a moment after served)."""
        return self.served - self.read


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the run was started
    rss_mb: float
    py_threads: int
    os_threads: int
    cameras: tuple[CameraSample, ...] = field(default=())

    @property
    def processed(self) -> int:
        return sum(c.processed for c in self.cameras)


class Sampler:
    """Samples this process and the run every `every_s` on its own `soak-sampler` thread.

    The pipeline is handed over by `attach` (the run's progress callback, called on the main
    thread every half second once capture has started); `Pipeline.cameras()` and the
    server's counters are thread-safe reads.
    """

    def __init__(self, server: CameraServer, *, every_s: float) -> None:
        self._process = psutil.Process()
        self._server = server
        self._every_s = every_s
        self._pipeline: Pipeline | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self.capture_started_s: float | None = None  # since start(): the first progress call
        self.samples: list[Sample] = []
        self.thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def attach(self, pipeline: Pipeline) -> None:
        if self._pipeline is None:
            self.capture_started_s = time.monotonic() - self._t0
        self._pipeline = pipeline

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10.0)
        if self.thread.is_alive():
            log.error("the soak-sampler thread did not stop")

    def take(self) -> Sample:
        cams: tuple[CameraSample, ...] = ()
        if self._pipeline is not None:
            cams = tuple(
                CameraSample(
                    name=s.name,
                    served=self._server.frames_sent(s.name),
                    read=s.read,
                    processed=s.frames,
                    dropped=s.dropped,
                    state=s.state.value,
                )
                for s in self._pipeline.cameras()
            )
        return Sample(
            t_s=round(time.monotonic() - self._t0, 3),
            rss_mb=round(self._process.memory_info().rss / MB, 2),
            py_threads=threading.active_count(),
            os_threads=self._process.num_threads(),
            cameras=cams,
        )

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                sample = self.take()
            except Exception:  # a failed sample must not end the soak; it is logged
                log.exception("sample failed")
                continue
            self.samples.append(sample)
            log.info(
                "t=%6.0f s  rss %7.1f MB  threads %3d py / %3d os  processed %7d  in transit %s",
                sample.t_s,
                sample.rss_mb,
                sample.py_threads,
                sample.os_threads,
                sample.processed,
                [c.in_transit for c in sample.cameras],
            )


# ---------------------------------------------------------------------- the soak


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="examples:\n  python3 scripts/soak.py --duration 600 --out /tmp/soak\n"
        "  python3 scripts/soak.py --duration 90 --out /tmp/soak90",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds live (600)")
    parser.add_argument("--out", type=Path, required=True, help="folder for soak.json and run")
    parser.add_argument("--cameras", type=int, default=6, help="served cameras (6)")
    parser.add_argument("--fps", type=float, default=15.0, help="pace of each camera (15)")
    parser.add_argument("--model", default=None, help="model (the product's default model)")
    parser.add_argument(
        "--weights",
        default=None,
        help=f"weights file, or 'none' (default: {SHARED_ONNX} if there, else none)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (auto)")
    parser.add_argument("--rig", type=Path, default=RIG, help="the clips to serve (sample rig)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="sampling period (5)")
    parser.add_argument(
        "--warmup-s", type=float, default=None, help="RSS warm-up (60, or 10%% of a short run)"
    )
    parser.add_argument("--window-s", type=float, default=60.0, help="latency window (60)")
    parser.add_argument("--rss-limit-mb", type=float, default=50.0, help="RSS growth limit (50)")
    parser.add_argument(
        "--latency-ratio", type=float, default=1.2, help="p99 last/first window limit (1.2)"
    )
    parser.add_argument(
        "--tolerance-frames",
        type=int,
        default=3,
        help="frames one connection may leave unread in its buffers at its end (3)",
    )
    return parser


def _python_threads() -> tuple[str, ...]:
    return tuple(sorted(t.name for t in threading.enumerate()))


def _os_threads(process: psutil.Process, *, readings: int = 10, every_s: float = 0.1) -> int:
    """The process's OS thread count, the most common of a few readings: a served camera
    that reaches the end of its clip reopens it, and its FFmpeg decoder threads come and go
    for a moment."""
    counts = []
    for k in range(readings):
        if k:
            time.sleep(every_s)
        counts.append(int(process.num_threads()))
    return collections.Counter(counts).most_common(1)[0][0]


def _wait_clients_gone(server: CameraServer, names: Sequence[str]) -> bool:
    """Wait for the server's client handlers to notice our client left (they do at their
    next write, within a frame period); False if some are still there after CLIENTS_GONE_S."""
    deadline = time.monotonic() + CLIENTS_GONE_S
    while time.monotonic() < deadline:
        handlers = [t for t in threading.enumerate() if t.name.startswith("serve-client-")]
        if not handlers and all(server.clients(n) == 0 for n in names):
            return True
        time.sleep(0.05)
    return False


def _prime(detector: Detector) -> None:
    """One batch through the model before the thread baseline, so that torch's intra-op pool
    (native threads that live as long as the process, by design) is in it whichever torch
    build creates it lazily. (This torch makes it when the model is loaded.)"""
    import torch

    width, height = detector.input.size
    with torch.inference_mode():
        detector.module(torch.zeros((1, 3, height, width)))


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity turned into None (soak.json is strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass
class Outcome:
    """Everything measured, ready for soak.json."""

    settings: dict[str, Any]
    threads: ThreadCheck
    rss: RssGrowth
    rss_after_run_mb: float
    latency: LatencyWindows
    accounting: list[Accounting]
    extra: dict[str, Any]
    samples: list[Sample]
    criteria: list[Criterion]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)

    def to_json(self) -> dict[str, Any]:
        samples = [
            {**asdict(s), "cameras": [{**asdict(c), "in_transit": c.in_transit} for c in s.cameras]}
            for s in self.samples
        ]
        data = {
            "passed": self.passed,
            "settings": self.settings,
            "criteria": [asdict(c) for c in self.criteria],
            "threads": {
                **asdict(self.threads),
                "leaked": self.threads.leaked,
                "gone": self.threads.gone,
            },
            "rss": {
                **asdict(self.rss),
                "growth_mb": round(self.rss.growth_mb, 2),
                "after_run_mb": self.rss_after_run_mb,
            },
            "latency": {**asdict(self.latency), "ratio": round(self.latency.ratio, 4)},
            "accounting": [
                {
                    **asdict(a),
                    "unread": a.unread,
                    "allowed_unread": a.allowed_unread,
                    "pipeline_balanced": a.pipeline_balanced,
                    "passed": a.passed,
                }
                for a in self.accounting
            ],
            **self.extra,
            "samples": samples,
        }
        out: dict[str, Any] = _finite(data)
        return out


def in_transit(samples: Sequence[Sample]) -> dict[str, dict[str, int]]:
    """Per camera, the served-but-unread backlog seen while the run went: max and median."""
    by_cam: dict[str, list[int]] = collections.defaultdict(list)
    for s in samples:
        for c in s.cameras:
            by_cam[c.name].append(c.in_transit)
    return {
        name: {"max": max(v), "median": int(np.median(v)), "samples": len(v)}
        for name, v in by_cam.items()
    }


def _weights(given: str | None) -> tuple[str, str]:
    """(weights, what they are): as given, else the shared ONNX export, else random."""
    if given is not None:
        return given, "as given"
    if SHARED_ONNX.is_file():
        return str(SHARED_ONNX), "the shared YOLOX-nano ONNX export"
    log.warning("no weights at %s: the model runs with RANDOM weights", SHARED_ONNX)
    return "none", f"RANDOM weights ({SHARED_ONNX} not found)"


def soak(args: argparse.Namespace) -> Outcome:
    """Serve, run live, sample, measure (see the module docstring).

    Raises:
        DrivePerceptError: the cameras cannot be served or the run cannot start.
    """
    from drivepercept.run import DEFAULT_MODEL, Mode, RunOptions, run
    from drivepercept.run.job import load_model
    from drivepercept.sim.serve import CameraServer, cameras_from_sources

    weights, weights_note = _weights(args.weights)
    model = args.model or DEFAULT_MODEL
    cams = camera_pairs(cameras_from_sources([str(args.rig)]), args.cameras)
    names = [n for n, _ in cams]
    process = psutil.Process()
    load_before = os.getloadavg()
    with CameraServer(cams, fps=args.fps) as server:
        options = RunOptions(
            sources=tuple(f"{n}={server.url(n)}" for n in names),
            mode=Mode.LIVE,
            model=model,
            weights=weights,
            settings={"device": args.device},
            out_root=args.out,
            name="live-soak",
            duration_s=args.duration,
        )
        # The product's own loading (run() would call the same), done first so that the
        # thread baseline is taken with the model, and its native pools, in place.
        detector = load_model(options)
        _prime(detector)
        before_names, before_os = _python_threads(), _os_threads(process)
        sampler = Sampler(server, every_s=args.sample_s)
        sampler.start()
        try:
            result = run(options, detector=detector, progress=sampler.attach)
        finally:
            last = sampler.take()  # the run is over: threads as the run left them
            sampler.stop()
        clients_gone = _wait_clients_gone(server, names)
        after_names, after_os = _python_threads(), _os_threads(process)
        served = {n: server.frames_sent(n) for n in names}
        skipped = {n: server.frames_skipped(n) for n in names}
        published = {n: server.frames_published(n) for n in names}
    load_after = os.getloadavg()
    rss_after_run_mb = round(process.memory_info().rss / MB, 2)
    during = list(sampler.samples)
    record = result.record
    live = record.live or {}
    summary = record.summary or {}
    stats = {c.name: c for c in result.stats.cameras}
    accounting = [
        Accounting(
            camera=n,
            served=served[n],
            read=int(live[n]["frames_received"]),
            processed=stats[n].frames,
            dropped=stats[n].dropped,
            discarded=stats[n].discarded,
            connects=int(live[n]["connects"]),
            tolerance=args.tolerance_frames,
        )
        for n in names
    ]
    threads = ThreadCheck(
        before_names=before_names,
        after_names=after_names,
        before_os=before_os,
        after_os=after_os,
        during_max_py=max([s.py_threads for s in during] or [0]),
        during_max_os=max([s.os_threads for s in during] or [0]),
    )
    capture, e2e = read_latencies(result.run_dir / "frames.csv")
    latency = latency_windows(capture, e2e, window_s=args.window_s)
    # memory time runs from the start of capture (model load and the engine's warm-up come
    # before it); the end is the last sample while the pipeline's threads ran: `run` also
    # writes the report (matplotlib plots), whose memory is not the pipeline's
    t0 = sampler.capture_started_s or 0.0
    warmup_s = warmup_s_for(args.duration, args.warmup_s)
    running = [s for s in during if s.py_threads > len(before_names) + 1]  # +1: the sampler
    rss = rss_growth([(s.t_s - t0, s.rss_mb) for s in running], warmup_s=warmup_s)
    checks = criteria(
        threads=threads,
        rss=rss,
        latency=latency,
        accounting=accounting,
        rss_limit_mb=args.rss_limit_mb,
        latency_ratio=args.latency_ratio,
        run_status=record.status,
        threads_not_stopped=summary.get("threads_not_stopped", []),
    )
    settings = {
        "duration_s": args.duration,
        "cameras": names,
        "clips": [str(p) for _, p in cams],
        "fps": args.fps,
        "model": model,
        "weights": weights,
        "weights_note": weights_note,
        "device": record.environment.get("device"),
        "sample_s": args.sample_s,
        "warmup_s": warmup_s,
        "window_s": args.window_s,
        "tolerance_frames": args.tolerance_frames,
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in load_after],
    }
    extra = {
        "run_dir": str(result.run_dir),
        "run_summary": {
            k: summary.get(k)
            for k in ("frames", "elapsed_s", "throughput_fps", "batches", "mean_batch_size")
        },
        "capture_started_s": t0,
        "server": {"published": published, "sent": served, "skipped_slow_client": skipped},
        "outages": {
            n: {k: live[n][k] for k in ("connects", "outage_s", "frames_lost_estimate")}
            for n in names
        },
        "in_transit_during_run": in_transit(during),
        "threads_at_run_end": {"py": last.py_threads, "os": last.os_threads},
        "server_clients_gone": clients_gone,
    }
    return Outcome(
        settings=settings,
        threads=threads,
        rss=rss,
        rss_after_run_mb=rss_after_run_mb,
        latency=latency,
        accounting=accounting,
        extra=extra,
        samples=during,
        criteria=checks,
    )


def table(outcome: Outcome) -> Iterator[str]:
    """The figures and the verdicts, as printed."""
    s = outcome.settings
    t = outcome.threads
    yield (
        f"soak: {len(s['cameras'])} cameras at {s['fps']:g} fps for {s['duration_s']:g} s, "
        f"model {s['model']} ({s['weights_note']}), device {s['device']}, "
        f"load average {s['loadavg_before'][0]:.2f} -> {s['loadavg_after'][0]:.2f} "
        f"on {s['cpu_count']} CPUs"
    )
    summary = outcome.extra["run_summary"]
    yield (
        f"run      {summary['frames']} frames in {summary['elapsed_s']} s "
        f"({summary['throughput_fps']} fps, mean batch {summary['mean_batch_size']}), "
        f"{outcome.extra['run_dir']}"
    )
    yield (
        f"threads  python: before {len(t.before_names)}, during max {t.during_max_py}, "
        f"after {len(t.after_names)}   os: before {t.before_os}, during max "
        f"{t.during_max_os}, after {t.after_os}"
    )
    r = outcome.rss
    yield (
        f"rss      after {r.warmup_s:g} s warm-up {r.after_warmup_mb:.1f} MB, end "
        f"{r.end_mb:.1f} MB, growth {r.growth_mb:+.1f} MB, max {r.max_mb:.1f} MB, "
        f"after the run {outcome.rss_after_run_mb:.1f} MB"
    )
    lat = outcome.latency
    yield (
        f"latency  p99 first {lat.window_s:.0f} s {lat.first_p99_ms:.1f} ms "
        f"({lat.first_frames} frames), last {lat.window_s:.0f} s {lat.last_p99_ms:.1f} ms "
        f"({lat.last_frames} frames), ratio {lat.ratio:.3f}"
    )
    transit = outcome.extra["in_transit_during_run"]
    outages = outcome.extra["outages"]
    skipped = outcome.extra["server"]["skipped_slow_client"]
    yield (
        "frames   served = read + unread; read = processed + dropped + discarded "
        "(unread: written to the socket after the decoder's last read, at the stop or at a "
        "broken connection; allowed: tolerance x connects)"
    )
    yield (
        f"{'camera':<14}{'served':>8}{'read':>8}{'processed':>10}{'dropped':>9}"
        f"{'discarded':>10}{'unread':>8}{'allowed':>8}{'connects':>9}{'transit max':>12}"
        f"{'outage est':>11}{'srv skipped':>12}"
    )
    for a in outcome.accounting:
        yield (
            f"{a.camera:<14}{a.served:>8}{a.read:>8}{a.processed:>10}{a.dropped:>9}"
            f"{a.discarded:>10}{a.unread:>8}{a.allowed_unread:>8}{a.connects:>9}"
            f"{transit.get(a.camera, {}).get('max', 0):>12}"
            f"{outages[a.camera]['frames_lost_estimate']:>11}{skipped[a.camera]:>12}"
        )
    for c in outcome.criteria:
        yield f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.value} (limit {c.limit})"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.duration >= 3 * args.sample_s > 0:
        parser.error(f"expected --duration >= 3 x --sample-s > 0, got {args.duration:g} s")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("drivepercept").setLevel(logging.WARNING)
    from drivepercept.errors import DrivePerceptError

    try:
        outcome = soak(args)
    except DrivePerceptError as exc:
        print(f"soak: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "soak.json"
    path.write_text(json.dumps(outcome.to_json(), indent=2, allow_nan=False) + "\n")
    for line in table(outcome):
        print(line)
    print(f"{'PASSED' if outcome.passed else 'FAILED'}; details in {path}")
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
