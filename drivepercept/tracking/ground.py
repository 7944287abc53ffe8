"""Where a camera's boxes stand on the ground, in the ego frame: each box's bottom centre
through the camera's intrinsics and mount (`drivepercept.geometry.ground_points_of_rows`), then
half its class's depth farther along the line of sight. For the rig's fusion (`fusion.py`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from drivepercept.geometry import Extrinsics, Intrinsics, camera_rotation, ground_points_of_rows
from drivepercept.rig import CameraConfig

log = logging.getLogger(__name__)

# half an object's depth on the ground, by class (m): from the near side a box's bottom shows,
# to the centre (a car: 4.5 m long, 1.8 m wide, seen from any side on average)
HALF_DEPTH_M = {"car": 1.6, "truck": 2.5, "bus": 3.0, "cyclist": 0.6, "pedestrian": 0.25}


class GroundPlacer:
    """Places boxes on the ground with the rig's geometry. Used by one thread.

    Args:
        cameras: the rig's cameras; those with intrinsics and extrinsics are placed (one log
            line names the rest, or says that none can be).
        max_range_m: places farther than this are not used (a pixel spans metres there).
    """

    def __init__(self, cameras: Sequence[CameraConfig], *, max_range_m: float) -> None:
        self.max_range_m = max_range_m
        self._geometry: dict[str, tuple[Intrinsics, Extrinsics, tuple[int, int] | None]] = {}
        for cam in cameras:
            if cam.intrinsics is not None and cam.extrinsics is not None:
                self._geometry[cam.name] = (cam.intrinsics, cam.extrinsics, cam.size)
        missing = [c.name for c in cameras if c.name not in self._geometry]
        if not self._geometry:
            log.warning(
                "tracking per camera only: the rig has no camera geometry (intrinsics and "
                "extrinsics in rig.toml) to place objects around the vehicle"
            )
        elif missing:
            log.warning(
                "tracking: camera(s) %s have no geometry; their tracks are not joined with "
                "the others", ", ".join(missing)
            )  # fmt: skip
        self._rows: dict[str, npt.NDArray[np.float64]] = {}
        self._never_placed = {name: 0 for name in self._geometry}  # boxes, while none placed
        self._warned: set[str] = set()

    @property
    def placing(self) -> bool:
        """Whether any camera has the geometry to place objects."""
        return bool(self._geometry)

    def place(
        self,
        camera: str,
        xyxy: npt.NDArray[np.float64],
        frame_size: tuple[int, int],
        class_names: Sequence[str] = (),
    ) -> npt.NDArray[np.float64]:
        """(N, 2) ground places (ego x, y) of the objects behind boxes; NaN where a box cannot
        be placed (a camera without geometry, a point at or above the horizon, too far).

        A box's bottom centre is where the object's near side meets the ground; its centre
        is about half its depth farther along the camera's line of sight (`HALF_DEPTH_M` of
        its class), so that two cameras seeing different sides place it alike."""
        return self.place_all([(camera, xyxy, frame_size, class_names)])[0]

    def place_all(
        self,
        frames: Sequence[tuple[str, npt.NDArray[np.float64], tuple[int, int], Sequence[str]]],
    ) -> list[npt.NDArray[np.float64]]:
        """`place` for several frames (camera, boxes, frame size, class names) at once: the
        projection of a whole batch's boxes is one set of array operations."""
        parts, rows, scales, depths, counts = [], [], [], [], []
        for camera, xyxy, frame_size, class_names in frames:
            boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
            geometry = self._geometry.get(camera)
            if geometry is None or not len(boxes):
                counts.append(-len(boxes))  # unplaced: NaN rows
                continue
            size = geometry[2]
            if size is not None and size != frame_size and size[0] > 0 and size[1] > 0:
                # the rig's intrinsics are for its size: a frame of another size scales them
                scales.append((size[0] / frame_size[0], size[1] / frame_size[1]))
            else:
                scales.append((1.0, 1.0))
            parts.append(boxes)
            rows.append(self._row(camera))
            names = class_names if len(class_names) else [""] * len(boxes)
            depths += [HALF_DEPTH_M.get(n, 0.0) for n in names]
            counts.append(len(boxes))
        xy_all = np.zeros((0, 2))
        if parts:
            boxes = np.concatenate(parts) if len(parts) > 1 else parts[0]
            placed = [n for n in counts if n > 0]
            # per box: fx, fy, cx, cy, the rotation's 9, the mount's 3; the frame's scale
            row = np.repeat(np.array(rows), placed, axis=0)
            scale = np.repeat(np.array(scales), placed, axis=0)
            uv = np.empty((len(boxes), 2))
            uv[:, 0] = (boxes[:, 0] + boxes[:, 2]) * 0.5
            uv[:, 1] = boxes[:, 3]
            xy_all = ground_points_of_rows(
                uv * scale,
                row[:, :4],
                row[:, 4:13].reshape(-1, 3, 3),
                row[:, 13:16],
                max_range_m=self.max_range_m,
            )
            sight = xy_all - row[:, 13:15]
            dist = np.hypot(sight[:, 0], sight[:, 1])
            depth = np.array(depths)
            with np.errstate(invalid="ignore", divide="ignore"):
                xy_all = xy_all + sight * (depth / np.where(dist > 0, dist, np.inf))[:, None]
        out, start = [], 0
        for (camera, *_), count in zip(frames, counts, strict=True):
            if count <= 0:
                out.append(np.full((-count, 2), np.nan))
                continue
            xy = xy_all[start : start + count]
            start += count
            self._check_placing(camera, xy)
            out.append(xy)
        return out

    def _row(self, camera: str) -> npt.NDArray[np.float64]:
        """A placed camera's constants for `ground_points_of_rows`, as one row."""
        row = self._rows.get(camera)
        if row is None:
            intrinsics, extrinsics, _ = self._geometry[camera]
            k = [intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy]
            rotation = camera_rotation(extrinsics).ravel().tolist()
            row = self._rows[camera] = np.array([*k, *rotation, *extrinsics.position_m])
        return row

    def _check_placing(self, camera: str, xy: npt.NDArray[np.float64]) -> None:
        """One line for a camera that has boxes but never places any (its view does not
        meet the ground: pitched at the sky, or mounted below the ground)."""
        if camera in self._warned or camera not in self._never_placed:
            return
        if np.isfinite(xy).all(axis=1).any():
            del self._never_placed[camera]
            return
        self._never_placed[camera] += len(xy)
        if self._never_placed[camera] >= 50:
            self._warned.add(camera)
            log.warning(
                "tracking: camera %s placed none of its last %d boxes on the ground (does "
                "its rig geometry point it at the sky?); its tracks stay per camera",
                camera,
                self._never_placed[camera],
            )
