"""Made stand-ins for the third-party labelled fixtures (../shared/reallabeled), for a clone
without them: a MOT17-style sequence, a KITTI mmdetection3d `*.coco.json` with its `image_2/`
folder and a nuScenes one-camera `*.coco.json`.

They copy the real files' structure (folders, file names, json keys and fields, gt.txt
columns), none of their content: the rows and boxes are written here and the images are
noise. `Labelled` holds their paths and the facts a test expects of them (how many targets,
ignore regions, ...), counted from what was written by what each row or box is declared to
be, not by the readers' class tables.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

Kinds = Mapping[tuple[str, str], int]  # (driving class, "target" or "ignore") -> count


@dataclass(frozen=True)
class Labelled:
    """Labelled data in the three third-party formats and what eval is to make of it."""

    made: bool  # written by `make_labelled`, not the real fixtures
    mot: Path  # a MOTChallenge sequence folder (seqinfo.ini, img1/, gt/gt.txt)
    mot_name: str  # its camera (seqinfo's name)
    mot_frames: int  # images in img1/ (gt.txt rows of later frames are not scored)
    mot_considered: int  # class 1 rows with consider == 1 on those frames: targets
    mot_person_like: int  # consider == 0 pedestrians and classes 2, 7, 8, 12: ignore regions
    mot_visible: int  # of the considered, those at least half visible
    kitti: Path  # the mmdetection3d KITTI json (its images in image_2/ beside it)
    kitti_frame: int  # the labelled image's place in image_2/ (the reader's order)
    kitti_folder_frames: int  # images in image_2/
    kitti_missing: int  # listed in the json, not in image_2/
    kitti_kinds: Kinds
    nuscenes: Path  # the mmdetection3d nuScenes json (one camera's image below it)
    nuscenes_camera: str  # the one camera whose image is there
    nuscenes_missing: int  # the listed images of the other cameras
    nuscenes_kinds: Kinds


# --------------------------------------------------------------------------- MOT17-style

MOT_NAME = "MADE17-01-NOISE"
MOT_SIZE = (320, 180)  # small: the CLI test runs a model on it
MOT_IMAGES = 3  # img1/000001.jpg .. 000003.jpg; gt.txt has rows for frame 4 too
MOT_GT_FRAMES = 4
# (track, class, consider, what it is to eval, visibility in frames 1-4; None: not in it)
MOT_TRACKS: tuple[tuple[int, int, int, str, tuple[float | None, ...]], ...] = (
    (1, 1, 1, "target", (1.0, 0.9, 0.8, 1.0)),
    (2, 1, 1, "target", (0.6, 0.5, 0.45, 0.4)),  # 0.5 is at least half visible
    (3, 1, 1, "target", (0.2, 0.0, 0.3, 0.7)),
    (4, 1, 1, "target", (None, 1.0, 0.1, 1.0)),
    (5, 1, 1, "target", (0.75, None, None, 0.3)),
    (6, 1, 0, "person_like", (1.0, 0.4, 0.0, 1.0)),  # a pedestrian not considered
    (7, 2, 0, "person_like", (0.9, 0.9, None, 0.9)),  # person on a vehicle
    (8, 7, 0, "person_like", (1.0, 1.0, 1.0, 1.0)),  # static person
    (9, 8, 0, "person_like", (0.3, None, 0.6, 0.5)),  # distractor
    (10, 12, 0, "person_like", (None, 0.8, 0.8, None)),  # reflection
    (11, 4, 0, "cycle", (1.0, 0.7, 0.2, 1.0)),  # bicycle
    (12, 5, 0, "cycle", (0.5, None, 1.0, 1.0)),  # motorbike
    (13, 3, 0, "car", (1.0, 1.0, None, 1.0)),
    (14, 6, 0, "dropped", (1.0, 1.0, 1.0, 1.0)),  # non-motorised vehicle
    (15, 9, 0, "dropped", (0.4, 0.6, None, 1.0)),  # occluders
    (16, 10, 0, "dropped", (1.0, None, 0.7, 1.0)),
    (17, 11, 0, "dropped", (None, 0.2, 1.0, 0.8)),
)


def _mot_rows() -> list[tuple[int, int, int, int, int, int, int, int, float, str]]:
    """(frame, track, x, y, w, h, consider, class, visibility, kind), 1-based pixels. Each
    track keeps its own 18-pixel column, so no box overlaps another (nor itself moved down)."""
    rows = []
    for frame in range(1, MOT_GT_FRAMES + 1):
        for slot, (track, cls, consider, kind, seen) in enumerate(MOT_TRACKS):
            visibility = seen[frame - 1]
            if visibility is None:
                continue
            x, y = 2 + 18 * slot + frame % 2, 40 + 7 * (slot % 4) + frame
            w, h = 14, 24 + 6 * (slot % 5)  # all taller than eval's 12-pixel floor
            rows.append((frame, track, x, y, w, h, consider, cls, visibility, kind))
    return rows


def write_mot(root: Path) -> Path:
    """A MOT17-style sequence folder below `root`; returns it."""
    seq = root / MOT_NAME
    info = {
        "name": MOT_NAME,
        "imDir": "img1",
        "frameRate": 30,
        "seqLength": MOT_GT_FRAMES,
        "imWidth": MOT_SIZE[0],
        "imHeight": MOT_SIZE[1],
        "imExt": ".jpg",
    }
    seq.mkdir(parents=True)
    lines = ["[Sequence]", *(f"{key}={value}" for key, value in info.items())]
    (seq / "seqinfo.ini").write_text("\n".join(lines) + "\n")
    for frame in range(1, MOT_IMAGES + 1):
        noise_image(seq / "img1" / f"{frame:06d}.jpg", MOT_SIZE, seed=frame)
    (seq / "gt").mkdir()
    lines = [",".join(str(v) for v in row[:9]) for row in _mot_rows()]
    (seq / "gt" / "gt.txt").write_text("\n".join(lines) + "\n")
    return seq


# --------------------------------------------------------------------------- KITTI-style

KITTI_FILES = ("000000.png", "000003.png", "000007.png", "000010.png")  # in image_2/
KITTI_SIZE = (320, 96)
KITTI_NAMES = ("Pedestrian", "Cyclist", "Car")
KITTI_AS = {"Pedestrian": "pedestrian", "Cyclist": "cyclist", "Car": "car"}  # all targets
# (image listed in the json, there or not, its boxes: name and [x, y, w, h])
KITTI_LABELS: tuple[tuple[str, bool, tuple[tuple[str, list[float]], ...]], ...] = (
    (
        "000007.png",
        True,
        (
            ("Car", [10.5, 40.0, 60.25, 30.0]),
            ("Car", [80.0, 35.5, 40.0, 22.0]),
            ("Pedestrian", [140.0, 30.0, 12.0, 34.0]),
            ("Pedestrian", [170.0, 32.0, 11.0, 30.5]),
            ("Cyclist", [200.0, 28.0, 20.0, 36.0]),
        ),
    ),
    ("000012.png", False, (("Car", [5.0, 40.0, 50.0, 30.0]),)),  # not in image_2/
)


def _frame_id(name: str) -> int:
    return int(Path(name).stem)


def write_kitti(root: Path) -> Path:
    """An mmdetection3d-style KITTI json in `root` and its image_2/ folder; returns the json.
    Its file_names keep the source repository's folders (training/image_2/...)."""
    for n, name in enumerate(KITTI_FILES):
        noise_image(root / "image_2" / name, KITTI_SIZE, seed=10 + n)
    eye = np.eye(4).tolist()
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for name, _, boxes in KITTI_LABELS:
        file_name = f"training/image_2/{name}"
        images.append(
            {
                "file_name": file_name,
                "id": _frame_id(name),
                "Tri2v": eye,
                "Trv2c": eye,
                "rect": eye,
                "cam_intrinsic": [[200.0, 0.0, 160.0, 0.0], [0.0, 200.0, 48.0, 0.0], *eye[2:]],
                "width": KITTI_SIZE[0],
                "height": KITTI_SIZE[1],
            }
        )
        for label, box in boxes:
            x, y, w, h = box
            depth = 10.0 + len(annotations)
            annotations.append(
                {
                    "file_name": file_name,
                    "image_id": _frame_id(name),
                    "area": w * h,
                    "category_name": label,
                    "category_id": KITTI_NAMES.index(label),
                    "bbox": box,
                    "iscrowd": 0,
                    "bbox_cam3d": [0.0, 1.0, depth, 1.0, 1.5, 1.0, -1.57],
                    "velo_cam3d": -1,
                    "center2d": [x + w / 2, y + h / 2, depth],
                    "attribute_name": -1,
                    "attribute_id": -1,
                    "segmentation": [],
                    "id": len(annotations),
                }
            )
    return _write_coco(root / "kitti_infos_mono3d.coco.json", images, annotations, KITTI_NAMES)


