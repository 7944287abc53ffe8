"""`drivepercept export`: the ONNX file gives the torch model's boxes (within 1 px) on real
frames through ONNX Runtime, at a fixed and a dynamic batch; the sidecar has the schema the
backend reads; bad input is one line and exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest
import torch
from thirdparty import YOLOX_NANO_ONNX, present

from drivepercept.cli import main
from drivepercept.models import Detector, load_detector
from drivepercept.models.export import export_onnx, exportable
from drivepercept.run import export_model
from drivepercept.sources.prepare import prepare

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[1]
VIDEOS = ROOT / "sample_videos"
SIZE = (448, 256)
INPUT_KEYS = {
    "size",
    "letterbox",
    "pad",
    "pad_value",
    "interpolation",
    "channels",
    "value_range",
    "mean",
    "std",
}
Boxes = npt.NDArray[np.float32]


def _frames(n: int) -> list[npt.NDArray[np.uint8]]:
    """The 10th frame of the first n sample cameras (BGR)."""
    out = []
    for name in ("front", "back", "front_left", "front_right", "back_left", "back_right")[:n]:
        cap = cv2.VideoCapture(str(VIDEOS / f"{name}.mp4"))
        for _ in range(10):
            ok, frame = cap.read()
        cap.release()
        assert ok
        out.append(np.asarray(frame, dtype=np.uint8))
    return out


def _batch(detector: Detector, frames: list[npt.NDArray[np.uint8]]) -> torch.Tensor:
    """Frames prepared exactly as the pipeline does (InputSpec), as a float batch."""
    spec = detector.input
    images = np.stack([prepare(f, spec)[0] for f in frames]).astype(np.float32)
    x = torch.from_numpy(images).permute(0, 3, 1, 2) * (spec.value_range / 255.0)
    mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
    std = torch.tensor(spec.std).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def _ort_dets(path: Path, layout: str, x: torch.Tensor) -> list[dict[str, np.ndarray]]:
    """The ONNX outputs decoded per image into boxes (xyxy), scores, labels."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = dict(
        zip(
            [o.name for o in session.get_outputs()],
            session.run(None, {"images": x.numpy()}),
            strict=True,
        )
    )
    if layout == "end2end":
        return [
            {"boxes": outs["boxes"][i], "scores": outs["scores"][i], "labels": outs["labels"][i]}
            for i in range(x.shape[0])
        ]
    assert layout == "yolox"
    rows = outs["output"]
    xy, wh = rows[..., :2], rows[..., 2:4]
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], axis=-1)
    scores = rows[..., 4] * rows[..., 5:].max(-1)
    labels = rows[..., 5:].argmax(-1)
    return [
        {"boxes": boxes[i], "scores": scores[i], "labels": labels[i]} for i in range(x.shape[0])
    ]


def _kept(det: dict[str, np.ndarray], min_score: float) -> Boxes:
    """(label, x1, y1, x2, y2) of the boxes scoring at least min_score, in a canonical order."""
    keep = det["scores"] >= min_score
    rows = np.concatenate([det["labels"][keep, None].astype(np.float32), det["boxes"][keep]], 1)
    return rows[np.lexsort(rows.T[::-1])]


def _max_box_diff(detector: Detector, path: Path, layout: str, n: int) -> float:
    """Largest box coordinate difference, torch vs ONNX Runtime, over n real frames."""
    x = _batch(detector, _frames(n))
    with torch.no_grad():
        ref = [{k: v.numpy() for k, v in d.items()} for d in detector.module(x)]
    got = _ort_dets(path, layout, x)
    worst, compared = 0.0, 0
    for want, have in zip(ref, got, strict=True):
        a, b = _kept(want, 0.05), _kept(have, 0.05)
        assert a.shape == b.shape, (a.shape, b.shape)
        assert np.array_equal(a[:, 0], b[:, 0])  # the same labels
        if len(a):
            worst = max(worst, float(np.abs(a[:, 1:] - b[:, 1:]).max()))
        compared += len(a)
    assert compared > 0  # real detections were compared, not just empty lists
    print(f"{path.name} batch {x.shape[0]}: {compared} boxes, max diff {worst:.5f} px")
    return worst


@pytest.fixture(scope="module")
def tiny() -> Detector:
    return load_detector("drivepercept-tiny", weights="DEFAULT")


@pytest.fixture(scope="module")
def yolox() -> Detector:
    """YOLOX-nano with the released weights where ../shared has them, else random ones."""
    weights = str(YOLOX_NANO_ONNX) if present(YOLOX_NANO_ONNX) else "none"
    return load_detector("yolox-nano", weights=weights, input_size=SIZE)


