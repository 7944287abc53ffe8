"""Rasterise the world for every camera of the rig, with exact ground truth.

Painter's algorithm with OpenCV: sky and ground first, then the road surface, then solids from
far to near (and the parts of each solid from far to near), back faces culled, faces clipped
at the near plane. Alongside the colour image, the same polygons are drawn into an instance
map (the track id of the labelled object that owns each pixel, 0 elsewhere), so the
ground-truth box of an object is the bounding rectangle of exactly the pixels it ended up owning.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.sim import road as rd
from drivepercept.sim.camera import CameraModel, Pose2D
from drivepercept.sim.models import CUBOID_FACES, CUBOID_NORMALS, Category, Solid
from drivepercept.sim.world import VIEW_RANGE_M, World

FloatArray = npt.NDArray[np.float64]
ImageU8 = npt.NDArray[np.uint8]

NEAR_M = 0.05
_SHIFT = 4  # fixed-point bits for OpenCV polygon vertices (1/16 px)
_ONE = 1 << _SHIFT
_MAX_SILHOUETTE_PX = 4_000_000  # larger silhouettes are measured at reduced scale


@dataclass(frozen=True)
class GroundTruthBox:
    """One labelled object as one camera sees it.

    Attributes:
        track_id: persistent id of the object across frames and cameras.
        category: its class.
        xyxy: (x0, y0, x1, y1) pixel edges of the visible pixels: pixel i spans [i, i + 1), so
            the box covers columns x0..x1-1 and rows y0..y1-1; clipped to the image.
        visible_px: pixels of the image the object owns.
        visibility: visible_px over the pixels its whole projection would cover with no
            occluder on a canvas extending the image by its width and height on every side
            (so it accounts for occlusion and truncation); in (0, 1].
        distance_m: distance from the camera centre to the centre of the object's box.
    """

    track_id: int
    category: Category
    xyxy: tuple[int, int, int, int]
    visible_px: int
    visibility: float
    distance_m: float


@dataclass(frozen=True, eq=False)
class RenderedView:
    """One camera's frame at one instant."""

    camera: str
    image: ImageU8
    instance_map: npt.NDArray[np.int32]
    boxes: tuple[GroundTruthBox, ...]

    def __repr__(self) -> str:
        return (
            f"RenderedView(camera={self.camera!r}, image={self.image.shape}, "
            f"boxes={len(self.boxes)})"
        )


@dataclass(frozen=True, eq=False)
class _Scene:
    """Every face in the world near the ego at one instant, in world coordinates."""

    quads: FloatArray  # (F, 4, 3)
    normals: FloatArray  # (F, 3)
    colours: FloatArray  # (F, 3) shaded BGR
    face_id: npt.NDArray[np.int32]  # (F,) track id drawn into the instance map, 0 if unlabelled
    face_part: npt.NDArray[np.int64]  # (F,) global part index
    part_obj: npt.NDArray[np.int64]  # (P,) object index
    part_centres: FloatArray  # (P, 3)
    part_radius: FloatArray  # (P,) half the diagonal of the part
    obj_centres: FloatArray  # (O, 3) labelled centre (for distance and sorting)
    obj_radius: FloatArray  # (O,)
    obj_track: npt.NDArray[np.int32]  # (O,) 0 for scenery
    obj_category: npt.NDArray[np.int64]  # (O,) 0 for scenery
    ground: tuple[tuple[tuple[int, int, int], FloatArray], ...]  # (colour, quads) back to front


