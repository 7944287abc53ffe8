"""Tests for drivepercept.models: the registry, weights loading, plugins and the oracle.

Nothing here touches the network: pretrained downloads are replaced by stubs that fail (or by
a file placed in a temporary torch.hub cache).
"""

from __future__ import annotations

import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from drivepercept.models import (
    PLUGIN_FORM,
    Detector,
    ModelError,
    available_models,
    load_detector,
)
from drivepercept.models.oracle import OracleDetector, make_oracle

SSDLITE = "ssdlite320_mobilenet_v3_large"
FRCNN_320 = "fasterrcnn_mobilenet_v3_large_320_fpn"
FAST_MODELS = (SSDLITE, FRCNN_320)  # forward in a second or so on two CPU cores

EXPECTED_SIZES = {
    SSDLITE: (320, 320),
    FRCNN_320: (576, 320),
    "fasterrcnn_mobilenet_v3_large_fpn": (1344, 768),
    "retinanet_resnet50_fpn_v2": (1344, 768),
    "fcos_resnet50_fpn": (1344, 768),
}
DRIVING = {"person", "bicycle", "car", "motorcycle", "bus", "truck", "traffic light", "stop sign"}


def _one_line_error(call: Callable[[], object]) -> str:
    """Runs `call`, expecting a ModelError, and returns its message (checked to be one line)."""
    with pytest.raises(ModelError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, f"message spans lines: {message!r}"
    return message


def _params(detector: Detector) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in detector.module.state_dict().items()}


def _assert_same_weights(want: dict[str, torch.Tensor], detector: Detector) -> None:
    got = detector.module.state_dict()
    assert set(want) <= set(got)
    assert all(torch.equal(v, got[k]) for k, v in want.items())


def _assert_detection_dicts(out: Any, batch: int, size: tuple[int, int]) -> None:
    assert isinstance(out, list) and len(out) == batch
    w, h = size
    for d in out:
        assert set(d) >= {"boxes", "scores", "labels"}
        n = d["scores"].shape[0]
        assert d["boxes"].shape == (n, 4) and d["boxes"].dtype == torch.float32
        assert d["scores"].shape == (n,)
        assert d["labels"].shape == (n,) and d["labels"].dtype == torch.int64
        if n:
            assert float(d["boxes"].min()) >= 0.0
            assert float(d["boxes"][:, 0::2].max()) <= w
            assert float(d["boxes"][:, 1::2].max()) <= h


def _stub_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException) -> Path:
    """An empty torch.hub cache in tmp_path whose downloads fail with `error`."""

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(torch.hub, "download_url_to_file", fail)
    return tmp_path / "checkpoints"


# --------------------------------------------------------------------------- registry


def test_available_models_lists_the_torchvision_detectors() -> None:
    # given / when
    names = available_models()

    # then
    assert set(EXPECTED_SIZES) <= set(names)


@pytest.mark.parametrize("name", sorted(EXPECTED_SIZES))
def test_each_model_builds_untrained_with_its_input_spec(name: str) -> None:
    # given a registered name, when it is built without weights
    detector = load_detector(name, weights="none")

    # then it is an eval-mode COCO detector whose spec matches its own inner resize
    assert detector.name == name
    assert not detector.module.training
    assert detector.input.size == EXPECTED_SIZES[name]
    assert detector.input.mean == (0.0, 0.0, 0.0) and detector.input.std == (1.0, 1.0, 1.0)
    # SSD's transform stretches to its fixed size; the others keep the aspect ratio
    assert detector.input.letterbox == (not name.startswith("ssd"))
    assert len(detector.class_names) == 91 and detector.class_names[1] == "person"
    w, h = detector.input.size
    images, _ = detector.module.transform([torch.rand(3, h, w)])  # type: ignore[operator]
    assert images.image_sizes == [(h, w)], "torchvision would resize our input a second time"


