"""The command line: simulate end to end, determinism, bad input, interruption."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import pytest

from drivepercept.cli import main
from drivepercept.errors import ConfigError
from drivepercept.rig import load_rig
from drivepercept.sim.clip import simulate_clip
from drivepercept.sim.config import SimulationConfig
from drivepercept.types import (
    CameraSnapshot,
    CameraState,
    GpuSample,
    LoadSample,
    ReaderStatus,
)

CAMERAS = ["front", "front_left", "front_right", "back", "back_left", "back_right"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drivepercept", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _read_video(path: Path) -> tuple[int, float, tuple[int, int]]:
    cap = cv2.VideoCapture(str(path))
    assert cap.isOpened(), path
    frames = 0
    size = (0, 0)
    while True:
        ok, image = cap.read()
        if not ok:
            break
        frames += 1
        size = (image.shape[1], image.shape[0])
    fps = cap.get(cv2.CAP_PROP_FPS)
    cap.release()
    return frames, fps, size


def test_simulate_acceptance_command(tmp_path: Path) -> None:
    # given the acceptance command
    out = tmp_path / "rig"
    proc = _run(
        "simulate",
        "--out",
        str(out),
        "--cameras",
        "6",
        "--seconds",
        "4",
        "--fps",
        "15",
        "--size",
        "640x360",
        "--seed",
        "7",
    )
    assert proc.returncode == 0, proc.stderr
    # then six videos decode with the right frame count, size and frame rate
    for cam in CAMERAS:
        frames, fps, size = _read_video(out / f"{cam}.mp4")
        assert (frames, fps, size) == (60, 15.0, (640, 360)), cam
    # and the rig file describes them
    rig = load_rig(out / "rig.toml")
    assert list(rig.names) == CAMERAS
    assert all(c.video == (out / f"{c.name}.mp4").resolve() for c in rig.cameras)
    assert all(c.fps == 15.0 and c.size == (640, 360) for c in rig.cameras)
    # and the ground truth is COCO with one image per camera per frame
    gt = json.loads((out / "ground_truth.json").read_text())
    assert len(gt["images"]) == 6 * 60
    assert {c["name"] for c in gt["categories"]} >= {"car", "pedestrian", "traffic_light"}
    images = {im["id"]: im for im in gt["images"]}
    assert {(im["camera"], im["frame_index"]) for im in images.values()} == {
        (c, k) for c in CAMERAS for k in range(60)
    }
    assert images[7]["timestamp_s"] == pytest.approx(1 / 15, abs=1e-6)
    assert len(gt["annotations"]) > 500
    for ann in gt["annotations"]:
        image = images[ann["image_id"]]
        assert ann["camera"] == image["camera"]
        assert ann["frame_index"] == image["frame_index"]
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= 640 and y + h <= 360
        assert 0 < ann["visibility"] <= 1 and ann["distance_m"] > 0
    assert not list(out.glob("*.part")) and not list(out.glob("*.tmp"))


def test_same_seed_same_ground_truth_bytes(tmp_path: Path) -> None:
    def gt(seed: int, name: str) -> bytes:
        args = [
            "simulate",
            "--out",
            str(tmp_path / name),
            "--cameras",
            "2",
            "--seconds",
            "1",
            "--size",
            "320x180",
            "--seed",
            str(seed),
        ]
        assert main(args) == 0
        return (tmp_path / name / "ground_truth.json").read_bytes()

    assert gt(3, "a") == gt(3, "b")
    assert gt(3, "a") != gt(4, "c")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cameras", "0"], "camera count must be between 1 and 12, got 0"),
        (["--size", "10x10"], "frame size must be between"),
        (["--fps", "-1"], "fps must be > 0"),
        (["--size", "641x361"], "even width and height"),
        (["--seconds", "0"], "seconds must be > 0"),
        (["--size", "wide"], "WIDTHxHEIGHT"),
        (["--cameras", "two"], "invalid int value"),
    ],
)
def test_bad_simulate_input_is_one_clear_line(
    tmp_path: Path,
    args: list[str],
    message: str,
    in_process: Callable[[list[str]], tuple[int, str]],
) -> None:
    # in this process; test_unwritable_out_is_one_clear_line runs the real command
    code, err = in_process(["simulate", "--out", str(tmp_path / "x"), *args])
    assert code != 0
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_unwritable_out_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out in (blocker / "sub", blocker):
        proc = _run("simulate", "--out", str(out), "--seconds", "0.2")
        assert proc.returncode == 2  # bad input
        assert "error:" in proc.stderr and str(out) in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "Traceback" not in proc.stderr


def test_interrupted_simulation_leaves_valid_files(tmp_path: Path) -> None:
    def stop_after_five(done: int, total: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    config = SimulationConfig(
        out_dir=tmp_path, cameras=2, seconds=2.0, fps=10.0, width=320, height=180, seed=1
    )
    result = simulate_clip(config, progress=stop_after_five)
    assert result.interrupted and result.frames == 5
    gt = json.loads(result.ground_truth_path.read_text())
    assert gt["info"]["frames"] == 5 and len(gt["images"]) == 10
    for video in result.videos:
        frames, fps, size = _read_video(video)
        assert (frames, fps, size) == (5, 10.0, (320, 180))


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    proc = _run("--version")  # the real command, once
    assert proc.returncode == 0 and "drivepercept" in proc.stdout
    with pytest.raises(SystemExit) as exited:  # argparse's exit after the help
        main(["simulate", "--help"])
    assert exited.value.code == 0 and "examples:" in capsys.readouterr().out


# what the handlers run on, never what a help text or a usage error needs
HEAVY = ("torch", "torchvision", "onnxruntime", "onnx", "cv2", "numpy", "matplotlib", "scipy")
_ANSWER = """
import sys, time
t0 = time.perf_counter()
import drivepercept.cli
imported_s = time.perf_counter() - t0
try:
    drivepercept.cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("RESULT", code, round(imported_s * 1000, 1), *sorted(set(HEAVY) & set(sys.modules)))
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["replay", "--help"], ["replay", "--no-such-flag"], ["bench", "--mode", "x"]],
    ids=["help", "replay-help", "unknown-flag", "bad-choice"],
)
def test_help_and_usage_errors_load_no_model_runtime(argv: list[str]) -> None:
    # given a fresh interpreter (nothing imported yet)
    # when it imports the command line and answers --help or a usage error
    code = f"HEAVY = {HEAVY!r}\n{_ANSWER}"
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # then it answers (0 for help, 2 for a usage error) without loading any of them
    result = proc.stdout.strip().splitlines()[-1].split()
    assert result[0] == "RESULT", proc.stdout + proc.stderr
    assert result[1] == ("0" if "--help" in argv else "2")
    assert result[3:] == [], f"{argv} loaded {result[3:]}"
    print(f"{' '.join(argv)}: drivepercept.cli imported in {result[2]} ms")


