"""The `crossing` simulation preset: objects that cross from camera to camera on a winding
drive, and a default preset that stayed what it was."""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from drivepercept.errors import ConfigError
from drivepercept.sim.clip import simulate_clip
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.models import Category
from drivepercept.sim.world import World, generate_world

# generate_world(42, duration_s=2.0) before the presets existed (see _world_fingerprint)
DEFAULT_WORLD_42 = "00dda586b188acb9dd5ac67207862245f37081fc445fcae760f7877a3e0ab812"


def _world_fingerprint(world: World) -> str:
    h = hashlib.sha256()
    for a in world.actors + world.scenery:
        m = a.motion
        fields: tuple[float, ...] = (a.track_id, int(a.category or 0), m.s0_m, m.d0_m)
        fields += (m.speed_s_mps, m.speed_d_mps)
        fields += (m.t_start_s, m.duration_s, m.wobble_m, m.wobble_period_s, m.yaw_rad)
        h.update(repr((*fields, a.light_period_s, a.light_offset_s)).encode())
        h.update(np.ascontiguousarray(a.solid.vertices_m).tobytes())
    for array in (world.road.x_m, world.road.y_m, world.road.heading_rad):
        h.update(array.tobytes())
    h.update(repr(world.ego).encode())
    h.update(repr(world.lighting).encode())
    h.update(repr(world.crosswalks_s).encode())
    return h.hexdigest()


def test_default_preset_world_is_unchanged() -> None:
    # given seed 42, whose world sample_videos/ was rendered from
    world = generate_world(42, duration_s=2.0)
    # then its objects, trajectories, road and lighting are those of before the presets
    assert len(world.actors) == 115
    assert len(world.scenery) == 56
    assert _world_fingerprint(world) == DEFAULT_WORLD_42
    assert _world_fingerprint(generate_world(42, duration_s=2.0, preset="default")) == (
        DEFAULT_WORLD_42
    )


def test_unknown_preset_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="preset"):
        generate_world(1, duration_s=2.0, preset="highway")
    with pytest.raises(ConfigError, match="preset"):
        SimulationConfig(out_dir=Path("x"), preset="highway")


def test_crossing_world_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    a, b, c = (generate_world(s, duration_s=12.0, preset="crossing") for s in (3, 3, 4))
    assert _world_fingerprint(a) == _world_fingerprint(b)
    assert _world_fingerprint(a) != _world_fingerprint(c)
    assert not np.array_equal(a.road.heading_rad, c.road.heading_rad)


def test_crossing_ego_turns_and_traffic_overtakes_both_ways() -> None:
    for seed in range(5):
        # given a 20 s crossing drive
        world = generate_world(seed, duration_s=20.0, preset="crossing")
        # then the ego turns: its heading changes by more than 20 degrees
        headings = [world.ego_pose(t).heading_rad for t in np.linspace(0.0, 20.0, 81)]
        assert math.degrees(max(headings) - min(headings)) > 20.0, seed
        # and a vehicle overtakes it (from behind to ahead) and it overtakes one
        ego_end = world.ego.speed_s_mps * 20.0
        ends = [
            (a.motion.s0_m, a.motion.s0_m + a.motion.speed_s_mps * 20.0)
            for a in world.actors
            if a.category in (Category.CAR, Category.TRUCK, Category.BUS)
        ]
        assert any(s0 < -3.0 and s1 > ego_end + 3.0 for s0, s1 in ends), seed
        assert any(s0 > 3.0 and s1 < ego_end - 3.0 and s1 > s0 for s0, s1 in ends), seed
        # and people walk or ride along the road
        kinds = {a.category for a in world.actors}
        assert {Category.PEDESTRIAN, Category.CYCLIST} <= kinds


@pytest.fixture(scope="module")
def crossing_clip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("crossing")
    config = SimulationConfig(
        out_dir=out,
        cameras=6,
        seconds=12.0,
        fps=3.0,
        width=320,
        height=180,
        seed=5,
        noise=False,
        preset="crossing",
    )
    result = simulate_clip(config)
    assert result.frames == 36
    truth: dict[str, object] = json.loads(result.ground_truth_path.read_text())
    return truth


def test_crossing_clip_hands_objects_over_between_cameras(
    crossing_clip: dict[str, object],
) -> None:
    anns = crossing_clip["annotations"]
    assert isinstance(anns, list)
    cams_at: dict[tuple[int, int], set[str]] = defaultdict(set)
    cams_of: dict[int, set[str]] = defaultdict(set)
    for a in anns:
        cams_at[(a["track_id"], a["frame_index"])].add(a["camera"])
        cams_of[a["track_id"]].add(a["camera"])
    # objects seen by two cameras at one instant, and many seen by two cameras over the drive
    assert sum(len(c) >= 2 for c in cams_at.values()) > 50
    assert sum(len(c) >= 2 for c in cams_of.values()) >= 10
    # hand-overs: a track enters a camera while another camera saw it the frame before
    handovers = sum(
        1
        for (track, frame), cams in cams_at.items()
        if (before := cams_at.get((track, frame - 1))) and cams - before
    )
    assert handovers >= 10


def test_crossing_clip_records_its_preset(crossing_clip: dict[str, object]) -> None:
    info = crossing_clip["info"]
    assert isinstance(info, dict)
    assert info["preset"] == "crossing"
    assert info["seconds"] == 12.0


def test_default_clip_records_no_preset(tmp_path: Path) -> None:
    # (so a default clip's ground_truth.json and rig.toml keep their bytes)
    config = SimulationConfig(out_dir=tmp_path, seconds=0.2, fps=5.0, width=64, height=36)
    result = simulate_clip(config)
    assert "preset" not in json.loads(result.ground_truth_path.read_text())["info"]
    assert "preset" not in result.rig_path.read_text()