@dataclass(frozen=True, eq=False)
class _PartTable:
    """The parts of many solids packed into flat arrays; owner[i] is part i's solid."""

    vertices: FloatArray  # (P, 8, 3) in the solid's frame
    colours: FloatArray
    labelled: npt.NDArray[np.bool_]
    emissive: npt.NDArray[np.bool_]
    swing: FloatArray
    lamp: npt.NDArray[np.int64]
    owner: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]  # (S + 1,) first part of each solid, then P

    @classmethod
    def pack(cls, solids: Sequence[Solid]) -> _PartTable:
        counts = [len(x.vertices_m) for x in solids]
        if not solids:
            return cls(
                np.zeros((0, 8, 3)),
                np.zeros((0, 3)),
                np.zeros(0, bool),
                np.zeros(0, bool),
                np.zeros(0),
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                np.zeros(1, np.int64),
            )
        return cls(
            vertices=np.concatenate([x.vertices_m for x in solids]),
            colours=np.concatenate([x.colours for x in solids]),
            labelled=np.concatenate([x.labelled for x in solids]),
            emissive=np.concatenate([x.emissive for x in solids]),
            swing=np.concatenate([x.swing for x in solids]),
            lamp=np.concatenate([x.lamp for x in solids]),
            owner=np.repeat(np.arange(len(solids)), counts),
            starts=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        )


def _shade(
    colours: FloatArray, normals: FloatArray, emissive: npt.NDArray[np.bool_], world: World
) -> FloatArray:
    light = world.lighting
    lambert = np.clip(normals @ np.array(light.sun_dir), 0.0, None)
    factor = light.ambient + light.diffuse * lambert
    factor = np.where(emissive, 1.0, factor)
    return np.clip(colours * factor[:, None], 0.0, 255.0)