@pytest.mark.parametrize("name", sorted(EXPECTED_SIZES))
def test_keep_labels_are_exactly_the_driving_classes(name: str) -> None:
    # given / when
    detector = load_detector(name)

    # then
    assert detector.keep_labels is not None
    kept = {detector.class_names[i] for i in detector.keep_labels}
    assert kept == DRIVING and len(detector.keep_labels) == len(DRIVING)


@pytest.mark.parametrize("name", FAST_MODELS)
def test_forward_of_fast_models_returns_one_dict_per_image(name: str) -> None:
    # given an untrained detector and a batch of two random images at its input size
    torch.manual_seed(0)
    detector = load_detector(name, weights=None)
    w, h = detector.input.size

    # when
    with torch.inference_mode():
        out = detector.module(torch.rand(2, 3, h, w))

    # then
    _assert_detection_dicts(out, 2, (w, h))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_SIZES))
def test_forward_of_every_model_returns_one_dict_per_image(name: str) -> None:
    # given
    torch.manual_seed(0)
    detector = load_detector(name)
    w, h = detector.input.size

    # when
    with torch.inference_mode():
        out = detector.module(torch.rand(1, 3, h, w))

    # then
    _assert_detection_dicts(out, 1, (w, h))


def test_unknown_name_lists_the_available_models_and_the_plugin_form() -> None:
    # given / when
    message = _one_line_error(lambda: load_detector("ssdlite320"))

    # then
    assert "'ssdlite320'" in message
    assert all(name in message for name in available_models())
    assert PLUGIN_FORM in message
    assert f"did you mean '{SSDLITE}'" in message


def test_weights_none_is_case_insensitive_and_empty_weights_is_an_error() -> None:
    # given / when
    detector = load_detector(SSDLITE, weights="NONE")

    # then
    assert isinstance(detector, Detector)
    assert "got ' '" in _one_line_error(lambda: load_detector(SSDLITE, weights=" "))


# --------------------------------------------------------------------------- weights files


def test_state_dict_round_trips_through_a_weights_file(tmp_path: Path) -> None:
    # given a detector's weights saved to a file, and a differently seeded fresh build
    torch.manual_seed(1)
    saved = load_detector(SSDLITE)
    path = tmp_path / "ssdlite.pth"
    torch.save(saved.module.state_dict(), path)
    torch.manual_seed(2)
    other = load_detector(SSDLITE).module.state_dict()
    assert any(not torch.equal(v, other[k]) for k, v in _params(saved).items())

    # when
    loaded = load_detector(SSDLITE, weights=str(path))

    # then every parameter and buffer equals the saved one
    want, got = _params(saved), _params(loaded)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert not loaded.module.training


@pytest.mark.parametrize("wrapper", ["state_dict", "model"])
def test_wrapped_state_dict_loads(tmp_path: Path, wrapper: str) -> None:
    # given a training checkpoint that wraps the weights
    torch.manual_seed(3)
    saved = load_detector(SSDLITE)
    path = tmp_path / "checkpoint.pth"
    torch.save({wrapper: saved.module.state_dict(), "epoch": torch.tensor(7)}, path)

    # when
    loaded = load_detector(SSDLITE, weights=str(path))

    # then
    _assert_same_weights(_params(saved), loaded)


def test_frozen_batchnorm_checkpoint_without_batch_counters_loads(tmp_path: Path) -> None:
    # given weights as torchvision ships them for frozen-backbone models: no BN batch counters
    torch.manual_seed(4)
    saved = load_detector(FRCNN_320)
    state = {
        k: v for k, v in saved.module.state_dict().items() if not k.endswith("num_batches_tracked")
    }
    assert len(state) < len(saved.module.state_dict())
    path = tmp_path / "frcnn.pth"
    torch.save(state, path)

    # when
    loaded = load_detector(FRCNN_320, weights=str(path))

    # then
    _assert_same_weights(state, loaded)


