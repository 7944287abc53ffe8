"""The runtime choice (models/runtime.py) and the export cache (models/export_cache.py): auto
runs exportable models on ONNX Runtime on a CPU, from a cache, with torch's outputs."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from standins import RoadClips

from drivepercept.config import PipelineConfig
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ModelError
from drivepercept.models import export, export_cache, load_detector
from drivepercept.models.base import Detector
from drivepercept.models.onnx import openvino, providers
from drivepercept.models.runtime import RuntimeRequest, choose_runtime
from drivepercept.run import RunOptions, environment_settings, read_settings_file
from drivepercept.run.job import load_model
from drivepercept.run.options import default_onnx_cache

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytestmark = pytest.mark.timeout(300)

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
Cli = Callable[[list[str]], tuple[int, str]]


def _replay(cli: Cli, out: Path, name: str, *flags: str) -> dict[str, Any]:
    """The sample rig, 3 frames a camera: run.json."""
    argv = ["replay", str(SAMPLE_RIG), "--max-frames", "3", "--out", str(out), "--name", name]
    code, err = cli([*argv, "--no-progress", "--no-report", *flags])
    assert code == 0, err
    record: dict[str, Any] = json.loads((out / name / "run.json").read_text())
    return record


def _boxes(run_dir: Path) -> dict[tuple[str, int], tuple[np.ndarray[Any, Any], list[str]]]:
    """(camera, frame) -> (boxes (N, 4), class names) from detections.jsonl."""
    found = {}
    for line in (run_dir / "detections.jsonl").read_text().splitlines():
        d = json.loads(line)
        boxes = np.asarray(d["boxes"], dtype=np.float64).reshape(-1, 4)
        found[(d["camera"], d["frame_index"])] = (boxes, list(d["class_names"]))
    return found


def _assert_same_boxes(run_a: Path, run_b: Path, *, tol_px: float = 1.0) -> None:
    """Both runs hold the same camera frames, some boxes, and in every frame the same boxes
    (within `tol_px`) of the same classes."""
    want, got = _boxes(run_a), _boxes(run_b)
    assert sorted(want) == sorted(got) and sum(len(b) for b, _ in want.values()) > 0
    for key, (boxes, names) in want.items():
        other, other_names = got[key]
        assert names == other_names, key
        assert boxes.shape == other.shape, key
        assert np.abs(boxes - other).max(initial=0) <= tol_px, key


def _exports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the cache's exports: the names of the models exported, in order."""
    made: list[str] = []
    real = export.export_onnx

    def counting(detector: Detector, out: Path, *, batch: int | None = 1) -> export.Exported:
        made.append(detector.name)
        return real(detector, out, batch=batch)

    monkeypatch.setattr(export, "export_onnx", counting)
    return made


# --------------------------------------------------------------------------- the default


def test_a_plain_replay_of_the_sample_rig_runs_on_ort_with_torchs_boxes(
    in_process: Cli, tmp_path: Path
) -> None:
    # given the sample rig (drivepercept-tiny, its bundled weights), no runtime flag
    cache = tmp_path / "cache"
    auto = _replay(in_process, tmp_path, "auto", "--onnx-cache", str(cache))
    # then ONNX Runtime ran it, from an export in the cache, and run.json says why
    choice = auto["model"]["runtime_choice"]
    assert (choice["asked"], choice["ran"]) == ("auto", "onnxruntime")
    assert "CPU" in choice["reason"] and Path(choice["onnx"]).parent == cache
    assert auto["model"]["runtime"]["backend"] == "onnxruntime"
    assert auto["model"]["name"] == "drivepercept-tiny"
    # when the same frames run on torch
    plain = _replay(in_process, tmp_path, "torch", "--runtime", "torch")
    assert plain["model"]["runtime_choice"]["ran"] == "torch"
    assert "runtime" not in plain["model"]
    # then every camera frame has the same boxes, within a pixel, of the same classes
    assert len(_boxes(tmp_path / "auto")) == 18
    _assert_same_boxes(tmp_path / "torch", tmp_path / "auto")


