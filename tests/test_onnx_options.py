"""The ONNX backend's options from the outside: `--onnx-layout`, `--onnx-batch` and
`--trt-cache` through the CLI, TOML and `RunOptions` to `build()` (over the sidecar), refused
with a model that is not ONNX; NMS-free end-to-end models; run.json's record of what ran; and
`eval` of an exported drivepercept-tiny against the torch model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from drivepercept.cli.commands import run_options
from drivepercept.cli.parser import build_parser
from drivepercept.engine.stages import postprocess
from drivepercept.errors import ConfigError
from drivepercept.models import ModelError, load_detector
from drivepercept.run import Mode, RunOptions, evaluate_clip, read_settings_file, run

pytest.importorskip("onnxruntime")

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"


class _Boxes(torch.nn.Module):
    """(B, N, 5 + 3), decoded (an Exp in the graph): the 'yolox' layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        row = torch.tensor([50.0, 40.0, 20.0, 10.0, 0.8, 0.1, 0.2, 0.9]).view(1, 1, 8)
        return row.expand(x.shape[0], 30, 8) * torch.exp(x.mean() * 0)


class _Detr(torch.nn.Module):
    """labels, boxes, scores (two overlapping boxes of one class): 'end2end'."""

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x.shape[0]
        norm = torch.tensor([[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.52, 0.5]]).expand(b, 2, 4)
        boxes = norm * sizes.float().repeat(1, 2).unsqueeze(1)
        labels = torch.full((b, 2), 2, dtype=torch.int64)
        scores = torch.tensor([[0.9, 0.8]]).expand(b, 2) + x.mean() * 0
        return labels, boxes, scores


