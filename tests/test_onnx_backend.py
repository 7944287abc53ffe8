"""The ONNX Runtime backend: synthetic exports of each layout, the shared real models through
replay against a direct onnxruntime run with their own reference preparation, and the refusals."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from standins import RoadClips
from thirdparty import DEIMV2_ATTO, DEIMV2_FEMTO, YOLOX_NANO_ONNX, present
from torchvision.ops import batched_nms

from drivepercept.models import ModelError, load_detector
from drivepercept.models.yolox_weights import COCO80
from drivepercept.run import RunOptions, run
from drivepercept.types import COCO_TO_DRIVING, DRIVING_CLASSES

pytest.importorskip("onnxruntime")

YOLOX_NANO = YOLOX_NANO_ONNX
FEMTO = DEIMV2_FEMTO
ATTO = DEIMV2_ATTO


# ------------------------------------------------------------------ synthetic exports


class _Yolov8Like(torch.nn.Module):
    """(B, 4 + 3, N): one fixed box per 'cell' with class 1 scoring 0.9."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        box = torch.tensor([50.0, 40.0, 20.0, 10.0, 0.1, 0.9, 0.2]).view(1, 7, 1)
        return box.expand(b, 7, 30) + x.mean() * 0


class _YoloxDecodedLike(torch.nn.Module):
    """(B, N, 5 + 3), already decoded (has an Exp)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        row = torch.tensor([50.0, 40.0, 20.0, 10.0, 0.8, 0.1, 0.2, 0.9]).view(1, 1, 8)
        return row.expand(b, 30, 8) * torch.exp(x.mean() * 0)


class _End2EndLike(torch.nn.Module):
    """labels, boxes (normalised * orig_target_sizes), scores."""

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x.shape[0]
        norm = torch.tensor([0.25, 0.25, 0.5, 0.75]).view(1, 1, 4).expand(b, 5, 4)
        boxes = norm * sizes.float().repeat(1, 2).unsqueeze(1)
        labels = torch.full((b, 5), 2, dtype=torch.int64)
        scores = torch.full((b, 5), 0.7) + x.mean() * 0
        return labels, boxes, scores


def _export(
    module: torch.nn.Module, path: Path, *, end2end: bool = False, counted: bool = False
) -> Path:
    """`counted`: the outputs' second dimension (detections per image) is left variable."""
    x = torch.zeros(1, 3, 64, 96)
    args: tuple[Any, ...] = (x, torch.tensor([[96, 64]])) if end2end else (x,)
    inputs = ["images", "orig_target_sizes"] if end2end else ["images"]
    outputs = ["labels", "boxes", "scores"] if end2end else ["output"]
    axes: dict[str, dict[int, str]] = {name: {0: "N"} for name in inputs + outputs}
    for name in outputs if counted else ():
        axes[name][1] = "K"
    torch.onnx.export(
        module, args, str(path), input_names=inputs, output_names=outputs,
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip
    return path


def _sidecar(path: Path, text: str) -> None:
    path.with_suffix(".toml").write_text(text, encoding="utf-8")


def test_yolov8_layout_is_recognised_and_decoded(tmp_path: Path) -> None:
    model = _export(_Yolov8Like(), tmp_path / "v8.onnx")
    det = load_detector(str(model), classes="all")
    assert det.module.layout == "yolov8" and det.input.size == (96, 64)
    out = det.module(torch.zeros(2, 3, 64, 96))
    assert len(out) == 2 and out[1]["boxes"].shape == (30, 4)
    assert out[0]["boxes"][0].tolist() == pytest.approx([40.0, 35.0, 60.0, 45.0])
    assert out[0]["labels"][0] == 1 and float(out[0]["scores"][0]) == pytest.approx(0.9)
    assert det.class_names == ("class0", "class1", "class2")


def test_decoded_yolox_layout_with_sidecar_classes_and_input(tmp_path: Path) -> None:
    model = _export(_YoloxDecodedLike(), tmp_path / "v5.onnx")
    _sidecar(
        model,
        'schema = 1\nlayout = "yolox"\nclasses = ["a", "b", "c"]\n'
        '[input]\nletterbox = false\nchannels = "bgr"\npad = "top_left"\nvalue_range = 255.0\n',
    )
    det = load_detector(str(model))
    assert not det.module.raw_grid and det.class_names == ("a", "b", "c")
    assert not det.input.letterbox and det.input.value_range == 255.0
    out = det.module(torch.zeros(1, 3, 64, 96))[0]
    assert out["boxes"][0].tolist() == pytest.approx([40.0, 35.0, 60.0, 45.0])
    assert out["labels"][0] == 2 and float(out["scores"][0]) == pytest.approx(0.72)


def test_end2end_boxes_come_back_in_model_input_pixels(tmp_path: Path) -> None:
    model = _export(_End2EndLike(), tmp_path / "detr.onnx", end2end=True)
    det = load_detector(str(model))
    assert det.module.layout == "end2end" and det.class_names == COCO80
    out = det.module(torch.zeros(3, 3, 64, 96))
    assert len(out) == 3
    assert out[2]["boxes"][0].tolist() == pytest.approx([24.0, 16.0, 48.0, 48.0])
    assert out[2]["labels"][0] == 2


def test_lanes_of_one_thread_keep_whole_batches_where_outputs_vary_in_size(
    tmp_path: Path,
) -> None:
    # given an end2end export whose detections per image are of a variable count (per-image
    # runs might not join into one batch; drivepercept-tiny's fixed 100 do: test_runtime)
    counted = load_detector(
        str(_export(_End2EndLike(), tmp_path / "k.onnx", end2end=True, counted=True))
    )
    x = torch.zeros(3, 3, 64, 96)
    module: Any = counted.module
    whole = module(x)
    # when it is set to run in two lanes of one thread
    assert module.use_lanes(2, 1)
    # then it keeps running whole batches, with the same results, and says so
    assert not module.per_image and not module.describe()["per_image"]
    for got, want in zip(module(x), whole, strict=True):
        assert torch.equal(got["boxes"], want["boxes"])
        assert torch.equal(got["labels"], want["labels"])


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('schema = 1\nlayot = "yolox"\n', "unknown key 'layot'"),
        ("[input]\nsize = [64, 64]\ncolour = 'rgb'\n", "unknown key 'input.colour'"),
        ('layout = "ssd"\n', "layout must be one of"),
        ('[input]\npad = "middle"\n', "input.pad"),
    ],
)
def test_a_sidecar_with_wrong_keys_is_refused(tmp_path: Path, text: str, match: str) -> None:
    model = _export(_Yolov8Like(), tmp_path / "m.onnx")
    _sidecar(model, text)
    with pytest.raises(ModelError, match=match):
        load_detector(str(model))


