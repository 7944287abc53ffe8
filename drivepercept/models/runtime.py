"""Which runtime runs a detector: the fastest for the device, by one rule.

`runtime = "auto"` (the default):

* on a CPU, a registered model that exports cleanly (drivepercept-tiny, the YOLOX family:
  `export.exportable`) runs on ONNX Runtime, from an export made once into the cache
  (`export_cache.py`). Measured on the 2-core machine, yolox-nano: 129-131 pipeline frames/s
  on ORT against 81-83 on torch. It stays on torch, with one log line saying why, where the
  export cannot help: a model that does not export (torchvision's detectors, plugins),
  onnxruntime or onnx missing, torch-only speed options asked for (compile, CUDA graphs), a
  precision other than fp32 (the export is fp32), an export or cache that fails;
* on a GPU, torch, unless TensorRT is installed (then ORT's TensorRT provider, on the same
  cached export, fp32 only);
* an `.onnx` model always runs on ORT (`runtime = "torch"` with one is an error).

`runtime = "torch"` is always torch; `runtime = "onnxruntime"` is ORT or a one-line
`ModelError` saying why not. Random weights ("none") are exported into a temporary folder
removed with the detector, not into the cache: a fresh draw is never seen again.

The ORT detector keeps the torch one's name, class names, class filter and renaming, input
preparation and NMS policy, so a run's outputs do not depend on the runtime beyond float noise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from drivepercept.errors import ModelError
from drivepercept.models import export, onnx
from drivepercept.models.base import Detector, RuntimeChoice
from drivepercept.models.export_cache import ExportCache
from drivepercept.models.onnx import providers
from drivepercept.types import RUNTIMES

log = logging.getLogger(__name__)

TORCH, ORT = "torch", "onnxruntime"


@dataclass(frozen=True)
class RuntimeRequest:
    """What the choice depends on besides the model.

    Attributes:
        runtime: one of `RUNTIMES`.
        device_type: the engine's device type ("cpu", "cuda").
        precision: "fp32", "fp16" or "bf16".
        compile, cuda_graphs: torch-only speed options asked for.
        threads: ORT's intra-op threads (0: its default, one per physical core).
        cache: the export cache folder; None exports into a temporary folder (not kept).
        random_weights: the weights are a random draw (not cached, see the module docstring).
    """

    runtime: str = "auto"
    device_type: str = "cpu"
    precision: str = "fp32"
    compile: bool = False
    cuda_graphs: bool = False
    threads: int = 0
    cache: Path | None = None
    random_weights: bool = False


def check_runtime(runtime: str) -> str:
    """`runtime` if it is one of `RUNTIMES`.

    Raises:
        ModelError: it is not.
    """
    if runtime not in RUNTIMES:
        raise ModelError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    return runtime


def for_onnx_file(detector: Detector, runtime: str) -> Detector:
    """An `.onnx` model's detector with its choice: ORT whatever was asked, except torch.

    Raises:
        ModelError: runtime "torch" (an ONNX file has no torch network).
    """
    if check_runtime(runtime) == TORCH:
        raise ModelError(
            f"runtime torch cannot run an .onnx model ({detector.name}); use auto or onnxruntime"
        )
    choice = RuntimeChoice(runtime, ORT, "an .onnx model runs on ONNX Runtime")
    return dataclasses.replace(detector, runtime_choice=choice)


def choose_runtime(detector: Detector, request: RuntimeRequest) -> Detector:
    """The detector on the runtime `request` asks for (see the module docstring): the torch
    `detector` itself, or an ORT one made from its export.

    Raises:
        ModelError: runtime "onnxruntime" and it cannot run there, or an unknown runtime.
    """
    asked = check_runtime(request.runtime)
    if asked == TORCH:
        return _torch(detector, asked, "asked for")
    why_not = _why_not_ort(detector, request)
    if why_not is not None:
        if asked == ORT:
            raise ModelError(f"runtime onnxruntime: {why_not}")
        # a model or option that is torch's by design is a choice (-v shows it); a missing
        # package is a broken install, said at once
        level = logging.WARNING if "not installed" in why_not else logging.INFO
        log.log(level, "runtime auto: %s runs on torch: %s", detector.name, why_not)
        return _torch(detector, asked, why_not)
    try:
        return _on_ort(detector, request)
    except Exception as exc:  # the exporter and ORT raise their own kinds: any is a fallback
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        why = f"export to ONNX failed ({first or type(exc).__name__})"
        if asked == ORT:
            raise ModelError(f"runtime onnxruntime: {why}") from None
        log.warning("runtime auto: %s runs on torch: %s", detector.name, why)
        return _torch(detector, asked, why)


def _torch(detector: Detector, asked: str, reason: str) -> Detector:
    return dataclasses.replace(detector, runtime_choice=RuntimeChoice(asked, TORCH, reason))


def _why_not_ort(detector: Detector, request: RuntimeRequest) -> str | None:
    """Why the detector cannot (or, for auto, should not) run on ORT; None when it can."""
    try:  # what exports is the exporter's to say (it knows each family's layout)
        export.exportable(detector)
    except ModelError as exc:
        return str(exc)
    for package in ("onnxruntime", "onnx"):
        if importlib.util.find_spec(package) is None:
            return f"the {package} package is not installed (pip install {package})"
    for flag, asked in (("compile", request.compile), ("cuda_graphs", request.cuda_graphs)):
        if asked:
            return f"{flag} is a torch option"
    if request.precision != "fp32":
        return f"precision {request.precision} runs on torch (the ONNX export is fp32)"
    on_gpu = request.device_type == "cuda" and request.runtime == "auto"
    if on_gpu and not (providers.tensorrt_installed() and _ort_offers(providers.TENSORRT)):
        return "on a GPU torch is the faster runtime without TensorRT"
    return None


def _ort_offers(provider: str) -> bool:
    import onnxruntime  # type: ignore[import-untyped]

    return provider in onnxruntime.get_available_providers()


def _on_ort(detector: Detector, request: RuntimeRequest) -> Detector:
    """The ORT detector from the cached export (re-exported once if the file does not load).

    Raises:
        ModelError, OSError: the export or the cache failed (or whatever the exporter raises).
    """
    temporary = request.cache is None or request.random_weights
    folder = Path(tempfile.mkdtemp(prefix="drivepercept-onnx-")) if temporary else request.cache
    assert folder is not None
    cache = ExportCache(folder)
    entry = cache.get(detector)
    try:
        ort = onnx.build(entry.onnx, threads=request.threads)
    except ModelError as exc:  # a corrupt or cut-short entry: exported again, once
        log.warning("ONNX cache entry %s does not load (%s); exporting it again", entry.onnx, exc)
        cache.discard(entry.onnx)
        entry = cache.get(detector, refresh=True)
        ort = onnx.build(entry.onnx, threads=request.threads)
    if temporary and request.device_type != "cuda":
        # the CPU session holds the model in memory: the file is not needed again (and the
        # CLI ends with os._exit, which runs no finalizer)
        shutil.rmtree(folder, ignore_errors=True)
    elif temporary:  # a GPU session opens the file on first use: it goes with the detector
        weakref.finalize(ort.module, shutil.rmtree, folder, True)
    reason = (
        "TensorRT is installed: ORT's TensorRT provider"
        if request.device_type == "cuda"
        else "exportable model on a CPU: ONNX Runtime is the faster runtime"
    )
    choice = RuntimeChoice(request.runtime, ORT, reason, onnx=entry.onnx, export_s=entry.export_s)
    log.info("runtime %s: %s runs on ONNX Runtime (%s)", request.runtime, detector.name, entry.onnx)
    return dataclasses.replace(
        ort,
        name=detector.name,
        input=detector.input,
        class_names=detector.class_names,
        keep_labels=detector.keep_labels,
        report_as=detector.report_as,
        final_outputs=detector.final_outputs,
        runtime_choice=choice,
    )
