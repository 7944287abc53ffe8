"""bench_peer's network on ONNX Runtime: the settled and calibrated YOLOv8n exported once to
an ONNX file that each tool runs through its own documented ONNX path.

* Ultralytics: `YOLO("x.onnx", task="detect")`. Its `AutoBackend` reads the export's
  `metadata_props` (stride, task, batch, imgsz, names, args) as its own exporter writes them
  (`engine/exporter.py`); the file is exported as that exporter does with `dynamic=True`
  (dynamic batch, height and width, the head decoding its anchors in the graph), so the
  peer letterboxes and batches the streams as it does for the torch network.
* drivepercept: `--model x.onnx`, with the sidecar `x.toml` beside it: layout `yolov8`, the
  class names and the torch `Detector`'s own `InputSpec` (the same letterbox).

Ultralytics' ONNX backend opens its ORT session without options (ORT's default threads, one
per physical core) and has no setting for them; `peer_ort_threads` gives it session options
with the threads drivepercept runs on, for the matched rounds.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivepercept.models.base import Detector

OPSET = 17


def ultralytics_metadata(
    *, version: str, stride: int, imgsz: int, names: Sequence[str]
) -> dict[str, Any]:
    """The metadata Ultralytics' exporter writes into an ONNX detection export with
    `dynamic=True`, `batch=1`, no NMS, fp32 (values as Python objects: `write_metadata`
    stores them as `str(value)`, as the exporter does, and AutoBackend reads them back with
    `ast.literal_eval`)."""
    return {
        "description": "Ultralytics YOLOv8n model (bench_peer: yolov8n.yaml, settled, calibrated)",
        "author": "Ultralytics",
        "version": version,
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "stride": stride,
        "task": "detect",
        "head": "Detect",
        "batch": 1,
        "imgsz": [imgsz, imgsz],
        "names": dict(enumerate(names)),
        "args": {
            "batch": 1,
            "half": False,
            "dynamic": True,
            "simplify": False,
            "opset": OPSET,
            "nms": False,
        },
        "channels": 3,
        "end2end": False,
    }


def export_onnx(
    net: Any, detector: Detector, folder: Path, *, version: str
) -> tuple[Path, dict[str, Any]]:
    """`net` (the finished Ultralytics DetectionModel; not changed) -> `folder/yolov8n.onnx`
    with Ultralytics' metadata and drivepercept's sidecar `yolov8n.toml` beside it; the path
    and the metadata written."""
    import onnx
    import torch

    from drivepercept.models.onnx.sidecar import Sidecar

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "yolov8n.onnx"
    model = copy.deepcopy(net).float().eval().to(memory_format=torch.contiguous_format)
    head = model.model[-1]
    head.dynamic, head.export, head.format, head.shape = True, True, "onnx", None
    w, h = detector.input.size
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, h, w),),
            str(path),
            input_names=["images"],
            output_names=["output0"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,  # the TorchScript exporter, as Ultralytics' own export uses
        )
    metadata = ultralytics_metadata(
        version=version,
        stride=int(max(model.stride)),
        imgsz=h,
        names=detector.class_names,
    )
    written = onnx.load(str(path))
    for key, value in metadata.items():
        prop = written.metadata_props.add()
        prop.key, prop.value = key, str(value)
    onnx.save(written, str(path))
    Sidecar.of(detector, "yolov8").write(path)
    return path, metadata


@contextlib.contextmanager
def peer_ort_threads(threads: int) -> Iterator[None]:
    """Within the block, Ultralytics' ONNX backend opens its ORT session with `threads`
    intra-op threads (its `session_options` argument, which AutoBackend never passes)."""
    import onnxruntime  # type: ignore[import-untyped]

    autobackend = importlib.import_module("ultralytics.nn.autobackend").AutoBackend
    original = autobackend._BACKEND_MAP
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    onnx_backend = functools.partial(original["onnx"], session_options=options)
    autobackend._BACKEND_MAP = {**original, "onnx": onnx_backend}
    try:
        yield
    finally:
        autobackend._BACKEND_MAP = original


def session_threads(yolo: Any) -> int:
    """The intra-op threads of the ORT session Ultralytics opened for `yolo`'s predictor
    (0: ORT's default, one per physical core; -1: no session found)."""
    backend = getattr(getattr(getattr(yolo, "predictor", None), "model", None), "backend", None)
    session = getattr(backend, "session", None)
    if session is None:
        return -1
    return int(session.get_session_options().intra_op_num_threads)
