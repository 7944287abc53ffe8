"""The sidecar TOML beside an ONNX file (`model.onnx` -> `model.toml`): its layout, class names
and preparation, in one fixed schema. This module is the format's one owner: `Sidecar` is
read here (`read_sidecar`) and written here (`Sidecar.of(detector, layout).write(model)`, what
`export`, `quantize` and the export cache use).

```toml
schema = 1
layout = "yolox"            # yolox | yolov8 | end2end
classes = ["person", ...]   # label order, or a names file (one a line) relative to the sidecar
batch = "loop"              # fixed-batch exports: loop over the images (default) or refuse
nms = false                 # the outputs are final (default: true, except DETR-style end2end)
[input]                     # InputSpec's fields by name
size = [416, 416]           # width, height
letterbox = true
pad = "center"              # center | top-left
pad_value = 114
interpolation = "bilinear"  # bilinear | area
channels = "bgr"            # rgb | bgr
value_range = 255.0
mean = [0.0, 0.0, 0.0]
std = [1.0, 1.0, 1.0]
```

Every key is optional; an unknown key is an error that names it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivepercept.errors import ModelError
from drivepercept.types import ColorOrder, InputSpec, Interpolation, PadPlacement

if TYPE_CHECKING:
    from drivepercept.models.base import Detector

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCHEMA = 1
LAYOUTS: tuple[str, ...] = ("yolox", "yolov8", "end2end")
BATCH_POLICIES: tuple[str, ...] = ("loop", "refuse")
TOP_KEYS = frozenset({"schema", "layout", "classes", "batch", "nms", "input"})
INPUT_KEYS = frozenset(f.name for f in fields(InputSpec))  # the [input] table's keys


@dataclass(frozen=True)
class Sidecar:
    """What a sidecar says (None / empty where it is silent).

    Attributes:
        path: the file read (None: no sidecar).
        layout: one of `LAYOUTS`.
        classes: class names in label order.
        batch: "loop" or "refuse" for fixed-batch exports.
        nms: whether the engine's NMS runs on the outputs (None: the backend decides).
        input: `InputSpec` keyword arguments, already converted to its types.
    """

    path: Path | None = None
    layout: str | None = None
    classes: tuple[str, ...] | None = None
    batch: str = "loop"
    nms: bool | None = None
    input: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, detector: Detector, layout: str) -> Sidecar:
        """What a file exported from `detector` in `layout` needs: its class names and its
        whole `InputSpec`."""
        spec = detector.input
        prepared = {f.name: getattr(spec, f.name) for f in fields(InputSpec)}
        return cls(layout=layout, classes=tuple(detector.class_names), input=prepared)

    def over(self, base: Sidecar) -> Sidecar:
        """This sidecar's keys, and `base`'s where this one is silent (a quantized file keeps
        its float file's batch policy and NMS switch)."""
        return Sidecar(
            path=self.path,
            layout=self.layout if self.layout is not None else base.layout,
            classes=self.classes if self.classes is not None else base.classes,
            batch=self.batch if self.batch != "loop" else base.batch,
            nms=self.nms if self.nms is not None else base.nms,
            input={**base.input, **self.input},
        )

    def to_toml(self) -> str:
        """The TOML text, written with tomli-w (hand-rolled TOML quoting is an easy place for
        bugs); keys this sidecar is silent on are left out, so that a reader's defaults apply."""
        import tomli_w

        table: dict[str, Any] = {"schema": SCHEMA}
        if self.layout is not None:
            table["layout"] = self.layout
        if self.classes is not None:
            table["classes"] = list(self.classes)
        if self.batch != "loop":
            table["batch"] = self.batch
        if self.nms is not None:
            table["nms"] = self.nms
        if self.input:
            table["input"] = {key: _toml_value(value) for key, value in self.input.items()}
        return tomli_w.dumps(table)

    def write(self, model: Path) -> Path:
        """Writes the sidecar beside `model`; its path.

        Raises:
            ModelError: the file cannot be written (one line).
        """
        path = sidecar_path(model)
        try:
            path.write_text(self.to_toml(), encoding="utf-8")
        except OSError as exc:
            raise ModelError(f"cannot write {path}: {exc.strerror or exc}") from None
        return path


def _toml_value(value: Any) -> Any:
    """An `InputSpec` value as TOML holds it (enums by value, tuples as arrays)."""
    if isinstance(value, (PadPlacement, Interpolation, ColorOrder)):
        return value.value
    if isinstance(value, tuple):
        return [_toml_value(v) for v in value]
    return value


def sidecar_path(model: Path) -> Path:
    """`dir/model.onnx` -> `dir/model.toml`."""
    return model.with_suffix(".toml")


def read_sidecar(model: Path) -> Sidecar:
    """The sidecar beside `model`, or an empty `Sidecar` when there is none.

    Raises:
        ModelError: unreadable TOML, an unknown key, or a value of the wrong kind (one line,
            naming the file and the key).
    """
    path = sidecar_path(model)
    if not path.is_file():
        return Sidecar()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ModelError(f"sidecar {path}: not readable TOML ({exc})") from None
    return parse_sidecar(raw, path)


def parse_sidecar(raw: dict[str, Any], path: Path) -> Sidecar:
    """A parsed TOML table -> `Sidecar` (see `read_sidecar`)."""
    where = f"sidecar {path}"
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ModelError(
            f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(sorted(TOP_KEYS))}"
        )
    schema = raw.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise ModelError(f"{where}: schema must be {SCHEMA}, got {schema!r}")
    layout = raw.get("layout")
    if layout is not None and layout not in LAYOUTS:
        raise ModelError(f"{where}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    batch = raw.get("batch", "loop")
    if batch not in BATCH_POLICIES:
        raise ModelError(
            f"{where}: batch must be one of {', '.join(BATCH_POLICIES)}, got {batch!r}"
        )
    nms = raw.get("nms")
    if nms is not None and not isinstance(nms, bool):
        raise ModelError(f"{where}: nms must be true or false, got {nms!r}")
    table = raw.get("input", {})
    if not isinstance(table, dict):
        raise ModelError(f"{where}: [input] must be a table, got {table!r}")
    bad = sorted(set(table) - INPUT_KEYS)
    if bad:
        raise ModelError(
            f"{where}: unknown key 'input.{bad[0]}'; [input] keys: {', '.join(sorted(INPUT_KEYS))}"
        )
    return Sidecar(
        path=path,
        layout=layout,
        classes=_classes(raw.get("classes"), path),
        batch=batch,
        nms=nms,
        input={key: _input_value(key, value, where) for key, value in table.items()},
    )


def _classes(value: object, path: Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, str):
        names_file = path.parent / value
        try:
            lines = names_file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ModelError(f"sidecar {path}: classes file {names_file}: {exc.strerror}") from None
        names = tuple(line.strip() for line in lines if line.strip())
        if names:
            return names
    raise ModelError(
        f"sidecar {path}: classes must be a list of names or a names file, got {value!r}"
    )


def _input_value(key: str, value: Any, where: str) -> Any:
    """One [input] value converted to what `InputSpec` takes."""
    try:
        if key == "size":
            _need(isinstance(value, list) and len(value) == 2)
            _need(all(isinstance(v, int) and not isinstance(v, bool) for v in value))
            return (int(value[0]), int(value[1]))
        if key == "letterbox":
            _need(isinstance(value, bool))
            return value
        if key == "pad":
            _need(isinstance(value, str))
            return PadPlacement(value.replace("_", "-"))
        if key == "interpolation":
            _need(isinstance(value, str))
            return Interpolation(value)
        if key == "channels":
            _need(isinstance(value, str))
            return ColorOrder(value.lower())
        if key == "value_range":
            _need(isinstance(value, (int, float)) and not isinstance(value, bool))
            return float(value)
        if key in ("mean", "std"):
            _need(isinstance(value, list) and len(value) == 3)
            return tuple(float(v) for v in value)
        if key == "pad_value":
            if isinstance(value, list):
                return tuple(int(v) for v in value)
            _need(isinstance(value, int) and not isinstance(value, bool))
            return value
    except (ValueError, TypeError):
        pass
    raise ModelError(f"{where}: input.{key} = {value!r} is not valid ({_EXPECTED[key]})")


def _need(condition: bool) -> None:
    if not condition:
        raise ValueError("bad value")


_EXPECTED = {
    "size": "[width, height]",
    "letterbox": "true or false",
    "pad": "center or top-left",
    "interpolation": "bilinear or area",
    "channels": "rgb or bgr",
    "value_range": "1.0 or 255.0",
    "mean": "three numbers",
    "std": "three numbers",
    "pad_value": "0..255, one or three",
}
