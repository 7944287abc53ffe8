"""Rig files and configuration validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivepercept.errors import ConfigError
from drivepercept.geometry import parse_input_size, parse_size
from drivepercept.rig import CameraConfig, RigConfig, load_rig, write_rig
from drivepercept.sim.camera import default_rig_cameras
from drivepercept.sim.config import SimulationConfig


def test_rig_round_trips_through_toml(tmp_path: Path) -> None:
    cams = tuple(
        CameraConfig(
            name=c.name,
            video=tmp_path / f"{c.name}.mp4",
            fps=15.0,
            width=c.width,
            height=c.height,
            intrinsics=c.intrinsics,
            extrinsics=c.extrinsics,
        )
        for c in default_rig_cameras(6, width=640, height=360)
    )
    path = write_rig(
        RigConfig(cameras=cams), tmp_path / "rig.toml", extra={"simulation": {"seed": 3}}
    )
    text = path.read_text()
    assert 'video = "front.mp4"' in text  # stored relative to the rig file
    loaded = load_rig(path)
    assert loaded.names == tuple(c.name for c in cams)
    for a, b in zip(loaded.cameras, cams, strict=True):
        assert a.video == b.video
        assert (a.width, a.height, a.fps) == (b.width, b.height, b.fps)
        assert a.intrinsics is not None and b.intrinsics is not None
        assert a.intrinsics.fx == pytest.approx(b.intrinsics.fx, abs=1e-5)
        assert a.extrinsics == b.extrinsics


def test_hand_written_minimal_rig_loads(tmp_path: Path) -> None:
    rig = tmp_path / "rig.toml"
    rig.write_text('[[cameras]]\nname = "dash"\nvideo = "/data/dash.mp4"\n')
    loaded = load_rig(rig)
    assert loaded.camera("dash").video == Path("/data/dash.mp4")
    assert loaded.camera("dash").intrinsics is None
    with pytest.raises(ConfigError, match="no camera 'rear'"):
        loaded.camera("rear")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[cameras]]\nname = 'a'\nvidoe = 'x.mp4'\n", "unknown keys"),
        ("[[cameras]]\nname = 'a'\n[[cameras]]\nname = 'a'\n", "unique"),
        ("[[cameras]]\nname = 'a'\nwidth = 10\nheight = 10\n", "frame size"),
        ("[[cameras]]\nname = 'a'\nwidth = 640\n", "both width and height"),
        ("[[cameras]]\nname = 'a b'\n", "camera name"),
        ("[[cameras]]\nname = 'a'\nfps = -1\n", "fps"),
        ("[[cameras]]\nname = 'a'\n[cameras.intrinsics]\nfx = 'x'\n", "fx must be a number"),
        ("cameras = 3\n", "no \\[\\[cameras\\]\\]"),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_bad_rig_files_give_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    rig = tmp_path / "rig.toml"
    rig.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_rig(rig)
    assert str(rig) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_rig_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_rig(tmp_path / "nope.toml")


def test_parse_size() -> None:
    assert parse_size("640x360") == (640, 360)
    assert parse_size(" 1280X720 ") == (1280, 720)
    for bad in ("640", "axb", "640x", "10x10", "99999x10"):
        with pytest.raises(ConfigError):
            parse_size(bad)


def test_parse_input_size_takes_any_positive_size_as_text_or_pair() -> None:
    assert parse_input_size(None) is None
    assert parse_input_size(" 416X256 ") == (416, 256)
    assert parse_input_size([16, 8]) == (16, 8)  # no camera frame range: the model checks
    for bad in ("huge", "640x", "1.5x3", 416, (0, 3), [True, 2], (1, 2, 3)):
        with pytest.raises(ConfigError, match="input size must look like WIDTHxHEIGHT"):
            parse_input_size(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cameras": 0}, "between 1 and 12"),
        ({"cameras": 13}, "between 1 and 12"),
        ({"fps": -1.0}, "fps"),
        ({"fps": float("nan")}, "fps"),
        ({"width": 10, "height": 10}, "frame size"),
        ({"width": 641, "height": 360}, "even"),
        ({"seconds": 0.0}, "seconds"),
        ({"seconds": 0.01, "fps": 15.0}, "less than one frame"),
        ({"seed": -3}, "seed"),
    ],
)
def test_simulation_config_validation(
    tmp_path: Path, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulationConfig(out_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_frame_count() -> None:
    assert SimulationConfig(out_dir=Path("x"), seconds=4.0, fps=15.0).frame_count == 60
