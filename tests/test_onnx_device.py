"""The ONNX backend on a device: the providers rule (CPU-runnable, with made-up lists of
available providers), IO binding on the CPU (the same code binds GPU tensors), and, marked
`cuda`, the CUDA provider against the CPU one and through the engine.

The `cuda` tests skip without a GPU, without onnxruntime's CUDA provider (onnxruntime-gpu) or
without the onnx package (the export); scripts/gpu_check.sh runs them in a step of their own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from drivepercept.errors import ModelError
from drivepercept.models import load_detector
from drivepercept.models.onnx import providers as eps

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
STREAM = 0x7F00DEAD


# ------------------------------------------------------------------ the providers rule


def test_a_cpu_device_gets_the_cpu_provider() -> None:
    chosen = eps.choose_providers([eps.TENSORRT, eps.CUDA, eps.CPU], device_type="cpu")
    assert chosen == [(eps.CPU, {})]


def test_cuda_runs_on_the_given_stream_then_the_cpu() -> None:
    chosen = eps.choose_providers(
        [eps.TENSORRT, eps.CUDA, eps.CPU], device_type="cuda", device_index=1, stream=STREAM
    )
    assert eps.names(chosen) == [eps.CUDA, eps.CPU]  # TensorRT listed, but not installed
    assert chosen[0][1] == {
        "device_id": "1",
        "has_user_compute_stream": "1",
        "user_compute_stream": str(STREAM),
    }


def test_tensorrt_comes_first_when_installed_with_a_cache(tmp_path: Path) -> None:
    available = [eps.TENSORRT, eps.CUDA, eps.CPU]
    chosen = eps.choose_providers(
        available, device_type="cuda", stream=STREAM, tensorrt=True, trt_cache=tmp_path
    )
    assert eps.names(chosen) == [eps.TENSORRT, eps.CUDA, eps.CPU]
    trt = chosen[0][1]
    assert trt["trt_engine_cache_enable"] == "True"
    assert trt["trt_engine_cache_path"] == str(tmp_path)
    assert trt["user_compute_stream"] == str(STREAM)
    # without a cache folder it is left out (it would rebuild its engines on every start)
    without = eps.choose_providers(available, device_type="cuda", tensorrt=True)
    assert eps.names(without) == [eps.CUDA, eps.CPU]


def test_no_gpu_provider_means_the_cpu() -> None:
    assert eps.names(eps.choose_providers([eps.CPU], device_type="cuda")) == [eps.CPU]


def test_the_trt_cache_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("onnxruntime")
    assert eps.default_trt_cache(Path("/m/yolo.onnx")) == Path("/m/yolo.trt-cache")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert eps.prepare_cache(blocker / "cache") is not None
    model = _export(_Rows(), tmp_path / "m.onnx")
    # an explicit folder that cannot be made is the user's error, in one line
    module: Any = load_detector(str(model), trt_cache=blocker / "cache").module
    with pytest.raises(ModelError, match="cannot make the TensorRT engine cache folder"):
        module._trt_folder()
    # the default one beside the model is made; where it cannot be, TensorRT is left out
    module = load_detector(str(model)).module
    assert module._trt_folder() == tmp_path / "m.trt-cache"
    (tmp_path / "n.trt-cache").write_text("x")
    (tmp_path / "m.onnx").rename(tmp_path / "n.onnx")
    module = load_detector(str(tmp_path / "n.onnx")).module
    with caplog.at_level(logging.WARNING):
        assert module._trt_folder() is None
    assert "TensorRT left out" in caplog.text


# ------------------------------------------------------------------ IO binding (CPU)


class _Rows(torch.nn.Module):
    """(B, N, 5 + 3), decoded, varying with the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        row = torch.tensor([50.0, 40.0, 20.0, 10.0, 0.8, 0.1, 0.2, 0.9]).view(1, 1, 8)
        m = x.mean(dim=(1, 2, 3)).view(-1, 1, 1)
        return row.expand(x.shape[0], 30, 8) * torch.exp(m)


class _Detr(torch.nn.Module):
    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x.shape[0]
        norm = torch.tensor([0.1, 0.1, 0.5, 0.5]).view(1, 1, 4).expand(b, 3, 4)
        boxes = norm * sizes.float().repeat(1, 2).unsqueeze(1) + x.mean() * 0
        return torch.full((b, 3), 2, dtype=torch.int64), boxes, torch.full((b, 3), 0.7)