def test_random_yolox_weights_run_on_ort_from_a_temporary_export(
    in_process: Cli, tmp_path: Path
) -> None:
    # given yolox-nano with random weights (a draw never seen again), no runtime flag
    cache = tmp_path / "cache"
    record = _replay(
        in_process, tmp_path, "nano", "--model", "yolox-nano", "--weights", "none",
        "--onnx-cache", str(cache),
    )  # fmt: skip
    # then ORT ran it, and the export was not kept in the cache
    choice = record["model"]["runtime_choice"]
    assert choice["ran"] == "onnxruntime" and choice["export_s"] is not None
    assert not cache.exists() or not list(cache.iterdir())
    assert not Path(choice["onnx"]).exists()  # removed once the CPU session had loaded it
    assert len(_boxes(tmp_path / "nano")) == 18


def test_ort_gives_torchs_raw_outputs_for_the_same_random_yolox() -> None:
    # given one random yolox-nano, on torch and, exported, on ORT
    torch_det = load_detector("yolox-nano", weights="none")
    ort_det = choose_runtime(torch_det, RuntimeRequest(random_weights=True))
    assert ort_det.runtime_choice is not None and ort_det.runtime_choice.ran == "onnxruntime"
    # then what the engine sees of each is the same model: classes, filter, input, NMS
    for field in ("name", "input", "class_names", "keep_labels", "report_as", "final_outputs"):
        assert getattr(ort_det, field) == getattr(torch_det, field), field
    # and its raw outputs on the same batch of 3 agree (no NMS: no near-tie can reorder them)
    w, h = torch_det.input.size
    x = torch.rand(3, 3, h, w, generator=torch.Generator().manual_seed(0)) * 255
    with torch.inference_mode():
        want, got = torch_det.module(x), ort_det.module(x)
    assert len(want) == len(got) == 3
    for a, b in zip(want, got, strict=True):
        assert a["boxes"].shape == b["boxes"].shape
        assert torch.allclose(a["scores"], b["scores"], atol=1e-4)
        assert torch.allclose(a["boxes"], b["boxes"], atol=0.05)


# --------------------------------------------------------------------------- the cache


def test_a_second_run_reuses_the_cached_export(
    in_process: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _exports(monkeypatch)
    cache = tmp_path / "cache"
    first = _replay(in_process, tmp_path, "one", "--onnx-cache", str(cache))
    entry = Path(first["model"]["runtime_choice"]["onnx"])
    stamp = entry.stat().st_mtime_ns
    second = _replay(in_process, tmp_path, "two", "--onnx-cache", str(cache))
    # then one export: the second run found it (same file, untouched, no export time)
    assert made == ["drivepercept-tiny"]
    assert second["model"]["runtime_choice"]["onnx"] == str(entry)
    assert second["model"]["runtime_choice"]["export_s"] is None
    assert entry.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in cache.iterdir()) == [entry.name, entry.with_suffix(".toml").name]


def _nano_weights(tmp_path: Path) -> str:
    """A yolox-nano weights file (a state dict: cached, unlike random weights)."""
    from drivepercept.models.yolox import SIZES, YOLOX
    from drivepercept.models.yolox_weights import COCO80

    path = tmp_path / "nano.pth"
    torch.save(YOLOX(SIZES["nano"], num_classes=len(COCO80)).state_dict(), path)  # unfused
    return str(path)


def test_another_input_size_or_weights_is_another_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _exports(monkeypatch)
    weights = _nano_weights(tmp_path)
    cache = tmp_path / "cache"

    def entry(size: tuple[int, int], weights: str = weights) -> Path:
        options = RunOptions(
            sources=("a.mp4",), model="yolox-nano", weights=weights, input_size=size,
            onnx_cache=cache, settings={"device": "cpu"},
        )  # fmt: skip
        choice = load_model(options).runtime_choice
        assert choice is not None and choice.onnx is not None
        return choice.onnx

    small, again, large = entry((320, 192)), entry((320, 192)), entry((416, 256))
    assert small == again and small != large and "320x192" in small.name
    other = tmp_path / "other.pth"
    state = torch.load(weights)
    state[next(iter(state))] += 1.0
    torch.save(state, other)
    assert entry((320, 192), str(other)) != small  # the key follows the weights themselves
    assert made == ["yolox-nano"] * 3


