"""Stream a run to a Rerun viewer (`--rerun`; the `drivepercept[viz]` extra).

What is logged, on one `rr.RecordingStream` of the sink's own (never Rerun's global one, so
two runs in one process do not mix):

* `cameras/<camera>/image`: the original frame as JPEG (`write_with_image` only; quality
  `JPEG_QUALITY`: a 640x360 road frame is ~15 KB instead of 675 KB raw, so a recording of six
  cameras stays small and a viewer over the network keeps up);
* `cameras/<camera>/image/boxes`: the detections, xyxy in original pixels, labelled
  "name score", coloured by class (`AnnotationContext` at `cameras`, logged once); an empty
  frame logs an empty list, so the last boxes never linger over a later image; a frame the
  model did not see has the tracker's boxes, thinner, labelled "name score predicted";
* `cameras/<camera>/latency_ms`: capture-to-emission latency (`FrameTiming.end_to_end_ms`);
* `load/cpu/process_pct`, `load/cpu/system_pct`, `load/gpu<i>/util_pct`,
  `load/gpu<i>/memory_used_mb`, `load/gpu<i>/power_w`: the load sampler's samples, through
  `load_sink` (i = the NVML index, as `nvidia-smi` numbers GPUs; MB are 2**20 bytes).

Timelines (the viewer offers each in its time panel):

* `host_time` (duration since the sink opened, on the host's monotonic clock): frames at their
  capture time, load samples at theirs. The default, and the one to read a run by: it is the
  only clock that frames and GPU/CPU load share, so a latency spike lines up with the load
  that caused it, and the frames of all cameras captured together sit together in live runs.
  A duration rather than a wall-clock timestamp because the monotonic clock has no date, and
  "12.3 s into the run" is what a reader compares against the report.
* `pts` (duration): the frame's presentation time in its source, so a replay scrubs like the
  recorded clips, whatever speed it ran at, and the cameras of a synchronised rig line up.
* `frame_index` (sequence): the frame's index in its source, to step frame by frame.

Where it goes (`RerunTarget`): a viewer spawned on this machine, a viewer or Rerun server
already running (gRPC URL), an `.rrd` file, or a gRPC server plus Rerun's web viewer served by
this process from the wheel (no network needed; open `viewer_url` in a browser).

Threads: `write`/`write_with_image` come from one thread (the sink's own `sink-rerun` thread
under the slow-output policy, so a slow viewer costs dropped frames, never engine time);
`load_sink.write` from the `gpu-monitor` thread; `close` from the pipeline's. Rerun's stream
is thread-safe and its time cursor is per thread (`set_time` on one thread does not move
another's), and each write sets all of its own timelines, so frames and load samples never
borrow each other's times. The sink's lock guards only its own state (closed, counters), never
a Rerun call: Rerun's gRPC client pushes back on a viewer that stops reading (once ~300 MB are
buffered, `log` blocks until the viewer reads again), and `close()` must still work then. It
does, within `CLOSE_TIMEOUT_S` (see `close`), and nothing is logged after it. Under the run's
slow-output policy such a blocked write costs dropped frames, never engine time; but the
sink's thread then outlives the set's close, so the caller closes the sink itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import cv2
import numpy as np

from drivepercept.errors import ConfigError, OutputError, one_line
from drivepercept.sinks.base import ClosingSink, LoadFace
from drivepercept.types import FrameResult, ImageU8, LoadSample

log = logging.getLogger(__name__)

JPEG_QUALITY = 85
FLUSH_TIMEOUT_S = 10.0  # close() waits this long for data still on its way to the target
CLOSE_TIMEOUT_S = 20.0  # ... and this long in all (Rerun's disconnect may take ~5 s more)
PROBE_TIMEOUT_S = 3.0  # how long "is a viewer listening there?" may take
SERVER_MEMORY_LIMIT = "512MiB"  # `serve`: the newest data kept for a browser that joins late
DEFAULT_GRPC_PORT = 9876  # Rerun's own defaults
DEFAULT_WEB_PORT = 9090
_MB = float(1 << 20)
_SCHEMES = ("rerun://", "rerun+http://", "rerun+https://")
INSTALL_HINT = "pip install 'drivepercept[viz]'"

TargetKind = Literal["spawn", "connect", "save", "serve"]


@dataclass(frozen=True)
class RerunTarget:
    """Where the recording goes.

    Attributes:
        kind: "spawn" a viewer on this machine (Rerun's `rerun` binary, from the wheel);
            "connect" to a running viewer or server at `address` (one must be listening when
            the sink opens); "save" to the `.rrd` at `path`; "serve" a gRPC server on
            127.0.0.1:`grpc_port` and Rerun's web viewer on `web_port` (Rerun binds that one
            on every interface; it holds only the viewer's static files), for a browser on
            this machine or through an SSH tunnel of both ports (the sink's `viewer_url`).
        address: "connect": the gRPC URL (`rerun+http://host:9876/proxy`); None: Rerun's
            default, a viewer on this machine.
        path: "save": the `.rrd` file (missing folders are made; an existing file is replaced).
        grpc_port: "spawn", "serve": the gRPC port (None: 9876).
        web_port: "serve": the web viewer's HTTP port (None: 9090).
    """

    kind: TargetKind
    address: str | None = None
    path: Path | None = None
    grpc_port: int | None = None
    web_port: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("spawn", "connect", "save", "serve"):
            raise ConfigError(
                f"rerun target must be spawn, connect, save or serve, got {self.kind!r}"
            )
        if (self.kind == "save") != (self.path is not None):
            raise ConfigError(f"a rerun save target needs a path, and only it; got {self!r}")
        if self.address is not None:
            if self.kind != "connect":
                raise ConfigError(f"only a rerun connect target takes an address; got {self!r}")
            if not self.address.startswith(_SCHEMES):
                raise ConfigError(
                    "rerun address must be a gRPC URL like rerun+http://127.0.0.1:9876/proxy, "
                    f"got {self.address!r}"
                )
        for name in ("grpc_port", "web_port"):
            port = getattr(self, name)
            if port is not None and not 0 < port < 65536:
                raise ConfigError(f"rerun {name} must be in 1..65535, got {port}")


def _import_rerun() -> Any:
    """The `rerun` module (imported here, not at the top: the base install lacks it)."""
    try:
        import rerun
    except ImportError:
        raise ConfigError(
            f"--rerun needs the Rerun SDK, which is not installed: {INSTALL_HINT}"
        ) from None
    return rerun


def camera_path(camera: str) -> str:
    """The entity path of a camera's branch (`cameras/<camera>`, the name escaped, so a
    camera called "rear/left" stays one entity)."""
    rr = _import_rerun()
    return f"cameras/{rr.escape_entity_path_part(camera)}"


def _probe(address: str, *, what: str) -> None:
    """Raise OutputError unless something accepts TCP connections at a gRPC URL's host:port."""
    parts = urlsplit(address)
    secure = parts.scheme in ("rerun", "rerun+https")
    try:
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80)
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OutputError(f"{what} {address}: {one_line(why or type(exc).__name__)}") from None


