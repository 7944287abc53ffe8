"""Any exported ONNX detector through ONNX Runtime: `build("model.onnx")` -> `Detector`.

The output layout (`layouts.py`) and the preparation come from the sidecar TOML beside the
file (`sidecar.py`), else from the graph: a raw YOLOX export gets YOLOX's preparation, an
end-to-end model with an `orig_target_sizes` input (DEIMv2, RT-DETR) a plain stretch to RGB
0-1, a YOLOv8-style output Ultralytics' centred letterbox to RGB 0-1. The layout and the
batch policy given to `build` (the `--onnx-layout` / `--onnx-batch` flags) win over both.

Such a DETR-style end-to-end model's boxes are final (`Detector.final_outputs`: the engine
skips its NMS); other layouts, drivepercept-tiny's end-to-end export included (the torch
model's boxes go through the engine's NMS too), keep it. The sidecar's `nms` says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivepercept.errors import ModelError
from drivepercept.models.base import Detector
from drivepercept.models.classes import coco_driving_view
from drivepercept.models.onnx import layouts
from drivepercept.models.onnx.session import OnnxDetector, open_session, read_graph
from drivepercept.models.onnx.sidecar import BATCH_POLICIES, LAYOUTS, read_sidecar, sidecar_path
from drivepercept.models.yolox_weights import COCO80
from drivepercept.models.yolox_weights import input_spec as yolox_spec
from drivepercept.types import ColorOrder, InputSpec, Interpolation, PadPlacement

__all__ = ["BATCH_POLICIES", "LAYOUTS", "build", "is_onnx"]


def is_onnx(name: str) -> bool:
    """Whether a model name is an ONNX file path."""
    return name.strip().lower().endswith(".onnx")


def build(
    path: str | Path,
    *,
    weights: str | None = None,
    input_size: tuple[int, int] | None = None,
    layout: str | None = None,
    batch: str | None = None,
    trt_cache: str | Path | None = None,
    threads: int = 0,
) -> Detector:
    """The detector an ONNX file holds, on ONNX Runtime (CPU; a GPU's providers on first use
    there, see `session.py`).

    Args:
        path: the `.onnx` file; its sidecar is `<stem>.toml` beside it.
        weights: None or "DEFAULT" (the file carries its weights); anything else is refused.
        input_size: (width, height) for graphs whose image size is dynamic.
        layout: "yolox", "yolov8" or "end2end", over the sidecar's and the graph's.
        batch: "loop" or "refuse" (a batch-1 export given a larger batch), over the sidecar's.
        trt_cache: TensorRT's engine cache folder (default `<stem>.trt-cache` beside the file).
        threads: ORT's intra-op threads on the CPU (0: its default, one per physical core).

    Raises:
        ModelError: no onnxruntime, not an ONNX file, a classifier, an unknown layout, a bad
            sidecar or input size (one line).
    """
    path = Path(path)
    if weights not in (None, "DEFAULT"):
        raise ModelError(
            f"an ONNX model carries its own weights; got weights {weights!r} for {path}"
        )
    if layout is not None and layout not in LAYOUTS:
        raise ModelError(f"ONNX layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if batch is not None and batch not in BATCH_POLICIES:
        raise ModelError(
            f"ONNX batch policy must be one of {', '.join(BATCH_POLICIES)}, got {batch!r}"
        )
    side = read_sidecar(path)
    session = open_session(path, threads=threads)
    graph = read_graph(path, session)
    chosen = layout or side.layout or layouts.recognise(graph)
    if chosen is None:
        raise ModelError(
            f"{path}: unknown output layout ({layouts.describe(graph)}); name it with "
            f'layout = "yolox" | "yolov8" | "end2end" in {sidecar_path(path)}'
        )
    image = graph.image
    fixed = (image.shape[3], image.shape[2])
    size = _size(path, fixed, side.input.get("size") or input_size)
    rows = graph.outputs[0].shape[1] if chosen == "yolox" else None
    raw = chosen == "yolox" and layouts.is_raw_yolox(graph, rows, (size[1], size[0]))
    spec_args = {**_family_spec(chosen, raw, graph), **side.input, "size": size}
    spec = InputSpec(**spec_args)
    classes = side.classes or _default_classes(chosen, graph)
    module = OnnxDetector(
        session,
        graph,
        path=path,
        layout=chosen,
        raw_grid=raw,
        refuse_batches=(batch or side.batch) == "refuse",
        trt_cache=Path(trt_cache) if trt_cache is not None else None,
        threads=threads,
    )
    detr_style = chosen == "end2end" and graph.size_input is not None
    try:
        keep, report_as = coco_driving_view(classes)
    except ModelError:
        keep, report_as = None, None  # not COCO names: every class reported as it is
    return Detector(
        name=str(path),
        module=module.eval(),
        input=spec,
        class_names=classes,
        keep_labels=keep,
        report_as=report_as,
        reduced_precision=(),  # ORT runs the graph's own precision
        final_outputs=not side.nms if side.nms is not None else detr_style,
        runtime=module.describe,
    )


def _size(
    path: Path, fixed: tuple[int | None, int | None], wanted: tuple[int, int] | None
) -> tuple[int, int]:
    if fixed[0] is not None and fixed[1] is not None:
        if wanted is not None and tuple(wanted) != fixed:
            raise ModelError(
                f"{path} is exported for {fixed[0]}x{fixed[1]} input, got {wanted[0]}x{wanted[1]}"
            )
        return (fixed[0], fixed[1])
    if wanted is None:
        raise ModelError(
            f"{path} takes any input size: give one (input size, or size in {sidecar_path(path)})"
        )
    return (int(wanted[0]), int(wanted[1]))


def _family_spec(layout: str, raw_yolox: bool, graph: layouts.Graph) -> dict[str, Any]:
    """The preparation of the family the graph looks like (size filled in by the caller)."""
    if raw_yolox:
        spec = yolox_spec((32, 32))
        keys = ("letterbox", "pad_value", "interpolation", "pad", "channels", "value_range")
        return {k: getattr(spec, k) for k in keys}
    if layout == "end2end":  # DEIMv2 / RT-DETR / D-FINE: stretch, RGB 0-1
        return {
            "letterbox": False,
            "interpolation": Interpolation.BILINEAR,
            "channels": ColorOrder.RGB,
            "value_range": 1.0,
        }
    # Ultralytics (YOLOv5 / v8 / 11): centred letterbox on 114, RGB 0-1
    return {
        "letterbox": True,
        "pad_value": 114,
        "pad": PadPlacement.CENTER,
        "interpolation": Interpolation.BILINEAR,
        "channels": ColorOrder.RGB,
        "value_range": 1.0,
    }


def _default_classes(layout: str, graph: layouts.Graph) -> tuple[str, ...]:
    """COCO-80 for 80-class and end-to-end graphs, else `class<i>`."""
    out = graph.outputs[0].shape
    count = None
    if layout == "yolox" and out[-1] is not None:
        count = out[-1] - 5
    elif layout == "yolov8" and out[1] is not None:
        count = out[1] - 4
    if count is None or count == len(COCO80):
        return COCO80
    return tuple(f"class{i}" for i in range(count))
