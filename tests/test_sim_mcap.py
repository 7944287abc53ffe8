"""`drivepercept simulate --format mcap` (issue 28): the synthetic rig as one MCAP file, images,
calibration and exact labels inside, which replays like the same frames in image folders and
which `eval` scores against the labels it carries.

The drive is small (2 cameras, 1.5 s at 10 frames/s, 320x180) and made once per module.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

pytest.importorskip("mcap")
pytest.importorskip("mcap_ros2")

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory

from drivepercept.cli import main
from drivepercept.errors import ConfigError
from drivepercept.recording import messages
from drivepercept.recording.mcapfile import McapOut
from drivepercept.rig import load_rig
from drivepercept.rundir import RunDir
from drivepercept.sim.clip import SimulationResult, simulate_clip
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.mcapclip import STAMP_BASE_NS, stamp_ns

CAMERAS = ["front", "back"]
FPS = 10.0
FRAMES = 15  # 1.5 s
SIZE = (320, 180)
MODEL = "drivepercept-tiny"
THREADS = ("encode", "decode-", "batcher", "engine", "gpu-monitor")

pytestmark = pytest.mark.timeout(180)


def _config(out: Path, **kw: Any) -> SimulationConfig:
    return SimulationConfig(
        out_dir=out,
        cameras=2,
        seconds=FRAMES / FPS,
        fps=FPS,
        width=SIZE[0],
        height=SIZE[1],
        seed=5,
        format="mcap",
        **kw,
    )


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """Simulation and replays stop and join every thread they start."""
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith(THREADS)] == []


@pytest.fixture(scope="module")
def drive(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    result = simulate_clip(_config(tmp_path_factory.mktemp("sim") / "out"))
    assert not result.interrupted and result.frames == FRAMES
    return result


class _JsonDecoders:
    def decoder_for(self, encoding: str, schema: Any) -> Any:
        return json.loads if encoding == "json" else None


def _messages(path: Path) -> dict[str, list[tuple[int, str, Any]]]:
    """topic -> (log time, schema name, decoded message) in log-time order."""
    out: dict[str, list[tuple[int, str, Any]]] = {}
    with path.open("rb") as fh:
        factories: list[Any] = [DecoderFactory(), _JsonDecoders()]
        reader = make_reader(fh, decoder_factories=factories)
        for schema, channel, message, decoded in reader.iter_decoded_messages():
            name = schema.name if schema else ""
            out.setdefault(channel.topic, []).append((message.log_time, name, decoded))
    return out


def _mcap_parts(path: Path) -> tuple[dict[str, bytes], dict[str, dict[str, str]]]:
    """(attachments by name, metadata by name) of an MCAP file, read through its summary."""
    with path.open("rb") as fh:
        reader = make_reader(fh)
        assert reader.get_summary() is not None  # finished: indexed, seekable
        attachments = {a.name: bytes(a.data) for a in reader.iter_attachments()}
        metadata = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
    return attachments, metadata


# ------------------------------------------------------------------ the file


def test_the_drive_is_one_mcap_with_a_rig_file_and_the_ground_truth_beside(
    drive: SimulationResult,
) -> None:
    # given a simulation as MCAP; then the folder holds the one file, the rig and the labels
    out = drive.out_dir
    assert drive.videos == (out / "drive.mcap",)
    assert sorted(p.name for p in out.iterdir()) == ["drive.mcap", "ground_truth.json", "rig.toml"]
    # and the rig reads each camera from its topic of that file, with its geometry
    rig = load_rig(drive.rig_path)
    assert list(rig.names) == CAMERAS
    assert rig.model == MODEL
    for cam in rig.cameras:
        assert cam.video == (out / "drive.mcap").resolve()
        assert cam.topic == f"/{cam.name}/image/compressed"
        assert (cam.fps, cam.size) == (FPS, SIZE)
        assert cam.intrinsics is not None and cam.extrinsics is not None


def test_each_camera_has_its_images_calibration_and_annotations(drive: SimulationResult) -> None:
    # when the file is read back with the mcap reader
    topics = _messages(drive.videos[0])
    expected = {
        f"/{cam}/{suffix}": schema
        for cam in CAMERAS
        for suffix, schema in (
            ("image/compressed", messages.COMPRESSED_IMAGE),
            ("camera_info", messages.CAMERA_INFO),
            ("ground_truth", messages.IMAGE_ANNOTATIONS),
        )
    }
    # then every camera has its three topics, each of one schema
    assert {t: {name for _, name, _ in msgs} for t, msgs in topics.items()} == {
        t: {schema} for t, schema in expected.items()
    }
    stamps = [stamp_ns(k, FPS) for k in range(FRAMES)]
    assert stamps[0] == STAMP_BASE_NS == 1_767_225_600 * 10**9
    assert stamps[1] - stamps[0] == 100_000_000
    rig = {c.name: c for c in load_rig(drive.rig_path).cameras}
    for cam in CAMERAS:
        # one JPEG a frame, stamped (header and log time) k / fps after the fixed base
        images = topics[f"/{cam}/image/compressed"]
        assert [t for t, _, _ in images] == stamps
        for log_time, _, msg in images:
            stamp = msg.header.stamp
            assert stamp.sec * 10**9 + stamp.nanosec == log_time
            assert msg.format == "jpeg" and msg.header.frame_id == cam
        first = cv2.imdecode(np.frombuffer(bytes(images[0][2].data), np.uint8), cv2.IMREAD_COLOR)
        assert first is not None and first.shape == (SIZE[1], SIZE[0], 3)
        # calibration with the first frame and once a second, the rig's intrinsics
        infos = topics[f"/{cam}/camera_info"]
        assert [t for t, _, _ in infos] == [stamps[0], stamps[10]]
        k = rig[cam].intrinsics
        assert k is not None
        for _, _, info in infos:
            assert (info.width, info.height) == SIZE
            assert list(info.k) == pytest.approx([k.fx, 0, k.cx, 0, k.fy, k.cy, 0, 0, 1])
        # annotations with every image
        assert [t for t, _, _ in topics[f"/{cam}/ground_truth"]] == stamps


def test_the_attachment_is_the_ground_truth_file(drive: SimulationResult) -> None:
    attachments, metadata = _mcap_parts(drive.videos[0])
    assert attachments == {"ground_truth.json": drive.ground_truth_path.read_bytes()}
    gt = json.loads(attachments["ground_truth.json"])
    assert gt["info"]["format"] == "mcap" and gt["info"]["stamp_base_ns"] == STAMP_BASE_NS
    assert {im["file_name"] for im in gt["images"]} == {"drive.mcap"}
    assert len(gt["images"]) == FRAMES * len(CAMERAS)
    assert metadata["simulation"]["seed"] == "5"


def test_the_annotations_draw_the_ground_truth_boxes(drive: SimulationResult) -> None:
    # given the ground truth of one frame of the front camera
    gt = json.loads(drive.ground_truth_path.read_text())
    names = {c["id"]: c["name"] for c in gt["categories"]}
    k = 7
    image = next(im for im in gt["images"] if (im["camera"], im["frame_index"]) == ("front", k))
    boxes = [a for a in gt["annotations"] if a["image_id"] == image["id"]]
    assert boxes  # a frame with something in it
    # when that frame's foxglove.ImageAnnotations is read
    _, _, drawn = _messages(drive.videos[0])["/front/ground_truth"][k]
    # then each box is a closed outline on its pixel edges, labelled with class and track id
    outlines = [
        (p["points"][0]["x"], p["points"][0]["y"], p["points"][2]["x"], p["points"][2]["y"])
        for p in drawn["points"]
    ]
    assert outlines == [tuple(a["bbox_xyxy"]) for a in boxes]
    assert all(p["type"] == messages.LINE_LOOP and len(p["points"]) == 4 for p in drawn["points"])
    labels = [t["text"] for t in drawn["texts"]]
    assert labels == [f"{names[a['category_id']]} #{a['track_id']}" for a in boxes]


def test_the_same_seed_writes_the_same_file(drive: SimulationResult, tmp_path: Path) -> None:
    again = simulate_clip(_config(tmp_path / "again"))
    assert again.videos[0].read_bytes() == drive.videos[0].read_bytes()


def test_an_interrupted_simulation_leaves_a_finished_mcap(tmp_path: Path) -> None:
    def stop_after_four(done: int, total: int) -> None:
        if done == 4:
            raise KeyboardInterrupt

    # given a simulation interrupted after four frames
    result = simulate_clip(_config(tmp_path / "cut"), progress=stop_after_four)
    # then the MCAP is finished (summary, attachment) and holds those four frames
    assert result.interrupted and result.frames == 4
    attachments, _ = _mcap_parts(result.videos[0])
    assert json.loads(attachments["ground_truth.json"])["info"]["frames"] == 4
    topics = _messages(result.videos[0])
    assert [len(topics[f"/{cam}/image/compressed"]) for cam in CAMERAS] == [4, 4]
    assert not list(result.out_dir.glob("*.part")) and not list(result.out_dir.glob("*.tmp"))


def test_a_format_other_than_mp4_or_mcap_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="format must be one of mp4, mcap, got 'avi'"):
        SimulationConfig(out_dir=tmp_path, format="avi")
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--out", str(tmp_path / "x"), "--format", "avi"])
    assert exit_.value.code == 2
    assert "invalid choice: 'avi'" in capsys.readouterr().err


# ------------------------------------------------------------------ replay and eval


def _replay(sources: list[str], out: Path, name: str) -> dict[tuple[str, int], Any]:
    code = main(
        [
            *("replay", *sources, "--model", MODEL, "--out", str(out), "--name", name),
            *("--no-progress", "--no-report", "--device", "cpu"),
        ]
    )
    assert code == 0
    with RunDir(out / name).detections_jsonl.open() as fh:
        lines = [json.loads(line) for line in fh]
    return {(d["camera"], d["frame_index"]): d for d in lines}


def test_replaying_the_mcap_gives_the_detections_of_its_frames_in_image_folders(
    drive: SimulationResult, tmp_path: Path
) -> None:
    # given each camera's JPEG messages copied, byte for byte, into an image folder
    topics = _messages(drive.videos[0])
    folders = []
    for cam in CAMERAS:
        folder = tmp_path / f"folder_{cam}"
        folder.mkdir()
        for k, (_, _, msg) in enumerate(topics[f"/{cam}/image/compressed"]):
            (folder / f"frame_{k:05d}.jpg").write_bytes(bytes(msg.data))
        folders.append(f"{cam}={folder}")
    # when the MCAP, the rig file beside it and the folders are replayed
    from_mcap = _replay([str(drive.videos[0])], tmp_path, "mcap")
    from_rig = _replay([str(drive.rig_path)], tmp_path, "rig")
    from_folders = _replay(folders, tmp_path, "folders")
    # then every camera and frame has the same boxes, labels and scores, each frame its stamp
    expected = {(cam, k) for cam in CAMERAS for k in range(FRAMES)}
    assert set(from_mcap) == set(from_rig) == set(from_folders) == expected
    for key, want in from_folders.items():
        for got in (from_mcap[key], from_rig[key]):
            assert got["boxes"] == want["boxes"], key
            assert (got["labels"], got["scores"]) == (want["labels"], want["scores"]), key
            assert got["stamp_ns"] == stamp_ns(key[1], FPS)
    assert sum(len(d["boxes"]) for d in from_mcap.values()) > 0  # a comparison of something


def test_eval_scores_the_mcap_against_its_attached_ground_truth(
    drive: SimulationResult, tmp_path: Path
) -> None:
    from drivepercept.run import evaluate_clip

    settings = {"model": MODEL, "out": str(tmp_path), "device": "cpu"}
    # when the MCAP itself is evaluated (labels from its attachment)
    result = evaluate_clip(drive.videos[0], settings={**settings, "name": "mcap"})
    assert result is not None
    report = result.report
    # then every frame written is scored, and the model trained on this world finds most
    assert report.images == FRAMES * len(CAMERAS)
    assert 0.0 <= report.map_50_95 <= report.map_50 <= 1.0
    assert report.recall_50 > 0.5, report.table()
    assert set(report.per_camera) == set(CAMERAS)
    # and the clip folder (its rig reads the MCAP, its ground_truth.json beside) scores the same
    folder = evaluate_clip(drive.out_dir, settings={**settings, "name": "folder"})
    assert folder is not None
    assert folder.report.to_json() == report.to_json()


def test_eval_of_an_mcap_without_ground_truth_is_one_clear_line(tmp_path: Path) -> None:
    from drivepercept.run.groundtruth import read_ground_truth

    # given an MCAP of one camera's image and no attachment
    path = tmp_path / "plain.mcap"
    jpeg = cv2.imencode(".jpg", np.zeros((64, 64, 3), np.uint8))[1].tobytes()
    with McapOut(path, profile="ros2") as out:
        msg = messages.compressed_image(STAMP_BASE_NS, "front", "jpeg", jpeg)
        out.ros2(
            "/front/image/compressed", messages.COMPRESSED_IMAGE, msg, log_time_ns=STAMP_BASE_NS
        )
    with pytest.raises(ConfigError) as error:
        read_ground_truth(path)
    assert "has no ground truth attachment" in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)
