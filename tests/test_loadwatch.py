"""Load figures beside a benchmark (`telemetry.loadwatch`): the pure summary over measured
windows, against hand-computed values, and the sampler thread it runs (started, fed, stopped)."""

from __future__ import annotations

import json
import math
import threading
import time
import types
from typing import Any

import pytest

from drivepercept.telemetry.loadwatch import LoadRecorder, load_figures, watch_load
from drivepercept.telemetry.sampler import GpuRef
from drivepercept.types import GpuSample, LoadSample

pytestmark = pytest.mark.timeout(60)

MB = 1 << 20


def _gpu(util: float, mem_mb: float) -> GpuSample:
    nan = math.nan
    return GpuSample(0, util, nan, mem_mb * MB, 80_000 * MB, nan, nan, nan, nan, nan, nan, nan, -1)


def _sample(t_ns: int, cpu: float, *gpus: GpuSample) -> LoadSample:
    return LoadSample(t_ns, cpu, cpu / 2, (cpu / 2, cpu / 2), 1 << 30, 2 << 30, 8 << 30, gpus)


SAMPLES = [
    _sample(100, 50.0, _gpu(10.0, 1000.0)),
    _sample(200, 150.0, _gpu(90.0, 3000.0)),
    _sample(300, 100.0, _gpu(math.nan, math.nan)),  # a figure NVML did not give
    _sample(400, 20.0, _gpu(70.0, 2000.0)),
]


def test_figures_are_mean_and_max_of_the_samples_in_the_measured_windows() -> None:
    # given samples at 100..400 ns and two measured windows that leave out the one at 200
    got = load_figures(SAMPLES, rate_hz=10.0, windows=[(100, 200), (300, 401)])
    # then only 100, 300 and 400 count, and the GPU's missing figures are left out
    assert got.samples == 3 and got.rate_hz == 10.0
    assert got.gpu_util_mean_pct == pytest.approx(40.0) and got.gpu_util_max_pct == 70.0
    assert got.gpu_mem_max_mb == pytest.approx(2000.0)
    assert got.process_cpu_mean_pct == pytest.approx(170 / 3) and got.process_cpu_max_pct == 100
    assert (got.gpu_util_cell, got.gpu_mem_cell, got.cpu_cell) == ("40/70", "2000", "57")
    assert got.describe() == (
        "load: GPU util 40.0 % mean, 70.0 % max, GPU memory 2000 MB max; "
        "process CPU 57 % mean, 100 % max (3 samples at 10 Hz)"
    )
    # and every sample counts without windows
    assert load_figures(SAMPLES, rate_hz=10.0).gpu_util_max_pct == 90.0


def test_without_a_gpu_the_gpu_figures_are_null_and_say_why() -> None:
    cpu_only = [_sample(t, 100.0) for t in (1, 2)]
    got = load_figures(cpu_only, rate_hz=10.0, gpu_unavailable="the run did not use a GPU")
    assert got.gpu_util_mean_pct is None and got.gpu_mem_max_mb is None
    assert (got.gpu_util_cell, got.gpu_mem_cell, got.cpu_cell) == ("n/a", "n/a", "100")
    assert "GPU n/a (the run did not use a GPU)" in got.describe()
    record = got.as_dict()
    assert record["gpu_util_mean_pct"] is None and record["process_cpu_mean_pct"] == 100.0
    assert record["gpu_unavailable"] == "the run did not use a GPU"
    json.dumps(record, allow_nan=False)


def test_a_window_with_no_sample_says_so_rather_than_zero() -> None:
    got = load_figures(SAMPLES, rate_hz=10.0, windows=[(1000, 2000)])
    assert got.samples == 0 and got.process_cpu_mean_pct is None
    assert got.describe() == "load: no sample in the measured time (sampler at 10 Hz)"
    assert load_figures([], rate_hz=0.0).describe() == "load: not sampled (sample_hz 0)"


def test_the_recorder_takes_samples_as_a_load_sink_and_summarises_windows() -> None:
    recorder = LoadRecorder(rate_hz=5.0)
    for s in SAMPLES:
        recorder.write(s)
    recorder.close()
    assert recorder.figures([(150, 250)]).gpu_util_max_pct == 90.0
    assert recorder.figures().samples == 4


def test_watching_runs_the_sampler_thread_and_stops_it() -> None:
    # given a 50 Hz sampler on a CPU benchmark
    started = time.monotonic_ns()
    with watch_load((), rate_hz=50.0) as recorder:
        assert any(t.name == "gpu-monitor" for t in threading.enumerate())
        time.sleep(0.3)
    window = (started, time.monotonic_ns())
    # then it sampled the CPU, said why there is no GPU, and its thread is gone
    assert not any(t.name == "gpu-monitor" and t.is_alive() for t in threading.enumerate())
    got = recorder.figures([window])
    assert got.samples >= 3 and got.process_cpu_mean_pct is not None
    assert got.gpu_unavailable == "the run did not use a GPU"
    # and with the sampler off there is no thread and no figure
    with watch_load((), rate_hz=0.0) as off:
        assert not any(t.name == "gpu-monitor" for t in threading.enumerate())
    assert off.figures().describe() == "load: not sampled (sample_hz 0)"


def test_watching_a_gpu_through_nvml() -> None:
    # given a stand-in NVML with one GPU at 87 % and 3 GiB in use
    class NvmlError(Exception):
        pass

    pci = types.SimpleNamespace(domain=0, bus=0x17, device=0, busId=b"00000000:17:00.0")
    nvml: Any = types.SimpleNamespace(
        NVMLError=NvmlError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.1",
        nvmlSystemGetNVMLVersion=lambda: "13.580",
        nvmlDeviceGetHandleByPciBusId=lambda bus_id: 0,
        nvmlDeviceGetIndex=lambda h: h,
        nvmlDeviceGetPciInfo=lambda h: pci,
        nvmlDeviceGetName=lambda h: "Fake GPU",
        nvmlDeviceGetUUID=lambda h: "GPU-0",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 << 30, total=80 << 30),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=41),
        nvmlDeviceGetPowerUsage=lambda h: 200_000,
        nvmlDeviceGetTemperature=lambda h, kind: 61,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetPcieThroughput=lambda h, kind: 1024,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
    )
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x17, pci_device=0)
    # when a benchmark is watched for a moment
    with watch_load([ref], rate_hz=50.0, nvml_importer=lambda: nvml) as recorder:
        time.sleep(0.2)
    # then the GPU's figures are there, memory in MB of 2**20 bytes
    got = recorder.figures()
    assert got.gpu_unavailable is None and got.samples >= 2
    assert (got.gpu_util_mean_pct, got.gpu_util_max_pct, got.gpu_mem_max_mb) == (87, 87, 3072)
    assert got.gpu_util_cell == "87/87"
