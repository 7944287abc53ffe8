"""The model registry: a name (or a plugin path) and a weights choice -> a ready `Detector`.

Names are the bundled `drivepercept-tiny` (trained on the synthetic rig; its "DEFAULT"
weights are the file shipped in `models/`), the YOLOX family (`yolox-nano` ... `yolox-x`,
COCO; "DEFAULT" is the official release checkpoint, downloaded once, and a path may be a
`.pth` checkpoint or an `.onnx` export) and torchvision's COCO detectors (see
`available_models()`). A name ending in `.onnx` is an exported detector run by ONNX Runtime
(`drivepercept.models.onnx`; its weights are the file's). A name with a colon,
`package.module:factory`, is a plugin: the module is imported and `factory(weights)` must
return a `Detector`. Weights are chosen the same way for every model:

* `"none"` (any case) or None: random initialisation, for tests and timing runs;
* `"DEFAULT"` (any case): the model's published pretrained weights, downloaded once into
  torch.hub's cache;
* anything else: the path of a state dict saved with `torch.save(model.state_dict(), path)`.
"""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path

from drivepercept.models import _torchvision, onnx, tiny, yolox_weights
from drivepercept.models._weights import short_reason
from drivepercept.models.base import Detector, ModelError, WeightsStore
from drivepercept.models.classes import with_classes

PLUGIN_FORM = "package.module:factory"


def available_models() -> tuple[str, ...]:
    """Registered model names (plugins, `package.module:factory`, are not listed)."""
    return (tiny.NAME, *yolox_weights.NAMES, *_torchvision.NAMES)


def default_input_size(name: str, *, device_type: str) -> tuple[int, int] | None:
    """The input size a registered YOLOX model runs at by default on `device_type`
    (`yolox_weights.default_input_size`); None for models whose input is fixed or their own
    (tiny, torchvision's, plugins, `.onnx` files)."""
    if name not in yolox_weights.NAMES:
        return None
    size = name.removeprefix(yolox_weights.PREFIX)
    return yolox_weights.default_input_size(size, device_type=device_type)


def load_detector(
    name: str,
    *,
    weights: str | None = "none",
    classes: str = "driving",
    input_size: tuple[int, int] | None = None,
    store: WeightsStore | None = None,
    onnx_layout: str | None = None,
    onnx_batch: str | None = None,
    trt_cache: str | Path | None = None,
    threads: int = 0,
) -> Detector:
    """Builds a detector, in eval mode, on the CPU.

    Args:
        name: a name from `available_models()`, or `package.module:factory`.
        weights: "none"/None (random), "DEFAULT" (pretrained download) or a state dict path.
            A plugin's factory receives None for "none", "DEFAULT" for any spelling of it,
            and the path otherwise.
        classes: "driving" (the detector's class filter, COCO classes mapped onto the
            driving ones) or "all" (every class it has).
        input_size: (width, height) for models that run at any size (YOLOX: multiples of
            32); None for the model's default.
        store: where "DEFAULT" weights are looked for and downloaded from (YOLOX).
        onnx_layout, onnx_batch, trt_cache: an ONNX model's output layout, batch policy
            and TensorRT engine cache (`drivepercept.models.onnx.build`); an error for
            other models.
        threads: an ONNX model's intra-op threads (0: ONNX Runtime's default); a torch
            model's threads are the engine's (`torch_threads`).

    Returns:
        The detector.

    Raises:
        ModelError: unknown name, broken plugin, or weights that cannot be had or do not fit;
            the message is one line.
    """
    weights = _normalise_weights(weights)
    if onnx.is_onnx(name):
        detector = onnx.build(
            name.strip(),
            weights=weights,
            input_size=input_size,
            layout=onnx_layout,
            batch=onnx_batch,
            trt_cache=trt_cache,
            threads=threads,
        )
        return with_classes(detector, classes)
    given = {"onnx_layout": onnx_layout, "onnx_batch": onnx_batch, "trt_cache": trt_cache}
    for key, value in given.items():
        if value is not None:
            raise ModelError(f"{key} is for .onnx models, got {key} {value!r} for model {name}")
    if input_size is not None and name not in yolox_weights.NAMES:
        raise ModelError(
            f"model {name} has a fixed input size, got {input_size[0]}x{input_size[1]}; an "
            "input size can be chosen for "
            f"{', '.join(yolox_weights.NAMES)}"
        )
    return with_classes(_build(name, weights, input_size, store), classes)


def _build(
    name: str,
    weights: str | None,
    input_size: tuple[int, int] | None,
    store: WeightsStore | None,
) -> Detector:
    if ":" in name:
        return _load_plugin(name, weights)
    if name == tiny.NAME:
        return tiny.make_tiny(weights)
    if name in yolox_weights.NAMES:
        return yolox_weights.build(name, weights, input_size=input_size, store=store)
    if name in _torchvision.NAMES:
        return _torchvision.build(name, weights)
    close = [n for n in available_models() if name.lower() in n]
    close = close or difflib.get_close_matches(name.lower(), available_models(), n=1)
    hint = f"did you mean {close[0]!r}? " if len(close) == 1 else ""
    raise ModelError(
        f"unknown model {name!r}; {hint}available: {', '.join(available_models())}, "
        f"or your own as {PLUGIN_FORM}"
    )


def _normalise_weights(weights: str | None) -> str | None:
    """None for random weights, "DEFAULT" for the pretrained ones, else the path as given."""
    if weights is None or weights.strip().lower() == "none":
        return None
    if weights.strip().upper() == "DEFAULT":
        return "DEFAULT"
    if not weights.strip():
        # An empty path (an unset variable, say) must not quietly mean random weights.
        raise ModelError(f"weights must be 'none', 'DEFAULT' or a file path, got {weights!r}")
    return weights


def _load_plugin(path: str, weights: str | None) -> Detector:
    """Imports `package.module:factory` and calls `factory(weights)`."""
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path or ":" in attr_path:
        raise ModelError(f"model plugin must be written {PLUGIN_FORM}, got {path!r}")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(
            f"cannot import model plugin module {module_name!r} ({short_reason(exc)})"
        ) from exc
    except Exception as exc:  # the user's module body may raise anything
        raise ModelError(
            f"model plugin module {module_name!r} failed while importing ({short_reason(exc)})"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model plugin module {module_name!r} has no {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model plugin {path!r} is a {type(target).__name__}, not a factory")
    try:
        detector = target(weights)
    except ModelError:
        raise
    except Exception as exc:  # the user's factory may raise anything
        raise ModelError(f"model plugin {path!r} failed ({short_reason(exc)})") from exc
    if not isinstance(detector, Detector):
        raise ModelError(
            f"model plugin {path!r} returned a {type(detector).__name__}, expected a "
            "drivepercept.models.Detector"
        )
    detector.module.eval()
    return detector