class RerunSink(ClosingSink):
    """Streams each camera's image, boxes and latency, and the run's load, to Rerun (see the
    module docstring for entities, timelines and threads).

    Args:
        target: where the recording goes.
        cameras: the run's camera names, in order (the viewer's layout: one image view per
            camera, a latency plot, a load plot).
        application_id: Rerun's application id (recordings of one id share viewer settings).
        recording_name: the recording's name in the viewer (None: Rerun's default).

    Raises:
        ConfigError: the Rerun SDK is not installed, or the target is invalid.
        OutputError: the `.rrd` cannot be created, nothing answers at the connect address,
            the spawned viewer does not start, or the serve ports cannot be bound.
    """

    def __init__(
        self,
        target: RerunTarget,
        *,
        cameras: Sequence[str],
        application_id: str = "drivepercept",
        recording_name: str | None = None,
    ) -> None:
        self._rr = _import_rerun()
        self.target = target
        self.cameras = tuple(cameras)
        self._lock = threading.Lock()
        self._closed = False
        self._load_closed = False
        self._paths: dict[str, str] = {c: camera_path(c) for c in self.cameras}
        self._class_names: tuple[str, ...] | None = None
        self._origin_ns = time.monotonic_ns()  # host_time 0 (see `_since_origin_s`)
        self._origin_fixed = False
        self.frames_written = 0
        self.images_written = 0
        self.load_samples_written = 0
        self.viewer_url: str | None = None  # "serve": the page to open in a browser
        # the sink's own stream (rerun.RecordingStream; typed Any: the base install lacks rerun)
        self.recording: Any = self._rr.RecordingStream(application_id)
        try:
            self._open(target, recording_name)
        except BaseException:
            with contextlib.suppress(Exception):
                self.recording.disconnect()
            raise
        self.load_sink = LoadFace(self._log_load, self._stop_load)

    # ------------------------------------------------------------------ opening

    def _open(self, target: RerunTarget, recording_name: str | None) -> None:
        rr = self._rr
        rec = self.recording
        blueprint = self._blueprint()
        if target.kind == "save":
            assert target.path is not None
            path = Path(target.path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not os.access(path.parent, os.W_OK):
                    raise PermissionError(13, "Permission denied")
                rec.save(path, default_blueprint=blueprint)
            except (OSError, RuntimeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise OutputError(
                    f"cannot create rerun recording {path}: {one_line(why)}"
                ) from None
        elif target.kind == "connect":
            address = target.address or f"rerun+http://127.0.0.1:{DEFAULT_GRPC_PORT}/proxy"
            # Rerun itself would wait for a viewer forever, buffering, and then block the
            # sink: a viewer that is not there is said now, as a bad output path would be
            _probe(address, what="no Rerun viewer or server answers at")
            try:
                rec.connect_grpc(address, default_blueprint=blueprint)
            except RuntimeError as exc:  # a malformed URL
                raise ConfigError(f"bad rerun address {address!r}: {one_line(str(exc))}") from None
        elif target.kind == "spawn":
            port = target.grpc_port or DEFAULT_GRPC_PORT
            try:
                rec.spawn(port=port, hide_welcome_screen=True, default_blueprint=blueprint)
            except (OSError, RuntimeError) as exc:
                raise OutputError(f"cannot spawn the Rerun viewer: {one_line(str(exc))}") from None
            # spawn() returns even when the viewer died at once (no display, as over SSH)
            _probe(
                f"rerun+http://127.0.0.1:{port}/proxy",
                what="the spawned Rerun viewer did not start (no display?); nothing listens at",
            )
        else:
            grpc_port = target.grpc_port or DEFAULT_GRPC_PORT
            web_port = target.web_port or DEFAULT_WEB_PORT
            try:
                # Rerun only logs a gRPC port already taken, and serves nothing
                with socket.socket() as taken:
                    taken.bind(("127.0.0.1", grpc_port))
                server = rr.GrpcServerSink(
                    bind_ip="127.0.0.1", port=grpc_port, server_memory_limit=SERVER_MEMORY_LIMIT
                )
                rec.set_sinks(server, default_blueprint=blueprint)
                # static files only (the wheel's viewer); it lives as long as the process
                rr.serve_web_viewer(web_port=web_port, open_browser=False, connect_to=server.uri)
            except (OSError, RuntimeError) as exc:
                raise OutputError(
                    f"cannot serve Rerun on ports {grpc_port} (gRPC) and {web_port} (web): "
                    f"{one_line(str(exc))}"
                ) from None
            self.viewer_url = f"http://127.0.0.1:{web_port}/?url={quote(server.uri, safe='')}"
            log.info("rerun web viewer on %s", self.viewer_url)
        if recording_name is not None:
            rec.send_recording_name(recording_name)

    def _blueprint(self) -> Any:
        """The viewer's default layout: the cameras' images in a grid above the latency and
        load plots (a user's own layout in the viewer wins over it)."""
        rrb = self._rr.blueprint
        images = [
            rrb.Spatial2DView(origin=f"{path}/image", name=camera)
            for camera, path in self._paths.items()
        ]
        # (an explicit list: the viewer's entity filters take no "*" inside a path)
        latency = [f"{path}/latency_ms" for path in self._paths.values()]
        plots = rrb.Horizontal(
            rrb.TimeSeriesView(origin="cameras", contents=latency, name="latency"),
            rrb.TimeSeriesView(origin="load", name="load"),
        )
        return rrb.Blueprint(
            rrb.Vertical(rrb.Grid(*images), plots, row_shares=[3, 1]),
            rrb.TimePanel(timeline="host_time"),
        )

    # ------------------------------------------------------------------ frames

    def write(self, result: FrameResult) -> None:
        """Log one frame's boxes and latency (no image)."""
        self._log_frame(result, None)

    def write_with_image(self, result: FrameResult, image_bgr: ImageU8) -> None:
        """Log one frame's image (JPEG), boxes and latency."""
        ok, jpeg = cv2.imencode(".jpg", image_bgr, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise ValueError(f"cannot encode a {image_bgr.dtype} {image_bgr.shape} image as JPEG")
        self._log_frame(result, jpeg.tobytes())

    def _path(self, camera: str) -> str:
        path = self._paths.get(camera)
        if path is None:  # a camera not named up front still gets its branch
            path = self._paths[camera] = camera_path(camera)
        return path

    def _log_frame(self, result: FrameResult, jpeg: bytes | None) -> None:
        rr = self._rr
        det = result.detections
        boxes = rr.Boxes2D(
            array=np.asarray(det.xyxy, np.float32).reshape(-1, 4),
            array_format=rr.Box2DFormat.XYXY,
            labels=[  # a frame the model did not see: the tracker's boxes, said so
                f"{name} {score:.2f}{' predicted' if det.predicted else ''}"
                for name, score in zip(det.names, det.scores.tolist(), strict=True)
            ],
            radii=0.5 if det.predicted else None,
            class_ids=det.labels,
        )
        with self._lock:
            if self._closed:
                return
            new_names = bool(det.class_names) and det.class_names != self._class_names
            if new_names:
                self._class_names = det.class_names
            path = self._path(result.camera)
            host_time_s = self._since_origin_s(result.timing.capture_ns)
            self.frames_written += 1
            self.images_written += 0 if jpeg is None else 1
        # (outside the lock: a log call may block on a viewer that stopped reading)
        rec = self.recording
        if new_names:
            context = rr.AnnotationContext(list(enumerate(det.class_names)))
            rec.log("cameras", context, static=True)
        rec.reset_time()
        rec.set_time("host_time", duration=host_time_s)
        if math.isfinite(result.pts_s):
            rec.set_time("pts", duration=result.pts_s)
        rec.set_time("frame_index", sequence=result.frame_index)
        if jpeg is not None:
            rec.log(f"{path}/image", rr.EncodedImage(contents=jpeg, media_type="image/jpeg"))
        rec.log(f"{path}/image/boxes", boxes)
        rec.log(f"{path}/latency_ms", rr.Scalars(result.timing.end_to_end_ms))

    def _since_origin_s(self, t_ns: int) -> float:
        """`t_ns` on the host_time timeline (called under the lock). Its zero is when the sink
        opened, or the first stamp logged if that is earlier (stamps made before the sink):
        Rerun 0.41's web viewer drew no image at large negative times (seen in Chromium)."""
        if not self._origin_fixed:
            self._origin_fixed = True
            self._origin_ns = min(self._origin_ns, t_ns)
        return (t_ns - self._origin_ns) / 1e9

    # ------------------------------------------------------------------ load

    def _log_load(self, sample: LoadSample) -> None:
        rr = self._rr
        series = [
            ("load/cpu/process_pct", sample.process_cpu_pct),
            ("load/cpu/system_pct", sample.system_cpu_pct),
        ]
        for g in sample.gpus:
            series += [
                (f"load/gpu{g.index}/util_pct", g.util_pct),
                (f"load/gpu{g.index}/memory_used_mb", g.mem_used_bytes / _MB),
                (f"load/gpu{g.index}/power_w", g.power_w),
            ]
        with self._lock:
            if self._closed or self._load_closed:
                return
            host_time_s = self._since_origin_s(sample.t_ns)
            self.load_samples_written += 1
        rec = self.recording
        rec.reset_time()
        rec.set_time("host_time", duration=host_time_s)
        for path, value in series:
            if not math.isnan(value):  # what the hardware does not report is left out
                rec.log(path, rr.Scalars(value))

    # ------------------------------------------------------------------ closing

    def _stop_load(self) -> None:
        with self._lock:
            self._load_closed = True

    def close(self) -> None:
        """Send what is still queued and end the recording: an `.rrd` gets its footer, a
        viewer sees the stream end. Idempotent; nothing is logged after it.

        Never waits more than `CLOSE_TIMEOUT_S`: a viewer that accepted the connection but
        stopped reading (hung, or on a stalled network) makes Rerun's own flush and
        disconnect wait forever, whatever their timeout, so they run on a `rerun-close`
        thread. When that thread is still waiting at the deadline, the error is logged and
        Rerun's exit hook is removed (it would hang the process at exit the same way).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        closer = threading.Thread(target=self._finish, name="rerun-close", daemon=True)
        closer.start()
        closer.join(timeout=CLOSE_TIMEOUT_S)
        if closer.is_alive():
            log.error(
                "rerun: the viewer took nothing for %.0f s; its stream is abandoned",
                CLOSE_TIMEOUT_S,
            )
            self._rr.unregister_shutdown()

    def _finish(self) -> None:
        try:
            self.recording.flush(timeout_sec=FLUSH_TIMEOUT_S)
        except Exception as exc:  # a viewer that went away: what it missed is lost, not fatal
            log.warning("rerun: not all data was sent before closing: %s", one_line(str(exc)))
        finally:
            self.recording.disconnect()
