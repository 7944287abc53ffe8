"""YOLOX: the network against the published sizes and a real export, its weights loaders, the
refusals, and the pipeline's boxes against a direct reference run of the same weights."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest
import torch
from standins import RoadClips
from standins import random_norms as _random_norms
from thirdparty import DEIMV2_ATTO, present
from torchvision.ops import batched_nms

from drivepercept.config import PipelineConfig
from drivepercept.engine.step import DetectorStep
from drivepercept.models import Detector, ModelError, WeightsStore, _weights, load_detector
from drivepercept.models import yolox_weights as yw
from drivepercept.models.export import export_onnx
from drivepercept.models.yolox import SIZES, YOLOX
from drivepercept.run import RunOptions, run
from drivepercept.sources.prepare import prepare
from drivepercept.types import COCO_TO_DRIVING, DRIVING_CLASSES

# Published parameter counts (millions) of the YOLOX model zoo.
PUBLISHED_PARAMS_M = {"nano": 0.91, "tiny": 5.06, "s": 9.0, "m": 25.3, "l": 54.2, "x": 99.1}


@pytest.mark.parametrize("size", list(SIZES))
def test_each_size_has_the_published_parameter_count(size: str) -> None:
    net = YOLOX(SIZES[size])
    params = sum(p.numel() for p in net.parameters()) / 1e6
    assert params == pytest.approx(PUBLISHED_PARAMS_M[size], abs=0.05)


def test_official_state_dict_names() -> None:
    keys = set(YOLOX(SIZES["nano"]).state_dict())
    for key in (
        "backbone.backbone.stem.conv.conv.weight",
        "backbone.backbone.dark2.0.dconv.bn.running_var",
        "backbone.backbone.dark5.1.conv2.conv.weight",
        "backbone.C3_p4.m.0.conv2.pconv.conv.weight",
        "backbone.bu_conv1.dconv.conv.weight",
        "head.stems.2.bn.weight",
        "head.cls_convs.0.1.pconv.conv.weight",
        "head.cls_preds.0.weight",
        "head.obj_preds.2.bias",
    ):
        assert key in keys, key


def test_fused_network_computes_what_the_unfused_one_does() -> None:
    net = _random_norms(YOLOX(SIZES["nano"]))
    x = torch.rand(2, 3, 96, 128) * 255
    with torch.no_grad():
        before = net.raw(x)
        after = net.fuse().raw(x)
    assert torch.allclose(before, after, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("batch", "wh"), [(1, (416, 256)), (3, (640, 384)), (2, (96, 64))])
def test_any_batch_and_any_multiple_of_32(batch: int, wh: tuple[int, int]) -> None:
    net = YOLOX(SIZES["nano"]).eval().fuse()
    w, h = wh
    with torch.no_grad():
        out = net(torch.rand(batch, 3, h, w) * 255)
    cells = sum((w // s) * (h // s) for s in (8, 16, 32))
    assert len(out) == batch
    for image in out:
        assert image["boxes"].shape == (cells, 4)
        assert image["scores"].shape == (cells,) and image["labels"].shape == (cells,)
        assert float(image["scores"].min()) >= 0.0 and float(image["scores"].max()) <= 1.0
    with pytest.raises(ValueError, match="multiples of 32"):
        net(torch.rand(1, 3, 100, 128))


def test_state_dict_round_trip_is_bit_exact(tmp_path: Path) -> None:
    net = _random_norms(YOLOX(SIZES["nano"]), seed=3)
    path = tmp_path / "yolox_nano.pth"
    torch.save({"model": net.state_dict()}, path)  # the official checkpoint layout
    again = YOLOX(SIZES["nano"])
    state = _weights.read_state_dict(str(path), model_name="yolox-nano")
    _weights.apply_state_dict(again, state, source=str(path), model_name="yolox-nano")
    for key, value in net.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key
    # and the detector built from it computes what the saved network computes, fused
    detector = load_detector("yolox-nano", weights=str(path))
    x = torch.rand(1, 3, 64, 96) * 255
    with torch.no_grad():
        assert torch.allclose(net.fuse().raw(x), detector.module.raw(x), atol=1e-3)  # type: ignore[operator]


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_checkpoint_with_a_missing_or_extra_key_is_refused(tmp_path: Path, change: str) -> None:
    state = YOLOX(SIZES["nano"]).state_dict()
    if change == "missing":
        del state["head.cls_preds.1.weight"]
    else:
        state["head.extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(ModelError) as err:
        load_detector("yolox-nano", weights=str(path))
    message = str(err.value)
    assert "\n" not in message and f"1 {change if change == 'missing' else 'unexpected'}" in message


def test_a_checkpoint_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "yolox_tiny.pth"
    torch.save({"model": YOLOX(SIZES["tiny"]).state_dict()}, path)
    with pytest.raises(ModelError, match="do not fit yolox-nano") as err:
        load_detector("yolox-nano", weights=str(path))
    assert "\n" not in str(err.value)


def test_the_released_onnx_export_loads_and_matches_onnxruntime(yolox_nano_onnx: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    detector = load_detector("yolox-nano", weights=str(yolox_nano_onnx))
    x = np.random.default_rng(0).uniform(0, 255, (1, 3, 416, 416)).astype(np.float32)
    session = ort.InferenceSession(str(yolox_nano_onnx), providers=["CPUExecutionProvider"])
    want = session.run(None, {"images": x})[0]
    with torch.no_grad():
        got = detector.module.raw(torch.from_numpy(x)).numpy()  # type: ignore[operator]
    assert got.shape == want.shape == (1, 3549, 85)
    assert np.abs(got - want).max() < 1e-3


def _foreign_onnx(folder: Path) -> list[Path]:
    """ONNX files of other models: drivepercept-tiny's export, and DEIMv2 where ../shared
    has it."""
    tiny = export_onnx(load_detector("drivepercept-tiny"), folder / "tiny.onnx", batch=1).onnx
    return [tiny, *([DEIMV2_ATTO] if present(DEIMV2_ATTO) else [])]


def test_foreign_and_broken_onnx_files_are_refused(tmp_path: Path, yolox_nano_onnx: Path) -> None:
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(yolox_nano_onnx.read_bytes()[:100_000])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01not a model" * 100)
    cases = [(truncated, "not a readable ONNX file"), (garbage, "ONNX")]
    cases += [(other, "is not a yolox-nano export") for other in _foreign_onnx(tmp_path)]
    for path, words in cases:
        with pytest.raises(ModelError, match=words) as err:
            load_detector("yolox-nano", weights=str(path))
        assert "\n" not in str(err.value), path
    with pytest.raises(ModelError, match="is not a yolox-tiny export"):
        load_detector("yolox-tiny", weights=str(yolox_nano_onnx))


REFUSED = WeightsStore(mirror="http://127.0.0.1:9/")  # refuses at once: never a download


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty torch hub cache (TORCH_HOME is torch's own variable)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    yield tmp_path / "hub"


def test_default_weights_offline_say_url_cache_and_what_to_do(empty_cache: Path) -> None:
    with pytest.raises(ModelError) as err:
        load_detector("yolox-nano", weights="DEFAULT", store=REFUSED)
    message = str(err.value)
    assert "\n" not in message
    assert "http://127.0.0.1:9/yolox_nano.pth" in message
    assert str(yw.cache_path("nano")) in message and str(empty_cache) in message
    assert "--weights PATH" in message and yw.WEIGHTS_DIR_ENV in message
    assert not any(yw.cache_path("nano").parent.glob("*")), "a partial file was left behind"


def test_default_weights_come_from_the_cache_and_the_weights_folder(
    empty_cache: Path, tmp_path: Path, yolox_nano_onnx: Path
) -> None:
    cached = yw.cache_path("nano")
    cached.parent.mkdir(parents=True)
    net = _random_norms(YOLOX(SIZES["nano"]), seed=5)
    torch.save({"model": net.state_dict()}, cached)
    x = torch.rand(1, 3, 64, 64) * 255
    with torch.no_grad():
        want = net.fuse().raw(x)
        got = load_detector("yolox-nano", weights="DEFAULT", store=REFUSED).module.raw(x)  # type: ignore[operator]
    assert torch.allclose(want, got, atol=1e-3)
    folder = WeightsStore(folder=yolox_nano_onnx.parent)
    load_detector("yolox-nano", weights="DEFAULT", store=folder)  # the folder wins
    with pytest.raises(ModelError, match=r"has neither yolox_nano\.pth nor yolox_nano\.onnx"):
        load_detector("yolox-nano", weights="DEFAULT", store=WeightsStore(folder=tmp_path))


@contextlib.contextmanager
def _serving(folder: Path) -> Iterator[str]:
    """A local HTTP server for `folder` (a mirror of the release files)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-mirror", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_default_weights_download_once_checked_then_reused(
    empty_cache: Path, tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    net = _random_norms(YOLOX(SIZES["nano"]), seed=7)
    torch.save({"model": net.state_dict()}, mirror / "yolox_nano.pth")
    (mirror / "yolox_tiny.pth").write_bytes(b"<html>not found</html>")  # a broken download
    with _serving(mirror) as url:
        store = WeightsStore(mirror=url)
        with pytest.raises(ModelError, match="is not usable") as err:
            load_detector("yolox-tiny", weights="DEFAULT", store=store)
        assert "\n" not in str(err.value) and ".part" not in str(err.value)
        load_detector("yolox-nano", weights="DEFAULT", store=store)
    cached = yw.cache_path("nano")
    assert cached.read_bytes() == (mirror / "yolox_nano.pth").read_bytes()
    assert sorted(p.name for p in cached.parent.iterdir()) == ["yolox_nano.pth"]  # no leftovers
    # the server is gone: the second load is the cache's
    x = torch.rand(1, 3, 64, 64) * 255
    with torch.no_grad():
        again = load_detector("yolox-nano", weights="DEFAULT", store=store)
        assert torch.allclose(net.fuse().raw(x), again.module.raw(x), atol=1e-3)  # type: ignore[operator]


