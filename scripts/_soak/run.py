"""The soak itself: serve the clips as live cameras, run the live pipeline over them,
sample, measure (see scripts/soak.py's docstring)."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from _soak.latency import latency_windows, read_latencies
from _soak.measure import (
    Accounting,
    ThreadCheck,
    camera_pairs,
    criteria,
    rss_growth,
    warmup_s_for,
)
from _soak.report import Outcome
from _soak.sampling import (
    MB,
    Sampler,
    _os_thread_ids,
    _os_threads,
    _python_threads,
    _wait_clients_gone,
    host_load,
    in_transit,
)

if TYPE_CHECKING:
    from drivepercept.models.base import Detector

ROOT = Path(__file__).resolve().parents[2]
RIG = ROOT / "sample_videos" / "rig.toml"
SHARED_ONNX = ROOT.parent / "shared" / "models" / "yolox_nano" / "yolox_nano.onnx"

log = logging.getLogger("soak")


# ---------------------------------------------------------------------- the soak


def _prime(detector: Detector) -> None:
    """One batch through the model, one frame through OpenCV's resize and one setting of
    torch's thread count before the thread baseline, so that the process-wide pools that
    live as long as the process, by design, are in it whichever build makes them lazily:
    torch's intra-op pool (this torch: at the model's load), OpenCV's parallel_for pool (at
    its first parallel call, the decoder threads' letterbox) and torch's pthreadpool (at the
    first `torch.set_num_threads`, which the engine and its lanes make); one thread each on
    2 cores."""
    import cv2
    import numpy as np
    import torch

    torch.set_num_threads(torch.get_num_threads())
    width, height = detector.input.size
    with torch.inference_mode():
        detector.module(torch.zeros((1, 3, height, width)))
    cv2.resize(np.zeros((720, 1280, 3), np.uint8), (width, height), interpolation=cv2.INTER_AREA)


def _weights(given: str | None) -> tuple[str, str]:
    """(weights, what they are): as given, else the shared ONNX export, else random."""
    if given is not None:
        return given, "as given"
    if SHARED_ONNX.is_file():
        return str(SHARED_ONNX), "the shared YOLOX-nano ONNX export"
    log.warning("no weights at %s: the model runs with RANDOM weights", SHARED_ONNX)
    return "none", f"RANDOM weights ({SHARED_ONNX} not found)"


def soak(args: argparse.Namespace) -> Outcome:
    """Serve, run live, sample, measure (see scripts/soak.py's docstring).

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
        before_ids = _os_thread_ids(process, every=False)
        sampler = Sampler(server, every_s=args.sample_s)
        sampler.start()
        try:
            result = run(options, detector=detector, progress=sampler.attach)
        finally:
            last = sampler.take()  # the run is over: threads as the run left them
            sampler.stop()
        clients_gone = _wait_clients_gone(server, names)
        after_names, after_os = _python_threads(), _os_threads(process)
        after_ids = _os_thread_ids(process, every=True)
        served = {n: server.frames_sent(n) for n in names}
        skipped = {n: server.frames_skipped(n) for n in names}
        published = {n: server.frames_published(n) for n in names}
    load_after = os.getloadavg()
    rss_after_run_mb = round(process.memory_info().rss / MB, 2)
    during = list(sampler.samples)
    record = result.record
    live = record.live or {}
    summary = record.summary.to_json() if record.summary else {}
    stats = {c.name: c for c in result.stats.cameras}
    accounting = [
        Accounting(
            camera=n,
            served=served[n],
            read=live[n].frames_received,
            processed=stats[n].frames,
            dropped=stats[n].dropped,
            discarded=stats[n].discarded,
            connects=live[n].connects,
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
        new_os=len(after_ids - before_ids),
    )
    load = host_load(during)
    capture, e2e, model_ms, wait_ms = read_latencies(result.run_dir)
    latency = latency_windows(
        capture, e2e, window_s=args.window_s, model_ms=model_ms, wait_ms=wait_ms
    )
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
        model_ratio=args.model_ratio,
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
            n: {k: live[n].to_json()[k] for k in ("connects", "outage_s", "frames_lost_estimate")}
            for n in names
        },
        "in_transit_during_run": in_transit(during),
        "host_cpu_cores": None if load is None else asdict(load),
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
