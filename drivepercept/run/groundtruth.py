"""Labelled data for `drivepercept eval`, told apart by the path given:

* a folder with `seqinfo.ini`: a **MOTChallenge** sequence (`gt/gt.txt`, images in `img1/`);
* a `rig.toml` or its folder: a **synthetic clip** (`ground_truth.json`, from `simulate`);
* a `.mcap` file: a **synthetic drive** from `simulate --format mcap`, its cameras read from
  its image topics, its labels from its `ground_truth.json` attachment;
* a `.json` file: a **COCO** annotation file (any, the mmdetection3d KITTI and nuScenes
  `*.coco.json` too), images found below its folder (or below an image folder given as the
  source, the json as `annotations`) by their path, else their base name.

Each ends as one COCO dict whose images are keyed by (camera, frame_index) as the pipeline's
image-folder reader emits them (a camera per folder, frames in name order), with boxes of the
driving classes, each a target or an ignore region (COCO "crowd": a detection of its class on
it is neither a hit nor a false positive). Classes a table does not name are dropped, as when
COCO scores a subset of its classes. Listed images that are absent are not scored.

The files themselves are read and checked by `drivepercept.eval.truth` (one COCO validator);
what is here is about the run: which images the pipeline reads, as which camera and frame.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.eval import (
    COCO_ANNOTATIONS,
    GROUND_TRUTH_FILE,
    MOT_CLASSES,
    ClassRule,
    class_rule,
    class_table,
    clip_paths,
    load_ground_truth,
    read_coco_json,
    read_mot_rows,
    read_seqinfo,
)
from drivepercept.geometry import MAX_CAMERAS
from drivepercept.rig import resolve_cameras, safe_name
from drivepercept.sources.readers import IMAGE_SUFFIXES, image_files
from drivepercept.sources.recordings import read_attachment, recording_cameras
from drivepercept.types import DRIVING_CLASSES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroundTruth:
    """Labelled data read for eval: what the pipeline reads and what it is scored against."""

    format: str  # synthetic, mot, kitti, nuscenes or coco (the class table used)
    path: Path  # the annotation file
    sources: tuple[str, ...]  # the pipeline's sources (a rig file, NAME=image-folder)
    coco: Mapping[str, Any] = field(repr=False)  # images carry camera and frame_index
    cameras: tuple[str, ...]  # the cameras scored
    # camera -> images its folder reader reads (checked after the run: an image the reader
    # skips would shift every later frame); empty for video clips
    folder_frames: Mapping[str, int] = field(default_factory=dict)
    missing_images: int = 0  # listed in the annotations, not found: not scored


def read_ground_truth(source: str | Path, *, annotations: str | Path | None = None) -> GroundTruth:
    """Labelled data from the path given to `drivepercept eval` (see the module docstring).

    Args:
        source: a MOTChallenge sequence folder, a clip (rig.toml or its folder), a COCO json,
            or an image folder (with `annotations`).
        annotations: a ground-truth file other than the format's default (a clip's
            ground_truth.json, a sequence's gt/gt.txt); for an image folder, its COCO json.

    Raises:
        ConfigError: the path is none of the formats, or its labels or images are unusable.
    """
    path = Path(source)
    gt = Path(annotations) if annotations is not None else None
    if path.is_dir() and (path / "seqinfo.ini").is_file():
        return read_mot(path, gt_file=gt)
    if path.suffix.lower() == ".mcap":
        return read_recorded(path, ground_truth=gt)
    if path.suffix.lower() == ".toml" or (path.is_dir() and (path / "rig.toml").exists()):
        return read_synthetic(path, ground_truth=gt)
    if path.suffix.lower() == ".json" and path.is_file():
        if gt is not None:
            raise ConfigError(f"{path} is the annotation file already: drop --ground-truth {gt}")
        if path.name == GROUND_TRUTH_FILE and (path.parent / "rig.toml").exists():
            return read_synthetic(path.parent, ground_truth=path)
        return read_coco(path, images=path.parent)
    if path.is_dir() and gt is not None:
        return read_coco(gt, images=path)
    if not path.exists():
        raise ConfigError(f"nothing to evaluate at {path}: no such file or folder")
    raise ConfigError(
        f"{path} is no labelled data eval reads: expected a clip (rig.toml), a MOTChallenge "
        "sequence (seqinfo.ini), a COCO json, or an image folder with --ground-truth COCO.json"
    )


def read_synthetic(clip: Path, *, ground_truth: Path | None = None) -> GroundTruth:
    """A `drivepercept simulate` clip: its rig's videos, its ground_truth.json."""
    rig, gt_path = clip_paths(clip, ground_truth)
    names = tuple(c.name for c in resolve_cameras([str(rig)]))
    truth = load_ground_truth(gt_path, cameras=names)
    return GroundTruth("synthetic", gt_path, (str(rig),), truth, names)