def test_a_corrupt_cache_entry_is_exported_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    made = _exports(monkeypatch)
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    request = RuntimeRequest(cache=tmp_path)
    entry = export_cache.ExportCache(tmp_path).path(tiny)
    assert choose_runtime(tiny, request).runtime_choice is not None and entry.is_file()
    # given the entry cut short (a crash of an older version, a full disk)
    entry.write_bytes(entry.read_bytes()[:1000])
    # when it is used again: one warning, a new export, and a detector that runs
    with caplog.at_level(logging.WARNING, logger="drivepercept.models.runtime"):
        again = choose_runtime(tiny, request)
    assert len(made) == 2 and "exporting it again" in caplog.text
    assert again.runtime_choice is not None and again.runtime_choice.ran == "onnxruntime"
    w, h = tiny.input.size
    with torch.inference_mode():
        assert len(again.module(torch.zeros(2, 3, h, w))) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export-")]


def test_the_cache_folder_comes_from_the_environment_the_cli_passes(tmp_path: Path) -> None:
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert default_onnx_cache(xdg) == tmp_path / "xdg" / "drivepercept" / "onnx"
    assert default_onnx_cache({}) == Path.home() / ".cache" / "drivepercept" / "onnx"
    assert environment_settings(xdg)["onnx_cache"] == str(default_onnx_cache(xdg))
    given = {**xdg, "DRIVEPERCEPT_ONNX_CACHE": str(tmp_path / "mine")}
    assert environment_settings(given)["onnx_cache"] == str(tmp_path / "mine")
    assert "onnx_cache" not in environment_settings({})  # RunOptions' default: ~/.cache's


def test_runtime_and_onnx_cache_are_settings_file_keys(tmp_path: Path) -> None:
    path = tmp_path / "replay.toml"
    path.write_text('runtime = "torch"\nonnx_cache = "/tmp/x"\n')
    assert read_settings_file(path) == {"runtime": "torch", "onnx_cache": "/tmp/x"}


# --------------------------------------------------------------------------- the fallbacks


def test_auto_runs_a_torchvision_model_on_torch_with_one_log_line(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    detector = load_detector("ssdlite320_mobilenet_v3_large", weights="none")
    with caplog.at_level(logging.INFO, logger="drivepercept.models.runtime"):
        chosen = choose_runtime(detector, RuntimeRequest(cache=tmp_path))
    assert chosen.module is detector.module and chosen.runtime is None  # torch, as it was
    assert chosen.runtime_choice is not None and chosen.runtime_choice.ran == "torch"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "runs on torch" in lines[0] and "cannot be exported" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (RuntimeRequest(compile=True), "compile is a torch option"),
        (RuntimeRequest(cuda_graphs=True, device_type="cuda"), "cuda_graphs is a torch option"),
        (RuntimeRequest(precision="fp16"), "precision fp16 runs on torch"),
    ],
)
def test_auto_keeps_torch_for_torch_only_options(
    request_: RuntimeRequest, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    with caplog.at_level(logging.INFO, logger="drivepercept.models.runtime"):
        chosen = choose_runtime(tiny, request_)
    assert chosen.runtime_choice is not None
    assert chosen.runtime_choice.ran == "torch" and chosen.runtime_choice.reason.startswith(reason)
    assert len(caplog.records) == 1
    # and asked for explicitly, ORT is an error saying the same
    explicit = RuntimeRequest(**{**request_.__dict__, "runtime": "onnxruntime"})
    with pytest.raises(ModelError, match=re.escape(f"runtime onnxruntime: {reason}")):
        choose_runtime(tiny, explicit)


def test_auto_keeps_torch_for_plugins_and_when_the_export_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from drivepercept.models.oracle import make_oracle

    oracle = make_oracle(size=(64, 64))
    assert choose_runtime(oracle, RuntimeRequest()).runtime_choice.ran == "torch"  # type: ignore[union-attr]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter exploded\nwith details")

    monkeypatch.setattr(export, "export_onnx", broken)
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    with caplog.at_level(logging.WARNING, logger="drivepercept.models.runtime"):
        chosen = choose_runtime(tiny, RuntimeRequest(cache=tmp_path))
    assert chosen.runtime_choice is not None and chosen.runtime_choice.ran == "torch"
    assert "export to ONNX failed (exporter exploded)" in chosen.runtime_choice.reason
    assert len(caplog.records) == 1
    with pytest.raises(ModelError, match="export to ONNX failed"):
        choose_runtime(tiny, RuntimeRequest(runtime="onnxruntime", cache=tmp_path))


def test_auto_on_a_gpu_keeps_torch_without_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "tensorrt_installed", lambda: False)
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    chosen = choose_runtime(tiny, RuntimeRequest(device_type="cuda"))
    assert chosen.runtime_choice is not None and chosen.runtime_choice.ran == "torch"
    assert "TensorRT" in chosen.runtime_choice.reason


