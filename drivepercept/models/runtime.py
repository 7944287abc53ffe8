"""Which runtime runs a detector: the fastest for the device, by one rule.

`runtime = "auto"` (the default):

* on a CPU, a registered model that exports cleanly (drivepercept-tiny, the YOLOX family:
  `export.exportable`) runs on ONNX Runtime in fp32, from an export made once into the cache
  (`export_cache.py`). Measured on the 2-core machine, yolox-nano at 416x416, six real
  streams: 83-91 pipeline frames/s on ORT against 63-67 on torch. It stays on torch, with one
  log line saying why, where the export cannot help: a model that does not export
  (torchvision's detectors, plugins), onnxruntime or onnx missing, torch-only speed options
  asked for (compile, CUDA graphs), fp16 (ORT runs the fp32 export), an export or cache that
  fails;
* on a CPU with precision bf16 and bf16 units (AVX-512 BF16, AMX), the same cached export
  runs on OpenVINO in bfloat16 where the openvino package is installed (the `[openvino]`
  extra), else on torch's autocast (with a warning naming the extra). Measured as above:
  104-105 pipeline frames/s on OpenVINO bf16, 83-91 on torch bf16. OpenVINO's fp32 is no
  clear win over ORT's (96-97 model-only frames/s against 86-92, 79 pipeline against 83-91):
  fp32 stays on ORT;
* on a GPU, torch, unless TensorRT is installed (then ORT's TensorRT provider, on the same
  cached export, fp32 only);
* an `.onnx` model runs on ORT, or on OpenVINO where the rule above picks it
  (`runtime = "torch"` with one is an error).

`runtime = "torch"` is always torch; `runtime = "onnxruntime"` and `runtime = "openvino"` are
that runtime or a one-line `ModelError` saying why not (openvino: the CPU only, fp32 or
bf16). Random weights ("none") are exported into a temporary folder removed with the
detector, not into the cache: a fresh draw is never seen again.

The exported detector keeps the torch one's name, class names, class filter and renaming,
input preparation and NMS policy, so a run's outputs do not depend on the runtime beyond float
noise (and, in bf16, bfloat16's rounding).
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
from drivepercept.models.export_cache import CachedExport, ExportCache
from drivepercept.models.onnx import openvino, providers
from drivepercept.models.onnx.session import OnnxDetector
from drivepercept.types import RUNTIMES

log = logging.getLogger(__name__)

AUTO, TORCH, ORT, OPENVINO = "auto", "torch", "onnxruntime", "openvino"


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


def for_onnx_file(detector: Detector, request: RuntimeRequest) -> Detector:
    """An `.onnx` model's detector with its choice: ORT, or OpenVINO where asked for (or, on
    auto, for bf16 on a CPU that has it), never torch.

    Raises:
        ModelError: runtime "torch" (an ONNX file has no torch network), or "openvino" where
            it cannot run.
    """
    asked = check_runtime(request.runtime)
    if asked == TORCH:
        raise ModelError(
            f"runtime torch cannot run an .onnx model ({detector.name}); use auto, "
            "onnxruntime or openvino"
        )
    if _target(request) == OPENVINO:
        why_not = _why_not_openvino(request)
        if why_not is None:
            return _on_openvino(detector, request, None)
        if asked == OPENVINO:
            raise ModelError(f"runtime openvino: {why_not}")
        log.log(
            _level(why_not), "runtime auto: %s runs on ONNX Runtime: %s", detector.name, why_not
        )
    choice = RuntimeChoice(asked, ORT, "an .onnx model runs on ONNX Runtime")
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
    target = _target(request)
    why_not = _why_not_exported(detector, request, target)
    if why_not is not None:
        if asked != AUTO:
            raise ModelError(f"runtime {asked}: {why_not}")
        log.log(_level(why_not), "runtime auto: %s runs on torch: %s", detector.name, why_not)
        return _torch(detector, asked, why_not)
    try:
        return _exported(detector, request, target)
    except Exception as exc:  # the exporter and ORT raise their own kinds: any is a fallback
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        why = f"export to ONNX failed ({first or type(exc).__name__})"
        if asked != AUTO:
            raise ModelError(f"runtime {asked}: {why}") from None
        log.warning("runtime auto: %s runs on torch: %s", detector.name, why)
        return _torch(detector, asked, why)


def _target(request: RuntimeRequest) -> str:
    """The exported graph's runtime `request` asks for: auto's is OpenVINO for bf16 on a CPU
    (the one that runs bfloat16 natively there), else ORT."""
    if request.runtime != AUTO:
        return request.runtime
    return OPENVINO if request.device_type == "cpu" and request.precision == "bf16" else ORT


def _level(why_not: str) -> int:
    # a model or option that is torch's by design is a choice (-v shows it); a missing
    # package is a broken install, said at once
    return logging.WARNING if "not installed" in why_not else logging.INFO


def _torch(detector: Detector, asked: str, reason: str) -> Detector:
    return dataclasses.replace(detector, runtime_choice=RuntimeChoice(asked, TORCH, reason))


def _why_not_exported(detector: Detector, request: RuntimeRequest, target: str) -> str | None:
    """Why the detector cannot (or, for auto, should not) run exported on `target`; None
    when it can."""
    try:  # what exports is the exporter's to say (it knows each family's layout)
        export.exportable(detector)
    except ModelError as exc:
        return str(exc)
    for package in ("onnxruntime", "onnx"):  # the export and its graph's reading need both
        if importlib.util.find_spec(package) is None:
            return f"the {package} package is not installed (pip install {package})"
    for flag, asked in (("compile", request.compile), ("cuda_graphs", request.cuda_graphs)):
        if asked:
            return f"{flag} is a torch option"
    if target == OPENVINO:
        return _why_not_openvino(request)
    if request.precision != "fp32":
        return f"precision {request.precision} runs on torch (ONNX Runtime runs the fp32 export)"
    on_gpu = request.device_type == "cuda" and request.runtime == AUTO
    if on_gpu and not (providers.tensorrt_installed() and _ort_offers(providers.TENSORRT)):
        return "on a GPU torch is the faster runtime without TensorRT"
    return None


def _why_not_openvino(request: RuntimeRequest) -> str | None:
    """Why OpenVINO cannot run the graph here; None when it can."""
    if request.device_type != "cpu":
        return f"OpenVINO runs on the CPU here, not on {request.device_type}"
    if not openvino.installed():
        return f"the openvino package is not installed ({openvino.INSTALL_HINT})"
    if request.precision not in openvino.PRECISIONS:
        return f"OpenVINO runs precision fp32 or bf16 on a CPU, not {request.precision}"
    if request.precision == "bf16" and not openvino.cpu_has_bf16():
        return "this CPU has no bf16 units (AVX-512 BF16 or AMX) for OpenVINO's bf16"
    return None


def _ort_offers(provider: str) -> bool:
    import onnxruntime  # type: ignore[import-untyped]

    return provider in onnxruntime.get_available_providers()


def _exported(detector: Detector, request: RuntimeRequest, target: str) -> Detector:
    """The detector on `target` from the cached export (re-exported once if the file does not
    load).

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
    kept = dataclasses.replace(
        ort,
        name=detector.name,
        input=detector.input,
        class_names=detector.class_names,
        keep_labels=detector.keep_labels,
        report_as=detector.report_as,
        final_outputs=detector.final_outputs,
    )
    try:
        if target == OPENVINO:
            return _on_openvino(kept, request, entry)
    finally:
        _let_go(temporary, folder, request, kept)
    reason = (
        "asked for"
        if request.runtime == ORT
        else "TensorRT is installed: ORT's TensorRT provider"
        if request.device_type == "cuda"
        else "exportable model on a CPU: ONNX Runtime is the faster runtime"
    )
    choice = RuntimeChoice(request.runtime, ORT, reason, onnx=entry.onnx, export_s=entry.export_s)
    log.info("runtime %s: %s runs on ONNX Runtime (%s)", request.runtime, detector.name, entry.onnx)
    return dataclasses.replace(kept, runtime_choice=choice)


