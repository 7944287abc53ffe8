"""The ONNX export cache: a registered model exported once per weights, size and version, and
reused by every later run (`models/runtime.py` runs it on ONNX Runtime).

An entry is `<model>-<W>x<H>-<key>.onnx` with its sidecar `<model>-<W>x<H>-<key>.toml`, where
the key hashes everything the file depends on: the model's name and module class, its weights
(the state dict's tensors, so the key follows the weights actually loaded, whatever file or
download they came from), its `InputSpec`, the class names, the dynamic batch (one file serves
any batch), fp32, the export's schema and opset, and the drivepercept, torch and onnx versions
(the exporter and the package writing the file). ONNX Runtime's version is not in the key: it
reads any file of the opset.

Entries are written atomically: the export goes to a private temporary folder inside the cache,
then the sidecar and, last, the model file are renamed into place (`Path.replace`), so a reader
that finds `<entry>.onnx` finds its sidecar too and never a half-written file; two processes
exporting the same entry at once both write identical files, and the last rename wins. Nothing
here reads the environment: the folder is given (`run/options.py` says which by default).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from drivepercept import __version__
from drivepercept.models import export
from drivepercept.models.base import Detector
from drivepercept.models.onnx import sidecar

log = logging.getLogger(__name__)

CACHE_SCHEMA = 1  # bump when an entry's content changes for the same key
BATCH = "dynamic"
PRECISION = "fp32"


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 of the module's state dict: names, dtypes, shapes and bytes of every tensor."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def entry_key(detector: Detector) -> str:
    """What the exported file depends on, hashed (see the module docstring)."""
    import onnx

    parts = [
        f"cache={CACHE_SCHEMA}",
        f"schema={sidecar.SCHEMA}",
        f"opset={export.OPSET}",
        f"drivepercept={__version__}",
        f"torch={torch.__version__}",
        f"onnx={onnx.__version__}",
        f"model={detector.name}",
        f"module={type(detector.module).__qualname__}",
        f"input={detector.input!r}",
        f"classes={','.join(detector.class_names)}",
        f"batch={BATCH}",
        f"precision={PRECISION}",
        f"weights={weights_digest(detector.module)}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class CachedExport:
    """An entry of the cache.

    Attributes:
        onnx: the model file (its sidecar is `<stem>.toml` beside it).
        export_s: seconds the export took, when it was made now; None when it was found.
    """

    onnx: Path
    export_s: float | None


class ExportCache:
    """The folder of exported models (made on first write)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path(self, detector: Detector) -> Path:
        """The entry's model file for `detector` (there or not)."""
        w, h = detector.input.size
        return self.folder / f"{detector.name}-{w}x{h}-{entry_key(detector)}.onnx"

    def get(self, detector: Detector, *, refresh: bool = False) -> CachedExport:
        """The detector's entry: found, or exported now (again, with `refresh`: a file that
        did not load).

        Raises:
            ModelError: the model cannot be exported.
            OSError: the folder cannot be made or written.
        """
        target = self.path(detector)
        side = sidecar.sidecar_path(target)
        if not refresh and target.is_file() and side.is_file():
            return CachedExport(target, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=self.folder))
        try:
            done = export.export_onnx(detector, staging / "model.onnx", batch=None)
            done.sidecar.replace(side)  # the sidecar first: the .onnx marks it complete
            done.onnx.replace(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        elapsed = time.perf_counter() - started
        log.info("exported %s to the ONNX cache in %.1f s: %s", detector.name, elapsed, target)
        return CachedExport(target, elapsed)

    def discard(self, onnx: Path) -> None:
        """Remove an entry (a file that does not load), both files; missing ones are fine."""
        for path in (onnx, sidecar.sidecar_path(onnx)):
            path.unlink(missing_ok=True)