def test_import_of_the_cli_shows_no_model_runtime() -> None:
    # given python -X importtime, which lists every module an import loads
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import drivepercept.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    # then the CLI module's import tree holds none of the heavy packages
    assert "drivepercept.cli.parser" in loaded, proc.stderr[-2000:]
    assert not {name.split(".")[0] for name in loaded} & set(HEAVY)
    assert "drivepercept.cli.commands" not in loaded  # the handlers: once a command runs


def _snapshot(name: str, fps: float, p95_ms: float) -> CameraSnapshot:
    reader = ReaderStatus(CameraState.STREAMING)
    return CameraSnapshot(name, CameraState.STREAMING, 10, 0, fps, p95_ms, 10, 0, 0, reader)


def test_status_line_shows_each_camera_and_the_load() -> None:
    from drivepercept.run.console import status_line

    cpu = LoadSample(
        t_ns=1,
        process_cpu_pct=150.0,
        system_cpu_pct=75.4,
        per_core_cpu_pct=(70.0, 80.8),
        process_rss_bytes=1 << 30,
        system_mem_used_bytes=2 << 30,
        system_mem_total_bytes=8 << 30,
    )
    cams = [_snapshot("front", 14.96, 87.4), _snapshot("back", 0.0, float("nan"))]
    assert status_line(cams, cpu) == "fps/p95 ms: front 15.0/87 back 0.0/- | CPU 75% of 2 cores"
    gpu = GpuSample(
        0, 93.0, 40.0, 3.0 * 2**30, 80.0 * 2**30, 250.0, 700.0, 60.0, 1980.0, 2619.0, 0.0, 0.0, 0
    )
    line = status_line([_snapshot("front", 30.0, 20.0)], dataclasses.replace(cpu, gpus=(gpu,)))
    assert line == "fps/p95 ms: front 30.0/20 | GPU0 93% 3072 MB"


def _args(argv: list[str]) -> argparse.Namespace:
    from drivepercept.cli.parser import build_parser

    return build_parser().parse_args(argv)


def test_config_file_then_flags_merge_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from drivepercept.cli.commands import merged_settings

    for name in ("DRIVEPERCEPT_ONNX_CACHE", "XDG_CACHE_HOME"):  # an environment that sets none
        monkeypatch.delenv(name, raising=False)

    config = tmp_path / "replay.toml"
    config.write_text(
        '[replay]\nsources = ["a.mp4"]\nscore_threshold = 0.4\nmodel = "m"\nmax_frames = 9\n'
    )
    sources, settings = merged_settings(
        _args(["replay", "b.mp4", "--config", str(config), "--max-frames", "3", "--no-warmup"])
    )
    # the file's sources first, then the command line's; a flag beats the file's key
    assert sources == ("a.mp4", "b.mp4")
    assert settings == {"score_threshold": 0.4, "model": "m", "max_frames": 3, "warmup": False}
    # an unset flag leaves the file's value, and no flag sets anything by itself
    _, settings = merged_settings(_args(["replay", "b.mp4"]))
    assert settings == {}


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    from drivepercept.cli.commands import merged_settings

    config = tmp_path / "bad.toml"
    config.write_text("scor_threshold = 0.4\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['scor_threshold'\]"):
        merged_settings(_args(["replay", "b.mp4", "--config", str(config)]))
    with pytest.raises(ConfigError, match="at least one SOURCE"):
        merged_settings(_args(["replay"]))


def test_live_cameras_and_the_run_options_the_cli_builds() -> None:
    from drivepercept.cli.commands import run_options
    from drivepercept.run import Mode

    args = _args(["live", "--camera", "a=0", "--no-report", "--reconnect-attempts", "3"])
    options = run_options(args, Mode.LIVE)
    assert options.sources == ("a=0",) and options.report_formats == ()
    assert options.reconnect.max_attempts == 3 and options.reconnect.initial_s == 0.25
    assert options.pipeline().drop_policy == "drop_oldest"
