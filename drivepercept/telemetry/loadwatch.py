"""Load beside a benchmark: the `gpu-monitor` sampler run while a measurement runs, and the
mean and max of what it saw in the measured time.

The benchmarks time the model or the pipeline themselves; the sampler only watches, on its own
thread at its usual rate, as it does in every run (its NVML reads release the GIL). A bench
mode runs one sampler at a time: where it measures a pipeline, the pipeline's own sampler is
off and this one samples at the pipeline's rate instead, so the measured code pays the cost it
pays in a replay, once.

`load_figures` is pure: samples in, figures out, over the time windows that were measured
(set-up, warm-up and compilation left out). NVML's utilization is itself an average over the
driver's window (1/6 s to 1 s), so a window shorter than about a second reads partly the time
around it, and one shorter than the sampler's interval may hold no sample at all.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from drivepercept.telemetry.sampler import GpuRef, LoadSampler, _import_nvml
from drivepercept.types import LoadSample

log = logging.getLogger(__name__)

_MB = float(1 << 20)  # as load.csv: MB are 2**20 bytes
_JOIN_TIMEOUT_S = 2.0  # one sample takes about 40 ms (NVML's PCIe reads)
NA = "n/a"

Window = tuple[int, int]  # [start_ns, end_ns) on `time.monotonic_ns()`, the samples' clock


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _cell(value: float | None, digits: int = 0) -> str:
    return NA if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class LoadFigures:
    """What the load sampler saw while a benchmark measured (None: nothing to say).

    Attributes:
        samples: samples inside the measured windows.
        rate_hz: the sampler's rate (0: it was off).
        gpu_util_mean_pct, gpu_util_max_pct: NVML utilization (share of time a kernel ran).
        gpu_mem_max_mb: the most device memory in use (NVML: every process on the GPU).
        process_cpu_mean_pct, process_cpu_max_pct: this process (100 = one core busy).
        gpu_unavailable: why there are no GPU figures (a CPU run, no NVML), or None.
    """

    samples: int
    rate_hz: float
    gpu_util_mean_pct: float | None = None
    gpu_util_max_pct: float | None = None
    gpu_mem_max_mb: float | None = None
    process_cpu_mean_pct: float | None = None
    process_cpu_max_pct: float | None = None
    gpu_unavailable: str | None = None

    @property
    def gpu_util_cell(self) -> str:
        """'mean/max' GPU utilization % for a table column, or n/a."""
        if self.gpu_util_mean_pct is None or self.gpu_util_max_pct is None:
            return NA
        return f"{self.gpu_util_mean_pct:.0f}/{self.gpu_util_max_pct:.0f}"

    @property
    def gpu_mem_cell(self) -> str:
        return _cell(self.gpu_mem_max_mb)

    @property
    def cpu_cell(self) -> str:
        """Mean process CPU % for a table column, or n/a."""
        return _cell(self.process_cpu_mean_pct)

    def describe(self) -> str:
        """One line for a table's foot."""
        if self.rate_hz <= 0:
            return "load: not sampled (sample_hz 0)"
        if self.samples == 0:
            return f"load: no sample in the measured time (sampler at {self.rate_hz:g} Hz)"
        if self.gpu_util_mean_pct is None:
            gpu = f"GPU {NA} ({self.gpu_unavailable or 'NVML gave no utilization'})"
        else:
            gpu = (
                f"GPU util {self.gpu_util_mean_pct:.1f} % mean, {_cell(self.gpu_util_max_pct, 1)}"
                f" % max, GPU memory {self.gpu_mem_cell} MB max"
            )
        cpu = (
            f"process CPU {_cell(self.process_cpu_mean_pct)} % mean, "
            f"{_cell(self.process_cpu_max_pct)} % max"
        )
        return f"load: {gpu}; {cpu} ({self.samples} samples at {self.rate_hz:g} Hz)"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (null where there is no figure)."""

        def num(x: float | None) -> float | None:
            return None if x is None else round(x, 1)

        return {
            "samples": self.samples,
            "rate_hz": self.rate_hz,
            "gpu_util_mean_pct": num(self.gpu_util_mean_pct),
            "gpu_util_max_pct": num(self.gpu_util_max_pct),
            "gpu_mem_max_mb": num(self.gpu_mem_max_mb),
            "process_cpu_mean_pct": num(self.process_cpu_mean_pct),
            "process_cpu_max_pct": num(self.process_cpu_max_pct),
            "gpu_unavailable": self.gpu_unavailable,
        }


def load_figures(
    samples: Iterable[LoadSample],
    *,
    rate_hz: float,
    windows: Sequence[Window] | None = None,
    gpu_unavailable: str | None = None,
) -> LoadFigures:
    """Mean and max of the samples taken inside `windows` (None: every sample), over every
    GPU sampled (a benchmark uses one). A figure NVML did not give (NaN) is left out."""
    kept = [s for s in samples if windows is None or any(a <= s.t_ns < b for a, b in windows)]
    cpu = [s.process_cpu_pct for s in kept if not math.isnan(s.process_cpu_pct)]
    util = [g.util_pct for s in kept for g in s.gpus if not math.isnan(g.util_pct)]
    mem = [g.mem_used_bytes / _MB for s in kept for g in s.gpus if not math.isnan(g.mem_used_bytes)]
    return LoadFigures(
        samples=len(kept),
        rate_hz=rate_hz,
        gpu_util_mean_pct=_mean(util),
        gpu_util_max_pct=max(util, default=None),
        gpu_mem_max_mb=max(mem, default=None),
        process_cpu_mean_pct=_mean(cpu),
        process_cpu_max_pct=max(cpu, default=None),
        gpu_unavailable=gpu_unavailable,
    )


class LoadRecorder:
    """Keeps the samples it is given (a `LoadSink`: the sampler's thread writes, the
    benchmark's thread reads; a lock between them) and summarises windows of them."""

    def __init__(self, *, rate_hz: float, gpu_unavailable: str | None = None) -> None:
        self.rate_hz = rate_hz
        self.gpu_unavailable = gpu_unavailable
        self._lock = threading.Lock()
        self._samples: list[LoadSample] = []

    def write(self, sample: LoadSample) -> None:
        with self._lock:
            self._samples.append(sample)

    def close(self) -> None:
        """Nothing to finish: the samples stay readable."""

    def figures(self, windows: Sequence[Window] | None = None) -> LoadFigures:
        """The figures over `windows` (None: every sample so far)."""
        with self._lock:
            samples = list(self._samples)
        return load_figures(
            samples, rate_hz=self.rate_hz, windows=windows, gpu_unavailable=self.gpu_unavailable
        )


@contextmanager
def watch_load(
    gpus: Sequence[GpuRef],
    *,
    rate_hz: float,
    nvml_importer: Callable[[], Any] = _import_nvml,
) -> Iterator[LoadRecorder]:
    """Run a `gpu-monitor` sampler at `rate_hz` (0: none) for the block; its samples go into
    the recorder it yields. The thread is stopped and joined on the way out, and reported if
    it does not stop.

    Args:
        gpus: the GPUs the benchmark uses (`sampler.gpu_refs(device)`; none on a CPU).
        rate_hz: samples per second, the pipeline's `sample_hz`.
        nvml_importer: where NVML comes from (tests pass a stand-in).
    """
    if rate_hz <= 0:
        yield LoadRecorder(rate_hz=0.0, gpu_unavailable="the sampler was off (sample_hz 0)")
        return
    stop = threading.Event()
    recorder = LoadRecorder(rate_hz=rate_hz)
    sampler = LoadSampler(
        rate_hz=rate_hz,
        gpus=gpus,
        stop=stop,
        on_sample=recorder.write,
        on_error=lambda exc: log.warning("load sampler stopped: %s", exc),
        nvml_importer=nvml_importer,
    )
    recorder.gpu_unavailable = sampler.info.gpu_unavailable
    sampler.start()
    try:
        yield recorder
    finally:
        stop.set()
        sampler.thread.join(timeout=_JOIN_TIMEOUT_S)
        if sampler.thread.is_alive():
            log.warning("thread %s did not stop within %g s", sampler.thread.name, _JOIN_TIMEOUT_S)
        sampler.close()
        recorder.gpu_unavailable = sampler.info.gpu_unavailable  # may have changed mid-run
