"""What the benchmark reads: a simulated drive (its rig and ground truth) and a tracked run
of it (detections.jsonl, objects.jsonl, eval.json's thresholds), and each camera's frames as
the scorer sees them, for the identity measures."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from _bench_trackers.measures import Frame
from drivepercept.errors import ConfigError
from drivepercept.eval import EvalThresholds
from drivepercept.eval.tracking import _frames, _step  # the scorer's own view of a run
from drivepercept.rig import load_rig
from drivepercept.run.groundtruth import read_ground_truth
from drivepercept.rundir import RunDir

Line = dict[str, Any]  # one detections.jsonl line


@dataclass(frozen=True)
class Drive:
    """A simulated drive: its ground truth and what the trackers need of its rig."""

    path: Path
    rig_toml: Path
    coco: Mapping[str, Any]
    cameras: tuple[str, ...]
    fps: Mapping[str, float]
    videos: Mapping[str, Path]  # camera -> its video (BoT-SORT's camera-motion compensation)
    mounts: Mapping[str, tuple[float, float]]  # camera -> (x, y) on the vehicle, metres

    @property
    def images(self) -> list[tuple[str, int]]:
        """(camera, frame_index) of every labelled frame of the rig's cameras (as eval)."""
        return [
            (str(im["camera"]), int(im["frame_index"]))
            for im in self.coco["images"]
            if im["camera"] in self.cameras
        ]


@dataclass(frozen=True)
class Run:
    """A tracked run of a drive."""

    path: Path
    name: str
    lines: list[Line]
    objects: list[Line]
    thresholds: EvalThresholds


def read_drive(path: str | Path) -> Drive:
    """A `drivepercept simulate` folder (or its rig.toml).

    Raises:
        ConfigError: no rig.toml or ground truth there, or one eval would refuse.
    """
    path = Path(path)
    rig_toml = path if path.suffix == ".toml" else path / "rig.toml"
    if not rig_toml.is_file():
        raise ConfigError(f"expected a simulated drive with a rig.toml, got {path}")
    truth = read_ground_truth(rig_toml.parent)
    rig = load_rig(rig_toml)
    return Drive(
        path=rig_toml.parent,
        rig_toml=rig_toml,
        coco=truth.coco,
        cameras=truth.cameras,
        fps={c.name: float(c.fps) for c in rig.cameras if c.fps},
        videos={c.name: c.video for c in rig.cameras if c.video is not None},
        mounts={
            c.name: (c.extrinsics.position_m[0], c.extrinsics.position_m[1])
            for c in rig.cameras
            if c.extrinsics is not None
        },
    )


def _jsonl(path: Path) -> list[Line]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def read_run(path: str | Path) -> Run:
    """A run folder of `drivepercept eval DRIVE --track` (eval.json's thresholds, else the
    defaults).

    Raises:
        ConfigError: no detections.jsonl, or its lines carry no track ids.
    """
    path = Path(path)
    folder = RunDir(path)
    detections = folder.detections_jsonl
    if not detections.is_file():
        raise ConfigError(f"expected a run folder with {detections.name}, got {path}")
    lines = _jsonl(detections)
    if not any("track_ids" in line for line in lines):
        raise ConfigError(f"{detections} has no track_ids: make the run with eval --track")
    objects = _jsonl(folder.objects_jsonl) if folder.objects_jsonl.is_file() else []
    thresholds = EvalThresholds()
    if folder.eval_json.is_file():
        saved = json.loads(folder.eval_json.read_text(encoding="utf-8")).get("thresholds")
        if isinstance(saved, Mapping):
            thresholds = EvalThresholds(**saved)
    return Run(path, path.name, lines, objects, thresholds)


def by_camera(lines: Iterable[Line]) -> dict[str, list[Line]]:
    """Each camera's lines in frame_index order."""
    out: dict[str, list[Line]] = defaultdict(list)
    for line in lines:
        out[str(line["camera"])].append(line)
    return {c: sorted(ls, key=lambda line: int(line["frame_index"])) for c, ls in out.items()}


def camera_frames(
    drive: Drive, lines: Sequence[Line], thresholds: EvalThresholds
) -> dict[str, tuple[list[Frame], dict[Hashable, int]]]:
    """Each camera's labelled frames as the scorer sees them (its targets, its scored tracked
    boxes and their ids, from `drivepercept.eval.tracking`'s own `_frames` and `_step`), with
    every box of the line, and where each tracked id was first output (any of its boxes,
    scored or not)."""
    scored = _frames(drive.coco, list(lines), thresholds, drive.images)
    records = {(str(line["camera"]), int(line["frame_index"])): line for line in lines}
    out: dict[str, tuple[list[Frame], dict[Hashable, int]]] = {}
    for cam in sorted({c for c, _ in scored}):
        fps = drive.fps.get(cam, 15.0)
        frames: list[Frame] = []
        born: dict[Hashable, int] = {}
        for pos, key in enumerate(sorted(k for k in scored if k[0] == cam)):
            step = _step(scored[key], key, rig=False)
            line = records.get(key, {})
            for t in line.get("track_ids", []):
                if int(t) >= 0:
                    born.setdefault(("t", cam, int(t)), pos)
            frames.append(
                Frame(
                    t_s=float(line.get("pts_s", key[1] / fps)),
                    gt_ids=step.gt_ids,
                    gt_boxes=step.gt_boxes,
                    pred_ids=step.pred_ids,
                    pred_boxes=step.pred_boxes,
                    det_boxes=np.asarray(line.get("boxes", []), np.float64).reshape(-1, 4),
                    det_scores=np.asarray(line.get("scores", []), np.float64).reshape(-1),
                )
            )
        out[cam] = (frames, born)
    return out