# --------------------------------------------------------------------------- nuScenes-style

NUSCENES_NAMES = (
    "car",
    "truck",
    "trailer",
    "bus",
    "construction_vehicle",
    "bicycle",
    "motorcycle",
    "pedestrian",
    "traffic_cone",
    "barrier",
)
NUSCENES_CAMERAS = (
    "CAM_FRONT",
    "CAM_FRONT_RIGHT",
    "CAM_FRONT_LEFT",
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
)
NUSCENES_PRESENT = "CAM_FRONT_RIGHT"  # the one camera whose image is written
NUSCENES_SIZE = (320, 180)
# what eval is to make of each name on the camera that is there; None: dropped
NUSCENES_AS: Mapping[str, tuple[str, str] | None] = {
    "car": ("car", "target"),
    "pedestrian": ("pedestrian", "target"),
    "bicycle": ("cyclist", "target"),
    "motorcycle": ("cyclist", "target"),
    "trailer": ("truck", "ignore"),
    "traffic_cone": None,
    "barrier": None,
}
# camera -> its boxes (name, [x, y, w, h]); each box keeps its own columns
NUSCENES_BOXES: Mapping[str, tuple[tuple[str, list[float]], ...]] = {
    "CAM_FRONT": (("truck", [0.0, 60.0, 120.0, 80.0]), ("car", [150.0, 70.0, 60.0, 40.0])),
    "CAM_FRONT_RIGHT": (
        ("car", [2.0, 80.0, 50.0, 35.0]),
        ("car", [60.0, 75.0, 40.0, 30.5]),
        ("pedestrian", [110.0, 60.0, 14.0, 40.0]),
        ("bicycle", [130.0, 70.0, 20.0, 30.0]),
        ("motorcycle", [160.0, 72.0, 22.0, 28.0]),
        ("trailer", [190.0, 50.0, 60.0, 45.0]),
        ("traffic_cone", [260.0, 100.0, 8.0, 14.0]),
        ("traffic_cone", [275.0, 101.0, 7.0, 13.0]),
        ("barrier", [290.0, 95.0, 28.0, 12.0]),
    ),
    "CAM_FRONT_LEFT": (("bus", [40.0, 30.0, 150.0, 110.0]),),
    "CAM_BACK": (("construction_vehicle", [100.0, 50.0, 90.0, 70.0]),),
    "CAM_BACK_LEFT": (),
    "CAM_BACK_RIGHT": (("pedestrian", [200.0, 60.0, 15.0, 42.0]),),
}