def _max_head_diff(detector: Detector, path: Path, n: int) -> tuple[float, float]:
    """Largest difference, torch vs ONNX Runtime, of the exported head's output on n sample
    frames, cell by cell: (box coordinates in pixels, objectness and class probabilities).

    Compared before any threshold, ranking or NMS, this holds for any weights: random ones
    score every cell alike, and their near-ties are broken differently by two runtimes
    after NMS, while each cell's numbers still agree."""
    x = _batch(detector, _frames(n))
    module, layout, _ = exportable(detector)
    assert layout == "yolox"
    with torch.no_grad():
        want = module(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": x.numpy()})[0]
    assert got.shape == want.shape and want.shape[0] == n and want.shape[2] == 85
    boxes = float(np.abs(got[..., :4] - want[..., :4]).max())
    probabilities = float(np.abs(got[..., 4:] - want[..., 4:]).max())
    print(
        f"{path.name} batch {n}: {want.shape[1]} cells, "
        f"max diff {boxes:.5f} px, {probabilities:.1e}"
    )
    return boxes, probabilities


@pytest.mark.parametrize(("batch", "frames"), [(1, 1), (3, 3), (None, 1), (None, 4)])
def test_tiny_export_gives_the_torch_boxes(
    tiny: Detector, tmp_path: Path, batch: int | None, frames: int
) -> None:
    done = export_onnx(tiny, tmp_path / "tiny.onnx", batch=batch)
    assert done.layout == "end2end" and done.sidecar == tmp_path / "tiny.toml"
    assert _max_box_diff(tiny, done.onnx, done.layout, frames) <= 1.0


@pytest.mark.parametrize(("batch", "frames"), [(1, 1), (3, 3), (None, 1), (None, 4)])
def test_yolox_export_gives_the_torch_boxes(
    yolox: Detector, tmp_path: Path, batch: int | None, frames: int
) -> None:
    done = export_onnx(yolox, tmp_path / "yolox.onnx", batch=batch)
    assert done.layout == "yolox"
    boxes, probabilities = _max_head_diff(yolox, done.onnx, frames)
    assert boxes <= 0.01 and probabilities <= 1e-4
    if present(YOLOX_NANO_ONNX):  # real weights: real, well-separated detections, after NMS
        assert _max_box_diff(yolox, done.onnx, done.layout, frames) <= 1.0


def test_fixed_batch_is_fixed_and_dynamic_is_not(tmp_path: Path) -> None:
    fixed = export_model("drivepercept-tiny", out=tmp_path / "f.onnx", weights="none", batch="2")
    free = export_model(
        "drivepercept-tiny", out=tmp_path / "d.onnx", weights="none", batch="dynamic"
    )

    def shape(path: Path) -> list[object]:
        return list(ort.InferenceSession(str(path)).get_inputs()[0].shape)

    assert shape(fixed.onnx) == [2, 3, 256, 448]
    assert not isinstance(shape(free.onnx)[0], int) and shape(free.onnx)[1:] == [3, 256, 448]
    # only the batch is dynamic: the backend recognises the layout by the other sizes
    outputs = ort.InferenceSession(str(free.onnx)).get_outputs()
    assert [o.shape[1:] for o in outputs] == [[100], [100, 4], [100]]
    assert all(not isinstance(o.shape[0], int) for o in outputs)


def test_the_sidecar_has_exactly_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.onnx"
    args = ["export", "--model", "yolox-nano", "--weights", "none", "--input", "448x256"]
    assert main([*args, "--batch", "dynamic", "--out", str(out)]) == 0
    assert "model.toml" in capsys.readouterr().out
    side = tomllib.loads((tmp_path / "model.toml").read_text())
    assert (
        set(side) == {"schema", "layout", "classes", "input"} and set(side["input"]) == INPUT_KEYS
    )
    assert side["schema"] == 1 and side["layout"] == "yolox" and len(side["classes"]) == 80
    assert side["classes"][0] == "person"
    assert side["input"] == {
        "size": [448, 256],
        "letterbox": True,
        "pad": "top-left",
        "pad_value": 114,
        "interpolation": "bilinear",
        "channels": "bgr",
        "value_range": 255.0,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
    }


def test_the_backend_reads_the_sidecar(tiny: Detector, tmp_path: Path) -> None:
    sidecar = pytest.importorskip("drivepercept.models.onnx.sidecar")
    done = export_onnx(tiny, tmp_path / "m.onnx", batch=1)
    read = sidecar.read_sidecar(done.onnx)
    assert read.layout == "end2end" and read.classes == tiny.class_names
    assert read.input["size"] == tiny.input.size and read.input["pad"] is tiny.input.pad


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--model", "yolox-nano", "--input", "44x2"], "multiples of 32"),
        (["--model", "yolox-nano", "--input", "wide"], "WIDTHxHEIGHT"),
        (["--model", "drivepercept-tiny", "--input", "640x384"], "runs at 448x256 only"),
        (["--model", "drivepercept-tiny", "--format", "tflite"], "invalid choice: 'tflite'"),
        (["--model", "drivepercept-tiny", "--batch", "0"], "positive number or 'dynamic'"),
        (["--model", "ssdlite320_mobilenet_v3_large"], "exportable: drivepercept-tiny"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--weights", "none", "--out", str(tmp_path / "m.onnx")]
    code = _exit_code(["export", *flags, *out])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("where", ["missing/m.onnx", "folder.onnx"])
def test_an_unwritable_out_is_one_line_and_exit_2(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "folder.onnx").mkdir()
    code = main(["export", "--model", "drivepercept-tiny", "--out", str(tmp_path / where)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(tmp_path) in err, err


def _exit_code(argv: list[str]) -> int:
    """main's return code, or argparse's exit code for a usage error."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
