"""The export job: a registered model and its weights -> an ONNX file and its sidecar TOML
(`drivepercept export`; the work is `drivepercept.models.export`)."""

from __future__ import annotations

from pathlib import Path

from drivepercept.errors import ConfigError
from drivepercept.geometry import parse_input_size
from drivepercept.models import WeightsStore, load_detector
from drivepercept.models.export import FORMATS, Exported, export_onnx
from drivepercept.models.yolox_weights import NAMES as YOLOX_NAMES


def parse_batch(value: str | int | None) -> int | None:
    """The batch flag: "dynamic" -> None, "N" -> N (positive); None -> 1.

    Raises:
        ConfigError: anything else.
    """
    if value is None:
        return 1
    text = str(value).strip().lower()
    if text == "dynamic":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(f"export batch must be a positive number or 'dynamic', got {value!r}")


def export_model(
    model: str,
    *,
    out: Path,
    weights: str | None = "DEFAULT",
    fmt: str = "onnx",
    input_size: str | tuple[int, int] | None = None,
    batch: str | int | None = 1,
    weights_dir: str | Path | None = None,
    weights_mirror: str | None = None,
) -> Exported:
    """Builds `model` with `weights` and writes it to `out` (and `<stem>.toml` beside it).

    Args:
        model: a registered name (drivepercept-tiny, yolox-*).
        out: the `.onnx` file.
        weights: "DEFAULT", "none" or a weights path (as for every other command).
        fmt: the file format; only "onnx".
        input_size: "WxH" (YOLOX: any multiple of 32; the others: their own size only).
        batch: a positive batch size, or "dynamic".
        weights_dir, weights_mirror: where "DEFAULT" weights come from (`WeightsStore`).

    Raises:
        ConfigError, ModelError: bad arguments, an unknown or unexportable model, an
            unwritable destination (one line each).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"export format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    size = parse_input_size(input_size)
    fixed_batch = parse_batch(batch)
    free_size = model in YOLOX_NAMES
    store = WeightsStore(Path(weights_dir) if weights_dir else None, weights_mirror)
    detector = load_detector(
        model, weights=weights, input_size=size if free_size else None, store=store
    )
    if size is not None and size != detector.input.size:
        w, h = detector.input.size
        raise ConfigError(
            f"model {model} runs at {w}x{h} only, got --input {size[0]}x{size[1]}; "
            f"a size can be chosen for {', '.join(YOLOX_NAMES)}"
        )
    return export_onnx(detector, Path(out), batch=fixed_batch)
