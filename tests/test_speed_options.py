"""Speed options: `--compile` (engine/compiled.py) and `--cuda-graphs` (engine/graphs.py).

On the CPU: compiling gives the detections eager gives, or falls back with one warning; a
failing compiler (forced) falls back and the run goes on; `--cuda-graphs` without a GPU is one
line and exit 2 before anything runs. Marked `cuda`: graphs give eager's boxes, for full and
partial (padded) batches, in the pipeline too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from drivepercept.config import PipelineConfig
from drivepercept.engine import compiled
from drivepercept.engine.graphs import GraphedForward
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ConfigError
from drivepercept.models import load_detector
from drivepercept.models.base import Detector, InputSpec
from drivepercept.run import Mode, RunOptions, run
from drivepercept.run.options import read_settings_file

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
RIG = ROOT / "sample_videos" / "rig.toml"
CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
InProcess = Callable[[list[str]], tuple[int, str]]


class _Toy(torch.nn.Module):
    """A detector small enough to compile in seconds: one convolution, a box per cell of its
    feature map, scored by the features (so the outputs depend on every pixel)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=8, padding=1)

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        if x.shape[1] != 3:
            raise ValueError(f"toy wants 3 channels, got {x.shape[1]}")
        f = self.conv(x)
        b, _, h, w = f.shape
        ys, xs = torch.meshgrid(
            torch.arange(h, device=x.device), torch.arange(w, device=x.device), indexing="ij"
        )
        centre = torch.stack((xs, ys), -1).reshape(1, -1, 2).float() * 8 + 4
        half = 4 + 2 * f[:, 1:3].flatten(2).permute(0, 2, 1).sigmoid()
        boxes = torch.cat((centre - half, centre + half), dim=-1)
        scores = f[:, 0].flatten(1).sigmoid()
        labels = (f[:, 3].flatten(1) > 0).long()
        return [{"boxes": boxes[i], "scores": scores[i], "labels": labels[i]} for i in range(b)]


def _toy() -> Detector:
    return Detector("toy", _Toy().eval(), InputSpec(size=(64, 48)), ("car", "person"))


def _batch(n: int, width: int = 64, height: int = 48, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, height, width, 3), generator=g, dtype=torch.uint8)


def _broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    raise RuntimeError("no compiler today")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Dynamo caches compiled code per function across modules and backends: each test
    compiles from scratch, with the backend it chose."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _speed_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("drivepercept.engine")
    ]


# ------------------------------------------------------------------ settings and flags


def test_the_options_are_off_by_default_and_are_settings_file_keys(tmp_path: Path) -> None:
    assert not PipelineConfig().compile and not PipelineConfig().cuda_graphs
    path = tmp_path / "run.toml"
    path.write_text("compile = true\ncuda_graphs = false\n")
    settings = read_settings_file(path)
    config = RunOptions(sources=(str(RIG),), settings=settings).pipeline()
    assert config.compile and not config.cuda_graphs
    path.write_text('cuda_graphs = "yes"\n')
    with pytest.raises(ConfigError, match="cuda_graphs must be true or false, got 'yes'"):
        read_settings_file(path)


def test_cuda_graphs_on_the_cpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cuda_graphs needs a CUDA device, got device 'cpu'"):
        PipelineConfig(device="cpu", cuda_graphs=True)
    # 'auto' is refused where it is resolved: by the step, before anything runs
    with pytest.raises(ConfigError, match="cuda_graphs needs a CUDA device"):
        DetectorStep(_toy(), PipelineConfig(cuda_graphs=True), CPU)


@pytest.mark.parametrize("command", ["replay", "bench", "live"])
def test_cuda_graphs_flag_on_a_cpu_is_one_line_and_exit_2(
    command: str, in_process: InProcess, tmp_path: Path
) -> None:
    out = ["--out", str(tmp_path / "runs")] if command != "bench" else []
    code, err = in_process([command, str(RIG), "--cuda-graphs", "--device", "cpu", *out])
    assert code == 2
    assert err.strip().count("\n") == 0 and "cuda_graphs needs a CUDA device" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="'auto' is a GPU here")
def test_cuda_graphs_with_auto_device_and_no_gpu_is_one_line_before_any_run(
    in_process: InProcess, tmp_path: Path
) -> None:
    code, err = in_process(["replay", str(RIG), "--cuda-graphs", "--out", str(tmp_path)])
    assert code == 2
    assert err.strip().count("\n") == 0 and "got device 'cpu'" in err, err
    assert list(tmp_path.iterdir()) == []  # no run folder


# ------------------------------------------------------------------ compile