def test_not_an_onnx_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "notes.onnx"
    bad.write_text("hello", encoding="utf-8")
    with pytest.raises(ModelError, match="is not an ONNX model"):
        load_detector(str(bad))
    with pytest.raises(ModelError, match="not found"):
        load_detector(str(tmp_path / "missing.onnx"))


def test_a_classifier_is_refused(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 96, 10))
    model = _export(net, tmp_path / "cls.onnx")
    with pytest.raises(ModelError, match="classifier"):
        load_detector(str(model))


class _Odd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1].mean(dim=(2, 3)).view(-1, 1, 1, 1).expand(-1, 2, 3, 4)


def test_an_unknown_layout_without_a_sidecar_is_refused(tmp_path: Path) -> None:
    model = _export(_Odd(), tmp_path / "odd.onnx")
    with pytest.raises(ModelError, match="unknown output layout"):
        load_detector(str(model))


def test_missing_onnxruntime_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _export(_Yolov8Like(), tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ModelError, match=r"pip install onnxruntime"):  # a base dependency now
        load_detector(str(model))


def test_the_cli_exits_2_with_one_line(in_process: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_text("x", encoding="utf-8")
    clip = tmp_path / "frames"
    clip.mkdir()
    cv2.imwrite(str(clip / "0.png"), np.zeros((64, 96, 3), np.uint8))
    code, err = in_process(["replay", str(clip), "--model", str(bad), "--out", str(tmp_path)])
    assert code == 2 and "not an ONNX model" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ shared real models


def _frames(path: Path, n: int) -> list[np.ndarray[Any, Any]]:
    cap = cv2.VideoCapture(str(path))
    frames: list[np.ndarray[Any, Any]] = []
    while len(frames) < n:
        ok, frame = cap.read()
        assert ok
        frames.append(frame)
    cap.release()
    return frames


def _reference(model: Path, session: Any, frame: np.ndarray[Any, Any], thr: float) -> list[Any]:
    """SOURCES.md's preparation and decoding, then on the driving classes the engine's
    class-aware NMS (YOLOX) or none (DEIMv2: NMS-free, its boxes are final):
    [(class, score, box in original pixels)]."""
    h, w = frame.shape[:2]
    if model == YOLOX_NANO:
        r = min(416 / h, 416 / w)
        resized = cv2.resize(frame, (int(w * r), int(h * r)), interpolation=cv2.INTER_LINEAR)
        canvas = np.full((416, 416, 3), 114, np.uint8)
        canvas[: resized.shape[0], : resized.shape[1]] = resized
        out = session.run(None, {"images": canvas.transpose(2, 0, 1)[None].astype(np.float32)})
        raw = out[0][0]
        grid, stride = [], []
        for s in (8, 16, 32):
            ys, xs = np.meshgrid(np.arange(416 // s), np.arange(416 // s), indexing="ij")
            grid.append(np.stack((xs, ys), -1).reshape(-1, 2))
            stride.append(np.full((grid[-1].shape[0], 1), s))
        g, st = np.concatenate(grid), np.concatenate(stride)
        cxcy, wh = (raw[:, :2] + g) * st, np.exp(raw[:, 2:4]) * st
        scores, labels = raw[:, 4] * raw[:, 5:].max(1), raw[:, 5:].argmax(1)
        boxes = np.concatenate((cxcy - wh / 2, cxcy + wh / 2), 1) / r
    else:
        side = 416 if model == FEMTO else 320
        rgb = cv2.cvtColor(cv2.resize(frame, (side, side)), cv2.COLOR_BGR2RGB)
        x = (rgb.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
        labels, boxes, scores = session.run(
            None, {"images": x, "orig_target_sizes": np.array([[w, h]], np.int64)}
        )
        labels, boxes, scores = labels[0], boxes[0], scores[0]
    keep = (scores >= thr) & np.array([COCO80[i] in COCO_TO_DRIVING for i in labels])
    mapped = np.array([DRIVING_CLASSES.index(COCO_TO_DRIVING[COCO80[i]]) for i in labels[keep]])
    b = np.clip(boxes[keep], 0, [w, h, w, h])
    kept = batched_nms(
        torch.from_numpy(b).float(),
        torch.from_numpy(scores[keep]).float(),
        torch.from_numpy(mapped.astype(np.int64)),
        0.5 if model == YOLOX_NANO else 1.0,  # IoU > 1 never: no box suppressed
    ).numpy()
    return [(DRIVING_CLASSES[mapped[i]], float(scores[keep][i]), b[i]) for i in kept]


@pytest.mark.parametrize("cameras", [1, 6], ids=["batch1", "batch6"])
@pytest.mark.parametrize("model", [YOLOX_NANO, FEMTO, ATTO], ids=["yolox_nano", "femto", "atto"])
def test_replay_boxes_equal_a_direct_onnxruntime_run(
    tmp_path: Path, road_clips: RoadClips, model: Path, cameras: int
) -> None:
    if not present(model):
        pytest.skip(f"needs the released {model.name} ({model} absent): its real detections")
    import onnxruntime as ort  # type: ignore[import-untyped]

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    clips = (road_clips.highway, road_clips.overhead)
    chosen = [clips[i % len(clips)] for i in range(cameras)]
    frames_each, thr = 2, 0.4
    result = run(
        RunOptions(
            sources=tuple(f"cam{i}={p}" for i, p in enumerate(chosen)),
            model=str(model),
            settings={"max_frames": frames_each, "score_threshold": thr, "sample_hz": 0},
            out_root=tmp_path,
            report_formats=(),
        )
    )
    got = {(f["camera"], f["frame_index"]): f for f in result.detections()}
    assert len(got) == cameras * frames_each
    if cameras > 1:
        assert result.stats.mean_batch_size > 1.5
    compared, worst = 0, 0.0
    for i, clip in enumerate(chosen):
        for k, frame in enumerate(_frames(clip, frames_each)):
            mine = got[(f"cam{i}", k)]
            pairs = list(zip(mine["class_names"], mine["scores"], mine["boxes"], strict=True))
            for name, score, box in _reference(model, session, frame, thr + 0.01):
                best = min(
                    (p for p in pairs if p[0] == name),
                    key=lambda p: float(np.abs(np.array(p[2]) - box).max()),
                )
                diff = float(np.abs(np.array(best[2]) - box).max())
                worst = max(worst, diff)
                assert diff <= 1.0, (clip.name, k, name, diff)
                assert best[1] == pytest.approx(score, abs=0.01)
                compared += 1
    print(f"{model.stem} batch {cameras}: {compared} boxes, max diff {worst:.3f} px")
    assert compared >= cameras  # real traffic was found and compared


def test_yolox_nano_through_ort_equals_the_torch_yolox(
    released_yolox_nano_onnx: Path, road_clips: RoadClips
) -> None:
    model = released_yolox_nano_onnx
    ort_det = load_detector(str(model))
    torch_det = load_detector("yolox-nano", weights=str(model), input_size=(416, 416))
    x = torch.from_numpy(
        np.stack([cv2.resize(f, (416, 416)) for f in _frames(road_clips.highway, 2)])
    )
    x = x.permute(0, 3, 1, 2).float()
    with torch.inference_mode():
        a, b = ort_det.module(x), torch_det.module(x)
    for one, two in zip(a, b, strict=True):
        sure = two["scores"] > 0.3
        assert sure.sum() > 0
        diff = float((one["boxes"][sure] - two["boxes"][sure]).abs().max())
        print(f"yolox-nano ORT vs torch: max box diff {diff:.4f} px")
        assert diff <= 1.0
        assert torch.equal(one["labels"][sure], two["labels"][sure])


def test_yolox_gets_the_engines_nms(yolox_nano_onnx: Path) -> None:
    assert load_detector(str(yolox_nano_onnx)).final_outputs is False


@pytest.mark.parametrize("model", [FEMTO, ATTO], ids=["femto", "atto"])
def test_deimv2_outputs_are_final(model: Path) -> None:
    if not present(model):
        pytest.skip(f"needs the released {model.name} ({model} absent)")
    assert load_detector(str(model)).final_outputs is True
