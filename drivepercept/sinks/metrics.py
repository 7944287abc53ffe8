"""Prometheus metrics on 127.0.0.1 during a run (prometheus_client for the metric types and
the text format; a small `metrics-http` server thread of our own, so it stops with the run).

Metrics (all with a `camera` or `gpu` label):

- drivepercept_frames_total: frames emitted per camera (counter);
- drivepercept_dropped_frames_total: frames dropped per camera (the queues' count);
- drivepercept_camera_fps: frames per second emitted over the last second;
- drivepercept_camera_state: 1 for the camera's current state (label `state`), 0 otherwise;
- drivepercept_end_to_end_latency_seconds: capture-to-emission histogram per camera;
- drivepercept_gpu_utilization_percent, drivepercept_gpu_memory_used_bytes,
  drivepercept_gpu_power_watts, drivepercept_gpu_temperature_celsius: from the load sampler;
- drivepercept_process_cpu_percent, drivepercept_process_rss_bytes.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from drivepercept.errors import OutputError
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import CameraSnapshot, CameraState, FrameResult, LoadSample

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


class _Polled:
    """A collector that asks the pipeline for drops, fps and states when scraped."""

    def __init__(self, poll: Callable[[], Sequence[CameraSnapshot]]) -> None:
        self.poll = poll

    def collect(self) -> Iterator[Any]:
        snapshot = self.poll()
        dropped = CounterMetricFamily(
            "drivepercept_dropped_frames", "Frames dropped per camera", labels=["camera"]
        )
        fps = GaugeMetricFamily(
            "drivepercept_camera_fps", "Frames per second over the last second", labels=["camera"]
        )
        state = GaugeMetricFamily(
            "drivepercept_camera_state", "1 for the camera's state", labels=["camera", "state"]
        )
        for snap in snapshot:
            dropped.add_metric([snap.name], snap.dropped)
            fps.add_metric([snap.name], snap.fps)
            for name in CameraState:
                state.add_metric([snap.name, name.value], 1.0 if snap.state is name else 0.0)
        yield from (dropped, fps, state)


class MetricsExporter:
    """Serves /metrics on 127.0.0.1:`port` until closed; `frames_sink` and `load_sink` feed it
    (the pipeline closes those with the run; the exporter stays up until `close()`, so a last
    scrape can see the final counts).

    Args:
        port: TCP port (0 picks a free one; see `.port`).
        cameras: camera names (their series exist from the start, at 0).
        poll: returns the pipeline's `CameraSnapshot`s, called on each scrape.

    Raises:
        OutputError: the port cannot be bound.
    """

    def __init__(
        self,
        *,
        port: int,
        cameras: Sequence[str],
        poll: Callable[[], Sequence[CameraSnapshot]],
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames = Counter(
            "drivepercept_frames", "Frames emitted per camera", ["camera"], registry=r
        )
        self.latency = Histogram(
            "drivepercept_end_to_end_latency_seconds",
            "Capture to emission per camera",
            ["camera"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        for camera in cameras:
            self.frames.labels(camera)
            self.latency.labels(camera)
        gpu = ["gpu"]
        self.gpu_util = Gauge(
            "drivepercept_gpu_utilization_percent", "NVML GPU utilization", gpu, registry=r
        )
        self.gpu_mem = Gauge(
            "drivepercept_gpu_memory_used_bytes", "GPU memory used", gpu, registry=r
        )
        self.gpu_power = Gauge("drivepercept_gpu_power_watts", "GPU power draw", gpu, registry=r)
        self.gpu_temp = Gauge(
            "drivepercept_gpu_temperature_celsius", "GPU temperature", gpu, registry=r
        )
        self.cpu = Gauge(
            "drivepercept_process_cpu_percent", "Process CPU (100 = one core)", registry=r
        )
        self.rss = Gauge("drivepercept_process_rss_bytes", "Process resident memory", registry=r)
        r.register(_Polled(poll))
        registry = r

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics: " + format, *args)

        try:
            self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise OutputError(
                f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-http"
        )
        self._thread.daemon = True
        self._thread.start()
        self._closed = False
        self.frames_sink = _FramesToMetrics(self)
        self.load_sink = _LoadToMetrics(self)
        log.info("metrics on http://127.0.0.1:%d/metrics", self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def write_frame(self, result: FrameResult) -> None:
        self.frames.labels(result.camera).inc()
        self.latency.labels(result.camera).observe(result.timing.end_to_end_ms / 1e3)

    def write_load(self, sample: LoadSample) -> None:
        self.cpu.set(sample.process_cpu_pct)
        self.rss.set(sample.process_rss_bytes)
        for k, g in enumerate(sample.gpus):
            label = str(k)
            for gauge, value in (
                (self.gpu_util, g.util_pct),
                (self.gpu_mem, g.mem_used_bytes),
                (self.gpu_power, g.power_w),
                (self.gpu_temp, g.temperature_c),
            ):
                if not math.isnan(value):
                    gauge.labels(label).set(value)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


class _FramesToMetrics(ClosingSink):
    """The sink face of a MetricsExporter (closing it leaves the exporter serving)."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter

    def write(self, result: FrameResult) -> None:
        self.exporter.write_frame(result)

    def close(self) -> None:
        pass


class _LoadToMetrics(ClosingSink):
    """The load-sink face of a MetricsExporter."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self.exporter = exporter

    def write(self, sample: LoadSample) -> None:
        self.exporter.write_load(sample)

    def close(self) -> None:
        pass
