"""The bad-input matrix: every entry point (replay, live, eval, bench, serve-cameras, report,
simulate, the rig file, the settings file, the Python API) given missing, empty, non-video,
zero-frame and huge inputs, broken rig and settings files, a device that is not there, and
weights that are empty, cut short, of another model or a pickle that would run code.

Each case: its documented exit code (README, "Exit codes"), one line on stderr that names the
problem and the offending value, no traceback. The CLI runs in-process (`cli.main`), so the
whole matrix costs seconds; a few cases run the real `python -m drivepercept` too, whose stderr
also holds whatever OpenCV, FFmpeg and torch print themselves.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from hostile import huge_jpegs
from torchvision.models.detection import ssdlite320_mobilenet_v3_large

from drivepercept.bench.compare import bench
from drivepercept.config import PipelineConfig, ReconnectPolicy
from drivepercept.errors import ConfigError, DrivePerceptError, ModelError
from drivepercept.models import load_detector
from drivepercept.models.export import export_onnx
from drivepercept.report import write_report
from drivepercept.report.rundata import ReportError
from drivepercept.rig import load_rig, resolve_cameras
from drivepercept.run import RunOptions, evaluate_clip, read_settings_file, run
from drivepercept.sim.config import SimulationConfig
from drivepercept.sim.serve import CameraServer, ServeError, cameras_from_sources
from drivepercept.sources.readers import SourceError

pytestmark = pytest.mark.timeout(120)

MARKER = "PWNED"  # what the pickle with code would create, were it ever run


class _RunsCode:
    """Pickled as a call of os.system: loading it would run the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (self.command,))


# --------------------------------------------------------------------------- the inputs


def _video(path: Path, frames: int, size: tuple[int, int] = (64, 48)) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10.0, size)
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), 40 * i, np.uint8))
    writer.release()