def test_input_size_is_checked_and_only_for_models_that_take_any() -> None:
    assert load_detector("yolox-nano", weights=None).input.size == (416, 256)
    assert load_detector("yolox-s", weights=None).input.size == (640, 384)
    assert load_detector("yolox-nano", weights=None, input_size=(640, 384)).input.size == (
        640,
        384,
    )
    with pytest.raises(ModelError, match="multiples of 32"):
        load_detector("yolox-nano", weights=None, input_size=(400, 256))
    with pytest.raises(ModelError, match="fixed input size"):
        load_detector("drivepercept-tiny", weights=None, input_size=(416, 256))


def test_coco_classes_are_reported_as_driving_classes() -> None:
    detector = load_detector("yolox-nano", weights=None)
    names, table = detector.output_classes()
    assert set(names) == set(DRIVING_CLASSES)
    assert names[table[detector.class_names.index("motorcycle")]] == "cyclist"
    assert names[table[detector.class_names.index("bicycle")]] == "cyclist"
    assert table[detector.class_names.index("toothbrush")] == -1
    everything = load_detector("yolox-nano", weights=None, classes="all")
    names, table = everything.output_classes()
    assert len(names) == 80 - 1 and -1 not in table  # bicycle and motorcycle are one class
    assert "pedestrian" in names and "toothbrush" in names