def read_recorded(drive: Path, *, ground_truth: Path | None = None) -> GroundTruth:
    """A `simulate --format mcap` drive: the MCAP itself is the pipeline's source (a camera
    per image topic), scored against its `ground_truth.json` attachment (or `ground_truth`).

    Raises:
        ConfigError: no such file, no attachment (and no `ground_truth`), labels malformed, or
            a camera of the recording that the labels lack.
        SourceError: the file cannot be read as MCAP.
    """
    if not drive.is_file():
        raise ConfigError(f"nothing to evaluate at {drive}: no such file")
    names = tuple(c.name for c in recording_cameras(drive))
    if ground_truth is not None:
        truth = load_ground_truth(ground_truth, cameras=names)
        return GroundTruth("synthetic", ground_truth, (str(drive),), truth, names)
    content = read_attachment(drive, GROUND_TRUTH_FILE)
    if content is None:
        raise ConfigError(
            f"{drive} has no ground truth attachment ({GROUND_TRUTH_FILE}, as `drivepercept "
            "simulate --format mcap` writes): give its labels with --ground-truth"
        )
    where = f"{drive} ({GROUND_TRUTH_FILE} attachment)"
    truth = load_ground_truth(where, cameras=names, content=content)
    extra = sorted({str(im["camera"]) for im in truth["images"]} - set(names))
    if extra:  # a drive cut down to some of its topics: the others are not scored
        log.info("%s: cameras %s are labelled but not in the recording", drive, extra)
    return GroundTruth("synthetic", drive, (str(drive),), truth, names)


# --------------------------------------------------------------------------- MOTChallenge


def read_mot(seq: Path, *, gt_file: Path | None = None) -> GroundTruth:
    """A MOTChallenge sequence: every image of `img1/` is scored (frame N is `N.jpg`,
    1-based), against the rows of `gt/gt.txt` (1-based pixels: moved to 0-based)."""
    info = read_seqinfo(seq / "seqinfo.ini")
    folder = seq / info.get("imdir", "img1")
    name = safe_name(info.get("name", seq.name))
    length = int(info["seqlength"]) if info.get("seqlength", "").isdigit() else 0
    frames = [  # (frame number, position in the reader's order, file)
        (int(p.stem), i, p)
        for i, p in enumerate(_listing(folder))
        if p.stem.isdigit() and (not length or int(p.stem) <= length)
    ]
    if not frames:
        raise ConfigError(f"no frame images (000001.jpg, ...) in {folder}")
    images = [
        {"id": n, "camera": name, "frame_index": i, "file_name": str(p)}
        for n, (_, i, p) in enumerate(frames, start=1)
    ]
    by_frame = {frame: n for n, (frame, _, _) in enumerate(frames, start=1)}
    gt_file = gt_file or seq / "gt" / "gt.txt"
    annotations = []
    for row in read_mot_rows(gt_file):
        frame, _, x, y, w, h, consider, cls, visibility = row[:9]
        rule = MOT_CLASSES.get(int(cls))
        image_id = by_frame.get(int(frame))
        if rule is None or image_id is None:
            continue
        scored = rule.scored and consider == 1
        box = [x - 1.0, y - 1.0, w, h]
        annotations.append(_annotation(image_id, rule, box, scored=scored, visibility=visibility))
    return _ground_truth("mot", gt_file, {name: folder}, images, annotations)


# --------------------------------------------------------------------------- COCO json