def test_a_failing_compiler_warns_once_and_the_model_runs_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(compiled, "BACKEND", _broken)
    eager = DetectorStep(_toy(), PipelineConfig(device="cpu", score_threshold=0.0), CPU)
    step = DetectorStep(
        _toy(), PipelineConfig(device="cpu", score_threshold=0.0, compile=True), CPU
    )
    batch = _batch(3)
    with caplog.at_level(logging.WARNING):
        packed, counts = step(batch)  # the first call compiles, fails, runs eagerly
        step(batch[:1])
        step(batch)
    want_packed, want_counts = eager(batch)
    assert torch.equal(packed, want_packed) and torch.equal(counts, want_counts)
    assert step.compiled is not None and not step.compiled.compiled
    warnings = _speed_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0]
    assert "model toy cannot be compiled (RuntimeError: no compiler today)" in warnings[0]


def test_torch_compile_raising_at_build_falls_back_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unsupported(*args: object, **kwargs: object) -> Any:
        raise RuntimeError("Dynamo is not supported on this Python\nsecond line")

    monkeypatch.setattr(torch, "compile", unsupported)
    with caplog.at_level(logging.WARNING):
        step = DetectorStep(_toy(), PipelineConfig(device="cpu", compile=True), CPU)
        step(_batch(2))
    assert _speed_warnings(caplog) == [
        "--compile: model toy cannot be compiled (RuntimeError: Dynamo is not supported on "
        "this Python); running it eagerly"
    ]


def test_a_model_error_is_the_models_not_blamed_on_the_compiler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(compiled, "BACKEND", "eager")  # dynamo's tracing, no code generation
    model = compiled.CompiledModel(_Toy().eval(), name="toy")
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        with pytest.raises(ValueError, match="toy wants 3 channels, got 4"):
            model(torch.zeros(2, 4, 48, 64))
        model(torch.zeros(2, 3, 48, 64))
    assert model.compiled and _speed_warnings(caplog) == []


def test_only_the_warm_up_shapes_are_compiled_others_run_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        # the image batch among the inputs (the weights are inputs too)
        graphs.extend(
            t.shape[0]
            for t in example_inputs
            if isinstance(t, torch.Tensor) and tuple(t.shape[-2:]) == (48, 64)
        )
        return gm.forward

    monkeypatch.setattr(compiled, "BACKEND", counting)
    config = PipelineConfig(device="cpu", score_threshold=0.0)
    eager = DetectorStep(_toy(), config, CPU)
    step = DetectorStep(
        _toy(), PipelineConfig(device="cpu", score_threshold=0.0, compile=True), CPU
    )
    for n in (4, 1, 4, 3, 1):  # the warm-up (rig's batch, one frame), then a partial batch
        packed, counts = step(_batch(n, seed=n))
        want_packed, want_counts = eager(_batch(n, seed=n))
        assert torch.allclose(packed, want_packed, atol=1e-4) and torch.equal(counts, want_counts)
    assert sorted(set(graphs)) == [1, 4]  # no compile for the batch of 3
    assert step.compiled is not None and step.compiled.compiled


def test_a_run_goes_on_when_compiling_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(compiled, "BACKEND", _broken)
    options = RunOptions(
        sources=(str(RIG),),
        mode=Mode.REPLAY,
        settings={"device": "cpu", "compile": True, "max_frames": 2, "sample_hz": 0.0},
        out_root=tmp_path,
        report_formats=(),
    )
    with caplog.at_level(logging.WARNING):
        result = run(options, detector=_toy())
    assert result.error is None and result.stats.frames == 12
    assert result.record.config["compile"] is True
    assert len(_speed_warnings(caplog)) == 1


@pytest.mark.slow  # one to three minutes: inductor compiles two shapes with gcc
@pytest.mark.timeout(1200)
def test_inductor_on_the_cpu_gives_eagers_detections_or_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    detector = load_detector("drivepercept-tiny", weights="DEFAULT")
    width, height = detector.input.size
    config = PipelineConfig(device="cpu", score_threshold=0.1)
    eager = DetectorStep(detector, config, CPU)
    step = DetectorStep(
        detector, PipelineConfig(device="cpu", score_threshold=0.1, compile=True), CPU
    )
    batch = _batch(3, width, height)
    with caplog.at_level(logging.WARNING):
        step(batch)  # the warm-up's two shapes
        step(batch[:1])
        packed, counts = step(batch)
    want_packed, want_counts = eager(batch)
    assert step.compiled is not None
    if not step.compiled.compiled:  # no working compiler here: one warning, eager results
        assert len(_speed_warnings(caplog)) == 1
        assert torch.equal(packed, want_packed)
        return
    assert _speed_warnings(caplog) == []
    assert torch.equal(counts, want_counts)
    assert torch.allclose(packed, want_packed, atol=1e-3, rtol=1e-4)


# ------------------------------------------------------------------ CUDA graphs