def _export(
    module: torch.nn.Module,
    path: Path,
    *,
    sizes: bool = False,
    batch1: bool = False,
    dynamic_rows: bool = False,
) -> Path:
    x = torch.zeros(1, 3, 64, 96)
    args: tuple[Any, ...] = (x, torch.tensor([[96, 64]])) if sizes else (x,)
    inputs = ["images", "orig_target_sizes"] if sizes else ["images"]
    outputs = ["labels", "boxes", "scores"] if sizes else ["output"]
    axes: dict[str, dict[int, str]] = {} if batch1 else {n: {0: "N"} for n in inputs + outputs}
    if dynamic_rows:
        axes["output"] = {0: "N", 1: "rows"}
    torch.onnx.export(
        module, args, str(path), input_names=inputs, output_names=outputs,
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip
    if not dynamic_rows and not sizes:  # the tracer leaves N symbolic: pin it, as export does
        onnx = pytest.importorskip("onnx")
        graph = onnx.load(str(path))
        graph.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 30
        onnx.save(graph, str(path))
    return path


def _bound(det: Any, *, loop: bool = False) -> Any:
    from drivepercept.models.onnx.binding import DeviceRun

    module = det.module
    return DeviceRun(module._sessions["cpu"], module.graph, torch.device("cpu"), loop=loop)


@pytest.mark.parametrize("dynamic_rows", [False, True], ids=["preallocated", "ort-allocated"])
def test_io_binding_gives_the_session_outputs(tmp_path: Path, dynamic_rows: bool) -> None:
    pytest.importorskip("onnxruntime")
    model = _export(_Rows(), tmp_path / "m.onnx", dynamic_rows=dynamic_rows)
    det = load_detector(str(model), onnx_layout="yolox")
    module: Any = det.module
    x = torch.rand(3, 3, 64, 96)
    run = _bound(det)
    (got,) = run(x, (64, 96))
    (want,) = module._sessions["cpu"].run(None, {"images": x.numpy()})
    assert run.runs == 1 and got.shape == (3, 30, 8)
    port = module.graph.outputs[0]
    assert (run._output_tensor(port, 3) is None) is dynamic_rows  # ORT allocates, DLPack
    assert torch.equal(got, torch.from_numpy(want))


def test_io_binding_feeds_the_size_input_and_loops_a_batch1_export(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    model = _export(_Detr(), tmp_path / "detr.onnx", sizes=True, batch1=True)
    det = load_detector(str(model))
    run = _bound(det, loop=True)
    labels, boxes, _ = run(torch.zeros(2, 3, 64, 96), (64, 96))
    assert run.runs == 2 and boxes.shape == (2, 3, 4) and labels.dtype == torch.int64
    assert boxes[1, 0].tolist() == pytest.approx([9.6, 6.4, 48.0, 32.0])
    # channels_last input (the engine's default memory format) is made contiguous first
    x = torch.zeros(2, 3, 64, 96).to(memory_format=torch.channels_last)
    assert torch.equal(run(x, (64, 96))[1], boxes)


def test_a_cpu_batch_keeps_the_plain_session_run(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    det = load_detector(str(_export(_Rows(), tmp_path / "m.onnx")))
    module: Any = det.module
    module(torch.zeros(2, 3, 64, 96))
    assert module._bound == {}  # no GPU session, no binding on the CPU
    assert det.runtime is not None
    assert det.runtime()["sessions"]["cpu"] == {
        "providers": ["CPUExecutionProvider"],
        "io_binding": False,
    }


def test_a_gpu_session_is_asked_for_on_the_callers_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # given an onnxruntime that lists CUDA (this one cannot start it: ORT falls back to the
    # CPU alone), and a batch coming on a CUDA stream
    ort = pytest.importorskip("onnxruntime")
    from types import SimpleNamespace

    from drivepercept.models.onnx import session as onnx_session

    fake_ort = SimpleNamespace(
        get_available_providers=lambda: [eps.TENSORRT, eps.CUDA, eps.CPU],
        SessionOptions=ort.SessionOptions,
        InferenceSession=ort.InferenceSession,
    )
    monkeypatch.setattr(onnx_session, "import_ort", lambda: fake_ort)
    stream = SimpleNamespace(cuda_stream=STREAM)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    asked: list[Any] = []
    opened = onnx_session.open_session

    def spy(path: Path, providers: Any = None, threads: int = 0) -> Any:
        asked.append(providers)
        return opened(path, providers, threads=threads)

    monkeypatch.setattr(onnx_session, "open_session", spy)
    module: Any = load_detector(str(_export(_Rows(), tmp_path / "m.onnx"))).module
    # when the GPU session is made
    with caplog.at_level(logging.WARNING):
        bound = module._device_run(torch.device("cuda", 1))
    # then CUDA was asked for on that GPU and stream (TensorRT is not installed here)
    assert eps.names(asked[0]) == [eps.CUDA, eps.CPU]
    assert asked[0][0][1]["user_compute_stream"] == str(STREAM)
    assert asked[0][0][1]["device_id"] == "1"
    # and, none started, batches go through the host, once said
    assert bound is None and "no GPU provider started" in caplog.text
    assert module._device_run(torch.device("cuda", 1)) is None and len(asked) == 1


# ------------------------------------------------------------------ CUDA


@pytest.fixture
def cuda_onnx(tmp_path: Path) -> Path:
    """drivepercept-tiny exported with a dynamic batch; skips where the CUDA path cannot run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ort = pytest.importorskip("onnxruntime")
    if eps.CUDA not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDA provider (onnxruntime-gpu)")
    pytest.importorskip("onnx")
    from drivepercept.run import export_model

    out = tmp_path / "tiny.onnx"
    export_model("drivepercept-tiny", out=out, batch="dynamic")
    return out


def _frames(n: int) -> torch.Tensor:
    """n sample-rig frames as tiny's input: (n, 3, 256, 448), RGB, normalised as it says."""
    images = []
    for name in ("front", "back", "front_left", "front_right", "back_left", "back_right")[:n]:
        cap = cv2.VideoCapture(str(SAMPLE / f"{name}.mp4"))
        ok, frame = cap.read()
        cap.release()
        assert ok
        images.append(cv2.resize(frame, (448, 256))[:, :, ::-1])
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div(255.0)
    return x.sub(0.45).div(0.25)  # drivepercept-tiny's mean and std


def _assert_same(gpu: list[dict[str, torch.Tensor]], cpu: list[dict[str, torch.Tensor]]) -> None:
    """Every CPU box scoring over 0.3 has a GPU box of its class within 1 px (matched, not
    compared by rank: near-equal scores may rank differently on the two devices)."""
    compared = 0
    for g, c in zip(gpu, cpu, strict=True):
        boxes, labels = g["boxes"].cpu(), g["labels"].cpu()
        sure = c["scores"] > 0.3
        for box, label in zip(c["boxes"][sure], c["labels"][sure], strict=True):
            same = labels == label
            assert same.any(), int(label)
            diff = float((boxes[same] - box).abs().max(dim=1).values.min())
            assert diff <= 1.0, diff
            compared += 1
    assert compared >= 10  # the rig's traffic was found and compared


@pytest.mark.cuda
def test_cuda_provider_gives_the_cpu_boxes_through_io_binding(cuda_onnx: Path) -> None:
    det = load_detector(str(cuda_onnx), classes="all")
    x = _frames(6)
    with torch.inference_mode():
        cpu = det.module(x)
        module: Any = det.module.to("cuda")

        def host_path(*_: Any) -> Any:
            raise AssertionError("a GPU batch went through host memory")

        module._run = host_path  # the CPU session's run: never used for a GPU batch
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            gpu = module(x.cuda())
        torch.cuda.synchronize()
        _assert_same(gpu, cpu)
        bound = module._bound["cuda:0"]
        assert bound is not None and bound.runs == 1
        assert bound.stream == stream.cuda_stream  # ORT runs on the caller's stream
        assert gpu[0]["boxes"].device.type == "cuda"
        # a batch on another stream (bench's model-only runs) is ordered by stream waits
        again = module(x.cuda())
        torch.cuda.synchronize()
        _assert_same(again, cpu)
    session = det.runtime()["sessions"]["cuda:0"]  # type: ignore[misc]
    assert session["io_binding"] and session["providers"][0] in eps.GPU_PROVIDERS


@pytest.mark.cuda
def test_a_cuda_replay_runs_the_onnx_model_on_the_gpu(cuda_onnx: Path, tmp_path: Path) -> None:
    from drivepercept.run import RunOptions, run

    results = {}
    for name, model in (("torch", "drivepercept-tiny"), ("onnx", str(cuda_onnx))):
        result = run(
            RunOptions(
                sources=(str(SAMPLE / "rig.toml"),),
                model=model,
                settings={"max_frames": 4, "sample_hz": 0, "device": "cuda"},
                out_root=tmp_path,
                name=name,
                report_formats=(),
            )
        )
        results[name] = {(f["camera"], f["frame_index"]): f for f in result.detections()}
    assert results["onnx"].keys() == results["torch"].keys()
    for key, want in results["torch"].items():
        got = results["onnx"][key]
        assert got["class_names"] == want["class_names"], key
        if want["boxes"]:
            assert np.abs(np.array(got["boxes"]) - np.array(want["boxes"])).max() <= 1.0, key
    record = json.loads((tmp_path / "onnx" / "run.json").read_text())
    session = record["model"]["runtime"]["sessions"]["cuda:0"]
    assert session["io_binding"] and session["providers"][0] in eps.GPU_PROVIDERS