class Renderer:
    """Renders every camera of a rig at a given instant of a world.

    Not thread-safe: one renderer per thread. Allocates its frame buffers once.
    """

    def __init__(
        self,
        world: World,
        cameras: Sequence[CameraModel],
        *,
        noise: bool = True,
        noise_seed: int = 0,
    ) -> None:
        self.world = world
        self.cameras = tuple(cameras)
        self.noise = noise
        self._noise_seed = noise_seed
        self._backgrounds = [self._background(cam) for cam in self.cameras]
        self._actors = _PartTable.pack([a.solid for a in world.actors])
        self._actor_centres = np.array([a.solid.centre_m for a in world.actors]).reshape(-1, 3)
        self._actor_radius = np.array([a.solid.radius_m for a in world.actors])
        self._actor_track = np.array([a.track_id for a in world.actors], dtype=np.int32)
        self._actor_cat = np.array([int(a.category or 0) for a in world.actors], dtype=np.int64)
        # Scenery never moves: pose it once.
        self._scenery = _PartTable.pack([a.solid for a in world.scenery])
        poses = world.scenery_poses()
        self._scenery_verts = (
            np.concatenate(
                [
                    p.to_world(a.solid.vertices_m.reshape(-1, 3)).reshape(-1, 8, 3)
                    for a, p in zip(world.scenery, poses, strict=True)
                ]
            )
            if world.scenery
            else np.zeros((0, 8, 3))
        )
        self._scenery_s = np.array([a.motion.s0_m for a in world.scenery])
        starts = self._scenery.starts
        flat = [self._scenery_verts[a:b].reshape(-1, 3) for a, b in itertools.pairwise(starts)]
        self._scenery_centres = np.array([(f.min(0) + f.max(0)) / 2 for f in flat]).reshape(-1, 3)
        self._scenery_radius = np.array([np.linalg.norm(f.max(0) - f.min(0)) / 2 for f in flat])
        self._noise_bank: dict[tuple[int, int], tuple[ImageU8, ImageU8]] = {}

    # ------------------------------------------------------------------ scene assembly

    def scene(self, t_s: float) -> _Scene:
        """Gather every solid within VIEW_RANGE_M of the ego at time t (vectorised)."""
        world = self.world
        ego_s = world.ego_s(t_s)
        st = world.actor_states(t_s)
        near_a = np.abs(st.s_m - ego_s) < VIEW_RANGE_M
        near_s = np.abs(self._scenery_s - ego_s) < VIEW_RANGE_M
        ta, ts = self._actors, self._scenery

        # Actors: pose every part of every near actor in one go.
        pa = np.flatnonzero(near_a[ta.owner])
        owner = ta.owner[pa]
        local = ta.vertices[pa].copy()
        local[..., 0] += (ta.swing[pa] * 0.25 * st.gait[owner])[:, None]
        c, s = np.cos(st.heading_rad[owner]), np.sin(st.heading_rad[owner])
        verts_a = np.empty_like(local)
        verts_a[..., 0] = (
            c[:, None] * local[..., 0] - s[:, None] * local[..., 1] + st.x_m[owner][:, None]
        )
        verts_a[..., 1] = (
            s[:, None] * local[..., 0] + c[:, None] * local[..., 1] + st.y_m[owner][:, None]
        )
        verts_a[..., 2] = local[..., 2]
        lit = st.lit_lamp[owner]
        dim = (lit >= 0) & (ta.lamp[pa] >= 0) & (ta.lamp[pa] != lit)
        colours_a = np.where(dim[:, None], ta.colours[pa] * 0.22, ta.colours[pa])
        actors = np.flatnonzero(near_a)
        ac = self._actor_centres[actors]
        hc, hs = np.cos(st.heading_rad[actors]), np.sin(st.heading_rad[actors])
        centres_a = np.stack(
            [
                hc * ac[:, 0] - hs * ac[:, 1] + st.x_m[actors],
                hs * ac[:, 0] + hc * ac[:, 1] + st.y_m[actors],
                ac[:, 2],
            ],
            axis=1,
        )
        # Object index: position among the near actors, then the near scenery.
        remap = np.cumsum(near_a) - 1
        obj_a = remap[owner]

        ps = np.flatnonzero(near_s[ts.owner]) if len(ts.owner) else np.zeros(0, dtype=np.int64)
        remap_s = np.cumsum(near_s) - 1 + len(actors)
        scenery = np.flatnonzero(near_s)

        all_verts = np.concatenate([verts_a, self._scenery_verts[ps]])
        part_obj = np.concatenate([obj_a, remap_s[ts.owner[ps]]]).astype(np.int64)
        part_colours = np.concatenate([colours_a, ts.colours[ps]])
        part_emissive = np.concatenate([ta.emissive[pa], ts.emissive[ps]])
        part_labelled = np.concatenate([ta.labelled[pa], np.zeros(len(ps), dtype=bool)])
        track = np.concatenate([self._actor_track[actors], np.zeros(len(scenery), dtype=np.int32)])
        n_parts = len(all_verts)
        quads = all_verts[:, CUBOID_FACES].reshape(-1, 4, 3)
        # Face normals rotate with the solid's heading; take them from the posed edges.
        e1 = all_verts[:, 1] - all_verts[:, 0]
        e2 = all_verts[:, 2] - all_verts[:, 0]
        ex = e1 / np.maximum(np.linalg.norm(e1, axis=1, keepdims=True), 1e-12)
        ey = e2 / np.maximum(np.linalg.norm(e2, axis=1, keepdims=True), 1e-12)
        ez = np.broadcast_to(np.array([0.0, 0.0, 1.0]), ex.shape)
        axes = np.stack([ex, ey, ez], axis=1)  # (P, 3, 3)
        normals = np.einsum("fk,pkj->pfj", CUBOID_NORMALS, axes).reshape(-1, 3)
        face_part = np.repeat(np.arange(n_parts), 6)
        face_id = np.where(part_labelled, track[part_obj], 0)[face_part]
        shaded = _shade(part_colours[face_part], normals, part_emissive[face_part], world)
        return _Scene(
            quads=quads,
            normals=normals,
            colours=shaded,
            face_id=face_id.astype(np.int32),
            face_part=face_part,
            part_obj=part_obj,
            part_centres=all_verts.mean(axis=1),
            part_radius=np.linalg.norm(all_verts[:, 7] - all_verts[:, 0], axis=1) / 2,
            obj_centres=np.concatenate([centres_a, self._scenery_centres[scenery]]),
            obj_radius=np.concatenate([self._actor_radius[actors], self._scenery_radius[scenery]]),
            obj_track=track,
            obj_category=np.concatenate(
                [self._actor_cat[actors], np.zeros(len(scenery), dtype=np.int64)]
            ),
            ground=self._ground(ego_s),
        )

    def _ground(self, ego_s: float) -> tuple[tuple[tuple[int, int, int], FloatArray], ...]:
        """Road surface layers around the ego, painted in this order."""
        road = self.world.road
        light = self.world.lighting
        lo, hi = ego_s - 150.0, ego_s + 500.0
        shade = light.ambient + light.diffuse * max(light.sun_dir[2], 0.0)

        def lit(c: tuple[int, int, int]) -> tuple[int, int, int]:
            return tuple(int(min(255, v * shade)) for v in c)  # type: ignore[return-value]

        asphalt = light.asphalt
        layers: list[tuple[tuple[int, int, int], FloatArray]] = [
            (lit((150, 155, 160)), road.band_quads(lo, hi, *rd.RIGHT_SIDEWALK_D, 5.0)),
            (lit((150, 155, 160)), road.band_quads(lo, hi, *rd.LEFT_SIDEWALK_D, 5.0)),
            (
                lit((asphalt[0] - 10, asphalt[1] - 5, asphalt[2] + 25)),
                road.band_quads(lo, hi, *rd.RIGHT_BIKE_D, 5.0),
            ),
            (
                lit((asphalt[0] - 10, asphalt[1] - 5, asphalt[2] + 25)),
                road.band_quads(lo, hi, *rd.LEFT_BIKE_D, 5.0),
            ),
            (lit(asphalt), road.band_quads(lo, hi, rd.RIGHT_EDGE_D, rd.LEFT_EDGE_D, 5.0)),
        ]
        white = lit((225, 225, 225))
        yellow = lit((40, 190, 230))
        m_lo, m_hi = ego_s - 100.0, ego_s + 160.0
        solid_lines = [
            road.band_quads(m_lo, m_hi, rd.RIGHT_EDGE_D + 0.1, rd.RIGHT_EDGE_D + 0.25, 4.0),
            road.band_quads(m_lo, m_hi, rd.LEFT_EDGE_D - 0.25, rd.LEFT_EDGE_D - 0.1, 4.0),
        ]
        layers.append((white, np.concatenate(solid_lines)))
        layers.append(
            (
                yellow,
                np.concatenate(
                    [
                        road.band_quads(m_lo, m_hi, -0.22, -0.1, 4.0),
                        road.band_quads(m_lo, m_hi, 0.1, 0.22, 4.0),
                    ]
                ),
            )
        )
        # Dashed lane separators: 3 m dash every 9 m, fixed to the road.
        start = math.floor(m_lo / 9.0) * 9.0
        dash_s = np.arange(start, m_hi, 9.0)
        dashes = []
        for d in (-rd.LANE_WIDTH_M, -2 * rd.LANE_WIDTH_M, rd.LANE_WIDTH_M):
            n = len(dash_s)
            dashes.append(
                road.patch_quads(dash_s, dash_s + 3.0, np.full(n, d - 0.07), np.full(n, d + 0.07))
            )
        # Zebra crossings: 0.5 m stripes across the carriageway.
        for s_c in self.world.crosswalks_s:
            if m_lo - 5 < s_c < m_hi + 5:
                d0 = np.arange(rd.RIGHT_EDGE_D + 0.5, rd.LEFT_EDGE_D - 0.5, 1.0)
                n = len(d0)
                dashes.append(
                    road.patch_quads(np.full(n, s_c - 2.0), np.full(n, s_c + 2.0), d0, d0 + 0.5)
                )
        layers.append((white, np.concatenate(dashes)))
        return tuple(layers)

    # ------------------------------------------------------------------ per camera

    def _background(self, cam: CameraModel) -> ImageU8:
        """Sky gradient above the horizon, ground fading into haze below it."""
        light = self.world.lighting
        h, w = cam.height, cam.width
        pitch = math.radians(cam.config.extrinsics.pitch_deg) if cam.config.extrinsics else 0.0
        fy, cy = cam.K[1, 1], cam.K[1, 2]
        horizon = cy - fy * math.tan(pitch)  # row of the horizon (cameras never roll)
        rows = np.arange(h, dtype=np.float64) + 0.5
        img = np.empty((h, w, 3), dtype=np.uint8)
        top, hor = np.array(light.sky_top, float), np.array(light.sky_horizon, float)
        sky_t = np.clip((horizon - rows) / max(horizon, 1.0), 0.0, 1.0)[:, None]
        sky = hor * (1 - sky_t) + top * sky_t
        # Ground distance at each row below the horizon, for the haze.
        cam_h = cam.mount_m[2]
        ang = np.arctan((rows - cy) / fy) + pitch
        dist = np.where(ang > 1e-4, cam_h / np.maximum(np.tan(ang), 1e-4), 1e9)
        fog = np.exp(-dist / light.visibility_m)[:, None]
        ground = np.array(light.ground, float) * fog + np.array(light.haze, float) * (1 - fog)
        column = np.where((rows > horizon)[:, None], ground, sky)
        img[:] = np.clip(column, 0, 255).astype(np.uint8)[:, None, :]
        return img

    def _noise(
        self, shape: tuple[int, int], frame_index: int, cam_index: int
    ) -> tuple[ImageU8, ImageU8]:
        """Windows into a per-size bank of Gaussian noise, chosen per frame and camera.

        Drawing fresh noise for every pixel costs more than the rest of the frame; a random
        window into a bank four times the size of the frame looks the same and costs nothing.
        The noise is split into its positive and negative parts so that two saturating uint8
        OpenCV calls apply it.
        """
        h, w = shape
        bank = self._noise_bank.get(shape)
        if bank is None:
            rng = np.random.default_rng([self._noise_seed, h, w])
            sigma = self.world.lighting.noise_sigma
            noise = np.round(rng.normal(0.0, sigma, (2 * h, 2 * w, 3)))
            bank = (
                np.clip(noise, 0, 255).astype(np.uint8),
                np.clip(-noise, 0, 255).astype(np.uint8),
            )
            self._noise_bank[shape] = bank
        rng = np.random.default_rng([self._noise_seed, frame_index, cam_index])
        oy, ox = int(rng.integers(h)), int(rng.integers(w))
        return bank[0][oy : oy + h, ox : ox + w], bank[1][oy : oy + h, ox : ox + w]

    def render(self, t_s: float, *, frame_index: int = 0) -> tuple[RenderedView, ...]:
        """Every camera at time t_s (one instant, shared by all cameras)."""
        scene = self.scene(t_s)
        ego = self.world.ego_pose(t_s)
        return tuple(
            self._render_camera(scene, cam, ego, self._backgrounds[i], frame_index, i)
            for i, cam in enumerate(self.cameras)
        )

    def _render_camera(
        self,
        scene: _Scene,
        cam: CameraModel,
        ego: Pose2D,
        background: ImageU8,
        frame_index: int,
        cam_index: int,
    ) -> RenderedView:
        R, t = cam.world_to_camera_transform(ego)
        w, h = cam.width, cam.height
        img = background.copy()
        ids = np.zeros((h, w), dtype=np.int32)
        fx, fy, cx, cy = cam.K[0, 0], cam.K[1, 1], cam.K[0, 2], cam.K[1, 2]
        tan_x = max(cx, w - cx) / fx
        tan_y = max(cy, h - cy) / fy
        light = self.world.lighting
        haze = np.array(light.haze, float)

        # Road surface, one fillPoly per layer and haze band.
        for colour, quads in scene.ground:
            quads_cam = (quads.reshape(-1, 3) @ R.T + t).reshape(-1, 4, 3)
            quads_cam = quads_cam[_roughly_in_view(quads_cam, tan_x, tan_y)]
            polys = _project_polygons(cam, quads_cam)
            dist = np.linalg.norm(quads_cam.mean(axis=1), axis=1)
            fog = np.exp(-dist / light.visibility_m)
            band = np.minimum((1.0 - fog) * 8.0, 7.0).astype(int)
            for b in np.unique(band):
                f = float(fog[band == b].mean())
                c = np.array(colour, float) * f + haze * (1 - f)
                sel = [
                    p
                    for p, bb in zip(polys, band.tolist(), strict=True)
                    if bb == b and p is not None
                ]
                if sel:
                    cv2.fillPoly(img, sel, c.tolist(), cv2.LINE_8, _SHIFT)

        # Solids: cull objects by bounding sphere, then faces.
        obj_cam = scene.obj_centres @ R.T + t
        r = scene.obj_radius
        keep_obj = (
            (obj_cam[:, 2] + r > NEAR_M)
            & (np.abs(obj_cam[:, 0]) - r < (np.abs(obj_cam[:, 2]) + r) * tan_x)
            & (np.abs(obj_cam[:, 1]) - r < (np.abs(obj_cam[:, 2]) + r) * tan_y)
        )
        obj_dist = np.linalg.norm(obj_cam, axis=1)
        face_obj = scene.part_obj[scene.face_part]
        faces = np.flatnonzero(keep_obj[face_obj])
        quads = scene.quads[faces].reshape(-1, 3) @ R.T + t
        quads = quads.reshape(-1, 4, 3)
        normals = scene.normals[faces] @ R.T
        front = np.einsum("fj,fj->f", normals, quads[:, 0]) < 0.0
        in_front = (quads[:, :, 2] > NEAR_M).any(axis=1)
        sel = front & in_front
        faces, quads = faces[sel], quads[sel]
        part = scene.face_part[faces]
        part_dist = np.linalg.norm(scene.part_centres[part] @ R.T + t, axis=1)
        # Parts smaller than half a pixel (a far lamp or window band) are not worth a draw call.
        big = scene.part_radius[part] * fx > 0.5 * part_dist
        faces, quads, part, part_dist = faces[big], quads[big], part[big], part_dist[big]
        obj = scene.part_obj[part]
        order = np.lexsort((-part_dist, -obj_dist[obj]))  # far objects first, far parts first
        fog = np.exp(-part_dist / light.visibility_m)[:, None]
        colours = scene.colours[faces] * fog + haze * (1.0 - fog)

        polys_of: dict[int, list[npt.NDArray[np.int32]]] = {}
        colours_list = colours.tolist()
        face_ids = scene.face_id[faces].tolist()
        polys = _project_polygons(cam, quads)
        lo, hi = _bounds(polys)
        onscreen = ((hi >= -_ONE) & (lo <= np.array([w + 1, h + 1]) * _ONE)).all(axis=1)
        obj_list = obj.tolist()
        onscreen_l: list[bool] = np.asarray(onscreen).tolist()
        for k in order.tolist():
            pts = polys[k]
            if pts is None:
                continue
            if onscreen_l[k]:
                cv2.fillConvexPoly(img, pts, colours_list[k], cv2.LINE_8, _SHIFT)
                cv2.fillConvexPoly(ids, pts, face_ids[k], cv2.LINE_8, _SHIFT)
            if face_ids[k]:
                # Off-screen faces of labelled objects still count for their truncation.
                polys_of.setdefault(obj_list[k], []).append(pts)

        boxes = self._ground_truth(scene, cam, ids, polys_of, obj_dist)

        if self.noise:
            sigma = light.blur_sigma
            cv2.GaussianBlur(img, (0, 0), sigma, dst=img)
            plus, minus = self._noise((h, w), frame_index, cam_index)
            cv2.add(img, plus, dst=img)
            cv2.subtract(img, minus, dst=img)
        return RenderedView(camera=cam.name, image=img, instance_map=ids, boxes=boxes)

    def _ground_truth(
        self,
        scene: _Scene,
        cam: CameraModel,
        ids: npt.NDArray[np.int32],
        polys_of: dict[int, list[npt.NDArray[np.int32]]],
        obj_dist: FloatArray,
    ) -> tuple[GroundTruthBox, ...]:
        h, w = ids.shape
        boxes = []
        for o, polys in polys_of.items():
            track = int(scene.obj_track[o])
            allpts = np.concatenate(polys)
            lo = np.floor(allpts.min(axis=0) / _ONE).astype(int)
            hi = np.ceil(allpts.max(axis=0) / _ONE).astype(int) + 1
            x0, y0 = max(int(lo[0]), 0), max(int(lo[1]), 0)
            x1, y1 = min(int(hi[0]), w), min(int(hi[1]), h)
            if x0 >= x1 or y0 >= y1:
                continue
            mask = ids[y0:y1, x0:x1] == track
            visible = int(np.count_nonzero(mask))
            if visible == 0:
                continue
            cols = np.flatnonzero(mask.any(axis=0))
            rows = np.flatnonzero(mask.any(axis=1))
            xyxy = (
                x0 + int(cols[0]),
                y0 + int(rows[0]),
                x0 + int(cols[-1]) + 1,
                y0 + int(rows[-1]) + 1,
            )
            full = _silhouette_px(polys, lo, hi, (w, h))
            boxes.append(
                GroundTruthBox(
                    track_id=track,
                    category=Category(int(scene.obj_category[o])),
                    xyxy=xyxy,
                    visible_px=visible,
                    visibility=min(1.0, visible / full) if full > 0 else 1.0,
                    distance_m=float(obj_dist[o]),
                )
            )
        boxes.sort(key=lambda b: b.track_id)
        return tuple(boxes)