def read_coco(path: Path, *, images: Path) -> GroundTruth:
    """A COCO annotation file, its images below `images` (matched by path, else base name).

    The class table follows the category names: KITTI's (Car, Cyclist, ...) or nuScenes'
    (car, bicycle, trailer, ...) when every name is one of theirs, else COCO's via
    `canonical_class`. 3D fields and segmentations are not read.
    """
    data = read_coco_json(path, COCO_ANNOTATIONS)
    table = class_table(c["name"] for c in data["categories"])
    rules = {c["id"]: class_rule(table, c["name"]) for c in data["categories"]}
    if not images.is_dir():
        raise ConfigError(f"image folder not found: {images}")
    finder = _ImageFinder(images)
    found: dict[Any, Path] = {}
    for im in data["images"]:
        hit = finder.find(str(im["file_name"]))
        if hit is not None:
            found[im["id"]] = hit
    listed = len(data["images"])
    if not found:
        example = data["images"][0]["file_name"] if listed else "none listed"
        raise ConfigError(
            f"none of the {listed} images in {path} is below {images} (by path or base name, "
            f"e.g. {example}): give the image folder as the source and the json as --ground-truth"
        )
    folders = _camera_names(sorted({p.parent for p in found.values()}))
    listings = {f: {p: i for i, p in enumerate(_listing(f))} for f in folders}
    image_ids: dict[Any, int] = {}
    images_out: list[dict[str, Any]] = []
    by_path: dict[Path, int] = {}
    for coco_id, file in found.items():
        if file not in by_path:  # one image listed twice: scored once
            by_path[file] = len(images_out) + 1
            index, camera = listings[file.parent][file], folders[file.parent]
            images_out.append(  # file_name: the image found, not the json's own path
                {
                    "id": by_path[file],
                    "camera": camera,
                    "frame_index": index,
                    "file_name": str(file),
                }
            )
        image_ids[coco_id] = by_path[file]
    annotations = []
    for ann in data["annotations"]:
        rule, image_id = rules.get(ann["category_id"]), image_ids.get(ann["image_id"])
        if rule is None or image_id is None:
            continue
        scored = rule.scored and not ann.get("iscrowd")
        annotations.append(_annotation(image_id, rule, list(ann["bbox"]), scored=scored))
    missing = listed - len(found)
    if missing:
        log.info("%d of %d images listed in %s are not below %s", missing, listed, path, images)
    cameras = {name: folder for folder, name in folders.items()}
    return _ground_truth(table, path, cameras, images_out, annotations, missing=missing)


class _ImageFinder:
    """Finds an annotation's `file_name` below a root: the path itself, else the one image of
    that base name (of several, the one whose path ends with `file_name`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._by_name: dict[str, list[Path]] | None = None

    def find(self, file_name: str) -> Path | None:
        direct = Path(os.path.normpath(self.root / file_name))
        if direct.is_file() and direct.suffix.lower() in IMAGE_SUFFIXES:
            return direct
        parts = PurePosixPath(file_name.replace("\\", "/")).parts
        if not parts:
            return None
        if self._by_name is None:
            self._by_name = defaultdict(list)
            for p in sorted(self.root.rglob("*")):
                if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file():
                    self._by_name[p.name].append(p)
        candidates = self._by_name.get(parts[-1], [])
        if len(candidates) > 1:  # the same name in several folders: the one the path names
            tail = "/" + "/".join(parts)
            candidates = [p for p in candidates if p.as_posix().endswith(tail)]
            if len(candidates) != 1:
                raise ConfigError(
                    f"{file_name} is not one image below {self.root}: several have its base "
                    "name; give the image folder that holds it as the source"
                )
        return candidates[0] if candidates else None


# --------------------------------------------------------------------------- shared


def _listing(folder: Path) -> list[Path]:
    """The images of a folder in the order the pipeline's image-folder reader reads them."""
    if not folder.is_dir():
        raise ConfigError(f"image folder not found: {folder}")
    return image_files(folder)


def _camera_names(folders: Iterable[Path]) -> dict[Path, str]:
    """One camera per image folder, named after it (repeats get _2, _3, ...)."""
    names: dict[Path, str] = {}
    for folder in folders:
        base = safe_name(folder.name)
        name, n = base, 1
        while name in names.values():
            n += 1
            name = f"{base}_{n}"
        names[folder] = name
    if len(names) > MAX_CAMERAS:
        raise ConfigError(
            f"the annotated images are in {len(names)} folders; eval reads at most "
            f"{MAX_CAMERAS} (one camera per folder)"
        )
    return names


def _annotation(
    image_id: int,
    rule: ClassRule,
    box: list[float],
    *,
    scored: bool,
    visibility: float = 1.0,
) -> dict[str, Any]:
    x, y, w, h = (float(v) for v in box)
    return {
        "image_id": image_id,
        "category_id": DRIVING_CLASSES.index(rule.driving_class) + 1,
        "bbox": [x, y, w, h],
        "area": w * h,
        "iscrowd": 0 if scored else 1,
        "visibility": visibility,
    }


def _ground_truth(
    table: str,
    path: Path,
    cameras: Mapping[str, Path],
    images: list[dict[str, Any]],
    annotations: list[dict[str, Any]],
    *,
    missing: int = 0,
) -> GroundTruth:
    for n, ann in enumerate(annotations, start=1):
        ann["id"] = n
    categories = [{"id": i, "name": c} for i, c in enumerate(DRIVING_CLASSES, start=1)]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    per_camera = {name: len(_listing(folder)) for name, folder in cameras.items()}
    return GroundTruth(
        format=table,
        path=path,
        sources=tuple(f"{name}={folder}" for name, folder in cameras.items()),
        coco=coco,
        cameras=tuple(cameras),
        folder_frames=per_camera,
        missing_images=missing,
    )
