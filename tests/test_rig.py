"""The one source -> camera resolver that replay, live and serve-cameras share."""

from __future__ import annotations

from pathlib import Path

import pytest

from drivepercept.errors import ConfigError
from drivepercept.geometry import MAX_CAMERAS
from drivepercept.rig import camera_source, resolve_cameras

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RIG = ROOT / "sample_videos" / "rig.toml"


def test_a_rig_file_gives_its_cameras_in_order_with_their_videos() -> None:
    cams = resolve_cameras([str(SAMPLE_RIG)])
    assert [c.name for c in cams][:2] == ["front", "front_left"]
    assert all(c.video is not None and c.video.is_file() for c in cams)


def test_files_folders_devices_urls_and_named_sources(tmp_path: Path) -> None:
    frames = tmp_path / "left cam"
    frames.mkdir()
    cams = resolve_cameras(
        ["rear view.mp4", str(frames), "0", "rtsp://u:p@10.0.0.2/s", "dash=/dev/video2", "x=y.avi"]
    )
    assert [c.name for c in cams] == ["rear_view", "left_cam", "cam3", "cam4", "dash", "x"]
    assert [camera_source(c) for c in cams] == [
        "rear view.mp4",
        str(frames),
        "0",
        "rtsp://u:p@10.0.0.2/s",
        "/dev/video2",
        "y.avi",
    ]
    # devices and streams are live sources; files are videos
    assert cams[2].source == "0" and cams[0].video == Path("rear view.mp4")


def test_a_repeated_derived_name_is_numbered_and_a_repeated_given_name_is_refused() -> None:
    cams = resolve_cameras(["a/front.mp4", "b/front.mp4", "c/front.mp4"])
    assert [c.name for c in cams] == ["front", "front_2", "front_3"]
    with pytest.raises(ConfigError, match=r"unique, got \['a'\]"):
        resolve_cameras(["a=0", "a=1"])


def test_folders_of_videos_for_serve_cameras(tmp_path: Path) -> None:
    for name in ("b.mp4", "a.avi", "notes.txt"):
        (tmp_path / name).write_text("x")
    cams = resolve_cameras([str(tmp_path)], folders_of_videos=True)
    assert [c.name for c in cams] == ["a", "b"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="expected videos"):
        resolve_cameras([str(empty)], folders_of_videos=True)


def test_live_rigs_take_a_cameras_source_and_replay_needs_a_video(tmp_path: Path) -> None:
    rig = tmp_path / "cams.toml"
    rig.write_text('[[cameras]]\nname = "dash"\nsource = "rtsp://cam/1"\n')
    assert camera_source(resolve_cameras([str(rig)], live=True)[0]) == "rtsp://cam/1"
    with pytest.raises(ConfigError, match=r"dash.* has no video"):
        resolve_cameras([str(rig)])


def test_limits() -> None:
    with pytest.raises(ConfigError, match="at least one source"):
        resolve_cameras([])
    with pytest.raises(ConfigError, match=f"at most {MAX_CAMERAS}"):
        resolve_cameras([f"v{i}.mp4" for i in range(MAX_CAMERAS + 1)])
    with pytest.raises(ConfigError, match="source is empty"):
        resolve_cameras(["a="])
