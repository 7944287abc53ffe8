"""The ONNX Runtime session behind an exported detector, as a `torch.nn.Module`.

The module takes the engine's normalised float batch (B, 3, H, W) and hands back the per-image
dicts of the `Detector` contract, on the batch's device. A batch on the CPU runs on the CPU
provider (numpy in, numpy out). A batch on a GPU runs, where onnxruntime offers CUDA (or
TensorRT, `providers.py`), in a session made on first use for that GPU on the stream current
then (the engine's compute stream: the warm-up comes first), through IO binding
(`binding.py`): no host round trip, no wait for the device. Without a GPU provider the batch
goes through host memory to the CPU session.

On the CPU the engine's lanes may run it from several threads at once (`use_lanes`): each
lane's batch then runs in a session of the lane's own intra-op threads (one: in the lane
thread itself, sessions shared), instead of one batch on a team of ORT threads that wait for
each other at every operator's end and spin for the next. Measured on the 2-core host with
bench_peer's YOLOv8n at 320, batches of 6, the model alone, 5 runs: median 52.4 frames/s
(42-57) in two lanes of one thread against 42.8 (42-46) for one session on two
(docs/BENCHMARKS.md, "ONNX Runtime lanes"). A one-thread lane runs its batch an image at a
time: yolox-nano at 512x288, two lanes, 6 interleaved rounds, 86.6 frames/s at one image a
run against 79.9 at three and 73.1 at six (its activations then stay in the core's caches).
"""

from __future__ import annotations

import logging
import queue
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from drivepercept.errors import ModelError
from drivepercept.models.onnx import layouts
from drivepercept.models.onnx import providers as eps
from drivepercept.models.onnx.binding import DeviceRun
from drivepercept.models.onnx.layouts import Dim, Graph, Port
from drivepercept.models.onnx.openvino import OpenVinoSession

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install onnxruntime"
SPINNING = "session.intra_op.allow_spinning"  # ORT's session config keys
STOP_SPINNING = "session.force_spinning_stop"
CPU = eps.CPU


def import_ort() -> Any:
    """The onnxruntime module.

    Raises:
        ModelError: it is not installed.
    """
    try:
        import onnxruntime  # type: ignore[import-untyped]
    except ImportError:
        raise ModelError(f"running ONNX models needs onnxruntime: {INSTALL_HINT}") from None
    return onnxruntime


def open_session(path: Path, providers: list[Any] | None = None, *, threads: int = 0) -> Any:
    """An `InferenceSession` for the file (CPU unless `providers` says otherwise), on
    `threads` intra-op threads (0: ORT's default, one per physical core), which spin between
    the operators of a run and sleep once it ends. The engine's CPU lanes and torch's thread
    count are torch's; this is the same setting for ORT.

    Raises:
        ModelError: onnxruntime missing, file missing, or not an ONNX model it can load.
    """
    ort = import_ort()
    if not path.is_file():
        raise ModelError(f"ONNX model file not found: {path}")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT's warnings are not the user's
    if threads > 0:
        options.intra_op_num_threads = threads
    # ORT's intra-op threads spin while they wait for the next operator, and by default go on
    # spinning after the run, on cores that the decoders, the batcher and the post-processing
    # of the last batch need. Spinning inside a run and stopping at its end: the step 15 %
    # faster than no spinning, the pipeline 8-14 % (docs/BENCHMARKS.md, "Glue on one torch
    # thread, ORT spinning within a run"); left spinning after the run, the pipeline loses
    # 0-9 % of that on two cores.
    options.add_session_config_entry(SPINNING, "1")
    options.add_session_config_entry(STOP_SPINNING, "1")
    try:
        return ort.InferenceSession(str(path), options, providers=providers or [CPU])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... for any bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{path} is not an ONNX model onnxruntime can load ({first[:160]})"
        ) from None


def read_graph(path: Path, session: Any) -> Graph:
    """The graph's ports (from the session) and operator types (from the onnx package, when
    installed; without it `ops` is empty)."""

    def ports(items: list[Any]) -> tuple[Port, ...]:
        return tuple(
            Port(p.name, tuple(_dim(d) for d in (p.shape or ())), str(p.type)) for p in items
        )

    ops: frozenset[str] = frozenset()
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        ops = frozenset(n.op_type for n in model.graph.node)
    except Exception:  # no onnx package or an odd file: the heuristics do without
        pass
    return Graph(ports(session.get_inputs()), ports(session.get_outputs()), ops)


def _dim(d: object) -> Dim:
    return d if isinstance(d, int) and d > 0 else None