def _let_go(temporary: bool, folder: Path, request: RuntimeRequest, detector: Detector) -> None:
    """A temporary export folder goes once the sessions hold the model (on a CPU: at once, as
    the CLI ends with os._exit, which runs no finalizer); a GPU session opens the file on
    first use, so there the folder goes with the detector."""
    if not temporary:
        return
    if request.device_type != "cuda":
        shutil.rmtree(folder, ignore_errors=True)
    else:
        weakref.finalize(detector.module, shutil.rmtree, folder, True)


def _on_openvino(
    detector: Detector, request: RuntimeRequest, entry: CachedExport | None
) -> Detector:
    """The ORT-built `detector` with its CPU batches on an OpenVINO session of the same file
    (`entry`'s export, or the `.onnx` model itself where None).

    Raises:
        ModelError: OpenVINO cannot read or run the file.
    """
    module = detector.module
    assert isinstance(module, OnnxDetector)
    session = openvino.OpenVinoSession(
        module.path, threads=request.threads, precision=request.precision
    )
    module.run_cpu_on(session)
    reason = (
        "asked for"
        if request.runtime == OPENVINO
        else "precision bf16 on a CPU with bf16 units: OpenVINO runs it natively"
    )
    choice = RuntimeChoice(
        request.runtime,
        OPENVINO,
        reason,
        onnx=entry.onnx if entry is not None else None,
        export_s=entry.export_s if entry is not None else None,
    )
    log.info("runtime %s: %s runs on OpenVINO (%s)", request.runtime, detector.name, module.path)
    return dataclasses.replace(detector, runtime_choice=choice)
