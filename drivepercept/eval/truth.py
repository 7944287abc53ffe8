"""Ground-truth files, read and checked: COCO json and MOTChallenge's text files.

Every COCO file eval reads (a `simulate` clip's ground_truth.json, any annotation file) is
checked by the one validator here, `read_coco_json`, told by a `CocoKind` how errors name the
file and which fields beside COCO's own its items must have. Which of the labelled images the
pipeline reads, and in which order, is the job's (`drivepercept.run.groundtruth`).
"""

from __future__ import annotations

import configparser
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError

GROUND_TRUTH_FILE = "ground_truth.json"
COCO_SECTIONS = ("images", "annotations", "categories")
MOT_COLUMNS = "frame, id, x, y, w, h, consider, class, visibility"

_Types = tuple[type, ...]


@dataclass(frozen=True)
class CocoKind:
    """One kind of COCO file for `read_coco_json`: its error messages (`str.format` templates
    of path, where (the section) and error) and what its items hold beside COCO's own fields
    (ids, file names, category names, `bbox` [x, y, w, h])."""

    what: str  # names the file: "cannot read {what} {path}"
    missing: str  # no file there
    not_coco: str  # no images/annotations/categories lists
    malformed: str  # an item lacks a field or has one of the wrong type
    id_types: _Types  # of image, category and annotation ids
    image_fields: Mapping[str, _Types]  # beside the id
    annotation_fields: Mapping[str, _Types]  # beside image_id, category_id and bbox
    visibility: bool = False  # annotations may carry a visibility, a number


SIMULATED_TRUTH = CocoKind(
    what="ground truth",
    missing=f"no ground truth at {{path}}: eval needs a clip with {GROUND_TRUTH_FILE} "
    "(as `drivepercept simulate` writes)",
    not_coco="ground truth {path} lacks COCO images/annotations/categories lists",
    malformed="ground truth {path} is malformed ({error}); "
    "see the format `drivepercept simulate` writes",
    id_types=(int,),
    image_fields={"frame_index": (int,), "camera": (str,)},
    annotation_fields={"id": (int,)},
    visibility=True,
)
COCO_ANNOTATIONS = CocoKind(  # any COCO file: ids may be strings, images are found by name
    what="annotation file",
    missing="annotation file not found: {path}",
    not_coco="{path} is not a COCO annotation file: no images/annotations/categories",
    malformed="{path}: malformed COCO {where} ({error})",
    id_types=(int, str),
    image_fields={"file_name": (str,)},
    annotation_fields={},
)


def read_coco_json(path: Path, kind: CocoKind, *, content: bytes | None = None) -> dict[str, Any]:
    """A COCO file read and checked item by item, so that scoring can index it blindly.

    Args:
        path: the file; with `content`, what names the labels in errors.
        kind: what the file is and holds.
        content: the file's bytes, read elsewhere (an MCAP attachment).

    Raises:
        ConfigError: missing, unreadable, not JSON, no COCO lists, or an item malformed.
    """
    try:
        text = path.read_text(encoding="utf-8") if content is None else content.decode("utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        raise ConfigError(kind.missing.format(path=path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {kind.what} {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{kind.what} {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in COCO_SECTIONS):
        raise ConfigError(kind.not_coco.format(path=path))
    where = "images"
    try:
        for im in data["images"]:
            _require(im, {"id": kind.id_types, **kind.image_fields})
        where = "categories"
        for cat in data["categories"]:
            _require(cat, {"id": kind.id_types, "name": (str,)})
        where = "annotations"
        ids = {"image_id": kind.id_types, "category_id": kind.id_types}
        for ann in data["annotations"]:
            _require(ann, {**kind.annotation_fields, **ids})
            box = ann["bbox"]
            if not (isinstance(box, list) and len(box) == 4 and all(map(_is_number, box))):
                raise ValueError(f"bbox must be 4 numbers [x, y, w, h], got {box!r}")
            if min(box[2:]) < 0:
                raise ValueError(f"bbox [x, y, w, h] must have w >= 0 and h >= 0, got {box!r}")
            if kind.visibility and not _is_number(ann.get("visibility", 1.0)):
                raise ValueError(f"visibility must be a number, got {ann['visibility']!r}")
    except (KeyError, TypeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise ConfigError(kind.malformed.format(path=path, where=where, error=error)) from None
    return data


def _require(item: Mapping[str, Any], fields: Mapping[str, _Types]) -> None:
    for key, types in fields.items():
        value = item[key]
        if isinstance(value, bool) or not isinstance(value, types):
            names = " or ".join("an integer" if t is int else "a string" for t in types)
            raise ValueError(f"{key} must be {names}, got {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_ground_truth(
    path: str | Path, *, cameras: Sequence[str] | None = None, content: bytes | None = None
) -> dict[str, Any]:
    """Read and check a COCO ground-truth file in the `simulate` format (`content`: its
    bytes, read elsewhere, `path` naming them in errors).

    Raises:
        ConfigError: missing, not JSON, missing COCO sections, or lacking a rig camera.
    """
    path = Path(path)
    data = read_coco_json(path, SIMULATED_TRUTH, content=content)
    if cameras is not None:
        gt_cameras = {str(im["camera"]) for im in data["images"]}
        missing = [c for c in cameras if c not in gt_cameras]
        if missing:
            raise ConfigError(
                f"ground truth {path} has no camera {', '.join(missing)}; it has: "
                f"{', '.join(sorted(gt_cameras)) or 'none'}"
            )
    return data


def clip_paths(clip: str | Path, ground_truth: str | Path | None = None) -> tuple[Path, Path]:
    """(rig.toml, ground_truth.json) of a clip given as its folder or its rig file."""
    clip = Path(clip)
    rig = clip / "rig.toml" if clip.is_dir() else clip
    if not rig.exists():
        raise ConfigError(f"no rig file at {rig}: give a clip folder or its rig.toml")
    gt = Path(ground_truth) if ground_truth is not None else rig.parent / GROUND_TRUTH_FILE
    return rig, gt


# --------------------------------------------------------------------------- MOTChallenge


def read_seqinfo(path: Path) -> dict[str, str]:
    """The [Sequence] section of a MOTChallenge seqinfo.ini (keys lower-cased)."""
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text(encoding="utf-8"))
    except configparser.MissingSectionHeaderError:
        pass  # said below
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise ConfigError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not parser.has_section("Sequence"):
        raise ConfigError(f"{path} has no [Sequence] section (a MOTChallenge seqinfo.ini)")
    return dict(parser["Sequence"])  # keys lower-cased by configparser


def read_mot_rows(path: Path) -> list[tuple[float, ...]]:
    """The rows of a MOTChallenge gt.txt (`MOT_COLUMNS`, then any more), checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no ground truth at {path} (MOTChallenge test sets have none)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = tuple(float(v) for v in line.split(","))
        except ValueError:
            row = ()
        if len(row) < 9 or not all(math.isfinite(v) for v in row) or min(row[4:6]) < 0:
            raise ConfigError(
                f"{path} line {n}: expected {MOT_COLUMNS} (numbers, w and h >= 0), "
                f"got {line[:80]!r}"
            )
        rows.append(row)
    return rows