def _token(n: int) -> str:
    return f"{n:032x}"


def write_nuscenes(root: Path) -> Path:
    """An mmdetection3d-style nuScenes json in `root` listing one sample's six cameras, only
    NUSCENES_PRESENT's image below samples/; returns the json."""
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for n, camera in enumerate(NUSCENES_CAMERAS):
        file_name = f"samples/{camera}/made-0001__{camera}__{1_000_000 + n}.jpg"
        if camera == NUSCENES_PRESENT:
            noise_image(root / file_name, NUSCENES_SIZE, seed=20 + n)
        image_id = _token(100 + n)
        images.append(
            {
                "file_name": file_name,
                "id": image_id,
                "token": _token(200 + n),
                "cam2ego_rotation": [1.0, 0.0, 0.0, 0.0],
                "cam2ego_translation": [1.0, 0.0, 1.5],
                "ego2global_rotation": [1.0, 0.0, 0.0, 0.0],
                "ego2global_translation": [100.0, 200.0, 0.0],
                "cam_intrinsic": [[250.0, 0.0, 160.0], [0.0, 250.0, 90.0], [0.0, 0.0, 1.0]],
                "width": NUSCENES_SIZE[0],
                "height": NUSCENES_SIZE[1],
            }
        )
        for name, box in NUSCENES_BOXES[camera]:
            x, y, w, h = box
            depth = 8.0 + len(annotations)
            annotations.append(
                {
                    "file_name": file_name,
                    "image_id": image_id,
                    "area": w * h,
                    "category_name": name,
                    "category_id": NUSCENES_NAMES.index(name),
                    "bbox": box,
                    "iscrowd": 0,
                    "bbox_cam3d": [0.0, 0.5, depth, 1.0, 1.0, 1.0, 0.0],
                    "velo_cam3d": [0.0, 0.0],
                    "center2d": [x + w / 2, y + h / 2, depth],
                    "attribute_name": "made.still",
                    "attribute_id": 0,
                    "segmentation": [],
                    "id": len(annotations),
                }
            )
    return _write_coco(root / "nus_infos_mono3d.coco.json", images, annotations, NUSCENES_NAMES)