class OnnxDetector(nn.Module):
    """An ONNX Runtime session with the decoding of its output layout.

    A fixed-batch export (batch dimension 1) runs a batch as a loop over its images, one
    session run each, unless `refuse_batches` (then a batch of more than one image is a
    `ModelError`). An `orig_target_sizes`-style input gets the model input's (width, height),
    so the boxes come back in model-input pixels, as the engine expects. `trt_cache` is
    TensorRT's engine cache folder (`providers.py`; default beside the model file).
    """

    def __init__(
        self,
        session: Any,
        graph: Graph,
        *,
        path: Path,
        layout: str,
        raw_grid: bool,
        refuse_batches: bool = False,
        trt_cache: Path | None = None,
        threads: int = 0,
    ) -> None:
        super().__init__()
        self.threads = self._asked = threads
        self.path = path
        self.graph = graph
        self.layout = layout
        self.raw_grid = raw_grid
        self.refuse_batches = refuse_batches
        self.trt_cache = trt_cache
        image = graph.image
        self.fixed_batch = image.shape[0]
        self.input_dtype = np.float16 if "float16" in image.type else np.float32
        self._sessions: dict[str, Any] = {"cpu": session}
        self.lanes = 1
        self.per_image = False  # CPU batches run an image at a time (lanes of one thread)
        self._free: queue.Queue[Any] | None = None  # the lanes' CPU sessions, when free
        self._bound: dict[str, DeviceRun | None] = {}  # per GPU: None runs through the host
        self._grids = layouts.YoloxGrids()
        self._order = layouts.end2end_order(graph) if layout == "end2end" else (0, 0, 0)

    def forward(self, x: torch.Tensor) -> layouts.Outputs:
        b = x.shape[0]
        hw = (int(x.shape[2]), int(x.shape[3]))
        loop = self._check_batch(b) or self.per_image
        bound = self._device_run(x.device) if x.device.type == "cuda" else None
        if bound is not None:
            return self._decode(bound(x, hw), hw)
        batch = x.detach().float().contiguous().cpu().numpy().astype(self.input_dtype, copy=False)
        free = self._free
        session = self._sessions["cpu"] if free is None else free.get()
        try:
            if loop:
                runs = [self._run(session, batch[i : i + 1], hw) for i in range(b)]
                outputs = [np.concatenate(parts, axis=0) for parts in zip(*runs, strict=True)]
            else:
                outputs = self._run(session, batch, hw)
        finally:
            if free is not None:
                free.put(session)
        tensors = [torch.from_numpy(np.ascontiguousarray(o)).to(x.device) for o in outputs]
        return self._decode(tensors, hw)

    def _check_batch(self, b: int) -> bool:
        """Whether a batch of `b` runs as a loop of single images.

        Raises:
            ModelError: the export's fixed batch does not fit and may not be looped over.
        """
        if self.fixed_batch is None or self.fixed_batch == b:
            return False
        if self.fixed_batch != 1 or self.refuse_batches:
            raise ModelError(
                f"{self.path} is exported for batches of {self.fixed_batch} and refuses "
                f"to loop over a batch of {b} (onnx batch policy 'refuse': sidecar or flag)"
                if self.fixed_batch == 1
                else f"{self.path} is exported for batches of {self.fixed_batch}, got {b}"
            )
        return True

    def _run(self, session: Any, batch: np.ndarray[Any, Any], hw: tuple[int, int]) -> list[Any]:
        feeds = {self.graph.image.name: batch}
        sizes = self.graph.size_input
        if sizes is not None:
            # (width, height) of the model input: boxes come back in model-input pixels
            feeds[sizes.name] = np.tile(np.array([[hw[1], hw[0]]], dtype=np.int64), (len(batch), 1))
        out: list[Any] = session.run(None, feeds)
        return out

    def _decode(self, outs: list[torch.Tensor], hw: tuple[int, int]) -> layouts.Outputs:
        if self.layout == "end2end":
            labels, boxes, scores = (outs[i] for i in self._order)
            return layouts.from_end2end(labels, boxes, scores)
        first = next(o for o, p in zip(outs, self.graph.outputs, strict=True) if "float" in p.type)
        if self.layout == "yolov8":
            return layouts.from_yolov8(first)
        if self.raw_grid:
            first = self._grids.decode(first, hw)
        return layouts.from_yolox(first)

    def _device_run(self, device: torch.device) -> DeviceRun | None:
        """The GPU session for `device`, IO-bound, made on first use on the current stream
        (the engine's compute stream); None when ORT has no GPU provider (host round trip)."""
        key = str(device)
        if key not in self._bound:
            available = import_ort().get_available_providers()
            trt = eps.TENSORRT in available and eps.tensorrt_installed()
            stream = torch.cuda.current_stream(device).cuda_stream
            chosen = eps.choose_providers(
                available,
                device_type="cuda",
                device_index=device.index or 0,
                stream=stream,
                tensorrt=trt,
                trt_cache=self._trt_folder() if trt else None,
            )
            self._bound[key] = None
            if eps.names(chosen) != [CPU]:
                session = open_session(self.path, chosen, threads=self.threads)
                # ORT falls back to the CPU alone when a GPU provider cannot start
                if set(session.get_providers()) & set(eps.GPU_PROVIDERS):
                    self._sessions[key] = session
                    loop = self.fixed_batch == 1
                    run = DeviceRun(session, self.graph, device, stream=stream, loop=loop)
                    self._bound[key] = run
                else:
                    log.warning("%s: no GPU provider started; batches go through the CPU", key)
        return self._bound[key]

    def use_lanes(self, count: int, threads: int) -> bool:
        """Be run on the CPU from `count` threads at once, each run on `threads` intra-op
        threads: one session shared by every lane on one thread (ORT runs a one-thread session
        in the calling thread, and its runs may overlap), else a session for each lane, taken
        for a run and given back. False, and nothing changed, where the CPU batches run in
        another runtime's session (OpenVINO's) or the file is gone (a temporary export);
        False for one lane, with the one session on the threads first asked for back."""
        if isinstance(self._sessions["cpu"], OpenVinoSession):
            return False
        if count < 2:
            if self._free is not None:  # one lane again: one session, as first asked for
                self._sessions["cpu"] = open_session(self.path, threads=self._asked)
                self._free, self.threads, self.lanes = None, self._asked, 1
                self.per_image = False
            return False
        if self._free is not None and (self.lanes, self.threads) == (count, threads):
            return True  # already so (a benchmark sets up several steps on one detector)
        if not self.path.is_file():  # a temporary export, let go once its session held it
            log.info("%s: not run in lanes (the file is gone)", self.path)
            return False
        opened = [
            open_session(self.path, threads=threads) for _ in range(count if threads > 1 else 1)
        ]
        free: queue.Queue[Any] = queue.Queue(maxsize=count)  # holds exactly the lanes' sessions
        for k in range(count):
            free.put(opened[k % len(opened)])
        self._sessions["cpu"], self._free = opened[0], free
        self.threads, self.lanes = threads, count
        # a one-thread run is cheaper per image at batch 1 than at 3 or 6 (see the docstring),
        # where the images' outputs join into the batch's: a grid layout's are of one size (its
        # anchors), an end2end export's only where its detection count is fixed
        fixed = self.layout != "end2end" or all(None not in o.shape[1:] for o in self.graph.outputs)
        self.per_image = threads == 1 and self.fixed_batch is None and fixed
        return True

    def run_cpu_on(self, session: Any) -> None:
        """Hands the CPU's batches to another session with ORT's `run`/`get_providers`
        calls (OpenVINO's, `openvino.py`); ORT's own CPU session is let go (and its lanes)."""
        self._sessions["cpu"], self._free, self.lanes = session, None, 1
        self.per_image = False

    def _trt_folder(self) -> Path | None:
        """TensorRT's engine cache: the one given (made, or a `ModelError`), else one beside
        the model (left out, with a warning, when it cannot be made)."""
        folder = self.trt_cache or eps.default_trt_cache(self.path)
        why = eps.prepare_cache(folder)
        if why is None:
            return folder
        if self.trt_cache is not None:
            raise ModelError(f"cannot make the TensorRT engine cache folder {folder}: {why}")
        log.warning("TensorRT left out: cannot make its engine cache %s (%s)", folder, why)
        return None

    def describe(self) -> dict[str, Any]:
        """What ran, for the run record: the layout, the batch policy, and per device the
        providers of its session and whether batches were IO-bound there."""
        sessions = {
            key: {
                "providers": list(session.get_providers()),
                "io_binding": self._bound.get(key) is not None,
            }
            for key, session in self._sessions.items()
        }
        cpu = self._sessions["cpu"]
        on_openvino = isinstance(cpu, OpenVinoSession)
        return {
            "backend": "openvino" if on_openvino else "onnxruntime",
            "version": cpu.version if on_openvino else getattr(import_ort(), "__version__", None),
            "layout": self.layout,
            "batch": "refuse" if self.refuse_batches else "loop",
            "threads": self.threads or None,  # None: ORT's default (one per physical core)
            "lanes": self.lanes,  # CPU sessions run at once, each on `threads`
            "per_image": self.per_image,  # a CPU lane's batch run an image at a time
            "sessions": sessions,
        }