def _roughly_in_view(quads_cam: FloatArray, tan_x: float, tan_y: float) -> npt.NDArray[np.bool_]:
    """Quads not wholly behind the near plane nor wholly beyond one side of the frustum."""
    z = quads_cam[:, :, 2]
    x = quads_cam[:, :, 0]
    y = quads_cam[:, :, 1]
    zp = np.maximum(z, NEAR_M)
    keep = (z > NEAR_M).any(axis=1)
    keep &= ~((x > zp * tan_x * 1.05).all(axis=1) | (x < -zp * tan_x * 1.05).all(axis=1))
    keep &= ~((y > zp * tan_y * 1.05).all(axis=1) | (y < -zp * tan_y * 1.05).all(axis=1))
    return np.asarray(keep, dtype=bool)


def _project_polygons(
    cam: CameraModel, quads_cam: FloatArray
) -> list[npt.NDArray[np.int32] | None]:
    """Camera-frame quads (N, 4, 3) -> OpenCV fixed-point polygons, None where nothing is left.

    Quads wholly in front of the near plane and not absurdly far off-screen (nearly all) are
    projected in one vectorised step; the rest are clipped one by one.
    """
    n = len(quads_cam)
    z = quads_cam[:, :, 2]
    simple = (z > NEAR_M).all(axis=1)
    uv = np.zeros((n, 4, 2))
    if simple.any():
        uv[simple] = cam.project(quads_cam[simple].reshape(-1, 3)).reshape(-1, 4, 2) - 0.5
    simple &= (np.abs(uv) < _GUARD).all(axis=(1, 2))
    fixed = np.round(uv * _ONE).astype(np.int32)
    out: list[npt.NDArray[np.int32] | None] = list(fixed)
    for i in np.flatnonzero(~simple).tolist():
        q = quads_cam[i]
        out[i] = _fixed(cam, _clip_near(q) if (q[:, 2] <= NEAR_M).any() else q)
    return out