# --------------------------------------------------------------------------- real frames


def _reference(session: object, frame_bgr: np.ndarray, threshold: float) -> list[tuple]:  # type: ignore[type-arg]
    """YOLOX's own preparation and decoding, written out: resize by r = min(416/h, 416/w)
    bilinearly, top-left on a 114 canvas, BGR 0-255; decode per cell; class-aware NMS of the
    driving classes (as the pipeline reports them); boxes divided by r."""
    h, w = frame_bgr.shape[:2]
    r = min(416 / h, 416 / w)
    resized = cv2.resize(frame_bgr, (int(w * r), int(h * r)), interpolation=cv2.INTER_LINEAR)
    canvas = np.full((416, 416, 3), 114, np.uint8)
    canvas[: resized.shape[0], : resized.shape[1]] = resized
    x = canvas.transpose(2, 0, 1)[None].astype(np.float32)
    out = session.run(None, {"images": x})[0][0]  # type: ignore[attr-defined]
    grid, stride = [], []
    for s in (8, 16, 32):
        ys, xs = np.meshgrid(np.arange(416 // s), np.arange(416 // s), indexing="ij")
        grid.append(np.stack((xs, ys), -1).reshape(-1, 2))
        stride.append(np.full((grid[-1].shape[0], 1), s))
    g, st = np.concatenate(grid), np.concatenate(stride)
    cxcy = (out[:, :2] + g) * st
    wh = np.exp(out[:, 2:4]) * st
    scores = out[:, 4] * out[:, 5:].max(1)
    labels = out[:, 5:].argmax(1)
    coco = yw.COCO80
    mapped = np.array([DRIVING_CLASSES.index(COCO_TO_DRIVING.get(coco[i], "car")) for i in labels])
    keep = (scores >= threshold) & np.array([coco[i] in COCO_TO_DRIVING for i in labels])
    boxes = np.concatenate((cxcy - wh / 2, cxcy + wh / 2), 1)[keep] / r
    kept = batched_nms(
        torch.from_numpy(boxes).float(),
        torch.from_numpy(scores[keep]).float(),
        torch.from_numpy(mapped[keep]),
        0.5,
    ).numpy()
    return [(DRIVING_CLASSES[int(mapped[keep][i])], float(scores[keep][i]), boxes[i]) for i in kept]


def _frames(path: Path, n: int) -> list[npt.NDArray[np.uint8]]:
    cap = cv2.VideoCapture(str(path))
    frames: list[npt.NDArray[np.uint8]] = []
    while len(frames) < n:
        ok, frame = cap.read()
        assert ok
        frames.append(np.asarray(frame, dtype=np.uint8))
    cap.release()
    return frames


@pytest.mark.parametrize("cameras", [1, 6])
def test_pipeline_boxes_equal_a_direct_reference_run(
    tmp_path: Path, road_clips: RoadClips, released_yolox_nano_onnx: Path, cameras: int
) -> None:
    yolox_nano_onnx = released_yolox_nano_onnx
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(yolox_nano_onnx), providers=["CPUExecutionProvider"])
    clips = [
        road_clips.highway,  # 960x540
        road_clips.overhead,  # 768x432
        road_clips.small,  # 320x240: enlarged, not shrunk
    ]
    chosen = [clips[i % len(clips)] for i in range(cameras)] if cameras > 1 else clips[:1]
    sources = tuple(f"cam{i}={p}" for i, p in enumerate(chosen))
    frames_each = 3
    threshold = 0.3
    detector = load_detector("yolox-nano", weights=str(yolox_nano_onnx), input_size=(416, 416))
    result = run(
        RunOptions(
            sources=sources,
            model="yolox-nano",
            settings={"max_frames": frames_each, "score_threshold": threshold, "sample_hz": 0},
            out_root=tmp_path,
            report_formats=(),
        ),
        detector=detector,
    )
    got = {(f["camera"], f["frame_index"]): f for f in result.detections()}
    assert len(got) == cameras * frames_each
    if cameras > 1:
        assert result.stats.mean_batch_size > 1.5
    compared = 0
    for i, clip in enumerate(chosen):
        for k, frame in enumerate(_frames(clip, frames_each)):
            want = _reference(session, frame, threshold)
            mine = got[(f"cam{i}", k)]
            pairs = list(zip(mine["class_names"], mine["scores"], mine["boxes"], strict=True))
            # a box scoring within a hair of the threshold may fall on either side; no more
            # boxes than the reference has either (NMS and class merging as the reference's)
            sure = [b for b in want if b[1] > threshold + 0.01]
            loose = _reference(session, frame, threshold - 0.01)
            assert len(sure) <= len(pairs) <= len(loose), (clip.name, k)
            for name, score, box in sure:
                best = min(
                    (p for p in pairs if p[0] == name),
                    key=lambda p: float(np.abs(np.array(p[2]) - box).max()),
                )
                assert float(np.abs(np.array(best[2]) - box).max()) <= 1.0, (clip.name, k, name)
                assert best[1] == pytest.approx(score, abs=0.01)
                compared += 1
    assert compared >= 3 * cameras  # real traffic was found and compared


def test_cars_found_on_every_highway_still(
    tmp_path: Path, real_labeled: Path, released_yolox_nano_onnx: Path
) -> None:
    stills = real_labeled / "udacity_stills"
    weights = released_yolox_nano_onnx
    result = run(
        RunOptions(
            sources=(str(stills),),
            model="yolox-nano",
            weights=str(weights),
            input_size=(832, 480),
            settings={"score_threshold": 0.5, "sample_hz": 0},
            out_root=tmp_path,
            report_formats=(),
        )
    )
    frames = list(result.detections())
    assert len(frames) == 6
    for f in frames:
        assert "car" in f["class_names"], f["frame_index"]


def test_bad_weights_on_the_command_line_are_one_line(
    tmp_path: Path,
    road_clips: RoadClips,
    yolox_nano_onnx: Path,
    in_process: Callable[[list[str]], tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    video = str(road_clips.highway)
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(yolox_nano_onnx.read_bytes()[:50_000])
    tiny_pth = tmp_path / "yolox_tiny.pth"
    torch.save({"model": YOLOX(SIZES["tiny"]).state_dict()}, tiny_pth)
    replay = ["replay", video, "--max-frames", "1", "--out", str(tmp_path), "--no-progress"]
    cases = [str(truncated), str(tiny_pth), *map(str, _foreign_onnx(tmp_path))]
    for weights in cases:
        code, err = in_process([*replay, "--weights", weights])
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    # DEFAULT where the file cannot be fetched (the real-road default model)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setenv(yw.WEIGHTS_DIR_ENV, "")
    monkeypatch.setenv(yw.MIRROR_ENV, "http://127.0.0.1:9/")  # refuses at once: no download
    code, err = in_process(replay)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "yolox_nano.pth" in err and "--weights PATH" in err


# --------------------------------------------------------------------------- precision, devices


def _step_outputs(
    detector: Detector, x: torch.Tensor, precision: str, device: str
) -> list[dict[str, torch.Tensor]]:
    config = PipelineConfig(device=device, precision=precision, channels_last=True)
    step = DetectorStep(detector, config, torch.device(device))
    with torch.inference_mode():
        return [{k: v.float().cpu() for k, v in o.items()} for o in step.forward(x.to(device))]


def _agree(
    want: list[dict[str, torch.Tensor]],
    got: list[dict[str, torch.Tensor]],
    *,
    tol: float,
    score_tol: float,
) -> int:
    """The cells the fp32 run is confident about (score > 0.3) keep their boxes within `tol`
    of the box size + 1 px and their scores within `score_tol` in half precision; their
    count."""
    compared = 0
    for w, g in zip(want, got, strict=True):
        cells = (w["scores"] > 0.3).nonzero().squeeze(1)
        size = (w["boxes"][cells, 2:] - w["boxes"][cells, :2]).abs().max(dim=1).values
        err = (w["boxes"][cells] - g["boxes"][cells]).abs().max(dim=1).values
        assert bool((err <= tol * size + 1.0).all()), float((err / size).max())
        assert torch.allclose(w["scores"][cells], g["scores"][cells], atol=score_tol)
        compared += int(cells.numel())
    return compared


def test_bf16_and_channels_last_on_the_cpu_keep_the_boxes(
    released_yolox_nano_onnx: Path, real_labeled: Path
) -> None:
    detector = load_detector("yolox-nano", weights=str(released_yolox_nano_onnx))
    stills = sorted((real_labeled / "udacity_stills").glob("*.jpg"))
    frames = [np.asarray(cv2.imread(str(p)), np.uint8) for p in stills]
    x = torch.stack(
        [torch.from_numpy(prepare(f, detector.input)[0]).permute(2, 0, 1).float() for f in frames]
    )
    want = _step_outputs(detector, x, "fp32", "cpu")
    got = _step_outputs(detector, x, "bf16", "cpu")
    assert all(o["boxes"].dtype == torch.float32 for o in got)
    # bf16 keeps 8 bits of mantissa: measured here, scores move by
    # up to 0.08 (fp16 keeps 11 bits and is checked tighter on CUDA)
    assert _agree(want, got, tol=0.05, score_tol=0.1) >= 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_cuda_in_half_precision_decoding_stays_float32(precision: str) -> None:
    torch.manual_seed(0)
    detector = load_detector("yolox-s", weights=None, input_size=(640, 384))
    # random weights: not what a real input gives, so the check is on the mechanics: every
    # output float32, shapes for any batch, and boxes no further off than half precision's
    # rounding of the heads (fp16 keeps 11 bits, bf16 8)
    _random_norms(detector.module)  # type: ignore[arg-type]
    x = torch.rand(6, 3, 384, 640) * 255
    want = _step_outputs(detector, x, "fp32", "cuda")
    got = _step_outputs(detector, x, precision, "cuda")
    assert len(got) == 6 and all(o["boxes"].shape == (5040, 4) for o in got)
    fp16 = precision == "fp16"
    _agree(want, got, tol=0.02 if fp16 else 0.1, score_tol=0.03 if fp16 else 0.1)


def test_a_forward_with_autograd_after_one_in_inference_mode() -> None:
    # the decode grid made during the engine's first (inference-mode) batch is reused
    net = YOLOX(SIZES["nano"]).eval()
    x = torch.rand(1, 3, 64, 96) * 255
    with torch.inference_mode():
        net(x)
    net(x)[0]["scores"].sum().backward()
    assert next(net.parameters()).grad is not None