def test_missing_weights_file_names_the_path(tmp_path: Path) -> None:
    # given
    path = tmp_path / "nope.pth"

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))

    # then
    assert "not found" in message and str(path) in message and SSDLITE in message


def test_directory_as_weights_is_an_error(tmp_path: Path) -> None:
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(tmp_path)))
    assert "not a file" in message and str(tmp_path) in message


@pytest.mark.parametrize("content", [b"garbage bytes, not a torch file", b""])
def test_garbage_weights_file_is_not_a_torch_file(tmp_path: Path, content: bytes) -> None:
    # given
    path = tmp_path / "garbage.pth"
    path.write_bytes(content)

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))

    # then
    assert str(path) in message and "not a torch weights file" in message
    assert "state dict" in message


def test_non_dict_pickle_is_rejected(tmp_path: Path) -> None:
    # given a torch file holding a list of tensors
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(2), torch.ones(3)], path)

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))

    # then
    assert str(path) in message and "holds a list, not a dict" in message


def test_dict_of_non_tensors_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "meta.pth"
    torch.save({"epoch": 3, "lr": 0.1}, path)
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))
    assert "not a state dict" in message and "'epoch'" in message


def test_whole_pickled_model_is_refused_without_running_its_code(tmp_path: Path) -> None:
    # given a whole module saved instead of its state dict
    path = tmp_path / "module.pth"
    torch.save(torch.nn.Linear(2, 2), path)

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))

    # then
    assert "torch.nn.modules.linear.Linear" in message and "state_dict()" in message


def test_weights_of_another_architecture_are_summarised(tmp_path: Path) -> None:
    # given SSDLite weights
    path = tmp_path / "ssdlite.pth"
    torch.save(load_detector(SSDLITE).module.state_dict(), path)

    # when they are loaded into Faster R-CNN
    message = _one_line_error(lambda: load_detector(FRCNN_320, weights=str(path)))

    # then the mismatch is counted, with an example, on one line
    assert str(path) in message and FRCNN_320 in message
    assert "missing keys, e.g. '" in message and "unexpected keys, e.g. '" in message


def test_weights_for_another_class_count_name_the_shape(tmp_path: Path) -> None:
    # given SSDLite weights for 21 classes (VOC) instead of 91
    import torchvision.models

    voc = torchvision.models.get_model(SSDLITE, weights=None, weights_backbone=None, num_classes=21)
    path = tmp_path / "voc.pth"
    torch.save(voc.state_dict(), path)

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights=str(path)))

    # then
    assert "shape mismatches" in message and "126" in message  # 6 anchors x 21 classes
    assert "missing" not in message and "unexpected" not in message


# --------------------------------------------------------------------------- DEFAULT weights


@pytest.mark.parametrize(
    "error",
    [
        urllib.error.URLError("[Errno -3] Temporary failure in name resolution"),
        OSError(28, "No space left on device"),
        RuntimeError('invalid hash value (expected "5c1", got "e3b")'),
    ],
    ids=["url", "os", "hash"],
)
def test_default_weights_offline_tell_the_user_to_pass_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException
) -> None:
    # given no network (and an empty hub cache)
    _stub_hub(monkeypatch, tmp_path, error)

    # when
    message = _one_line_error(lambda: load_detector(SSDLITE, weights="DEFAULT"))

    # then
    assert "could not download" in message and "https://" in message
    assert type(error).__name__ in message
    assert "--weights PATH" in message


def test_default_weights_come_from_the_hub_cache_without_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given the pretrained file already in the hub cache (here: a random state dict)
    import torchvision.models

    checkpoints = _stub_hub(monkeypatch, tmp_path, AssertionError("must not download"))
    checkpoints.mkdir()
    url = torchvision.models.get_model_weights(SSDLITE).DEFAULT.url
    torch.manual_seed(5)
    saved = load_detector(SSDLITE)
    torch.save(saved.module.state_dict(), checkpoints / Path(url).name)

    # when
    loaded = load_detector(SSDLITE, weights=" Default ")

    # then
    _assert_same_weights(_params(saved), loaded)


