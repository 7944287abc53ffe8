"""Ground truth as COCO JSON, written as the frames are rendered.

Standard COCO `images` / `annotations` / `categories`, extended with what a multi-camera
video needs: each image names its camera, frame index and timestamp; each annotation carries
the object's persistent `track_id`, its `visibility` (0-1, occlusion and truncation), its
visible pixel count and its distance from the camera. `bbox` is COCO `[x, y, w, h]`;
`bbox_xyxy` the same box as pixel edges.

Images and annotations are streamed to side files while rendering and joined at the end, so a
long clip does not hold its annotations in memory, and an interrupted run still leaves a
complete, valid file for the frames it rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from drivepercept.errors import OutputError
from drivepercept.sim.models import Category
from drivepercept.sim.render import GroundTruthBox

SCHEMA_VERSION = 1

_SUPERCATEGORY = {
    Category.CAR: "vehicle",
    Category.TRUCK: "vehicle",
    Category.BUS: "vehicle",
    Category.PEDESTRIAN: "person",
    Category.CYCLIST: "person",
    Category.TRAFFIC_LIGHT: "traffic_control",
    Category.TRAFFIC_SIGN: "traffic_control",
}


def categories() -> list[dict[str, Any]]:
    """The COCO category list of the synthetic world."""
    return [{"id": int(c), "name": c.label, "supercategory": _SUPERCATEGORY[c]} for c in Category]


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False)


class GroundTruthWriter:
    """Streams COCO images and annotations; `close()` writes the final JSON atomically.

    Not thread-safe: one writer, one thread.
    """

    def __init__(
        self,
        path: Path,
        *,
        info: Mapping[str, Any],
        cameras: Sequence[str],
        file_names: Sequence[str] | None = None,
    ) -> None:
        self.path = path
        self._info = dict(info)
        self._cameras = tuple(cameras)
        # each image's `file_name`: its camera's file (default `<camera>.mp4`)
        self._files = tuple(file_names or (f"{c}.mp4" for c in self._cameras))
        self._frames = 0
        self._image_id = 0
        self._ann_id = 0
        self._images_path = path.with_name(path.name + ".images.part")
        self._anns_path = path.with_name(path.name + ".annotations.part")
        try:
            self._images: IO[str] = self._images_path.open("w", encoding="utf-8")
            self._anns: IO[str] = self._anns_path.open("w", encoding="utf-8")
        except OSError as exc:
            raise OutputError(f"cannot write ground truth next to {path}: {exc.strerror}") from None
        self._closed = False

    @property
    def frames(self) -> int:
        """Frames (rig instants) recorded so far."""
        return self._frames

    def add_frame(
        self,
        *,
        frame_index: int,
        timestamp_s: float,
        width: int,
        height: int,
        boxes: Sequence[Sequence[GroundTruthBox]],
    ) -> None:
        """Record one instant: `boxes[i]` are camera i's boxes."""
        for cam, file_name, cam_boxes in zip(self._cameras, self._files, boxes, strict=True):
            self._image_id += 1
            image = {
                "id": self._image_id,
                "file_name": file_name,
                "camera": cam,
                "frame_index": frame_index,
                "timestamp_s": round(timestamp_s, 6),
                "width": width,
                "height": height,
            }
            self._images.write(("," if self._image_id > 1 else "") + _dumps(image) + "\n")
            for b in cam_boxes:
                self._ann_id += 1
                x0, y0, x1, y1 = b.xyxy
                ann = {
                    "id": self._ann_id,
                    "image_id": self._image_id,
                    "category_id": int(b.category),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "bbox_xyxy": [x0, y0, x1, y1],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                    "track_id": b.track_id,
                    "visibility": max(round(b.visibility, 4), 0.0001),
                    "visible_px": b.visible_px,
                    "distance_m": round(b.distance_m, 3),
                    "camera": cam,
                    "frame_index": frame_index,
                }
                self._anns.write(("," if self._ann_id > 1 else "") + _dumps(ann) + "\n")
        self._frames += 1

    def close(self) -> Path:
        """Join the parts into `path` (written to a temporary name, then renamed)."""
        if self._closed:
            return self.path
        self._closed = True
        self._images.close()
        self._anns.close()
        info = dict(self._info, frames=self._frames, schema_version=SCHEMA_VERSION)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("w", encoding="utf-8") as out:
                out.write(
                    '{"info":'
                    + _dumps(info)
                    + ',\n"categories":'
                    + json.dumps(categories())
                    + ',\n"images":[\n'
                )
                _copy(self._images_path, out)
                out.write('],\n"annotations":[\n')
                _copy(self._anns_path, out)
                out.write("]}\n")
            tmp.replace(self.path)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror}") from None
        finally:
            for part in (self._images_path, self._anns_path, tmp):
                part.unlink(missing_ok=True)
        return self.path


def _copy(src: Path, out: IO[str]) -> None:
    with src.open("r", encoding="utf-8") as fh:
        while chunk := fh.read(1 << 20):
            out.write(chunk)
