"""bench_peer's rounds: one round of each tool in each mode, and every round, interleaved."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from _bench_peer.exported import export_onnx, peer_ort_threads, session_threads
from _bench_peer.network import _Ultralytics, build_network, calibrated_network
from _bench_peer.options import PEER_OWN, Settings
from _bench_peer.process import (
    Globals,
    _get_threads,
    _set_threads,
    host_cpu_ticks,
    steal_pct,
)
from _bench_peer.stamps import ArrivalStamps, stamped_loader
from _bench_peer.stats import (
    RoundResult,
    count_agreement,
    percentile_ms,
    summarise,
    throughput_fps,
    timeline_figures,
)
from _bench_peer.streams import clip_paths, decodable_frames, jpeg_decode_ms, streams_file

if TYPE_CHECKING:
    from drivepercept.models.base import Detector
    from drivepercept.rundir.sections import ModelRecord
    from drivepercept.sim.serve import CameraServer

log = logging.getLogger("bench_peer")


# ---------------------------------------------------------------------- one round of each


ORT = "onnxruntime"


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
    onnx_path: Path | None = None  # the network exported once (runtime onnxruntime)
    server: CameraServer | None = None
    live_urls: list[str] = field(default_factory=list)
    # detections per (stream, frame) of the last matched peer replay per runtime, to check
    # ours against
    peer_counts: dict[str, dict[tuple[int, int], int]] = field(default_factory=dict)

    def peer_round(self, mode: str, number: int, runtime: str, tool: str) -> RoundResult:
        """The peer: on `settings.threads` (tool "peer") or its own default threads
        (`PEER_OWN`: torch's cpu_count - 1, ORT's default)."""
        s = self.settings
        own = tool == PEER_OWN
        self.globals.for_peer()
        # a fresh Ultralytics model object each round, so that every round starts as in a
        # new process (predictor, callbacks, threads, ORT session)
        if runtime == ORT:
            yolo = self.peer.package.YOLO(str(self.onnx_path), task="detect")
        else:
            yolo = build_network(self.peer)
            yolo.model = copy.deepcopy(self.yolo.model)
        if not own:
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
        with contextlib.ExitStack() as patches:
            if live:
                patches.enter_context(stamped_loader(self.peer, stamps))
            if runtime == ORT and not own:
                patches.enter_context(peer_ort_threads(s.threads))
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
                        threads = session_threads(yolo) if runtime == ORT else _get_threads()
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
        if not live and not own:
            self.peer_counts[runtime] = counts
        after = len(emitted) - len(sources)
        note = ""
        if live and len(latencies) < after:
            note = f"{after - len(latencies)} frames without an arrival stamp"
        if not live and len(emitted) != wanted:
            note = f"expected {wanted} frames, got {len(emitted)}"
        return RoundResult(
            tool=tool,
            mode=mode,
            runtime=runtime,
            round=number,
            frames=len(emitted),
            fps=throughput_fps(emitted, len(sources)),
            p50_ms=percentile_ms(latencies, 50) if live else math.nan,
            p99_ms=percentile_ms(latencies, 99) if live else math.nan,
            delivered=self._sent() - sent_before if live else 0,
            detections_per_frame=detections / len(emitted) if emitted else math.nan,
            threads=threads,
            wall_s=wall_s,
            note=note,
        )

    def ours_round(self, mode: str, number: int, runtime: str) -> RoundResult:
        """drivepercept on `settings.threads`: the torch `Detector` around the network, or
        `--model` the exported file (its sidecar beside it) on ONNX Runtime."""
        from drivepercept.report import load_run
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
            "torch_threads": s.threads,  # split over the CPU lanes; ORT's threads too
        }
        if not live:
            settings["max_frames"] = self.replay_frames
        on_ort = runtime == ORT
        options = RunOptions(
            sources=tuple(f"cam{i}={src}" for i, src in enumerate(sources)),
            mode=Mode.LIVE if live else Mode.REPLAY,
            model=str(self.onnx_path) if on_ort else "ultralytics-yolov8n",
            classes="all",  # every class, as the peer reports them
            runtime=runtime,
            settings=settings,
            out_root=self.work / "runs",
            name=f"{mode}-{runtime}-ours-{number}",
            report_formats=(),
            duration_s=s.duration_s if live else None,
        )
        sent_before = self._sent()
        started = time.monotonic()
        # torch: the very network object; ORT: the file, loaded as `--model x.onnx` loads it
        result = run(options, detector=None if on_ort else self.detector)
        wall_s = time.monotonic() - started
        data = load_run(result.run_dir)  # run.json and frames.csv, as the report reads them
        threads = _run_ort_threads(data.record.model) if on_ort else _get_threads()
        tl = data.timeline
        figures = timeline_figures(tl)
        later = figures.later_ms
        failure = result.failure()
        wanted = len(sources) * self.replay_frames
        note = failure or ""
        if not live and len(tl) != wanted:
            note = f"expected {wanted} frames, got {len(tl)}" + (f"; {note}" if note else "")
        peer_counts = self.peer_counts.get(runtime)
        if not live and peer_counts:
            keys = zip(tl.camera_index.tolist(), tl.frame_index.tolist(), strict=True)
            ours_counts = dict(zip(keys, tl.detections.tolist(), strict=True))
            note = (note + "; " if note else "") + count_agreement(peer_counts, ours_counts)
        return RoundResult(
            tool="ours",
            mode=mode,
            runtime=runtime,
            round=number,
            frames=len(tl),
            fps=figures.fps,
            p50_ms=percentile_ms(later, 50) if live else math.nan,
            p99_ms=percentile_ms(later, 99) if live else math.nan,
            delivered=self._sent() - sent_before if live else 0,
            detections_per_frame=float(tl.detections.mean()) if len(tl) else math.nan,
            threads=threads,
            wall_s=wall_s,
            note=note,
        )

    def _sent(self) -> int:
        if self.server is None:
            return 0
        return sum(self.server.frames_sent(f"cam{i}") for i in range(len(self.live_urls)))


def _run_ort_threads(model: ModelRecord) -> int:
    """The ORT intra-op threads a drivepercept run's sessions had in all, from its run.json's
    model section: each lane's threads times its lanes (0: ORT's default; -1: not recorded)."""
    runtime = model.runtime or {}
    if runtime.get("backend") != "onnxruntime":
        return -1
    return int(runtime.get("threads") or 0) * int(runtime.get("lanes") or 1)


def versions(peer: _Ultralytics) -> dict[str, str]:
    import cv2
    import torch
    import torchvision

    try:
        import onnxruntime  # type: ignore[import-untyped]

        ort_version = str(onnxruntime.__version__)
    except ImportError:
        ort_version = "not installed"
    return {
        "python": platform.python_version(),
        "ultralytics": peer.version,
        "torch": str(torch.__version__),
        "torchvision": str(torchvision.__version__),
        "opencv": str(cv2.__version__),
        "numpy": str(np.__version__),
        "onnxruntime": ort_version,
        "cpus": str(os.cpu_count()),
    }


# ---------------------------------------------------------------------- every round


def bench(settings: Settings, peer: _Ultralytics, globals_: Globals, work: Path) -> dict[str, Any]:
    """Every round, interleaved per mode (peer, ours, peer, ours, ...); the JSON record."""
    from drivepercept.sim.serve import CameraServer

    clips = clip_paths(settings.videos, settings.streams)
    shortest = min(decodable_frames(p) for p in dict.fromkeys(clips))
    replay_frames = settings.replay_frames or shortest
    if replay_frames > shortest:
        raise ValueError(f"--replay-frames must be <= {shortest} (the shortest clip)")
    yolo, detector, calibration = calibrated_network(
        peer, clips, settings.imgsz, conf=settings.conf, candidates=settings.candidates
    )
    net = yolo.model
    # Ultralytics deep-copies the model it is given in every predictor set-up, so it never
    # runs the object itself; its rounds copy this copy of the finished network, made before
    # any round, so that what drivepercept sets on `net` (channels_last) stays on ours.
    yolo.model = copy.deepcopy(net)
    params = sum(p.numel() for p in net.parameters())
    log.info("YOLOv8n: %.2f M parameters; calibration %s", params / 1e6, calibration)
    state = Bench(settings, peer, yolo, detector, globals_, work, clips, replay_frames)
    onnx_metadata: dict[str, Any] = {}
    if ORT in settings.runtimes:
        # once, before any round, from the peer's copy (ours sets channels_last on `net`)
        state.onnx_path, onnx_metadata = export_onnx(
            yolo.model, detector, work / "onnx", version=peer.version
        )
        log.info("exported to %s", state.onnx_path)
    tools = ("peer", "ours", PEER_OWN) if settings.peer_default_threads else ("peer", "ours")
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
                for runtime in settings.runtimes:
                    # a run's place in its round biases it: every other round goes backwards
                    for tool in tools if number % 2 else tools[::-1]:
                        load = os.getloadavg()[0]
                        log.info(
                            "%s round %d, %s: %s (load %.1f)", mode, number, runtime, tool, load
                        )
                        ticks = host_cpu_ticks()
                        if tool == "ours":
                            result = state.ours_round(mode, number, runtime)
                        else:
                            result = state.peer_round(mode, number, runtime, tool)
                        stolen = steal_pct(ticks, host_cpu_ticks())
                        result = dataclasses.replace(result, steal_pct=stolen)
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
        "torch_threads_found": globals_.torch_threads,
        "threads": settings.threads,
        "onnx": {"path": str(state.onnx_path), "metadata": onnx_metadata} if onnx_metadata else {},
        "peer_jpeg_decode_ms": jpeg_decode_ms(clips),
        "rounds": [asdict(r) for r in rounds],
        "summary": summary,
    }