def test_corrupt_file_in_hub_cache_is_a_download_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torchvision.models

    checkpoints = _stub_hub(monkeypatch, tmp_path, AssertionError("must not download"))
    checkpoints.mkdir()
    url = torchvision.models.get_model_weights(SSDLITE).DEFAULT.url
    (checkpoints / Path(url).name).write_bytes(b"half a download")

    message = _one_line_error(lambda: load_detector(SSDLITE, weights="DEFAULT"))

    assert "--weights PATH" in message


# --------------------------------------------------------------------------- plugins


def test_plugin_form_loads_the_oracle() -> None:
    # given / when
    detector = load_detector("drivepercept.models.oracle:make_oracle")

    # then
    assert isinstance(detector.module, OracleDetector)
    assert not detector.module.training
    assert detector.input.size == (640, 384)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("no_such_pkg_xyz.models:make", "cannot import"),
        ("drivepercept.models.oracle:no_such_factory", "has no 'no_such_factory'"),
        ("drivepercept.models.oracle:", PLUGIN_FORM),
        (":make_oracle", PLUGIN_FORM),
        ("a:b:c", PLUGIN_FORM),
        ("drivepercept.models.oracle:__doc__", "not a factory"),
        ("builtins:str", "returned a str"),
        ("builtins:len", "failed (TypeError"),
    ],
)
def test_bad_plugins_are_one_line_errors(name: str, expected: str) -> None:
    message = _one_line_error(lambda: load_detector(name))
    assert expected in message


def test_plugin_receives_the_weights_string() -> None:
    # given the oracle, which has no weights, when a weights path is passed through
    message = _one_line_error(
        lambda: load_detector("drivepercept.models.oracle:make_oracle", weights="w.pth")
    )

    # then the factory saw the string
    assert "'w.pth'" in message


# --------------------------------------------------------------------------- oracle


def test_oracle_returns_its_boxes_for_every_image_on_the_input_device() -> None:
    # given an oracle with two boxes
    detector = make_oracle(
        size=(64, 32), boxes=((1, 2, 10, 20), (30, 4, 60, 31)), scores=(0.8, 0.6), labels=(3, 1)
    )

    # when
    out = detector.module(torch.zeros(3, 3, 32, 64))

    # then
    assert len(out) == 3
    for d in out:
        assert d["boxes"].tolist() == [[1, 2, 10, 20], [30, 4, 60, 31]]
        assert d["scores"].tolist() == pytest.approx([0.8, 0.6])
        assert d["labels"].tolist() == [3, 1] and d["labels"].dtype == torch.int64
        assert d["boxes"].device == torch.device("cpu")
    out[0]["boxes"][0, 0] = -1.0
    assert float(detector.module(torch.zeros(1, 3, 32, 64))[0]["boxes"][0, 0]) == 1.0
    assert detector.class_names[3] == "car" and detector.keep_labels is None


def test_oracle_refuses_an_input_of_the_wrong_size() -> None:
    detector = make_oracle(size=(64, 32))
    with pytest.raises(ValueError, match="64x32"):
        detector.module(torch.zeros(1, 3, 64, 64))


def test_oracle_checks_parallel_lengths() -> None:
    with pytest.raises(ValueError, match="scores and labels"):
        OracleDetector(torch.zeros(2, 4), torch.zeros(3), torch.zeros(2, dtype=torch.int64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_oracle_answers_on_the_cuda_device() -> None:
    detector = make_oracle(size=(64, 32))
    module = detector.module.to("cuda")
    out = module(torch.zeros(1, 3, 32, 64, device="cuda"))
    assert out[0]["boxes"].is_cuda and out[0]["labels"].is_cuda
