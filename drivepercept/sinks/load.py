"""Load samples as CSV (`load.csv`): one row per sample of the `gpu-monitor` thread.


Columns: t_ns (the frames' monotonic clock), process_cpu_pct (100 = one core), system_cpu_pct
(100 = all cores), process_rss_mb, system_mem_used_mb, system_mem_total_mb, cpu<k>_pct per
core, then for each sampled GPU g (0, 1, ... in the order the run uses them): gpu<g>_util_pct,
gpu<g>_mem_util_pct, gpu<g>_mem_used_mb, gpu<g>_mem_total_mb, gpu<g>_power_w,
gpu<g>_power_limit_w, gpu<g>_temperature_c, gpu<g>_sm_clock_mhz, gpu<g>_mem_clock_mhz,
gpu<g>_pcie_tx_mb_s, gpu<g>_pcie_rx_mb_s, gpu<g>_throttle_reasons (NVML bit mask).
A value the hardware does not report is an empty field. MB are 2**20 bytes.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

from drivepercept.sinks._lines import LineFile
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import GpuSample, LoadSample

_MB = float(1 << 20)
SYSTEM_COLUMNS: tuple[str, ...] = (
    "t_ns",
    "process_cpu_pct",
    "system_cpu_pct",
    "process_rss_mb",
    "system_mem_used_mb",
    "system_mem_total_mb",
)
GPU_FIELDS: tuple[str, ...] = (
    "util_pct",
    "mem_util_pct",
    "mem_used_mb",
    "mem_total_mb",
    "power_w",
    "power_limit_w",
    "temperature_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pcie_tx_mb_s",
    "pcie_rx_mb_s",
    "throttle_reasons",
)


def load_csv_columns(*, cores: int, gpus: int) -> tuple[str, ...]:
    return (
        *SYSTEM_COLUMNS,
        *(f"cpu{k}_pct" for k in range(cores)),
        *(f"gpu{g}_{name}" for g in range(gpus) for name in GPU_FIELDS),
    )


def _num(value: float, digits: int = 2) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def _gpu_fields(g: GpuSample) -> list[str]:
    return [
        _num(g.util_pct, 1),
        _num(g.mem_util_pct, 1),
        _num(g.mem_used_bytes / _MB, 1),
        _num(g.mem_total_bytes / _MB, 1),
        _num(g.power_w),
        _num(g.power_limit_w),
        _num(g.temperature_c, 1),
        _num(g.sm_clock_mhz, 0),
        _num(g.mem_clock_mhz, 0),
        _num(g.pcie_tx_bytes_s / _MB),
        _num(g.pcie_rx_bytes_s / _MB),
        "" if g.throttle_reasons < 0 else str(g.throttle_reasons),
    ]


def load_row(sample: LoadSample, *, cores: int, gpus: int) -> list[str]:
    """The `load.csv` fields of one sample (cores and GPUs beyond the header's are cut,
    missing ones left empty, so every row has the header's width)."""
    per_core = [_num(v, 1) for v in sample.per_core_cpu_pct[:cores]]
    per_core += [""] * (cores - len(per_core))
    row = [
        str(sample.t_ns),
        _num(sample.process_cpu_pct, 1),
        _num(sample.system_cpu_pct, 1),
        _num(sample.process_rss_bytes / _MB, 1),
        _num(sample.system_mem_used_bytes / _MB, 1),
        _num(sample.system_mem_total_bytes / _MB, 1),
        *per_core,
    ]
    for g in range(gpus):
        row += _gpu_fields(sample.gpus[g]) if g < len(sample.gpus) else [""] * len(GPU_FIELDS)
    return row


class LoadCsvSink(ClosingSink):
    """Writes `load.csv` (see the module docstring); valid CSV once the first sample is in.

    The header's width (cores, GPUs) is taken from the first sample; a run that closes before
    any sample gets a header of the system columns alone. Thread-safe: the sampler thread
    writes, the pipeline closes; a sample arriving after `close()` is dropped.

    Raises:
        OutputError: the file cannot be created or written.
    """

    def __init__(self, path: Path | str) -> None:
        self._lock = threading.Lock()
        self._file = LineFile(Path(path), what="load file")
        self.cores: int | None = None
        self.gpus = 0

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def samples_written(self) -> int:
        return max(0, self._file.lines - 1)

    def _header(self, *, cores: int, gpus: int) -> None:
        self.cores, self.gpus = cores, gpus
        self._file.append(",".join(load_csv_columns(cores=cores, gpus=gpus)) + "\n")

    def write(self, sample: LoadSample) -> None:
        with self._lock:
            if self._file.closed:
                return
            if self.cores is None:
                self._header(cores=len(sample.per_core_cpu_pct), gpus=len(sample.gpus))
                self._file.flush()
            assert self.cores is not None
            row = load_row(sample, cores=self.cores, gpus=self.gpus)
            self._file.append(",".join(row) + "\n")

    def close(self) -> None:
        with self._lock:
            if not self._file.closed and self.cores is None:
                self._header(cores=0, gpus=0)
            self._file.close()
