"""`drivepercept simulate`: render a synthetic multi-camera drive to disk.

Writes, into one folder: `<camera>.mp4` for every camera (`format="mp4"`) or one
`drive.mcap` of them all (`format="mcap"`, see `mcapclip`), `ground_truth.json` (COCO, see
`groundtruth`) and `rig.toml` (the cameras, readable by `drivepercept.rig.load_rig`).

The main thread renders; a named `encode` thread writes the frames (`encode`: MP4 encoders, or
the MCAP writer). They are joined by a bounded queue: a slow disk slows the renderer down
instead of filling memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.errors import OutputError
from drivepercept.rig import SIMULATED_MODEL, SIMULATOR, CameraConfig, RigConfig, write_rig
from drivepercept.sim.camera import CameraModel, default_rig_cameras
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.encode import EncodeThread
from drivepercept.sim.groundtruth import GroundTruthWriter
from drivepercept.sim.render import GroundTruthBox, Renderer
from drivepercept.sim.world import generate_world

log = logging.getLogger(__name__)

RIG_FILE = "rig.toml"
# the model trained on this world: a synthetic rig's runs default to it
TRAINED_MODEL = SIMULATED_MODEL
GROUND_TRUTH_FILE = "ground_truth.json"


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation wrote and how long it took."""

    out_dir: Path
    rig_path: Path
    ground_truth_path: Path
    videos: tuple[Path, ...]  # a video per camera, or the one MCAP file of them all
    frames: int  # rig instants written (every camera has this many frames)
    annotations: int
    elapsed_s: float
    interrupted: bool


class _VideoFiles:
    """One MP4 writer per camera, fed by the `encode` thread (`drivepercept.sim.encode`)."""

    def __init__(self, paths: Sequence[Path], *, fps: float, size: tuple[int, int]) -> None:
        self._writers: list[cv2.VideoWriter] = []
        fourcc = cv2.VideoWriter.fourcc(*"mp4v")
        for path in paths:
            writer = cv2.VideoWriter(str(path), fourcc, fps, size)
            if not writer.isOpened():
                self._release()
                raise OutputError(
                    f"cannot open a video writer for {path} (is the folder "
                    "writable and the size even?)"
                )
            self._writers.append(writer)
        self._thread: EncodeThread[Sequence[npt.NDArray[np.uint8]]] = EncodeThread(
            self._write, what="video encoding"
        )

    def _write(self, images: Sequence[npt.NDArray[np.uint8]]) -> None:
        for writer, image in zip(self._writers, images, strict=True):
            writer.write(image)

    def submit(
        self,
        frame_index: int,
        images: Sequence[npt.NDArray[np.uint8]],
        boxes: Sequence[Sequence[GroundTruthBox]],
    ) -> None:
        """Queue one frame per camera; blocks while the queue is full, fails if the thread died."""
        self._thread.submit(images)

    def close(self, *, ground_truth: Path | None) -> None:
        """Drain the queue, stop the thread and finalise every file (the ground truth is a
        file of its own beside them)."""
        try:
            self._thread.stop()
        finally:
            self._release()
        self._thread.raise_if_failed()

    def _release(self) -> None:
        for writer in self._writers:
            writer.release()


class _ClipWriter(Protocol):
    """Where rendered frames go: MP4 files, or one MCAP file (`McapClipWriter`)."""

    def submit(
        self,
        frame_index: int,
        images: Sequence[npt.NDArray[np.uint8]],
        boxes: Sequence[Sequence[GroundTruthBox]],
    ) -> None: ...

    def close(self, *, ground_truth: Path | None) -> None: ...


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
        ConfigError: `format="mcap"` without the `[ros]` extra installed.
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
    mcap = config.format == "mcap"
    if mcap:
        from drivepercept.sim import mcapclip

        videos: tuple[Path, ...] = (out / mcapclip.MCAP_FILE,)
        cam_videos = [videos[0]] * len(cams)
        topics: list[str | None] = [mcapclip.image_topic(c.name) for c in cams]
    else:
        videos = tuple(out / f"{c.name}.mp4" for c in cams)
        cam_videos, topics = list(videos), [None] * len(cams)
    rig = RigConfig(
        cameras=tuple(
            CameraConfig(
                name=c.name,
                video=v,
                topic=topic,
                fps=c.fps,
                width=c.width,
                height=c.height,
                intrinsics=c.intrinsics,
                extrinsics=c.extrinsics,
            )
            for c, v, topic in zip(cams, cam_videos, topics, strict=True)
        ),
        model=TRAINED_MODEL,
    )
    sim_info: dict[str, object] = {
        "generator": SIMULATOR,
        "seed": config.seed,
        "seconds": config.seconds,
        "fps": config.fps,
        "cameras": config.cameras,
        "size": f"{config.width}x{config.height}",
    }
    if mcap:  # (an MP4 clip's rig file stays as it was before there was a choice)
        sim_info["format"] = config.format
    if config.preset != "default":  # (and so does a default world's)
        sim_info["preset"] = config.preset
    rig_path = write_rig(rig, out / RIG_FILE, extra={"simulation": sim_info})

    world = generate_world(config.seed, duration_s=config.seconds, preset=config.preset)
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
    if mcap:
        info["stamp_base_ns"] = mcapclip.STAMP_BASE_NS
    gt = GroundTruthWriter(
        out / GROUND_TRUTH_FILE,
        info=info,
        cameras=rig.names,
        file_names=[v.name for v in cam_videos],
    )
    annotations = 0
    interrupted = False
    writer: _ClipWriter | None = None
    try:
        if mcap:
            writer = mcapclip.McapClipWriter(videos[0], rig.cameras, fps=config.fps, metadata=info)
        else:
            writer = _VideoFiles(videos, fps=config.fps, size=(config.width, config.height))
        total = config.frame_count
        for k in range(total):
            t_s = k / config.fps
            views = renderer.render(t_s, frame_index=k)
            boxes = [v.boxes for v in views]
            writer.submit(k, [v.image for v in views], boxes)
            gt.add_frame(
                frame_index=k,
                timestamp_s=t_s,
                width=config.width,
                height=config.height,
                boxes=boxes,
            )
            annotations += sum(len(b) for b in boxes)
            if progress is not None:
                progress(k + 1, total)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted after %d frames; closing the files written so far", gt.frames)
    finally:
        # the ground truth first: the MCAP file carries it as an attachment
        truth: Path | None = None
        try:
            truth = gt.close()
        finally:
            if writer is not None:
                writer.close(ground_truth=truth)
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
