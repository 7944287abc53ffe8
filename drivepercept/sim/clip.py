"""`drivepercept simulate`: render a synthetic multi-camera drive to disk.

Writes, into one folder: `<camera>.mp4` for every camera, `ground_truth.json` (COCO, see
`groundtruth`) and `rig.toml` (the cameras, readable by `drivepercept.rig.load_rig`).

The main thread renders; a named `encode` thread feeds the MP4 encoders (OpenCV releases the
GIL while encoding, so on two cores rendering and encoding overlap). They are joined by a
bounded queue: a slow disk slows the renderer down instead of filling memory.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.errors import OutputError
from drivepercept.rig import SIMULATED_MODEL, SIMULATOR, CameraConfig, RigConfig, write_rig
from drivepercept.sim.camera import CameraModel, default_rig_cameras
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.groundtruth import GroundTruthWriter
from drivepercept.sim.render import Renderer
from drivepercept.sim.world import generate_world

log = logging.getLogger(__name__)

RIG_FILE = "rig.toml"
# the model trained on this world: a synthetic rig's runs default to it
TRAINED_MODEL = SIMULATED_MODEL
GROUND_TRUTH_FILE = "ground_truth.json"
_QUEUE_DEPTH = 4
_JOIN_TIMEOUT_S = 30.0
_STOP = object()


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation wrote and how long it took."""

    out_dir: Path
    rig_path: Path
    ground_truth_path: Path
    videos: tuple[Path, ...]
    frames: int  # rig instants written (every camera has this many frames)
    annotations: int
    elapsed_s: float
    interrupted: bool


class _VideoEncoder:
    """One MP4 writer per camera, fed by the `encode` thread through a bounded queue."""

    def __init__(self, paths: Sequence[Path], *, fps: float, size: tuple[int, int]) -> None:
        self._writers: list[cv2.VideoWriter] = []
        fourcc = cv2.VideoWriter.fourcc(*"mp4v")
        for path in paths:
            writer = cv2.VideoWriter(str(path), fourcc, fps, size)
            if not writer.isOpened():
                self.release()
                raise OutputError(
                    f"cannot open a video writer for {path} (is the folder "
                    "writable and the size even?)"
                )
            self._writers.append(writer)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=_QUEUE_DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="encode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                images: Sequence[npt.NDArray[np.uint8]] = item  # type: ignore[assignment]
                for writer, image in zip(self._writers, images, strict=True):
                    writer.write(image)
        except BaseException as exc:  # recorded and re-raised on the main thread
            self._error = exc

    def submit(self, images: Sequence[npt.NDArray[np.uint8]]) -> None:
        """Queue one frame per camera; blocks while the queue is full, fails if the thread died."""
        while True:
            self._raise_if_failed()
            try:
                self._queue.put(images, timeout=0.5)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    self._raise_if_failed()
                    raise OutputError("video encoder thread stopped unexpectedly") from None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise OutputError(f"video encoding failed: {self._error}") from self._error

    def close(self) -> None:
        """Drain the queue, stop the thread and finalise every file."""
        if self._thread.is_alive():
            while True:
                try:
                    self._queue.put(_STOP, timeout=0.5)
                    break
                except queue.Full:
                    if not self._thread.is_alive():
                        break
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("encode thread did not stop within %.0f s", _JOIN_TIMEOUT_S)
        self.release()
        self._raise_if_failed()

    def release(self) -> None:
        for writer in self._writers:
            writer.release()


def log_progress(every_s: float = 2.0) -> Callable[[int, int], None]:
    """A `progress` callback that logs "rendered N/M frames" at INFO every `every_s`."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= every_s or done == total:
            last[0] = time.monotonic()
            log.info("rendered %d/%d frames", done, total)

    return progress


def simulate_clip(
    config: SimulationConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Render `config` to `config.out_dir`; see the module docstring for what is written.

    A KeyboardInterrupt stops rendering early; the videos and ground truth then hold the
    frames rendered so far and are valid files (`SimulationResult.interrupted` is True).

    Raises:
        OutputError: the folder or a file in it cannot be created or written.
    """
    started = time.perf_counter()
    out = config.out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output folder {out}: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise OutputError(f"output path exists and is not a folder: {out}")

    cams = default_rig_cameras(
        config.cameras, width=config.width, height=config.height, fps=config.fps
    )
    videos = tuple(out / f"{c.name}.mp4" for c in cams)
    rig = RigConfig(
        cameras=tuple(
            CameraConfig(
                name=c.name,
                video=v,
                fps=c.fps,
                width=c.width,
                height=c.height,
                intrinsics=c.intrinsics,
                extrinsics=c.extrinsics,
            )
            for c, v in zip(cams, videos, strict=True)
        ),
        model=TRAINED_MODEL,
    )
    sim_info = {
        "generator": SIMULATOR,
        "seed": config.seed,
        "seconds": config.seconds,
        "fps": config.fps,
        "cameras": config.cameras,
        "size": f"{config.width}x{config.height}",
    }
    rig_path = write_rig(rig, out / RIG_FILE, extra={"simulation": sim_info})

    world = generate_world(config.seed, duration_s=config.seconds)
    renderer = Renderer(
        world,
        [CameraModel.from_config(c) for c in cams],
        noise=config.noise,
        noise_seed=config.seed,
    )
    info = dict(
        sim_info,
        description="drivepercept synthetic multi-camera drive",
        lighting=world.lighting.name,
        camera_names=list(rig.names),
    )
    gt = GroundTruthWriter(out / GROUND_TRUTH_FILE, info=info, cameras=rig.names)
    annotations = 0
    interrupted = False
    encoder: _VideoEncoder | None = None
    try:
        encoder = _VideoEncoder(videos, fps=config.fps, size=(config.width, config.height))
        total = config.frame_count
        for k in range(total):
            t_s = k / config.fps
            views = renderer.render(t_s, frame_index=k)
            encoder.submit([v.image for v in views])
            gt.add_frame(
                frame_index=k,
                timestamp_s=t_s,
                width=config.width,
                height=config.height,
                boxes=[v.boxes for v in views],
            )
            annotations += sum(len(v.boxes) for v in views)
            if progress is not None:
                progress(k + 1, total)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted after %d frames; closing the files written so far", gt.frames)
    finally:
        try:
            if encoder is not None:
                encoder.close()
        finally:
            gt.close()
    return SimulationResult(
        out_dir=out,
        rig_path=rig_path,
        ground_truth_path=gt.path,
        videos=videos,
        frames=gt.frames,
        annotations=annotations,
        elapsed_s=time.perf_counter() - started,
        interrupted=interrupted,
    )
