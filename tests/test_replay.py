"""`drivepercept replay` from the command line: outputs, real clips, bad input, Ctrl-C."""

from __future__ import annotations

import csv
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import children
import cv2
import numpy as np
import pytest
import torch
from standins import RoadClips

from drivepercept.cli import main
from drivepercept.types import STAMPS

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
ORACLE = "drivepercept.models.oracle:make_oracle"

pytestmark = [pytest.mark.timeout(300), pytest.mark.integration]


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """In-process replays must stop and join every pipeline thread."""
    yield
    left = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("decode-", "batcher", "engine", "gpu-monitor"))
    ]
    assert left == []


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drivepercept", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _decodable_frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


def _lines(run_dir: Path) -> list[dict[str, object]]:
    with (run_dir / "detections.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


def _per_camera(lines: list[dict[str, object]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for line in lines:
        out.setdefault(str(line["camera"]), []).append(int(line["frame_index"]))  # type: ignore[call-overload]
    return out


def test_replay_sample_rig_with_a_torchvision_model(tmp_path: Path) -> None:
    # given the acceptance command, shortened to 4 frames per camera
    code = main(
        [
            "replay",
            str(SAMPLE_RIG),
            "--model",
            "ssdlite320_mobilenet_v3_large",
            "--weights",
            "none",
            "--max-frames",
            "4",
            "--out",
            str(tmp_path),
            "--name",
            "r",
            "--no-progress",
        ]
    )
    assert code == 0
    run = tmp_path / "r"
    per_cam = _per_camera(_lines(run))
    assert sorted(per_cam) == sorted(
        ["front", "front_left", "front_right", "back", "back_left", "back_right"]
    )
    assert all(sorted(v) == [0, 1, 2, 3] for v in per_cam.values())
    with (run / "frames.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 24
    for row in rows:
        stamps = [int(row[f"{stamp}_ns"]) for stamp in STAMPS]
        assert stamps == sorted(stamps)
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete"
    assert record["summary"]["frames"] == 24
    assert record["model"]["name"] == "ssdlite320_mobilenet_v3_large"
    assert record["environment"]["torch"] == torch.__version__
    assert set(record["summary"]["cameras"]["front"]["end_to_end_ms"]) == {
        "p50",
        "p95",
        "p99",
        "max",
    }


@pytest.mark.slow
def test_replay_whole_sample_rig_processes_every_frame_once(tmp_path: Path) -> None:
    proc = _run(
        "replay",
        str(SAMPLE_RIG),
        "--model",
        "ssdlite320_mobilenet_v3_large",
        "--weights",
        "none",
        "--out",
        str(tmp_path),
        "--name",
        "full",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    per_cam = _per_camera(_lines(tmp_path / "full"))
    for cam, frames in per_cam.items():
        assert sorted(frames) == list(range(_decodable_frames(SAMPLE_RIG.parent / f"{cam}.mp4")))
    assert len(per_cam) == 6


@pytest.mark.slow  # 8 s on the real clips; the sample rig's replays stay quick
def test_replay_real_clips_as_one_rig(road_clips: RoadClips, tmp_path: Path) -> None:
    # given three road clips with different sizes, frame rates and containers
    clips = road_clips.all
    code = main(
        [
            "replay",
            *map(str, clips),
            "--model",
            ORACLE,
            "--weights",
            "none",
            "--out",
            str(tmp_path),
            "--name",
            "real",
            "--no-progress",
        ]
    )
    assert code == 0
    per_cam = _per_camera(_lines(tmp_path / "real"))
    # then every decodable frame of every clip was processed exactly once
    for clip in clips:
        name = clip.stem
        assert sorted(per_cam[name]) == list(range(_decodable_frames(clip))), name
    record = json.loads((tmp_path / "real" / "run.json").read_text())
    sizes = {(s["width"], s["height"]) for s in record["sources"]}
    assert sizes == {(960, 540), (320, 240), (768, 432)}


def test_boxes_of_an_oracle_plugin_land_inside_each_original_frame(
    road_clips: RoadClips, tmp_path: Path
) -> None:
    clips = road_clips.all
    assert (
        main(
            [
                "replay",
                *map(str, clips),
                "--model",
                ORACLE,
                "--weights",
                "none",
                "--max-frames",
                "3",
                "--out",
                str(tmp_path),
                "--name",
                "o",
                "--no-progress",
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "o" / "run.json").read_text())
    size = {s["camera"]: (s["width"], s["height"]) for s in record["sources"]}
    for line in _lines(tmp_path / "o"):
        w, h = size[str(line["camera"])]
        for x0, y0, x1, y1 in line["boxes"]:  # type: ignore[attr-defined]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h


def test_rig_flag_and_bench_on_the_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "replay",
                "--rig",
                str(SAMPLE_RIG),
                "--model",
                ORACLE,
                "--weights",
                "none",
                "--max-frames",
                "2",
                "--out",
                str(tmp_path),
                "--name",
                "g",
                "--no-progress",
            ]
        )
        == 0
    )
    assert len(_lines(tmp_path / "g")) == 12
    capsys.readouterr()
    assert (
        main(
            [
                "bench",
                str(SAMPLE_RIG),
                "--model",
                ORACLE,
                "--weights",
                "none",
                "--frames",
                "3",
                "--rounds",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for mode in ("model-only", "pipeline", "naive"):
        line = next(x for x in out.splitlines() if x.startswith(mode))
        frames, seconds, fps = line.split()[1:4]
        assert int(frames) == 18 and float(seconds) > 0 and float(fps) > 0
    assert "pipeline / model-only:" in out and "pipeline / naive:" in out


def test_config_file_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "replay.toml"
    config.write_text(
        f'model = "{ORACLE}"\nweights = "none"\nmax_frames = 3\n'
        "score_threshold = 0.5\nbatch_timeout_ms = 5.0\n"
    )
    assert (
        main(
            [
                "replay",
                str(SAMPLE_RIG),
                "--config",
                str(config),
                "--max-frames",
                "2",
                "--out",
                str(tmp_path),
                "--name",
                "c",
                "--no-progress",
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "c" / "run.json").read_text())
    assert record["config"]["max_frames"] == 2  # the flag wins
    assert record["config"]["batch_timeout_ms"] == 5.0  # the file's value
    assert record["summary"]["frames"] == 12


def test_save_video_writes_annotated_videos(tmp_path: Path) -> None:
    assert (
        main(
            [
                "replay",
                str(SAMPLE_RIG),
                "--model",
                ORACLE,
                "--weights",
                "none",
                "--max-frames",
                "5",
                "--save-video",
                "--out",
                str(tmp_path),
                "--name",
                "v",
                "--no-progress",
            ]
        )
        == 0
    )
    videos = sorted((tmp_path / "v" / "video").glob("*.mp4"))
    assert len(videos) == 6
    assert all(_decodable_frames(v) == 5 for v in videos)


def _truncated_avi(path: Path, frames: int, keep: float) -> int:
    """An AVI cut at `keep` of its bytes; returns how many frames stay decodable."""
    full = path.with_name("full.avi")
    writer = cv2.VideoWriter(str(full), cv2.VideoWriter.fourcc(*"MJPG"), 10, (160, 120))
    rng = np.random.default_rng(0)
    for _ in range(frames):
        writer.write(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8))
    writer.release()
    data = full.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return _decodable_frames(path)


def _overstated_avi(path: Path, frames: int, announced: int) -> None:
    """A whole AVI whose headers (avih dwTotalFrames, strh dwLength) announce `announced`
    frames: what many real files do, a few frames over."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25, (64, 48))
    for i in range(frames):
        writer.write(np.full((48, 64, 3), i % 256, np.uint8))
    writer.release()
    data = bytearray(path.read_bytes())
    avih, strh = data.find(b"avih"), data.find(b"strh")
    assert struct.unpack_from("<I", data, avih + 24)[0] == frames
    assert struct.unpack_from("<I", data, strh + 40)[0] == frames
    struct.pack_into("<I", data, avih + 24, announced)
    struct.pack_into("<I", data, strh + 40, announced)
    path.write_bytes(bytes(data))


def test_a_whole_file_whose_header_overstates_its_length_is_not_truncated(
    tmp_path: Path,
) -> None:
    video = tmp_path / "over.avi"
    _overstated_avi(video, 300, 303)
    assert int(cv2.VideoCapture(str(video)).get(cv2.CAP_PROP_FRAME_COUNT)) == 303
    proc = _run(
        "replay", str(video), "--model", ORACLE, "--weights", "none", "--out", str(tmp_path),
        "--name", "t", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(_per_camera(_lines(tmp_path / "t"))["over"]) == list(range(300))
    record = json.loads((tmp_path / "t" / "run.json").read_text())
    assert record["sources"][0]["frame_count"] == 303  # the header's estimate, beside
    assert record["summary"]["cameras"]["over"]["frames"] == 300  # what was read
    assert record["summary"]["cameras"]["over"]["frames_missing_from_source"] == 0


def test_truncated_video_in_a_rig_yields_everything_decodable(tmp_path: Path) -> None:
    # given a rig of a truncated AVI and an intact video
    cut = tmp_path / "cut.avi"
    decodable = _truncated_avi(cut, 40, 0.5)
    assert 0 < decodable < 40
    proc = _run(
        "replay",
        str(cut),
        str(SAMPLE_RIG.parent / "back.mp4"),
        "--model",
        ORACLE,
        "--weights",
        "none",
        "--out",
        str(tmp_path),
        "--name",
        "t",
        "--no-progress",
    )
    # then every decodable frame of both is processed, and the run says, in one line, that a
    # video ended early (non-zero exit)
    assert proc.returncode == 3  # done, but part of the input failed
    assert "ended early" in proc.stderr and "cut" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    per_cam = _per_camera(_lines(tmp_path / "t"))
    assert sorted(per_cam["cut"]) == list(range(decodable))
    assert sorted(per_cam["back"]) == list(range(120))
    record = json.loads((tmp_path / "t" / "run.json").read_text())
    assert record["summary"]["cameras"]["cut"]["frames_missing_from_source"] == 40 - decodable


def test_worker_failure_is_one_line(tmp_path: Path) -> None:
    plugin = tmp_path / "broken_plugin.py"
    plugin.write_text(
        "import torch\n"
        "from drivepercept.models.base import Detector, InputSpec\n"
        "class Broken(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError('first line\\nsecond line\\nthird line')\n"
        "def make(weights):\n"
        "    return Detector('broken', Broken(), InputSpec((64, 64)), ('a',))\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drivepercept",
            "replay",
            str(SAMPLE_RIG),
            "--model",
            "broken_plugin:make",
            "--weights",
            "none",
            "--out",
            str(tmp_path / "runs"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "first line second line" in proc.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    assert json.loads((runs[0] / "run.json").read_text())["status"] == "failed"


def test_cuda_on_a_machine_without_it_leaves_no_run_folder(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _run(
        "replay",
        str(SAMPLE_RIG),
        "--device",
        "cuda",
        "--weights",
        "none",
        "--out",
        str(tmp_path / "runs"),
        "--no-progress",
    )
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr
    assert not (tmp_path / "runs").exists()


RIG = str(SAMPLE_RIG)


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (None, ["{tmp}/missing.mp4"], "video not found"),
        ("text", ["{tmp}/notvideo.mp4"], "cannot open"),
        (None, [RIG, "--model", "yolo9000"], "unknown model"),
        (
            "garbage",
            [RIG, "--model", "ssdlite320_mobilenet_v3_large", "--weights", "{tmp}/garbage.pth"],
            "garbage.pth",
        ),
        (
            "other_arch",
            [
                RIG,
                "--model",
                "fasterrcnn_mobilenet_v3_large_320_fpn",
                "--weights",
                "{tmp}/other.pth",
            ],
            "other.pth",
        ),
        (None, [RIG, "--weights", "{tmp}/absent.pth"], "absent.pth"),
        (None, [RIG, "--batch-timeout-ms", "-5"], "batch_timeout_ms"),
        (None, [RIG, "--device", "tpu"], "device"),
        (None, [RIG, "--max-frames", "-2"], "max_frames"),
        ("bad_config", [RIG, "--config", "{tmp}/bad.toml"], "unknown keys"),
        (None, [], "SOURCE"),
        ("cut", ["{tmp}/cut.avi"], "ended early"),
    ],
)
def test_bad_replay_input_is_one_clear_line(
    tmp_path: Path,
    make: str | None,
    args: list[str],
    message: str,
    in_process: Callable[[list[str]], tuple[int, str]],
) -> None:
    # in this process (the real command's stderr, OpenCV's and FFmpeg's lines included, is
    # test_bad_input.py's test_the_real_command_prints_one_line[replay-text-as-video])
    if make == "text":
        (tmp_path / "notvideo.mp4").write_text("this is not a video\n" * 100)
    elif make == "garbage":
        (tmp_path / "garbage.pth").write_bytes(b"\x00\x01garbage" * 100)
    elif make == "other_arch":
        from torchvision.models.detection import ssdlite320_mobilenet_v3_large

        model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
        torch.save(model.state_dict(), tmp_path / "other.pth")
    elif make == "cut":
        _truncated_avi(tmp_path / "cut.avi", 40, 0.5)
    elif make == "bad_config":
        (tmp_path / "bad.toml").write_text("scor_threshold = 0.5\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    if "--weights" not in argv:
        argv += ["--weights", "none"]
    code, err = in_process(["replay", *argv, "--out", str(tmp_path / "runs"), "--no-progress"])
    # bad input (2); a cut video is processed to its last decodable frame: partial (3)
    assert code == (3 if make == "cut" else 2), err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_ctrl_c_stops_quickly_and_leaves_valid_outputs(tmp_path: Path) -> None:
    # given a replay long enough to interrupt (the full sample rig with a real model)
    proc = children.cli(
        "replay",
        str(SAMPLE_RIG),
        "--model",
        "ssdlite320_mobilenet_v3_large",
        "--weights",
        "none",
        "--out",
        str(tmp_path),
        "--name",
        "i",
        "--no-progress",
    )
    run = tmp_path / "i"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        jsonl = run / "detections.jsonl"
        if jsonl.exists() and jsonl.stat().st_size > 0:
            break
        time.sleep(0.2)
    # when Ctrl-C arrives mid-run
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    stop_s = time.monotonic() - t0
    # then it stops within 2 s (and a busy host's margin), says so, and every file is valid
    print(f"SIGINT: exit {proc.returncode} after {stop_s:.2f} s")
    assert proc.returncode == 130, err
    assert stop_s < children.STOP_S + children.BUSY_HOST_MARGIN_S
    assert "Traceback" not in err
    lines = _lines(run)
    assert 0 < len(lines) < 720
    with (run / "frames.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(lines)
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "interrupted"
    assert record["summary"]["frames"] == len(lines)


def test_image_folder_is_a_camera(tmp_path: Path) -> None:
    # given a folder of 5 images (and a stray text file) beside a video
    folder = tmp_path / "cam_images"
    folder.mkdir()
    for k in range(5):
        cv2.imwrite(str(folder / f"{k:04d}.png"), np.full((90, 160, 3), k * 40, np.uint8))
    (folder / "notes.txt").write_text("not an image")
    assert (
        main(
            [
                "replay",
                str(folder),
                str(SAMPLE_RIG.parent / "front.mp4"),
                "--model",
                ORACLE,
                "--weights",
                "none",
                "--max-frames",
                "8",
                "--out",
                str(tmp_path),
                "--name",
                "f",
                "--no-progress",
            ]
        )
        == 0
    )
    per_cam = _per_camera(_lines(tmp_path / "f"))
    assert sorted(per_cam["cam_images"]) == [0, 1, 2, 3, 4]
    assert sorted(per_cam["front"]) == list(range(8))