def _bounds(
    polys: list[npt.NDArray[np.int32] | None],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per-polygon (min, max) of the fixed-point vertices; empty boxes for None."""
    lo = np.full((len(polys), 2), 1 << 40, dtype=np.int64)
    hi = np.full((len(polys), 2), -(1 << 40), dtype=np.int64)
    quads = [i for i, p in enumerate(polys) if p is not None and len(p) == 4]
    if quads:
        stacked = np.stack([polys[i] for i in quads])  # type: ignore[misc]
        lo[quads] = stacked.min(axis=1)
        hi[quads] = stacked.max(axis=1)
    for i, p in enumerate(polys):
        if p is not None and len(p) != 4:
            lo[i], hi[i] = p.min(axis=0), p.max(axis=0)
    return lo, hi


def _clip_near(poly: FloatArray) -> FloatArray:
    """Sutherland-Hodgman clip of a convex polygon (N, 3) to z >= NEAR_M."""
    out = []
    n = len(poly)
    for i in range(n):
        a, b = poly[i], poly[(i + 1) % n]
        a_in, b_in = a[2] >= NEAR_M, b[2] >= NEAR_M
        if a_in:
            out.append(a)
        if a_in != b_in:
            s = (NEAR_M - a[2]) / (b[2] - a[2])
            out.append(a + s * (b - a))
    return np.array(out).reshape(-1, 3)


_GUARD = 1 << 14  # keep fixed-point vertices well inside int32 and OpenCV's drawing limits


def _fixed(cam: CameraModel, poly_cam: FloatArray) -> npt.NDArray[np.int32] | None:
    """Project a camera-frame polygon to OpenCV fixed-point vertices (pixel centres at .5)."""
    if len(poly_cam) < 3:
        return None
    uv = cam.project(poly_cam) - 0.5
    if np.abs(uv).max() > _GUARD:
        uv = _clip_rect(uv, -_GUARD, -_GUARD, _GUARD, _GUARD)
        if len(uv) < 3:
            return None
    return np.round(uv * _ONE).astype(np.int32)


def _clip_rect(poly: FloatArray, x0: float, y0: float, x1: float, y1: float) -> FloatArray:
    """Clip a convex 2D polygon to an axis-aligned rectangle (Sutherland-Hodgman)."""
    edges = ((0, x0, 1.0), (0, x1, -1.0), (1, y0, 1.0), (1, y1, -1.0))
    pts = poly
    for axis, bound, sign in edges:
        if len(pts) == 0:
            break
        out = []
        n = len(pts)
        for i in range(n):
            a, b = pts[i], pts[(i + 1) % n]
            a_in = sign * (a[axis] - bound) >= 0
            b_in = sign * (b[axis] - bound) >= 0
            if a_in:
                out.append(a)
            if a_in != b_in:
                s = (bound - a[axis]) / (b[axis] - a[axis])
                out.append(a + s * (b - a))
        pts = np.array(out).reshape(-1, 2)
    return pts


def _silhouette_px(
    polys: list[npt.NDArray[np.int32]],
    lo: npt.NDArray[np.int_],
    hi: npt.NDArray[np.int_],
    image_size: tuple[int, int],
) -> float:
    """Pixels covered by the union of polygons on the truncation canvas (scaled if huge).

    The canvas is the image extended by its own width and height on every side: an object
    reaching behind the camera has an unbounded projection, and measuring truncation against
    a finite canvas keeps its visibility meaningful.
    """
    w, h = image_size
    lo = np.maximum(lo, (-w, -h))
    hi = np.minimum(hi, (2 * w, 2 * h))
    width, height = int(hi[0] - lo[0]), int(hi[1] - lo[1])
    if width <= 0 or height <= 0:
        return 0.0
    scale = 1.0
    if width * height > _MAX_SILHOUETTE_PX:
        scale = math.sqrt(_MAX_SILHOUETTE_PX / (width * height))
    cw, ch = max(1, math.ceil(width * scale) + 1), max(1, math.ceil(height * scale) + 1)
    canvas = np.zeros((ch, cw), dtype=np.uint8)
    offset = (lo * _ONE).astype(np.int64)
    for p in polys:
        q = p.astype(np.int64) - offset
        if scale != 1.0:
            q = np.round(q * scale)
        cv2.fillConvexPoly(canvas, q.astype(np.int32), 1, cv2.LINE_8, _SHIFT)
    return float(np.count_nonzero(canvas)) / (scale * scale)