def _black_png(path: Path, width: int, height: int) -> None:
    """A black RGB PNG written row by row: a huge image without a huge array here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    packer = zlib.compressobj(1)
    row = bytes(1 + 3 * width)  # filter byte + pixels
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def _coco(path: Path, files: list[str], size: tuple[int, int]) -> None:
    images = [
        {"id": i + 1, "file_name": f, "width": size[0], "height": size[1]}
        for i, f in enumerate(files)
    ]
    categories = [{"id": 1, "name": "car"}]
    path.write_text(json.dumps({"images": images, "annotations": [], "categories": categories}))


RIGS = {
    "unknown_camera_key": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\nzoom = 2\n',
    "unknown_top_key": 'modle = "yolox-nano"\n[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\n',
    "fps_string": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\nfps = "fast"\n',
    "width_float": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\nwidth = 64.5\nheight = 48\n',
    "name_int": '[[cameras]]\nname = 7\nvideo = "../tiny.avi"\n',
    "video_int": '[[cameras]]\nname = "front"\nvideo = 3\n',
    "duplicate": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\n' * 2,
    "no_name": '[[cameras]]\nvideo = "../tiny.avi"\n',
    "no_video": '[[cameras]]\nname = "front"\n',
    "no_cameras": 'model = "yolox-nano"\n',
    "empty": "",
    "not_toml": "[[cameras]\nname =",
    "missing_video": '[[cameras]]\nname = "front"\nvideo = "../missing.mp4"\n',
    "zero_frames": '[[cameras]]\nname = "front"\nvideo = "../zero.avi"\n',
    "huge": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\nwidth = 99999\nheight = 99999\n',
    "width_only": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\nwidth = 640\n',
    "bad_name": '[[cameras]]\nname = "front/left"\nvideo = "../tiny.avi"\n',
    "model_int": 'model = 5\n[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\n',
    "position_2d": '[[cameras]]\nname = "front"\nvideo = "../tiny.avi"\n'
    "[cameras.extrinsics]\nposition_m = [1, 2]\nyaw_deg = 0\n",
}
SETTINGS = {
    "unknown_key": "scor_threshold = 0.5\n",
    "score_string": 'score_threshold = "high"\n',
    "max_frames_string": 'max_frames = "2"\n',
    "warmup_string": 'warmup = "yes"\n',
    "budget_string": 'budget_ms = "x"\n',
    "sources_string": 'sources = "front.mp4"\n',
    "replay_int": "replay = 5\n",
    "not_toml": "score_threshold = \n",
    "drop_oldest": 'drop_policy = "drop_oldest"\n',
}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of every bad (and a few good) inputs the cases name."""
    d = tmp_path_factory.mktemp("bad")
    _video(d / "tiny.avi", 3)
    _video(d / "zero.avi", 0)  # a valid container without a frame
    _video(d / "wide.avi", 1, (8256, 32))  # wider than any camera frame may be
    (d / "empty.mp4").write_bytes(b"")
    (d / "notvideo.mp4").write_text("this is not a video\n" * 50)
    for folder in ("emptydir", "pngs", "huge", "hugejpegs"):
        (d / folder).mkdir()
    for i, data in enumerate(huge_jpegs().values()):  # 30000^2 (one with a junk byte), 60000^2
        (d / "hugejpegs" / f"{i:03d}.jpg").write_bytes(data)
    for i in range(2):
        cv2.imwrite(str(d / "pngs" / f"{i:03d}.png"), np.zeros((48, 64, 3), np.uint8))
    _coco(d / "pngs.json", ["000.png", "001.png"], (64, 48))
    _black_png(d / "huge" / "000.png", 9000, 9000)
    _coco(d / "huge.json", ["000.png"], (9000, 9000))
    _coco(d / "other_images.json", ["nope.png"], (64, 48))
    (d / "notjson.json").write_text("not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "rigs").mkdir()
    for name, text in RIGS.items():
        (d / "rigs" / f"{name}.toml").write_text(text)
    (d / "rigs" / "not_utf8.toml").write_bytes(b"\xff\xfe\x00garbage")
    (d / "settings").mkdir()
    for name, text in SETTINGS.items():
        (d / "settings" / f"{name}.toml").write_text(text)
    _weights(d)
    _run_folders(d)
    export_onnx(load_detector("drivepercept-tiny", weights="none"), d / "tiny.onnx", batch=None)
    return d


def _weights(d: Path) -> None:
    (d / "empty.pth").write_bytes(b"")
    torch.save(load_detector("drivepercept-tiny").module.state_dict(), d / "tiny.pth")
    torch.save(load_detector("yolox-nano").module.state_dict(), d / "nano.pth")
    ssdlite = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    torch.save(ssdlite.state_dict(), d / "ssdlite.pth")
    for name in ("tiny", "nano"):
        whole = (d / f"{name}.pth").read_bytes()
        (d / f"{name}_cut.pth").write_bytes(whole[: len(whole) // 2])
    code = _RunsCode(f"touch {d / MARKER}")
    torch.save({"weight": code}, d / "code.pth")  # torch's own format
    with (d / "code_plain.pth").open("wb") as fh:  # a plain pickle
        pickle.dump({"weight": code}, fh, protocol=2)


def _run_folders(d: Path) -> None:
    """A real run folder, and copies of it damaged in the ways `report` meets."""
    options = RunOptions(
        sources=(str(d / "tiny.avi"),),
        model="drivepercept-tiny",
        weights="none",
        settings={"max_frames": 2, "device": "cpu", "sample_hz": 0.0},
        out_root=d / "rundirs",
        name="ok",
        report_formats=(),
    )
    ok = run(options).run_dir
    for name in ("empty_csv", "columns", "bad_json", "no_json"):
        shutil.copytree(ok, d / "rundirs" / name)
    (d / "rundirs" / "empty_csv" / "frames.csv").write_text("")
    (d / "rundirs" / "columns" / "frames.csv").write_text("a,b\n1,2\n")
    (d / "rundirs" / "bad_json" / "run.json").write_text("{not json")
    (d / "rundirs" / "no_json" / "run.json").unlink()
    (d / "rundirs" / "empty").mkdir()
    (d / "rundirs" / "afile").write_text("x")


# --------------------------------------------------------------------------- the CLI matrix
# (exit codes as the README documents them: 2 bad input, 3 partial, 4 no frames)

# the flags of each command that keep a case small: no model to download, two frames, no report
TINY = ["--model", "drivepercept-tiny", "--weights", "none", "--no-progress"]
FLAGS = {
    "{tiny}": TINY,
    "{replay}": [*TINY, "--max-frames", "2", "--out", "{d}/runs", "--no-report"],
    "{live}": [*TINY, "--duration", "2", "--out", "{d}/runs", "--no-report"],
    "{eval}": [*TINY, "--max-frames", "2", "--out", "{d}/runs"],
    "{bench}": [*TINY, "--frames", "2", "--rounds", "1"],
}
CUDA_7 = "device 'cuda:7' requested but"  # no CUDA here; fewer than 8 GPUs elsewhere
NO_ORT = "{no-onnxruntime}"  # the case runs as if onnxruntime were not installed
SSDLITE = "--model ssdlite320_mobilenet_v3_large --weights none --max-frames 2 --no-report"


def case(name: str, command: str, code: int, *phrases: str, marks: Any = ()) -> Any:
    """A case: its id, the command line ({d}: the inputs' folder; {replay}, ...: FLAGS), the
    exit code and what the error line must say."""
    return pytest.param(shlex.split(command), code, phrases, id=name, marks=marks)


def argv_in(folder: Path, words: list[str]) -> list[str]:
    expanded = [w for word in words for w in FLAGS.get(word, [word])]
    return [w.replace("{d}", str(folder)) for w in expanded]


# fmt: off
CLI_CASES = [
    # replay: the sources
    case("replay-missing", "replay {d}/missing.mp4 {replay}", 2, "video not found", "{d}/missing.mp4"),
    case("replay-empty-file", "replay {d}/empty.mp4 {replay}", 2, "cannot open", "{d}/empty.mp4"),
    case("replay-text-as-video", "replay {d}/notvideo.mp4 {replay}", 2, "not a video", "{d}/notvideo.mp4"),
    case("replay-zero-frames", "replay {d}/zero.avi {replay}", 4, "no camera delivered a frame", "zero"),
    case("replay-huge-video", "replay {d}/wide.avi {replay}", 2, "8256x32 pixels", "{d}/wide.avi"),
    # a folder none of whose images is usable (one too large is skipped and counted, and the
    # run goes on with the others: tests/test_frame_limit.py)
    case("replay-huge-image", "replay {d}/huge {replay}", 2, "no usable image in {d}/huge:", "9000x9000 pixels", "{d}/huge/000.png"),
    case("replay-huge-jpegs", "replay {d}/hugejpegs {replay}", 2, "no usable image in {d}/hugejpegs:", "30000x30000 pixels", "(2 more skipped)"),
    case("replay-empty-folder", "replay {d}/emptydir {replay}", 2, "no images", "{d}/emptydir"),
    case("replay-no-source", "replay {replay}", 2, "give at least one SOURCE"),
    # replay: settings and flags
    case("replay-cuda-7", "replay {d}/tiny.avi {replay} --device cuda:7", 2, CUDA_7),
    case("replay-device-tpu", "replay {d}/tiny.avi {replay} --device tpu", 2, "device must be", "'tpu'"),
    case("replay-timeout-nan", "replay {d}/tiny.avi {replay} --batch-timeout-ms nan", 2, "expected a finite number", "'nan'"),
    case("live-linger-inf", "live {d}/tiny.avi {replay} --metrics-linger-s inf", 2, "expected a finite number", "'inf'"),
    case("replay-precision", "replay {d}/tiny.avi {replay} --precision fp8", 2, "precision", "'fp8'"),
    case("replay-cpu-lanes", "replay {d}/tiny.avi {replay} --cpu-lanes -1", 2, "cpu_lanes must be 0", "-1"),
    case("replay-score", "replay {d}/tiny.avi {replay} --score-threshold 2", 2, "score_threshold", "got 2"),
    case("replay-max-frames-word", "replay {d}/tiny.avi {replay} --max-frames x", 2, "invalid int value", "'x'"),
    case("replay-input-size-huge", "replay {d}/tiny.avi {replay} --model yolox-nano --input-size 99999x99999", 2, "multiples of 32", "99999x99999"),
    case("replay-input-size-huge-32", "replay {d}/tiny.avi {replay} --model yolox-nano --input-size 99968x99968", 2, "16..8192", "99968x99968"),
    case("replay-input-size-fixed", "replay {d}/tiny.avi {replay} --input-size 640x384", 2, "fixed input size", "640x384"),
    case("replay-input-size-word", "replay {d}/tiny.avi {replay} --model yolox-nano --input-size huge", 2, "WIDTHxHEIGHT", "'huge'"),
    case("replay-unknown-model", "replay {d}/tiny.avi {replay} --model yolo9000", 2, "unknown model", "'yolo9000'"),
    case("replay-missing-plugin", "replay {d}/tiny.avi {replay} --model nowhere.module:make", 2, "cannot import", "'nowhere.module'"),
    case("replay-name", "replay {d}/tiny.avi {replay} --name ../x", 2, "run name", "'../x'"),
    case("replay-out-is-a-file", "replay {d}/tiny.avi {replay} --out {d}/tiny.avi", 2, "cannot create run folder", "{d}/tiny.avi"),
    # replay: the runtime
    case("runtime-unknown", "replay {d}/tiny.avi {replay} --runtime fast", 2, "runtime must be one of auto, torch, onnxruntime", "'fast'"),
    case("runtime-ort-not-installed", f"replay {{d}}/tiny.avi {{replay}} --runtime onnxruntime {NO_ORT}", 2, "runtime onnxruntime", "onnxruntime package is not installed"),
    case("runtime-ort-unexportable", f"replay {{d}}/tiny.avi {SSDLITE} --out {{d}}/runs --runtime onnxruntime", 2, "runtime onnxruntime", "ssdlite320_mobilenet_v3_large cannot be exported"),
    case("runtime-torch-onnx-model", "replay {d}/tiny.avi --model {d}/tiny.onnx --max-frames 2 --no-report --out {d}/runs --runtime torch", 2, "runtime torch cannot run an .onnx model", "{d}/tiny.onnx"),
    # replay: weights
    case("weights-empty", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/empty.pth", 2, "not a torch weights file", "{d}/empty.pth"),
    case("weights-truncated", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/nano_cut.pth", 2, "damaged torch weights file", "{d}/nano_cut.pth"),
    case("weights-truncated-tiny", "replay {d}/tiny.avi {replay} --model drivepercept-tiny --weights {d}/tiny_cut.pth", 2, "damaged torch weights file", "{d}/tiny_cut.pth"),
    case("weights-ssdlite-for-yolox", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/ssdlite.pth", 2, "do not fit yolox-nano", "{d}/ssdlite.pth"),
    case("weights-yolox-for-ssdlite", "replay {d}/tiny.avi {replay} --model ssdlite320_mobilenet_v3_large --weights {d}/nano.pth", 2, "do not fit ssdlite320_mobilenet_v3_large", "{d}/nano.pth"),
    case("weights-yolox-for-tiny", "replay {d}/tiny.avi {replay} --model drivepercept-tiny --weights {d}/nano.pth", 2, "do not fit drivepercept-tiny", "{d}/nano.pth"),
    case("weights-pickle-with-code", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/code.pth", 2, "a pickle that would call", "system", "{d}/code.pth"),
    case("weights-plain-pickle-with-code", "replay {d}/tiny.avi {replay} --model drivepercept-tiny --weights {d}/code_plain.pth", 2, "a pickle that would call", "{d}/code_plain.pth"),
    case("weights-a-video", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/tiny.avi", 2, "not a torch weights file", "{d}/tiny.avi"),
    case("weights-a-folder", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/pngs", 2, "not a file", "{d}/pngs"),
    case("weights-missing", "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/absent.pth", 2, "not found", "{d}/absent.pth"),
    case("weights-blank", "replay {d}/tiny.avi {replay} --model yolox-nano --weights ' '", 2, "weights must be", "' '"),
    # the settings file (--config)
    case("settings-missing", "replay {d}/tiny.avi {replay} --config {d}/settings/absent.toml", 2, "config file not found", "{d}/settings/absent.toml"),
    case("settings-not-toml", "replay {d}/tiny.avi {replay} --config {d}/settings/not_toml.toml", 2, "not valid TOML", "{d}/settings/not_toml.toml"),
    case("settings-unknown-key", "replay {d}/tiny.avi {replay} --config {d}/settings/unknown_key.toml", 2, "unknown keys", "'scor_threshold'"),
    case("settings-score-string", "replay {d}/tiny.avi {replay} --config {d}/settings/score_string.toml", 2, "score_threshold must be a number", "'high'"),
    case("settings-max-frames-string", "replay {d}/tiny.avi {tiny} --out {d}/runs --config {d}/settings/max_frames_string.toml", 2, "max_frames must be an integer", "'2'"),
    case("settings-warmup-string", "replay {d}/tiny.avi {replay} --config {d}/settings/warmup_string.toml", 2, "warmup must be true or false", "'yes'"),
    case("settings-budget-string", "replay {d}/tiny.avi {replay} --config {d}/settings/budget_string.toml", 2, "budget_ms must be a number", "'x'"),
    case("settings-sources-string", "replay {d}/tiny.avi {replay} --config {d}/settings/sources_string.toml", 2, "sources must be a list", "'front.mp4'"),
    case("settings-replay-not-a-table", "replay {d}/tiny.avi {replay} --config {d}/settings/replay_int.toml", 2, "[replay] must be a table", "5"),
    # the rig file
    case("rig-missing", "replay {d}/rigs/absent.toml {replay}", 2, "rig file not found", "{d}/rigs/absent.toml"),
    case("rig-empty", "replay {d}/rigs/empty.toml {replay}", 2, "no [[cameras]]", "{d}/rigs/empty.toml"),
    case("rig-not-toml", "replay {d}/rigs/not_toml.toml {replay}", 2, "not valid TOML", "{d}/rigs/not_toml.toml"),
    case("rig-not-utf8", "replay {d}/rigs/not_utf8.toml {replay}", 2, "cannot read rig file", "{d}/rigs/not_utf8.toml"),
    case("rig-no-cameras", "replay {d}/rigs/no_cameras.toml {replay}", 2, "no [[cameras]]", "{d}/rigs/no_cameras.toml"),
    case("rig-unknown-camera-key", "replay {d}/rigs/unknown_camera_key.toml {replay}", 2, "unknown keys", "'zoom'"),
    case("rig-unknown-key", "replay {d}/rigs/unknown_top_key.toml {replay}", 2, "unknown keys", "'modle'"),
    case("rig-fps-string", "replay {d}/rigs/fps_string.toml {replay}", 2, "fps must be a number", "'fast'"),
    case("rig-width-float", "replay {d}/rigs/width_float.toml {replay}", 2, "width must be an integer", "64.5"),
    case("rig-name-int", "replay {d}/rigs/name_int.toml {replay}", 2, "name must be a string", "got 7"),
    case("rig-video-int", "replay {d}/rigs/video_int.toml {replay}", 2, "video must be a non-empty path", "got 3"),
    case("rig-model-int", "replay {d}/rigs/model_int.toml {replay}", 2, "model must be a model name", "got 5"),
    case("rig-duplicate-names", "replay {d}/rigs/duplicate.toml {replay}", 2, "camera names must be unique", "front"),
    case("rig-no-name", "replay {d}/rigs/no_name.toml {replay}", 2, "name must be a string", "got None"),
    case("rig-no-video", "replay {d}/rigs/no_video.toml {replay}", 2, "has no video", "'front'"),
    case("rig-bad-name", "replay {d}/rigs/bad_name.toml {replay}", 2, "camera name must be", "'front/left'"),
    case("rig-width-only", "replay {d}/rigs/width_only.toml {replay}", 2, "give both width and height", "'front'"),
    case("rig-huge-size", "replay {d}/rigs/huge.toml {replay}", 2, "frame size must be between", "99999x99999"),
    case("rig-position-2d", "replay {d}/rigs/position_2d.toml {replay}", 2, "position_m", "(1.0, 2.0)"),
    case("rig-missing-video", "replay {d}/rigs/missing_video.toml {replay}", 2, "video not found", "missing.mp4"),
    case("rig-zero-frames", "replay {d}/rigs/zero_frames.toml {replay}", 4, "no camera delivered a frame", "front"),
    # live
    case("live-missing", "live {d}/missing.mp4 {live}", 2, "video not found", "{d}/missing.mp4"),
    case("live-text-as-video", "live --camera front={d}/notvideo.mp4 {live}", 2, "not a video", "{d}/notvideo.mp4"),
    case("live-zero-frames", "live {d}/zero.avi {live}", 4, "no camera delivered a frame", "zero"),
    case("live-huge-video", "live {d}/wide.avi {live}", 2, "8256x32 pixels", "{d}/wide.avi"),
    case("live-duplicate-names", "live --camera front={d}/tiny.avi --camera front={d}/tiny.avi {live}", 2, "unique", "'front'"),
    case("live-empty-source", "live --camera front= {live}", 2, "the source is empty", "'front='"),
    case("live-rig-no-source", "live {d}/rigs/no_video.toml {live}", 2, "neither a source nor a video", "'front'"),
    case("live-cuda-7", "live {d}/tiny.avi {live} --device cuda:7", 2, CUDA_7),
    case("live-duration", "live {d}/tiny.avi {live} --duration -1", 2, "duration must be > 0", "-1"),
    case("live-metrics-port", "live {d}/tiny.avi {live} --metrics-port 99999", 2, "metrics port", "99999"),
    case("live-reconnect", "live {d}/tiny.avi {live} --reconnect-initial-s 0", 2, "initial_s", "got 0"),
    case("live-absent-device", "live --camera front=/dev/video99 {live}", 2, "no such camera device", "/dev/video99"),
    # eval
    case("eval-missing", "eval {d}/missing {eval}", 2, "nothing to evaluate", "{d}/missing"),
    case("eval-empty-folder", "eval {d}/emptydir {eval}", 2, "no labelled data", "{d}/emptydir"),
    case("eval-a-video", "eval {d}/notvideo.mp4 {eval}", 2, "no labelled data", "{d}/notvideo.mp4"),
    case("eval-not-json", "eval {d}/notjson.json {eval}", 2, "not valid JSON", "{d}/notjson.json"),
    case("eval-not-coco", "eval {d}/list.json {eval}", 2, "not a COCO annotation file", "{d}/list.json"),
    case("eval-other-images", "eval {d}/other_images.json {eval}", 2, "none of the 1 images", "nope.png"),
    case("eval-missing-labels", "eval {d}/pngs --ground-truth {d}/absent.json {eval}", 2, "annotation file not found", "{d}/absent.json"),
    case("eval-huge-image", "eval {d}/huge --ground-truth {d}/huge.json {eval}", 2, "9000x9000 pixels", "{d}/huge/000.png"),
    case("eval-rig-duplicate", "eval {d}/rigs/duplicate.toml {eval}", 2, "camera names must be unique", "front"),
    case("eval-no-ground-truth", "eval {d}/rigs/zero_frames.toml {eval}", 2, "no ground truth", "{d}/rigs/ground_truth.json"),
    case("eval-two-clips", "eval {d}/pngs {d}/pngs {eval}", 2, "exactly one clip"),
    case("eval-cuda-7", "eval {d}/pngs --ground-truth {d}/pngs.json {eval} --device cuda:7", 2, CUDA_7),
    case("eval-drop-policy", "eval {d}/pngs --ground-truth {d}/pngs.json {eval} --config {d}/settings/drop_oldest.toml", 2, "drop_policy must be 'block'", "'drop_oldest'"),
    case("eval-pickle-with-code", "eval {d}/pngs --ground-truth {d}/pngs.json {eval} --model yolox-nano --weights {d}/code.pth", 2, "a pickle that would call", "{d}/code.pth"),
    # bench
    case("bench-missing", "bench {d}/missing.mp4 {bench}", 2, "video not found", "{d}/missing.mp4"),
    case("bench-text-as-video", "bench {d}/notvideo.mp4 {bench}", 2, "not a video", "{d}/notvideo.mp4"),
    case("bench-zero-frames", "bench {d}/zero.avi {bench}", 2, "no frames to benchmark with", "'zero'"),
    case("bench-huge-video", "bench {d}/wide.avi {bench}", 2, "8256x32 pixels", "{d}/wide.avi"),
    case("bench-no-frames", "bench {d}/tiny.avi {bench} --frames 0", 2, "must be >= 1", "got 0, 1"),
    case("bench-no-rounds", "bench {d}/tiny.avi {bench} --rounds 0", 2, "must be >= 1", "got 2, 0"),
    case("bench-cuda-7", "bench {d}/tiny.avi {bench} --device cuda:7", 2, CUDA_7),
    case("bench-rig-unknown-key", "bench {d}/rigs/unknown_camera_key.toml {bench}", 2, "unknown keys", "'zoom'"),
    case("bench-weights-truncated", "bench {d}/tiny.avi {bench} --model yolox-nano --weights {d}/nano_cut.pth", 2, "damaged torch weights file", "{d}/nano_cut.pth"),
    # serve-cameras
    case("serve-missing", "serve-cameras {d}/missing.mp4 --port 0", 2, "no file at", "{d}/missing.mp4"),
    case("serve-empty-file", "serve-cameras {d}/empty.mp4 --port 0", 2, "got no frame", "{d}/empty.mp4"),
    case("serve-text-as-video", "serve-cameras {d}/notvideo.mp4 --port 0", 2, "got no frame", "{d}/notvideo.mp4"),
    case("serve-zero-frames", "serve-cameras {d}/zero.avi --port 0", 2, "got no frame", "{d}/zero.avi"),
    case("serve-empty-folder", "serve-cameras {d}/emptydir --port 0", 2, "expected videos", "{d}/emptydir"),
    case("serve-rig-duplicate", "serve-cameras {d}/rigs/duplicate.toml --port 0", 2, "unique", "front"),
    case("serve-rig-wrong-type", "serve-cameras {d}/rigs/fps_string.toml --port 0", 2, "fps must be a number", "'fast'"),
    case("serve-a-stream", "serve-cameras cam=rtsp://10.0.0.1/x --port 0", 2, "no file at", "rtsp://10.0.0.1/x"),
    case("serve-port", "serve-cameras {d}/tiny.avi --port 70000", 2, "port in 0..65535", "70000"),
    case("serve-fps", "serve-cameras {d}/tiny.avi --port 0 --fps 0", 2, "fps must be > 0", "got 0"),
    # report
    case("report-missing", "report {d}/rundirs/absent", 2, "does not exist", "{d}/rundirs/absent"),
    case("report-a-file", "report {d}/rundirs/afile", 2, "is not a folder", "{d}/rundirs/afile"),
    case("report-empty-folder", "report {d}/rundirs/empty", 2, "has no frames.csv", "{d}/rundirs/empty"),
    case("report-empty-frames", "report {d}/rundirs/empty_csv --format json", 2, "is empty", "{d}/rundirs/empty_csv/frames.csv"),
    case("report-wrong-columns", "report {d}/rundirs/columns --format json", 2, "has no column(s)", "{d}/rundirs/columns/frames.csv"),
    case("report-run-json-not-json", "report {d}/rundirs/bad_json --format json", 3, "run.json is unreadable", "JSONDecodeError"),
    case("report-run-json-missing", "report {d}/rundirs/no_json --format json", 3, "run.json is missing"),
    case("report-format", "report {d}/rundirs/ok --format pdf", 2, "report formats are", "'pdf'"),
    case("report-budget", "report {d}/rundirs/ok --budget-ms -1", 2, "budget_ms must be > 0", "-1"),
    case("report-compare-missing", "report {d}/rundirs/ok --compare {d}/rundirs/absent", 2, "does not exist", "{d}/rundirs/absent"),
    # simulate
    case("simulate-cameras", "simulate --out {d}/sim --cameras 13", 2, "camera count", "got 13"),
    case("simulate-huge-size", "simulate --out {d}/sim --size 99999x99999", 2, "frame size", "99999x99999"),
    case("simulate-fps-nan", "simulate --out {d}/sim --fps nan", 2, "--fps: expected a finite number", "nan"),
    case("simulate-seconds-inf", "simulate --out {d}/sim --seconds inf", 2, "--seconds: expected a finite number", "inf"),
    case("simulate-seed", "simulate --out {d}/sim --seed -1", 2, "seed", "got -1"),
    case("simulate-out-is-a-file", "simulate --out {d}/tiny.avi --seconds 0.2", 2, "cannot create output folder", "{d}/tiny.avi"),
]
# fmt: on


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """A bad input stops what it started: no pipeline or camera-server thread is left."""
    yield
    names = ("decode-", "batcher", "engine", "gpu-monitor", "serve-")
    assert [t.name for t in threading.enumerate() if t.name.startswith(names)] == []


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(("argv", "code", "phrases"), CLI_CASES)
def test_cli_bad_input_is_one_clear_line(
    d: Path,
    in_process: Callable[[list[str]], tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    code: int,
    phrases: tuple[str, ...],
) -> None:
    if NO_ORT in argv:  # None in sys.modules: `import onnxruntime` fails, find_spec finds none
        monkeypatch.setitem(sys.modules, "onnxruntime", None)
        argv = [word for word in argv if word != NO_ORT]
    # given a bad input; when the command runs
    got, stderr = in_process(argv_in(d, argv))
    # then its documented exit code, and one line naming the problem and the value
    line = _one_line(stderr)
    assert line.startswith(f"drivepercept {argv[0]}: error: "), line
    for phrase in phrases:
        assert phrase.replace("{d}", str(d)) in line, line
    assert got == code, line
    assert not (d / MARKER).exists(), "the pickled code ran"


# --------------------------------------------------------------------------- the Python API


def _options(d: Path, **changes: Any) -> RunOptions:
    given: dict[str, Any] = {
        "sources": (str(d / "tiny.avi"),),
        "model": "drivepercept-tiny",
        "weights": "none",
        "settings": {"max_frames": 2},
        "out_root": d / "runs",
        "report_formats": (),
    }
    return RunOptions(**{**given, **changes})


def _run(d: Path, **changes: Any) -> Any:
    return run(_options(d, **changes))


def _bench(d: Path, frames: int, rounds: int) -> Any:
    return bench(_options(d), frames_per_camera=frames, rounds=rounds)


def _serve(path: Path) -> Any:
    with CameraServer([("cam", path)]) as server:  # started: closed again
        return server


# fmt: off
API_CASES = [
    pytest.param(lambda d: _options(d, sources=()), ConfigError, ("at least one source",), id="options-no-source"),
    pytest.param(lambda d: _options(d, mode="turbo"), ConfigError, ("mode must be", "'turbo'"), id="options-mode"),
    pytest.param(lambda d: _options(d, settings={"scor_threshold": 0.5}), ConfigError, ("unknown pipeline settings", "'scor_threshold'"), id="options-unknown-setting"),
    pytest.param(lambda d: _options(d, settings={"score_threshold": "high"}), ConfigError, ("score_threshold must be a number", "'high'"), id="options-setting-type"),
    pytest.param(lambda d: _options(d, settings={"queue_capacity": True}), ConfigError, ("queue_capacity must be an integer", "True"), id="options-setting-bool"),
    pytest.param(lambda d: _options(d, settings={"batch_timeout_ms": float("inf")}).pipeline(), ConfigError, ("batch_timeout_ms must be a finite number", "inf"), id="options-setting-inf"),
    pytest.param(lambda d: _options(d, metrics_linger_s=float("inf")), ConfigError, ("metrics linger", "inf"), id="options-linger-inf"),
    pytest.param(lambda d: _options(d, weights=5), ConfigError, ("weights must be", "got 5"), id="options-weights-type"),
    pytest.param(lambda d: _options(d, input_size="huge"), ConfigError, ("WIDTHxHEIGHT", "'huge'"), id="options-input-size"),
    pytest.param(lambda d: _options(d, runtime="tensorrt"), ConfigError, ("runtime must be one of", "'tensorrt'"), id="options-runtime"),
    pytest.param(lambda d: _run(d, model=str(d / "tiny.onnx"), weights=None, runtime="torch"), ModelError, ("runtime torch cannot run an .onnx model", "{d}/tiny.onnx"), id="run-torch-onnx-model"),
    pytest.param(lambda d: PipelineConfig(**dict[str, Any](queue_capacity=2.5)), ConfigError, ("queue_capacity must be an integer", "2.5"), id="pipeline-config-type"),
    pytest.param(lambda d: PipelineConfig(drain_timeout_s=-1.0), ConfigError, ("drain_timeout_s must be between", "-1"), id="pipeline-config-drain"),
    pytest.param(lambda d: ReconnectPolicy(**dict[str, Any](max_attempts="3")), ConfigError, ("max_attempts must be an integer", "'3'"), id="reconnect-policy-type"),
    pytest.param(lambda d: _run(d, sources=(str(d / "missing.mp4"),)), SourceError, ("video not found", "{d}/missing.mp4"), id="run-missing"),
    pytest.param(lambda d: _run(d, sources=(str(d / "notvideo.mp4"),)), SourceError, ("not a video", "{d}/notvideo.mp4"), id="run-text-as-video"),
    pytest.param(lambda d: _run(d, sources=(str(d / "wide.avi"),)), SourceError, ("8256x32 pixels", "{d}/wide.avi"), id="run-huge-video"),
    pytest.param(lambda d: _run(d, settings={"device": "cuda:7"}), ConfigError, (CUDA_7,), id="run-cuda-7"),
    pytest.param(lambda d: _run(d, settings={"device": 7}), ConfigError, ("device must be a string", "got 7"), id="run-device-int"),
    pytest.param(lambda d: _run(d, model="yolox-nano", weights=str(d / "code.pth")), ModelError, ("a pickle that would call", "{d}/code.pth"), id="run-pickle-with-code"),
    pytest.param(lambda d: load_detector("yolox-nano", weights=str(d / "ssdlite.pth")), ModelError, ("do not fit yolox-nano", "{d}/ssdlite.pth"), id="detector-other-model"),
    pytest.param(lambda d: load_detector("drivepercept-tiny", weights=str(d / "tiny_cut.pth")), ModelError, ("damaged torch weights file", "{d}/tiny_cut.pth"), id="detector-truncated"),
    pytest.param(lambda d: load_detector("yolox-nano", weights=str(d / "empty.pth")), ModelError, ("not a torch weights file", "{d}/empty.pth"), id="detector-empty"),
    pytest.param(lambda d: load_detector("yolo9000"), ModelError, ("unknown model", "'yolo9000'"), id="detector-unknown-model"),
    pytest.param(lambda d: load_rig(d / "rigs" / "duplicate.toml"), ConfigError, ("unique", "front"), id="rig-duplicate"),
    pytest.param(lambda d: load_rig(d / "rigs" / "unknown_top_key.toml"), ConfigError, ("unknown keys", "'modle'"), id="rig-unknown-key"),
    pytest.param(lambda d: load_rig(d / "rigs" / "absent.toml"), ConfigError, ("rig file not found", "{d}/rigs/absent.toml"), id="rig-missing"),
    pytest.param(lambda d: resolve_cameras(["front=a.mp4", "front=b.mp4"]), ConfigError, ("unique", "'front'"), id="cameras-duplicate"),
    pytest.param(lambda d: read_settings_file(d / "settings" / "score_string.toml"), ConfigError, ("score_threshold", "'high'"), id="settings-type"),
    pytest.param(lambda d: evaluate_clip(d / "missing"), ConfigError, ("nothing to evaluate", "{d}/missing"), id="evaluate-missing"),
    pytest.param(lambda d: evaluate_clip(d / "pngs", ground_truth=d / "pngs.json", settings={"drop_policy": "drop_oldest"}), ConfigError, ("'drop_oldest'",), id="evaluate-drop-policy"),
    pytest.param(lambda d: _bench(d, 0, 1), ConfigError, ("must be >= 1", "got 0, 1"), id="bench-no-frames"),
    pytest.param(lambda d: _bench(d, 2, 0), ConfigError, ("must be >= 1", "got 2, 0"), id="bench-no-rounds"),
    pytest.param(lambda d: _serve(d / "notvideo.mp4"), ServeError, ("got no frame", "{d}/notvideo.mp4"), id="serve-text-as-video"),
    pytest.param(lambda d: cameras_from_sources([str(d / "missing.mp4")]), ServeError, ("no file at", "{d}/missing.mp4"), id="serve-missing"),
    pytest.param(lambda d: SimulationConfig(out_dir=d / "sim", cameras=13), ConfigError, ("camera count", "got 13"), id="simulation-cameras"),
    pytest.param(lambda d: SimulationConfig(out_dir=d / "sim", width=99999, height=99999), ConfigError, ("frame size", "99999x99999"), id="simulation-huge"),
    pytest.param(lambda d: write_report(d / "rundirs" / "absent", formats=("json",)), ReportError, ("does not exist", "{d}/rundirs/absent"), id="report-missing"),
]
# fmt: on


@pytest.mark.parametrize(("call", "error", "phrases"), API_CASES)
def test_api_bad_input_raises_one_clear_line(
    d: Path,
    call: Callable[[Path], object],
    error: type[DrivePerceptError],
    phrases: tuple[str, ...],
) -> None:
    # given a bad input; when the API is called with it; then one error, of its type
    with pytest.raises(error) as info:
        call(d)
    message = str(info.value)
    assert "\n" not in message and message.strip(), message
    for phrase in phrases:
        assert phrase.replace("{d}", str(d)) in message, message
    assert not (d / MARKER).exists(), "the pickled code ran"


def test_the_matrix_is_at_least_sixty_cases() -> None:
    assert len(CLI_CASES) + len(API_CASES) >= 60


# --------------------------------------------------------------------------- the real thing


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "code", "phrases"),
    [
        # FFmpeg prints its own lines about a broken file unless told not to
        case("replay-text-as-video", "replay {d}/notvideo.mp4 {replay}", 2, "{d}/notvideo.mp4"),
        # torch warns about a plain pickle's protocol; the code in it must not run
        case(
            "weights-pickle-with-code",
            "replay {d}/tiny.avi {replay} --model yolox-nano --weights {d}/code_plain.pth",
            2,
            "a pickle that would call",
            "{d}/code_plain.pth",
        ),
        case(
            "report-partial", "report {d}/rundirs/no_json --format json", 3, "run.json is missing"
        ),
    ],
)
def test_the_real_command_prints_one_line(
    d: Path, argv: list[str], code: int, phrases: tuple[str, ...]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "drivepercept", *argv_in(d, argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = _one_line(proc.stderr)
    assert line.startswith(f"drivepercept {argv[0]}: error: "), line
    for phrase in phrases:
        assert phrase.replace("{d}", str(d)) in line, line
    assert proc.returncode == code, line
    assert not (d / MARKER).exists(), "the pickled code ran"