def test_ort_runs_on_the_configured_threads(in_process: Cli, tmp_path: Path) -> None:
    record = _replay(in_process, tmp_path, "t1", "--torch-threads", "1")
    assert record["model"]["runtime"]["threads"] == 1
    assert record["environment"]["cpu_lanes"] == 1  # lanes are torch's


@pytest.mark.cuda
def test_auto_on_cuda_runs_torch_unless_tensorrt_is_installed_cuda(
    in_process: Cli, tmp_path: Path
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    record = _replay(in_process, tmp_path, "gpu", "--device", "cuda")
    trt = providers.tensorrt_installed()
    assert record["model"]["runtime_choice"]["ran"] == ("onnxruntime" if trt else "torch")


def test_bench_figures_name_the_runtime_that_ran(tmp_path: Path) -> None:
    from drivepercept.bench.common import SpeedOptions
    from drivepercept.config import PipelineConfig

    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    on_ort = choose_runtime(tiny, RuntimeRequest(cache=tmp_path, threads=2))
    config = PipelineConfig(device="cpu", torch_threads=2)
    # on ONNX Runtime the torch options (channels_last, lanes, compile) did not apply
    ort_speed = SpeedOptions.of(config, detector=on_ort)
    assert ort_speed.line() == "speed: onnxruntime, fp32, threads 2"
    assert ort_speed.as_dict()["runtime"] == "onnxruntime"
    torch_speed = SpeedOptions.of(config, detector=tiny)
    assert torch_speed.runtime == "torch" and "channels_last" in torch_speed.line()
    default = SpeedOptions.of(PipelineConfig(device="cpu"), detector=on_ort).line()
    assert default == "speed: onnxruntime, fp32, threads ORT's default (one per physical core)"


def test_ort_threads_spin_within_a_run_and_stop_after_it(tmp_path: Path) -> None:
    # spinning between operators is ORT's speed; spinning on after a run would take the cores
    # the decoder threads and the post-processing of the last batch need
    from drivepercept.models.onnx.session import SPINNING, STOP_SPINNING

    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    on_ort = choose_runtime(tiny, RuntimeRequest(cache=tmp_path, threads=2))
    module: Any = on_ort.module
    options = module._sessions["cpu"].get_session_options()
    assert options.get_session_config_entry(SPINNING) == "1"
    assert options.get_session_config_entry(STOP_SPINNING) == "1"
    assert options.intra_op_num_threads == 2


def test_torch_work_around_another_runtime_runs_on_one_torch_thread(tmp_path: Path) -> None:
    # normalising, decoding and NMS around an ORT network: a team of torch threads would wait
    # for the cores ORT's threads hold; the caller's own count is given back after each step
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    on_ort = choose_runtime(tiny, RuntimeRequest(cache=tmp_path, threads=2))
    seen: list[int] = []
    module: Any = on_ort.module
    inner = module.forward

    def spy(x: torch.Tensor) -> Any:
        seen.append(torch.get_num_threads())
        assert x.is_contiguous()  # the plain layout ORT takes, whatever channels_last says
        return inner(x)

    module.forward = spy
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = PipelineConfig(device="cpu", torch_threads=2, channels_last=True)
        step = DetectorStep(on_ort, config, torch.device("cpu"), max_batch=2)
        assert step.glue_threads == 1 and not step.channels_last
        packed, counts = step(torch.zeros((2, 256, 448, 3), dtype=torch.uint8))
        # a frame in each of the two lanes, each on one torch thread
        assert seen == [1, 1] and torch.get_num_threads() == 2
        assert packed.shape[0] == 2 and counts.shape == (2,)
        on_torch = DetectorStep(tiny, config, torch.device("cpu"), max_batch=2)
        assert on_torch.glue_threads == 0 and on_torch.channels_last
        on_torch.close()
        step.close()
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- OpenVINO

needs_openvino = pytest.mark.skipif(
    not openvino.installed(), reason="needs the openvino package (the [openvino] extra)"
)
needs_bf16 = pytest.mark.skipif(
    not openvino.cpu_has_bf16(), reason="needs openvino and a CPU with bf16 units"
)


@needs_openvino
def test_openvino_fp32_gives_orts_boxes(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig on ORT (the default) and on OpenVINO, both in fp32
    cache = ("--onnx-cache", str(tmp_path / "cache"))
    ort = _replay(in_process, tmp_path, "ort", *cache)
    ov = _replay(in_process, tmp_path, "ov", "--runtime", "openvino", *cache)
    # then run.json says OpenVINO ran the same cached export, in fp32
    choice = ov["model"]["runtime_choice"]
    assert (choice["asked"], choice["ran"]) == ("openvino", "openvino")
    assert choice["onnx"] == ort["model"]["runtime_choice"]["onnx"]
    assert ov["model"]["runtime"]["backend"] == "openvino"
    assert ov["model"]["runtime"]["sessions"]["cpu"]["providers"] == ["OpenVINO CPU (fp32)"]
    # and every frame has ORT's boxes within a pixel, of the same classes
    _assert_same_boxes(tmp_path / "ort", tmp_path / "ov")


@needs_bf16
def test_bf16_on_a_cpu_with_bf16_units_runs_on_openvino(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig with precision bf16 and no runtime flag
    cache = ("--onnx-cache", str(tmp_path / "cache"))
    fp32 = _replay(in_process, tmp_path, "fp32", *cache)
    bf16 = _replay(in_process, tmp_path, "bf16", "--precision", "bf16", *cache)
    # then auto chose OpenVINO, which ran it in bf16, and run.json says so
    choice = bf16["model"]["runtime_choice"]
    assert (choice["asked"], choice["ran"]) == ("auto", "openvino")
    assert "bf16" in choice["reason"]
    assert bf16["model"]["runtime"]["sessions"]["cpu"]["providers"] == ["OpenVINO CPU (bf16)"]
    assert fp32["model"]["runtime_choice"]["ran"] == "onnxruntime"
    # and it finds the same objects: each fp32 box has a bf16 box of its class over IoU 0.9
    want, got = _boxes(tmp_path / "fp32"), _boxes(tmp_path / "bf16")
    assert sorted(want) == sorted(got)
    found = total = 0
    for key, (boxes, names) in want.items():
        other, other_names = got[key]
        for box, name in zip(boxes, names, strict=True):
            total += 1
            same = [o for o, n in zip(other, other_names, strict=True) if n == name]
            found += any(_iou(box, o) > 0.9 for o in same)
    assert total > 0 and found >= 0.95 * total, (found, total)


def _iou(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


@needs_openvino
def test_an_onnx_file_runs_on_openvino_when_asked(tmp_path: Path) -> None:
    from drivepercept.models import onnx
    from drivepercept.models.runtime import for_onnx_file

    # given a yolox-nano export (raw outputs: one row per anchor, in a fixed order)
    nano = load_detector("yolox-nano", weights="none")
    exported = choose_runtime(nano, RuntimeRequest(cache=tmp_path))
    assert exported.runtime_choice is not None and exported.runtime_choice.onnx is not None
    # when the file is run by OpenVINO
    ov = for_onnx_file(onnx.build(exported.runtime_choice.onnx), RuntimeRequest(runtime="openvino"))
    assert ov.runtime_choice is not None and ov.runtime_choice.ran == "openvino"
    assert ov.runtime is not None and ov.runtime()["backend"] == "openvino"
    # then each batch size a run meets (a full batch, then shorter ones, run padded while
    # their own compile) gives ORT's outputs
    w, h = nano.input.size
    for b in (3, 1, 2, 1, 3):
        x = torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(b)) * 255
        with torch.inference_mode():
            want, got = exported.module(x), ov.module(x)
        assert len(want) == len(got) == b
        for a, c in zip(want, got, strict=True):
            assert a["boxes"].shape == c["boxes"].shape
            assert torch.allclose(a["scores"], c["scores"], atol=1e-4)
            assert torch.allclose(a["boxes"], c["boxes"], atol=0.05)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (RuntimeRequest(runtime="openvino", device_type="cuda"), "OpenVINO runs on the CPU"),
        (RuntimeRequest(runtime="openvino", precision="fp16"), "precision fp32 or bf16"),
    ],
)
@needs_openvino
def test_openvino_refuses_what_it_cannot_run(request_: RuntimeRequest, reason: str) -> None:
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    with pytest.raises(ModelError, match=re.escape("runtime openvino: ") + ".*" + reason):
        choose_runtime(tiny, request_)


def test_without_openvino_bf16_stays_on_torch_and_asking_for_it_is_exit_2(
    in_process: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    # given a machine without the openvino package
    monkeypatch.setattr(openvino, "installed", lambda: False)
    monkeypatch.setattr(openvino, "cpu_has_bf16", lambda: True)
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    # then auto keeps bf16 on torch, with one warning saying what to install
    with caplog.at_level(logging.INFO, logger="drivepercept.models.runtime"):
        chosen = choose_runtime(tiny, RuntimeRequest(precision="bf16", cache=tmp_path))
    assert chosen.runtime_choice is not None and chosen.runtime_choice.ran == "torch"
    assert "openvino package is not installed" in chosen.runtime_choice.reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    # and asking for it by name is one line and exit 2
    argv = ["replay", str(SAMPLE_RIG), "--max-frames", "1", "--out", str(tmp_path)]
    code, err = in_process([*argv, "--no-progress", "--runtime", "openvino"])
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "openvino package is not installed" in lines[0], err


# --------------------------------------------------------------------------- input size


def test_yolox_nano_runs_larger_by_default_on_a_cpu_whatever_the_runtime(
    in_process: Cli, tmp_path: Path
) -> None:
    # given yolox-nano with no input size, on the CPU
    nano = ("--model", "yolox-nano", "--weights", "none")
    auto = _replay(in_process, tmp_path, "auto", *nano)
    on_torch = _replay(in_process, tmp_path, "torch", *nano, "--runtime", "torch")
    given = _replay(in_process, tmp_path, "given", *nano, "--input-size", "416x256")
    # then it runs at 512x288 on the default runtime and on torch alike (one model, one
    # size: the runtime changes the speed, not the boxes), and a size given wins
    assert auto["model"]["runtime_choice"]["ran"] == "onnxruntime"
    assert auto["model"]["input_size"] == on_torch["model"]["input_size"] == [512, 288]
    assert given["model"]["input_size"] == [416, 256]


def test_a_real_clip_replayed_with_no_runtime_flag_has_torchs_boxes(
    in_process: Cli, tmp_path: Path, road_clips: RoadClips, released_yolox_nano_onnx: Path
) -> None:
    # given a road clip and the released yolox-nano (the model real footage runs), no flag
    clip = ("replay", str(road_clips.highway), "--weights", str(released_yolox_nano_onnx))
    flags = ("--max-frames", "6", "--out", str(tmp_path), "--no-progress", "--no-report")
    code, err = in_process([*clip, *flags, "--name", "auto"])
    assert code == 0, err
    code, err = in_process([*clip, *flags, "--name", "torch", "--runtime", "torch"])
    assert code == 0, err
    # then run.json says ORT ran it, at the CPU's size, and torch gives its boxes within 1 px
    auto = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert auto["model"]["runtime_choice"]["ran"] == "onnxruntime"
    assert auto["model"]["input_size"] == [512, 288]
    _assert_same_boxes(tmp_path / "torch", tmp_path / "auto")


def test_the_default_input_depends_on_the_device_only_for_yolox_nano() -> None:
    from drivepercept.models import default_input_size

    assert default_input_size("yolox-nano", device_type="cpu") == (512, 288)
    assert default_input_size("yolox-nano", device_type="cuda") == (416, 256)
    assert default_input_size("yolox-tiny", device_type="cpu") == (416, 256)
    assert default_input_size("yolox-s", device_type="cpu") == (640, 384)
    assert default_input_size("drivepercept-tiny", device_type="cpu") is None


def test_ort_runs_in_lanes_of_one_thread_with_the_boxes_of_one_session(tmp_path: Path) -> None:
    # given tiny on ORT for two threads, and a batch of four real-looking frames
    tiny = load_detector("drivepercept-tiny", weights="DEFAULT")
    request = RuntimeRequest(cache=tmp_path, threads=2)
    lanes_ort, one_ort = choose_runtime(tiny, request), choose_runtime(tiny, request)
    frames = torch.from_numpy(
        np.random.default_rng(3).integers(0, 255, (4, 256, 448, 3), dtype=np.uint8)
    )
    config = PipelineConfig(device="cpu", torch_threads=2, score_threshold=0.05)
    # when one step runs it in two lanes and another in one session on both threads
    two = DetectorStep(lanes_ort, config, torch.device("cpu"), max_batch=4)
    one = DetectorStep(
        one_ort, dataclasses.replace(config, cpu_lanes=1), torch.device("cpu"), max_batch=4
    )
    try:
        got, got_n = two(frames)
        want, want_n = one(frames)
    finally:
        two.close()
        one.close()
    # then the lanes' sessions run on one thread each, an image at a time, the record says
    # so, and the boxes are the single session's (a batch of four in one run)
    module: Any = lanes_ort.module
    single: Any = one_ort.module
    assert two.lanes.count == 2 and module.lanes == 2 and module.threads == 1
    assert module._sessions["cpu"].get_session_options().intra_op_num_threads == 1
    assert module.describe()["lanes"] == 2 and single.describe()["lanes"] == 1
    assert module.describe()["per_image"] and not single.describe()["per_image"]
    assert torch.equal(got_n, want_n) and int(want_n.sum()) > 0
    assert torch.allclose(got, want, atol=1e-3)
    # and a second laned step keeps the sessions it has (nothing opened again)
    session = module._sessions["cpu"]
    DetectorStep(lanes_ort, config, torch.device("cpu"), max_batch=4).close()
    assert module._sessions["cpu"] is session and module.lanes == 2
    # and a later one-lane step on the laned detector has its one session on both threads
    again = DetectorStep(
        lanes_ort, dataclasses.replace(config, cpu_lanes=1), torch.device("cpu"), max_batch=4
    )
    again.close()
    assert module.lanes == 1 and module.threads == 2 and not module.per_image
    assert module._sessions["cpu"].get_session_options().intra_op_num_threads == 2