# --------------------------------------------------------------------------- all three


def noise_image(path: Path, size: tuple[int, int], *, seed: int) -> None:
    """A (width, height) image of noise at `path` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels: np.ndarray[Any, np.dtype[np.uint8]] = rng.integers(
        0, 256, (size[1], size[0], 3), dtype=np.uint8
    )
    if not cv2.imwrite(str(path), pixels):
        raise OSError(f"could not write {path}")


def make_labelled(root: Path) -> Labelled:
    """The three stand-ins written below `root`, with the facts counted from their rows and
    boxes by what each is declared to be."""
    scored = [r for r in _mot_rows() if r[0] <= MOT_IMAGES]
    considered = [r for r in scored if r[9] == "target"]
    kitti_there = [
        (KITTI_AS[label], "target")
        for _, there, boxes in KITTI_LABELS
        if there
        for label, _ in boxes
    ]
    nuscenes_there = [NUSCENES_AS[name] for name, _ in NUSCENES_BOXES[NUSCENES_PRESENT]]
    (labelled,) = (name for name, there, _ in KITTI_LABELS if there)
    return Labelled(
        made=True,
        mot=write_mot(root / "mot17"),
        mot_name=MOT_NAME,
        mot_frames=MOT_IMAGES,
        mot_considered=len(considered),
        mot_person_like=sum(r[9] == "person_like" for r in scored),
        mot_visible=sum(r[8] >= 0.5 for r in considered),
        kitti=write_kitti(root / "kitti"),
        kitti_frame=sorted(KITTI_FILES).index(labelled),
        kitti_folder_frames=len(KITTI_FILES),
        kitti_missing=sum(not there for _, there, _ in KITTI_LABELS),
        kitti_kinds=Counter(kitti_there),
        nuscenes=write_nuscenes(root / "nuscenes_one_camera"),
        nuscenes_camera=NUSCENES_PRESENT,
        nuscenes_missing=len(NUSCENES_CAMERAS) - 1,
        nuscenes_kinds=Counter(kind for kind in nuscenes_there if kind is not None),
    )


def _write_coco(
    path: Path,
    images: list[dict[str, Any]],
    annotations: list[dict[str, Any]],
    names: Sequence[str],
) -> Path:
    """An mmdetection3d-style COCO json: images, annotations, categories numbered from 0."""
    categories = [{"id": i, "name": name} for i, name in enumerate(names)]
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return path