def test_graphs_leave_cpu_tensors_to_the_forward() -> None:
    calls: list[int] = []

    def forward(x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        calls.append(x.shape[0])
        return [{"x": x[i]} for i in range(x.shape[0])]

    graphed = GraphedForward(forward, name="toy")
    for n in (2, 2, 2):
        assert len(graphed(torch.zeros(n, 3))) == n
    assert calls == [2, 2, 2] and graphed.batch_size == 0 and graphed.failure is None


def _graph_config(**kwargs: Any) -> PipelineConfig:
    return PipelineConfig(device="cuda", score_threshold=0.0, **kwargs)


@pytest.mark.cuda
@needs_cuda
def test_graphs_give_eagers_boxes_for_full_and_partial_batches_cuda() -> None:
    cuda = torch.device("cuda", torch.cuda.current_device())
    detector = load_detector("drivepercept-tiny", weights="DEFAULT")
    width, height = detector.input.size
    eager = DetectorStep(detector, _graph_config(), cuda)
    step = DetectorStep(detector, _graph_config(cuda_graphs=True), cuda)
    assert step.graphed is not None
    step(_batch(6, width, height))  # the warm-up's full batch: eager
    step(_batch(1, width, height))
    assert step.graphed.batch_size == 0
    for n, seed in ((6, 1), (6, 2), (2, 3), (5, 4), (6, 5)):
        batch = _batch(n, width, height, seed)
        packed, counts = step(batch)
        assert step.graphed.batch_size == 6, "captured at the full batch, then replayed"
        want_packed, want_counts = eager(batch)
        assert torch.equal(counts, want_counts), (n, seed)
        assert torch.allclose(packed, want_packed, atol=1e-3), (n, seed)
    assert step.graphed.failure is None


@pytest.mark.cuda
@needs_cuda
def test_replayed_outputs_survive_the_next_replay_cuda() -> None:
    cuda = torch.device("cuda", torch.cuda.current_device())
    step = DetectorStep(_toy(), _graph_config(cuda_graphs=True, channels_last=False), cuda)
    with torch.inference_mode():
        first = [step.normalise(_batch(4, seed=s).to(cuda)) for s in range(4)]
        for x in first[:2]:
            step.forward(x)  # eager, then captured
        a = step.forward(first[2])
        b = step.forward(first[3])  # in flight together, as in the engine
        want_a = step._run_model(first[2])
        want_b = step._run_model(first[3])
    for got, want in ((a, want_a), (b, want_b)):
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g["boxes"], w["boxes"], atol=1e-5)
            assert torch.allclose(g["scores"], w["scores"], atol=1e-5)


@pytest.mark.cuda
@needs_cuda
def test_a_forward_that_waits_for_the_device_falls_back_with_one_warning_cuda(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def syncing(x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        keep = int((x > 0).sum().item())  # a host read: cannot be captured
        return [{"n": torch.full((1,), keep, device=x.device)} for _ in range(x.shape[0])]

    graphed = GraphedForward(syncing, name="syncing")
    x = torch.ones(2, 3, device="cuda")
    with caplog.at_level(logging.WARNING):
        outs = [graphed(x) for _ in range(4)]
    assert all(int(o[0]["n"].item()) == 6 for o in outs)
    assert graphed.failure is not None and graphed.batch_size == 0
    assert len(_speed_warnings(caplog)) == 1


@pytest.mark.cuda
@needs_cuda
def test_graphs_and_compile_in_the_pipeline_give_eagers_detections_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(compiled, "BACKEND", "eager")  # dynamo without minutes of codegen
    found: dict[str, list[Any]] = {}
    for name, extra in (("eager", {}), ("graphs", {"cuda_graphs": True, "compile": True})):
        options = RunOptions(
            sources=(str(RIG),),
            settings={"device": "cuda", "max_frames": 4, "sample_hz": 0.0, **extra},
            out_root=tmp_path,
            name=name,
            report_formats=(),
        )
        result = run(options)
        assert result.error is None and result.stats.frames == 24
        lines = (tmp_path / name / "detections.jsonl").read_text().splitlines()
        found[name] = sorted(
            (d["camera"], d["frame_index"], d["boxes"]) for d in map(json.loads, lines)
        )
    for (cam, index, boxes), (cam2, index2, boxes2) in zip(
        found["eager"], found["graphs"], strict=True
    ):
        assert (cam, index) == (cam2, index2)
        assert len(boxes) == len(boxes2)
        assert torch.allclose(torch.tensor(boxes), torch.tensor(boxes2), atol=0.05)


def test_torch_threads_are_set_when_the_engine_starts_and_checked() -> None:
    from fakereaders import FakeReader

    from drivepercept.models.oracle import make_oracle
    from drivepercept.pipeline import Pipeline

    before = torch.get_num_threads()
    try:
        config = PipelineConfig(device="cpu", torch_threads=1, sample_hz=0.0)
        with Pipeline(
            cameras=[("c", FakeReader(frames=3))],
            detector=make_oracle(size=(64, 64)),
            config=config,
        ) as pipeline:
            pipeline.run()
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert PipelineConfig().torch_threads == 0  # the default leaves torch's own choice
    with pytest.raises(ConfigError, match="torch_threads must be 0"):
        PipelineConfig(torch_threads=-1)
