"""Recorded drives as robots record them (issue 28): MCAP files, ROS 2 bag folders (MCAP and
SQLite storage) and ROS 1 bags as sources, each image topic a camera.

The recordings are made here, from the bundled sample rig's first frames: JPEG-compressed
(`CompressedImage`, ROS and Foxglove) and raw (`Image` in rgb8, bgr8, mono8 and Bayer). Each
replays to the same detections, per camera and frame, as a folder of the same JPEG files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

pytest.importorskip("mcap")
pytest.importorskip("rosbags")

from drivepercept.recording import messages as msgs
from drivepercept.recording.mcapfile import McapOut
from drivepercept.sources import rosimage
from drivepercept.sources.readers import CorruptFrameError
from drivepercept.sources.recordings import (
    RecordingReader,
    camera_name,
    recording_cameras,
)

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
CAMERAS = ("front", "back", "front_left")
FRAMES = 5
T0_NS = 1_767_225_600 * 1_000_000_000  # 2026-01-01T00:00:00Z
PERIOD_NS = 66_666_667  # 15 frames/s
Cli = Callable[[list[str]], tuple[int, str]]


def _stamp(k: int) -> int:
    return T0_NS + k * PERIOD_NS


@pytest.fixture(scope="module")
def jpegs() -> dict[str, list[bytes]]:
    """camera -> the JPEG bytes of its first FRAMES sample frames."""
    out: dict[str, list[bytes]] = {}
    for cam in CAMERAS:
        cap = cv2.VideoCapture(str(SAMPLE / f"{cam}.mp4"))
        frames = []
        for _ in range(FRAMES):
            ok, image = cap.read()
            assert ok
            frames.append(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
        cap.release()
        out[cam] = frames
    return out


def _topic(cam: str, raw: bool = False) -> str:
    return f"/{cam}/image_raw" if raw else f"/{cam}/image_raw/compressed"


def _decoded(data: bytes) -> np.ndarray:
    return np.asarray(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))


# ------------------------------------------------------------------ the recordings, made here


def _ros2_bag(path: Path, jpegs: dict[str, list[bytes]], storage: str) -> Path:
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = msgs.typestore()
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=8, storage_plugin=plugin) as w:
        conns = {
            c: w.add_connection(_topic(c), msgs.COMPRESSED_IMAGE, typestore=store) for c in CAMERAS
        }
        for k in range(FRAMES):
            for cam in CAMERAS:
                m = msgs.compressed_image(_stamp(k), cam, "jpeg", jpegs[cam][k])
                w.write(conns[cam], _stamp(k) + 1000, store.serialize_cdr(m, msgs.COMPRESSED_IMAGE))
    return path


def _ros1_bag(path: Path, jpegs: dict[str, list[bytes]]) -> Path:
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    t = store.types
    name = "sensor_msgs/msg/CompressedImage"
    with Writer(path) as w:
        conns = {c: w.add_connection(_topic(c), name, typestore=store) for c in CAMERAS}
        for k in range(FRAMES):
            for cam in CAMERAS:
                stamp = _stamp(k)
                header = t["std_msgs/msg/Header"](
                    seq=k,
                    stamp=t["builtin_interfaces/msg/Time"](
                        sec=stamp // 10**9, nanosec=stamp % 10**9
                    ),
                    frame_id=cam,
                )
                m = t[name](
                    header=header, format="jpeg", data=np.frombuffer(jpegs[cam][k], np.uint8)
                )
                w.write(conns[cam], stamp, store.serialize_ros1(m, name))
    return path


def _bayer_rggb(bgr: np.ndarray) -> np.ndarray:
    """An RGGB mosaic (ROS `bayer_rggb8`: row 0 reads R G, row 1 reads G B)."""
    mosaic = np.empty(bgr.shape[:2], np.uint8)
    mosaic[0::2, 0::2] = bgr[0::2, 0::2, 2]
    mosaic[0::2, 1::2] = bgr[0::2, 1::2, 1]
    mosaic[1::2, 0::2] = bgr[1::2, 0::2, 1]
    mosaic[1::2, 1::2] = bgr[1::2, 1::2, 0]
    return mosaic


def _mcap(path: Path, jpegs: dict[str, list[bytes]], kind: str, **kw: Any) -> Path:
    """kind: ros2 (CompressedImage), raw (Image: rgb8 / bgr8 alternating), foxglove (JSON)."""
    with McapOut(path, profile="ros2", **kw) as out:
        for k in range(FRAMES):
            for cam in CAMERAS:
                data = jpegs[cam][k]
                if kind == "ros2":
                    m = msgs.compressed_image(_stamp(k), cam, "jpeg", data)
                    out.ros2(_topic(cam), msgs.COMPRESSED_IMAGE, m, log_time_ns=_stamp(k))
                elif kind == "raw":
                    bgr = _decoded(data)
                    rgb = k % 2 == 0
                    image = bgr[:, :, ::-1] if rgb else bgr
                    m = msgs.raw_image(_stamp(k), cam, image, "rgb8" if rgb else "bgr8")
                    out.ros2(_topic(cam, raw=True), msgs.RAW_IMAGE, m, log_time_ns=_stamp(k))
                else:
                    m = msgs.foxglove_compressed_image(_stamp(k), cam, "jpeg", data)
                    out.json(
                        f"/{cam}/image", msgs.FOXGLOVE_COMPRESSED_IMAGE, m, log_time_ns=_stamp(k)
                    )
    return path


def _make(kind: str, folder: Path, jpegs: dict[str, list[bytes]]) -> Path:
    if kind == "ros2-bag-mcap":
        return _ros2_bag(folder / "bag_mcap", jpegs, "mcap")
    if kind == "ros2-bag-sqlite3":
        return _ros2_bag(folder / "bag_sqlite", jpegs, "sqlite3")
    if kind == "ros1-bag":
        return _ros1_bag(folder / "drive.bag", jpegs)
    return _mcap(folder / f"{kind}.mcap", jpegs, kind.removeprefix("mcap-"))


# ------------------------------------------------------------------ replay


@pytest.fixture(scope="module")
def detector() -> Iterator[Any]:
    from drivepercept.run import RunOptions
    from drivepercept.run.job import load_model

    yield load_model(RunOptions(sources=("x",), model="drivepercept-tiny", settings={}))


def _replay(
    sources: list[str], out: Path, name: str, detector: Any, **kw: Any
) -> dict[tuple[str, int], Any]:
    from drivepercept.run import RunOptions, run

    options = RunOptions(
        sources=tuple(sources),
        model="drivepercept-tiny",
        out_root=out,
        name=name,
        report_formats=(),
        settings={"device": "cpu", "sample_hz": 0.0},
        **kw,
    )
    result = run(options, detector=detector)
    return {(d["camera"], d["frame_index"]): d for d in result.detections()}


@pytest.fixture(scope="module")
def from_folders(
    tmp_path_factory: pytest.TempPathFactory, jpegs: dict[str, list[bytes]], detector: Any
) -> dict[tuple[str, int], Any]:
    root = tmp_path_factory.mktemp("folders")
    sources = []
    for cam in CAMERAS:
        (root / cam).mkdir()
        for k, data in enumerate(jpegs[cam]):
            (root / cam / f"frame_{k:05d}.jpg").write_bytes(data)
        sources.append(f"{cam}={root / cam}")
    return _replay(sources, root, "folders", detector)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kind",
    ["mcap-ros2", "mcap-raw", "mcap-foxglove", "ros2-bag-mcap", "ros2-bag-sqlite3", "ros1-bag"],
)
def test_a_recording_replays_like_a_folder_of_its_frames(
    kind: str,
    tmp_path: Path,
    jpegs: dict[str, list[bytes]],
    detector: Any,
    from_folders: dict[tuple[str, int], Any],
) -> None:
    # given a recording of three cameras' frames, stamped at 15 frames/s
    recording = _make(kind, tmp_path, jpegs)
    # when it is replayed
    got = _replay([str(recording)], tmp_path, "rec", detector)
    # then every camera (named after its topic) and frame has the boxes of the same frame
    # read from a folder of its JPEG files, and its stamp as its time
    assert sorted(got) == sorted(from_folders)
    for key, want in from_folders.items():
        have = got[key]
        assert have["boxes"] == want["boxes"], key
        assert have["labels"] == want["labels"] and have["scores"] == want["scores"], key
        assert have["stamp_ns"] == _stamp(key[1])
        assert have["pts_s"] == pytest.approx(_stamp(key[1]) / 1e9, abs=1e-6)
    assert sum(len(d["boxes"]) for d in got.values()) > 0  # a comparison of something


def test_topics_pick_and_order_the_cameras(tmp_path: Path, jpegs: dict[str, list[bytes]]) -> None:
    path = _mcap(tmp_path / "d.mcap", jpegs, "ros2")
    cams = recording_cameras(path)
    assert [c.name for c in cams] == list(CAMERAS)
    picked = recording_cameras(path, topics=[_topic("front_left"), _topic("front")])
    assert [(c.name, c.topic) for c in picked] == [
        ("front_left", _topic("front_left")),
        ("front", _topic("front")),
    ]


def test_camera_names_come_from_topics() -> None:
    assert camera_name("/cam_front/image_raw/compressed") == "cam_front"
    assert camera_name("/CAM_FRONT/image_rect_compressed") == "CAM_FRONT_image_rect_compressed"
    assert camera_name("/vehicle/camera/left/image") == "vehicle_camera_left"
    assert camera_name("/image") == "image"


def test_camera_info_beside_an_image_topic_gives_its_intrinsics(
    tmp_path: Path, jpegs: dict[str, list[bytes]]
) -> None:
    path = tmp_path / "info.mcap"
    with McapOut(path, profile="ros2") as out:
        info = msgs.camera_info(
            T0_NS, "front", width=640, height=360, fx=500, fy=510, cx=321, cy=179
        )
        out.ros2("/front/camera_info", msgs.CAMERA_INFO, info, log_time_ns=T0_NS)
        m = msgs.compressed_image(T0_NS, "front", "jpeg", jpegs["front"][0])
        out.ros2(_topic("front"), msgs.COMPRESSED_IMAGE, m, log_time_ns=T0_NS)
        m = msgs.compressed_image(T0_NS, "back", "jpeg", jpegs["back"][0])
        out.ros2(_topic("back"), msgs.COMPRESSED_IMAGE, m, log_time_ns=T0_NS)
    front, back = recording_cameras(path)
    assert front.intrinsics is not None and (front.width, front.height) == (640, 360)
    assert (front.intrinsics.fx, front.intrinsics.fy) == (500, 510)
    assert (front.intrinsics.cx, front.intrinsics.cy) == (321, 179)
    assert back.intrinsics is None  # no CameraInfo in its namespace


# ------------------------------------------------------------------ raw encodings


def test_raw_encodings_convert_to_bgr() -> None:
    rng = np.random.default_rng(1)
    bgr = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)

    def convert(image: np.ndarray, encoding: str) -> np.ndarray:
        data = np.ascontiguousarray(image).tobytes()
        step = image.shape[1] * (1 if image.ndim == 2 else image.shape[2])
        return rosimage.raw_to_bgr(data, width=8, height=6, step=step, encoding=encoding)

    assert (convert(bgr, "bgr8") == bgr).all()
    assert (convert(bgr[:, :, ::-1], "rgb8") == bgr).all()
    gray = bgr[:, :, 0]
    assert (convert(gray, "mono8") == np.dstack([gray] * 3)).all()
    # a padded row (step > width * channels) is read without its padding
    padded = np.zeros((6, 30), np.uint8)
    padded[:, :24] = bgr.reshape(6, 24)
    got = rosimage.raw_to_bgr(padded.tobytes(), width=8, height=6, step=30, encoding="bgr8")
    assert (got == bgr).all()


@pytest.mark.parametrize("colour", [(0, 0, 255), (0, 255, 0), (255, 0, 0)])
def test_bayer_rggb8_follows_ros_naming(colour: tuple[int, int, int]) -> None:
    # a plain red, green or blue image mosaicked as ROS bayer_rggb8 comes back that colour
    bgr = np.zeros((16, 16, 3), np.uint8)
    bgr[:] = colour
    mosaic = _bayer_rggb(bgr)
    got = rosimage.raw_to_bgr(
        mosaic.tobytes(), width=16, height=16, step=16, encoding="bayer_rggb8"
    )
    centre = got[4:12, 4:12].reshape(-1, 3).mean(axis=0)
    assert np.allclose(centre, colour, atol=1), centre


def test_an_unsupported_encoding_and_a_short_image_are_named() -> None:
    with pytest.raises(rosimage.UnsupportedEncodingError, match=r"'mono16'.*supported: bgr8"):
        rosimage.raw_to_bgr(b"\0" * 32, width=4, height=4, step=8, encoding="mono16")
    with pytest.raises(CorruptFrameError, match="needs 4 rows of 12 bytes"):
        rosimage.raw_to_bgr(b"\0" * 20, width=4, height=4, step=12, encoding="bgr8")


# ------------------------------------------------------------------ real-time replay


@pytest.mark.timeout(60)
def test_realtime_replay_follows_irregular_stamps(
    tmp_path: Path, jpegs: dict[str, list[bytes]]
) -> None:
    import threading

    from drivepercept.config import ReconnectPolicy
    from drivepercept.sources.open import open_cameras, resolve_sources
    from drivepercept.types import Pacing

    # given two cameras whose stamps jitter by up to 20 ms and stop for 2 s, the second
    # camera starting 50 ms after the first
    offsets_s = [0.0, 0.10, 0.22, 0.30, 2.30, 2.42, 2.50]
    jitter_s = [0.0, 0.0, 0.02, -0.02, 0.0, 0.02, 0.0]
    path = tmp_path / "irregular.mcap"
    with McapOut(path, profile="ros2") as out:
        for k, (t, j) in enumerate(zip(offsets_s, jitter_s, strict=True)):
            for cam, late in (("front", 0.0), ("back", 0.05)):
                stamp = T0_NS + round((t + j + late) * 1e9)
                m = msgs.compressed_image(stamp, cam, "jpeg", jpegs[cam][k % FRAMES])
                out.ros2(_topic(cam), msgs.COMPRESSED_IMAGE, m, log_time_ns=stamp)
    cams = resolve_sources([str(path)])
    readers = open_cameras(
        cams, pacing=Pacing.PACED, policy=ReconnectPolicy(), stop=threading.Event()
    )
    # when both are read at their pace, each on its own thread
    due: dict[str, list[tuple[int, int]]] = {}

    def drain(name: str, reader: Any) -> None:
        got = []
        while (frame := reader.read()) is not None:
            got.append((frame.stamp_ns, frame.arrived_ns, time.monotonic_ns()))
        due[name] = [(s, a) for s, a, _ in got]
        lateness[name] = max(r - a for _, a, r in got)

    lateness: dict[str, int] = {}
    threads = [
        threading.Thread(target=drain, args=(c.name, r), name=f"test-{c.name}")
        for c, r in zip(cams, readers, strict=True)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    took = time.monotonic() - started
    # then every frame fell due at its stamp on one clock for both cameras (to the ns: the
    # due times are computed), and came when due (within scheduling slack)
    first = min(s for s, _ in due["front"] + due["back"])
    origin = min(a for _, a in due["front"] + due["back"])
    for name in ("front", "back"):
        assert len(due[name]) == len(offsets_s)
        for stamp, arrived in due[name]:
            assert arrived - origin == stamp - first
        assert lateness[name] < 50_000_000, lateness
    assert 2.5 <= took < 4.0, took  # the 2 s gap was waited out, not skipped


# ------------------------------------------------------------------ bad input


@pytest.mark.timeout(120)
def test_bad_recordings_give_one_line_and_their_exit_code(
    in_process: Cli, tmp_path: Path, jpegs: dict[str, list[bytes]]
) -> None:
    def replay(*args: str) -> tuple[int, list[str]]:
        code, err = in_process(
            ["replay", *args, "--model", "drivepercept-tiny", "--out", str(tmp_path),
             "--no-progress", "--no-report"]
        )  # fmt: skip
        return code, [line for line in err.splitlines() if line.startswith("drivepercept")]

    # no image topic at all
    only_info = tmp_path / "info_only.mcap"
    with McapOut(only_info, profile="ros2") as out:
        info = msgs.camera_info(T0_NS, "f", width=64, height=48, fx=50, fy=50, cx=32, cy=24)
        out.ros2("/f/camera_info", msgs.CAMERA_INFO, info, log_time_ns=T0_NS)
    code, lines = replay(str(only_info))
    assert code == 2 and len(lines) == 1, lines
    assert "has no image topic; its topics: /f/camera_info (sensor_msgs/msg/CameraInfo)" in lines[0]

    # a topic asked for that is not there
    drive = _mcap(tmp_path / "d.mcap", jpegs, "ros2")
    code, lines = replay(str(drive), "--topics", "/front/image_raw/compressed,/nope")
    assert code == 2 and len(lines) == 1 and "no image topic /nope" in lines[0], lines
    assert _topic("back") in lines[0]  # it lists the ones there are

    # an encoding that is not converted
    mono16 = tmp_path / "mono16.mcap"
    with McapOut(mono16, profile="ros2") as out:
        m = msgs.raw_image(T0_NS, "f", np.zeros((4, 8), np.uint8), "mono16")
        out.ros2("/f/image_raw", msgs.RAW_IMAGE, m, log_time_ns=T0_NS)
    code, lines = replay(str(mono16))
    assert code == 2 and len(lines) == 1 and "unsupported image encoding 'mono16'" in lines[0]

    # a file named .mcap that is not one
    fake = tmp_path / "fake.mcap"
    fake.write_text("not an mcap file at all")
    code, lines = replay(str(fake))
    assert code == 2 and len(lines) == 1 and "is not an MCAP file" in lines[0], lines


@pytest.mark.timeout(120)
def test_a_cut_mcap_keeps_the_frames_before_the_cut_and_exits_3(
    in_process: Cli, tmp_path: Path, jpegs: dict[str, list[bytes]]
) -> None:
    # given an MCAP of small chunks, cut at 60 % of its length (no footer, no summary)
    whole = _mcap(tmp_path / "whole.mcap", jpegs, "ros2", chunk_size=16_384)
    data = whole.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) * 6 // 10])
    # when it is replayed
    code, err = in_process(
        ["replay", str(cut), "--model", "drivepercept-tiny", "--out", str(tmp_path),
         "--name", "cut", "--no-progress", "--no-report"]
    )  # fmt: skip
    # then the frames before the cut were processed and written, and the run says it was cut
    lines = [line for line in err.splitlines() if line.startswith("drivepercept")]
    assert code == 3 and len(lines) == 1, err
    assert "cut short or damaged" in lines[0]
    written = (tmp_path / "cut" / "detections.jsonl").read_text().splitlines()
    frames = [json.loads(x) for x in written]
    assert 0 < len(frames) < FRAMES * len(CAMERAS)
    assert {f["camera"] for f in frames} == set(CAMERAS)


@pytest.mark.timeout(120)
def test_corrupt_messages_are_skipped_and_counted(
    in_process: Cli, tmp_path: Path, jpegs: dict[str, list[bytes]]
) -> None:
    # given a one-camera recording whose message 1 is not CDR and message 3 not a JPEG
    path = tmp_path / "corrupt.mcap"
    with McapOut(path, profile="ros2") as out:
        for k in range(FRAMES):
            data = b"\xff\xd8 not a jpeg" if k == 3 else jpegs["front"][k]
            m = msgs.compressed_image(_stamp(k), "front", "jpeg", data)
            out.ros2(_topic("front"), msgs.COMPRESSED_IMAGE, m, log_time_ns=_stamp(k))
    raw = path.read_bytes()
    # a message's CDR cut to its first bytes: the MCAP stays whole, the message is garbage
    reader = RecordingReader(path, _topic("front"))
    assert reader.info.frame_count == FRAMES
    reader.close()
    broken = tmp_path / "broken.mcap"
    _rewrite_message(path, broken, index=1)
    assert broken.read_bytes() != raw
    # when it is replayed
    code, err = in_process(
        ["replay", str(broken), "--model", "drivepercept-tiny", "--out", str(tmp_path),
         "--name", "c", "--no-progress", "--no-report"]
    )  # fmt: skip
    # then those two frames were skipped and counted, the other three processed: exit 3
    lines = [line for line in err.splitlines() if line.startswith("drivepercept")]
    assert code == 3 and len(lines) == 1 and "undecodable frames skipped (front: 2)" in lines[0]
    frames = (tmp_path / "c" / "detections.jsonl").read_text().splitlines()
    stamps = [json.loads(x)["stamp_ns"] for x in frames]
    assert stamps == [_stamp(0), _stamp(2), _stamp(4)]
    record = json.loads((tmp_path / "c" / "run.json").read_text())
    assert record["summary"]["cameras"]["front"]["frames_undecodable"] == 2


def _rewrite_message(src: Path, dst: Path, *, index: int) -> None:
    """`src` copied to `dst` with message `index` replaced by 7 bytes of garbage."""
    from mcap.reader import make_reader
    from mcap.writer import Writer

    with src.open("rb") as f, dst.open("wb") as g:
        reader = make_reader(f)
        writer = Writer(g)
        summary = reader.get_summary()
        assert summary is not None
        writer.start(profile="ros2", library="test")
        ids = {}
        for sid, schema in summary.schemas.items():
            ids[sid] = writer.register_schema(schema.name, schema.encoding, schema.data)
        chans = {}
        for cid, ch in summary.channels.items():
            chans[cid] = writer.register_channel(ch.topic, ch.message_encoding, ids[ch.schema_id])
        for k, (_, channel, message) in enumerate(reader.iter_messages()):
            data = b"\x00\x01\x00\x00garb" if k == index else message.data
            writer.add_message(chans[channel.id], message.log_time, data, message.publish_time)
        writer.finish()  # type: ignore[no-untyped-call]