def _export(
    module: torch.nn.Module, path: Path, *, sizes: bool = False, batch1: bool = False
) -> Path:
    x = torch.zeros(1, 3, 64, 96)
    args: tuple[Any, ...] = (x, torch.tensor([[96, 64]])) if sizes else (x,)
    inputs = ["images", "orig_target_sizes"] if sizes else ["images"]
    outputs = ["labels", "boxes", "scores"] if sizes else ["output"]
    axes = {} if batch1 else {name: {0: "N"} for name in inputs + outputs}
    torch.onnx.export(
        module, args, str(path), input_names=inputs, output_names=outputs,
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip
    return path


# ------------------------------------------------------------------ flags and options


def test_the_flags_reach_run_options(tmp_path: Path) -> None:
    # given every command that takes --model, when the ONNX flags are given
    for command in ("replay", "live", "eval", "bench"):
        flags = ["--onnx-layout", "yolov8", "--onnx-batch", "refuse", "--trt-cache", str(tmp_path)]
        args = build_parser().parse_args([command, "a.mp4", "--model", "m.onnx", *flags])
        # then they parse, and reach the run's options
        options = run_options(args, Mode.REPLAY)
        assert (options.onnx_layout, options.onnx_batch) == ("yolov8", "refuse")
        assert options.trt_cache == tmp_path


def test_a_settings_file_takes_the_same_keys(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('model = "m.onnx"\nonnx_layout = "end2end"\nonnx_batch = "loop"\n')
    assert read_settings_file(path)["onnx_layout"] == "end2end"


def test_onnx_options_with_another_model_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"--onnx-layout \(onnx_layout\) is for .onnx models"):
        RunOptions(sources=("a.mp4",), model="yolox-nano", onnx_layout="yolox")
    with pytest.raises(ModelError, match=r"trt_cache is for \.onnx models"):
        load_detector("drivepercept-tiny", trt_cache="/tmp/x")


def test_the_cli_says_so_in_one_line_and_exits_2(in_process: Any, tmp_path: Path) -> None:
    flags = ["--model", "yolox-nano", "--onnx-batch", "loop", "--out", str(tmp_path)]
    code, err = in_process(["replay", str(SAMPLE_RIG), *flags])
    assert code == 2 and "--onnx-batch (onnx_batch) is for .onnx models" in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # refused before any run folder


def test_a_bad_value_is_one_line(tmp_path: Path) -> None:
    model = _export(_Boxes(), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="batch policy must be one of loop, refuse"):
        load_detector(str(model), onnx_batch="sometimes")
    with pytest.raises(ModelError, match="layout must be one of"):
        load_detector(str(model), onnx_layout="ssd")


def test_the_flags_win_over_the_sidecar(tmp_path: Path) -> None:
    # given a batch-1 export whose sidecar names the wrong layout and refuses batches
    model = _export(_Boxes(), tmp_path / "m.onnx", batch1=True)
    model.with_suffix(".toml").write_text('layout = "yolov8"\nbatch = "refuse"\n')
    x = torch.zeros(3, 3, 64, 96)
    side = load_detector(str(model))
    assert side.module.layout == "yolov8"
    with pytest.raises(ModelError, match="refuses to loop over a batch of 3"):
        side.module(x)
    # when the flags say otherwise, then they win
    det = load_detector(str(model), onnx_layout="yolox", onnx_batch="loop")
    out = det.module(x)
    assert det.module.layout == "yolox" and len(out) == 3
    assert out[2]["boxes"][0].tolist() == pytest.approx([40.0, 35.0, 60.0, 45.0])
    # and refuse over a sidecar's loop
    model.with_suffix(".toml").write_text('layout = "yolox"\n')
    with pytest.raises(ModelError, match="refuses to loop"):
        load_detector(str(model), onnx_batch="refuse").module(x)


# ------------------------------------------------------------------ NMS-free models


def test_detr_style_outputs_are_final_and_skip_the_nms(tmp_path: Path) -> None:
    model = _export(_Detr(), tmp_path / "detr.onnx", sizes=True)
    det = load_detector(str(model), classes="all")
    assert det.final_outputs
    outputs = det.module(torch.zeros(1, 3, 64, 96))
    common: dict[str, Any] = {"score_threshold": 0.3, "iou_threshold": 0.5, "max_detections": 10}
    kept, counts = postprocess(outputs, num_classes=80, nms=False, **common)
    assert counts.tolist() == [2]  # both overlapping boxes, best first
    assert kept[0, :2, 4].tolist() == pytest.approx([0.9, 0.8])
    _, counts = postprocess(outputs, num_classes=80, **common)
    assert counts.tolist() == [1]  # what the engine's NMS would have made of them


@pytest.mark.parametrize(
    ("sidecar", "final"), [("", True), ("nms = true\n", False), ("nms = false\n", True)]
)
def test_the_sidecar_may_say_whether_nms_runs(tmp_path: Path, sidecar: str, final: bool) -> None:
    model = _export(_Detr(), tmp_path / "detr.onnx", sizes=True)
    model.with_suffix(".toml").write_text(sidecar)
    assert load_detector(str(model)).final_outputs is final


def test_other_layouts_keep_the_nms(tmp_path: Path) -> None:
    assert not load_detector(str(_export(_Boxes(), tmp_path / "m.onnx"))).final_outputs
    model = _export(_Boxes(), tmp_path / "n.onnx")
    model.with_suffix(".toml").write_text("nms = false\n")
    assert load_detector(str(model)).final_outputs
    model.with_suffix(".toml").write_text('nms = "no"\n')
    with pytest.raises(ModelError, match="nms must be true or false"):
        load_detector(str(model))


def test_a_replay_skips_nms_and_records_what_ran(tmp_path: Path) -> None:
    # given a DETR-style export and a refuse policy (its batch is dynamic: nothing refused)
    model = _export(_Detr(), tmp_path / "detr.onnx", sizes=True)
    result = run(
        RunOptions(
            sources=(str(SAMPLE_RIG),),
            model=str(model),
            onnx_batch="refuse",
            classes="all",
            settings={"max_frames": 2, "sample_hz": 0, "device": "cpu"},
            out_root=tmp_path,
            report_formats=(),
        )
    )
    # then both overlapping boxes come out of every frame
    frames = list(result.detections())
    assert len(frames) == 12 and all(len(f["boxes"]) == 2 for f in frames)
    # and run.json says what ran it
    runtime = json.loads((result.run_dir / "run.json").read_text())["model"]["runtime"]
    assert runtime["backend"] == "onnxruntime" and runtime["layout"] == "end2end"
    assert runtime["batch"] == "refuse"
    assert runtime["sessions"] == {
        "cpu": {"providers": ["CPUExecutionProvider"], "io_binding": False}
    }


# ------------------------------------------------------------------ eval


def test_eval_of_an_exported_tiny_equals_the_torch_tiny(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from drivepercept.run import export_model

    started = time.monotonic()
    onnx_file = tmp_path / "tiny.onnx"
    export_model("drivepercept-tiny", out=onnx_file, batch="dynamic")
    common = {"max_frames": 4, "sample_hz": 0, "device": "cpu", "report": ""}
    reports: dict[str, Any] = {}
    for model in ("drivepercept-tiny", str(onnx_file)):
        settings = {**common, "model": model, "out": str(tmp_path), "name": Path(model).stem}
        result = evaluate_clip(SAMPLE_RIG, settings=settings)
        assert result is not None
        reports[model] = result.report
    mine, theirs = reports[str(onnx_file)], reports["drivepercept-tiny"]
    assert theirs.targets > 50 and mine.targets == theirs.targets
    assert theirs.map_50 > 0.1  # the torch tiny finds the rig's traffic
    assert mine.map_50 == pytest.approx(theirs.map_50, abs=0.005)
    assert mine.map_50_95 == pytest.approx(theirs.map_50_95, abs=0.005)
    assert mine.recall_50 == pytest.approx(theirs.recall_50, abs=0.005)
    assert abs(mine.detections - theirs.detections) <= max(2, theirs.detections // 100)
    print(f"eval: tiny {theirs.map_50:.4f}, ONNX {mine.map_50:.4f} mAP@.5 "
          f"in {time.monotonic() - started:.1f} s")  # fmt: skip
