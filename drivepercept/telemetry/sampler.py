"""The load sampler: a `gpu-monitor` thread that reads GPU (NVML), CPU and memory load.

Every sample is stamped with `time.monotonic_ns()`, the clock of the frames' stage timestamps,
so load and latency line up on one time axis.

GPU figures come from NVML (`nvidia-ml-py`, imported as `pynvml`) for the GPUs the run uses,
named by PCI address so that `CUDA_VISIBLE_DEVICES` renumbering cannot mix them up. NVML's
utilization numbers are averages over the driver's own sampling window, between 1/6 s and 1 s
depending on the GPU: a 10 Hz sampler sees a smoothed curve, not single kernels. PCIe
throughput is itself measured by NVML over 20 ms per direction, so each GPU sample takes about
40 ms of this thread's time (ctypes releases the GIL meanwhile).

Without NVML, without a GPU, or on a CPU run, `SamplerInfo.gpu_unavailable` says why, once,
and the sampler still records CPU and memory (psutil).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from drivepercept.types import GpuSample, LoadSample

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEFAULT_RATE_HZ = 10.0

# NVML clocks-event ("throttle") reason bits, stable across driver versions.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def throttle_names(mask: int) -> tuple[str, ...]:
    """The names of the reason bits set in an NVML clocks-event mask (() for -1, unknown)."""
    if mask < 0:
        return ()
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    if rest:
        names.append(f"other_0x{rest:x}")
    return tuple(names)


@dataclass(frozen=True)
class GpuRef:
    """A GPU the run uses, by PCI address (as torch reports it) and CUDA index."""

    cuda_index: int
    pci_domain: int
    pci_bus: int
    pci_device: int

    @property
    def bus_id(self) -> str:
        """The PCI address as NVML takes it ("domain:bus:device.function", hex)."""
        return f"{self.pci_domain:08x}:{self.pci_bus:02x}:{self.pci_device:02x}.0"


def gpu_refs(device: torch.device) -> tuple[GpuRef, ...]:
    """The GPU a torch device runs on, by PCI address, for NVML (none for the CPU)."""
    if device.type != "cuda":
        return ()
    import torch  # only here: the report reads throttle names without loading torch

    index = device.index or 0
    props: Any = torch.cuda.get_device_properties(index)  # pci_* are missing from its stubs
    try:
        return (
            GpuRef(
                cuda_index=index,
                pci_domain=int(props.pci_domain_id),
                pci_bus=int(props.pci_bus_id),
                pci_device=int(props.pci_device_id),
            ),
        )
    except AttributeError:  # an older torch: no PCI address, so no safe match with NVML
        log.warning("this torch does not report the GPU's PCI address: no GPU metrics")
        return ()


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one sampled GPU."""

    index: int  # NVML index (-1 where NVML will not say)
    cuda_index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    power_limit_w: float


@dataclass(frozen=True)
class SamplerInfo:
    """What the sampler could see: written once into run.json and the report."""

    rate_hz: float
    cpu_count: int
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    nvml_version: str | None
    gpu_unavailable: str | None  # why there are no GPU metrics, or None
    unsupported: tuple[str, ...]  # metrics this GPU does not report (NaN in the samples)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (a figure NVML does not give, NaN here, is null there)."""

        def clean(info: GpuInfo) -> dict[str, Any]:
            return {
                k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in vars(info).items()
            }

        return {
            "rate_hz": self.rate_hz,
            "cpu_count": self.cpu_count,
            "gpus": [clean(g) for g in self.gpus],
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
            "gpu_unavailable": self.gpu_unavailable,
            "unsupported": list(self.unsupported),
        }


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """NVML handles for the GPUs in use and one `GpuSample` per read.

    A metric a GPU does not support (NVMLError, e.g. power on some boards) reads as NaN from
    then on and is listed in `unsupported`, instead of costing an exception every sample.
    """

    def __init__(self, nvml: Any, refs: Sequence[GpuRef]) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        try:
            self._open(refs)
        except BaseException:
            self.close()
            raise

    def _find(self, ref: GpuRef) -> Any:
        """The handle of the GPU at `ref`'s PCI address, opening no other GPU.

        Straight by bus id where NVML can; else (older bindings, or a lookup NVML refuses)
        by walking the GPUs, skipping those this process may not open (a GPU outside its
        Slurm or cgroup allocation answers NVML_ERROR_NO_PERMISSION): one GPU we cannot see
        must not cost the metrics of the one we use.
        """
        nvml = self.nvml
        lookup = getattr(nvml, "nvmlDeviceGetHandleByPciBusId", None)
        if lookup is not None:
            try:
                return lookup(ref.bus_id)
            except nvml.NVMLError as exc:
                log.debug("NVML lookup of %s by bus id: %s", ref.bus_id, exc)
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
            except nvml.NVMLError as exc:
                log.debug("NVML GPU %d skipped: %s", i, exc)
                continue
            if (int(pci.domain), int(pci.bus), int(pci.device)) == (
                ref.pci_domain,
                ref.pci_bus,
                ref.pci_device,
            ):
                return handle
        raise LookupError(f"NVML lists no GPU at PCI {ref.bus_id} (cuda:{ref.cuda_index})")

    def _index(self, handle: Any) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetIndex(handle))
        except (self.nvml.NVMLError, AttributeError):
            return -1

    def _open(self, refs: Sequence[GpuRef]) -> None:
        nvml = self.nvml
        self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        self.nvml_version = _text(nvml.nvmlSystemGetNVMLVersion())
        self.unsupported: set[str] = set()
        self.handles: list[Any] = []
        infos = []
        for ref in refs:
            handle = self._find(ref)
            index = self._index(handle)
            self.handles.append(handle)
            pci = nvml.nvmlDeviceGetPciInfo(handle)
            infos.append(
                GpuInfo(
                    index=index,
                    cuda_index=ref.cuda_index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_text(pci.busId),
                    memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    power_limit_w=self._read(
                        "power_limit_w", nvml.nvmlDeviceGetEnforcedPowerLimit, handle, scale=1e-3
                    ),
                )
            )
        self.infos = tuple(infos)
        self._reasons_fn = getattr(
            nvml,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        )

    def _read(
        self, metric: str, fn: Callable[..., Any] | None, *args: Any, scale: float = 1.0
    ) -> float:
        """fn(*args) * scale, or NaN from now on if NVML says this GPU cannot tell."""
        if metric in self.unsupported or fn is None:
            return math.nan
        try:
            return float(fn(*args)) * scale
        except self.nvml.NVMLError as exc:
            self.unsupported.add(metric)
            log.debug("NVML %s unavailable: %s", metric, exc)
            return math.nan

    def _read_struct(self, metric: str, fn: Callable[..., Any], *args: Any) -> Any | None:
        """fn(*args), or None from now on if NVML cannot give it (utilization on a MIG
        instance, for one)."""
        if metric in self.unsupported:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.unsupported.add(metric)
            log.debug("NVML %s unavailable: %s", metric, exc)
            return None

    def sample(self) -> tuple[GpuSample, ...]:
        nvml = self.nvml
        out = []
        for info, h in zip(self.infos, self.handles, strict=True):
            util = self._read_struct("util_pct", nvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._read_struct("mem_used_bytes", nvml.nvmlDeviceGetMemoryInfo, h)
            throttle = self._read("throttle_reasons", self._reasons_fn, h)
            pcie = nvml.nvmlDeviceGetPcieThroughput
            out.append(
                GpuSample(
                    index=info.index,
                    util_pct=float(util.gpu) if util is not None else math.nan,
                    mem_util_pct=float(util.memory) if util is not None else math.nan,
                    mem_used_bytes=float(mem.used) if mem is not None else math.nan,
                    mem_total_bytes=float(mem.total) if mem is not None else math.nan,
                    power_w=self._read("power_w", nvml.nvmlDeviceGetPowerUsage, h, scale=1e-3),
                    power_limit_w=info.power_limit_w,
                    temperature_c=self._read(
                        "temperature_c", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
                    ),
                    sm_clock_mhz=self._read(
                        "sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM
                    ),
                    mem_clock_mhz=self._read(
                        "mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM
                    ),
                    # NVML reports KB/s, measured over 20 ms per call
                    pcie_tx_bytes_s=self._read(
                        "pcie_tx_bytes_s", pcie, h, nvml.NVML_PCIE_UTIL_TX_BYTES, scale=1024.0
                    ),
                    pcie_rx_bytes_s=self._read(
                        "pcie_rx_bytes_s", pcie, h, nvml.NVML_PCIE_UTIL_RX_BYTES, scale=1024.0
                    ),
                    throttle_reasons=-1 if math.isnan(throttle) else int(throttle),
                )
            )
        return tuple(out)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def open_nvml(
    refs: Sequence[GpuRef], *, importer: Callable[[], Any] = _import_nvml
) -> tuple[NvmlReader | None, str | None]:
    """NVML for the given GPUs, or (None, the reason there are no GPU metrics)."""
    if not refs:
        return None, "the run did not use a GPU"
    try:
        nvml = importer()
    except ImportError as exc:
        return None, f"nvidia-ml-py (pynvml) is not installed: {exc}"
    try:
        return NvmlReader(nvml, refs), None
    except nvml.NVMLError as exc:
        return None, f"NVML failed: {exc}"
    except LookupError as exc:
        return None, str(exc)


class LoadSampler:
    """Samples load at `rate_hz` on a `gpu-monitor` thread until `stop` is set.

    Args:
        rate_hz: samples per second (> 0).
        gpus: the GPUs the run uses (empty on a CPU run).
        stop: the pipeline's stop event.
        on_sample: called on the sampler thread with each sample (e.g. the load.csv writer);
            it must be quick.
        on_error: called with an exception that ended the thread.
        nvml_importer: where NVML comes from (tests pass a stand-in).
    """

    def __init__(
        self,
        *,
        rate_hz: float = DEFAULT_RATE_HZ,
        gpus: Sequence[GpuRef] = (),
        stop: threading.Event,
        on_sample: Callable[[LoadSample], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        nvml_importer: Callable[[], Any] = _import_nvml,
    ) -> None:
        if not rate_hz > 0:
            raise ValueError(f"sampler rate must be > 0 Hz, got {rate_hz}")
        self.interval_s = 1.0 / rate_hz
        self.stop = stop
        self.on_sample = on_sample
        self.on_error = on_error
        self._process = psutil.Process()
        self._nvml, reason = open_nvml(gpus, importer=nvml_importer)
        if reason is not None:
            log.info("GPU metrics unavailable: %s", reason)
        self._reason = reason
        self._rate_hz = rate_hz
        self._lock = threading.Lock()
        self._latest: LoadSample | None = None
        self._closed = False
        self.samples_taken = 0
        self.thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        # prime psutil's CPU counters: its first reading covers no interval and is 0
        self._process.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)

    def describe(self) -> dict[str, Any]:
        """run.json's telemetry: the sampler's info and the samples taken so far (metrics
        found unsupported on the way are known only then)."""
        return {**self.info.as_dict(), "samples": self.samples_taken}

    @property
    def info(self) -> SamplerInfo:
        nvml = self._nvml
        return SamplerInfo(
            rate_hz=self._rate_hz,
            cpu_count=psutil.cpu_count() or 0,
            gpus=nvml.infos if nvml else (),
            driver_version=nvml.driver_version if nvml else None,
            nvml_version=nvml.nvml_version if nvml else None,
            gpu_unavailable=self._reason,
            unsupported=tuple(sorted(nvml.unsupported)) if nvml else (),
        )

    @property
    def latest(self) -> LoadSample | None:
        with self._lock:
            return self._latest

    def start(self) -> None:
        self.thread.start()

    def sample(self) -> LoadSample:
        """One reading now (the thread calls this; so may a test)."""
        t_ns = time.monotonic_ns()
        per_core = tuple(float(v) for v in psutil.cpu_percent(None, percpu=True))
        mem = psutil.virtual_memory()
        gpus: tuple[GpuSample, ...] = ()
        if self._nvml is not None:
            try:
                gpus = self._nvml.sample()
            except Exception as exc:  # a GPU gone from the bus must not stop detection
                log.error("GPU sampling stopped: %s", exc)
                self._reason = f"GPU sampling stopped mid-run: {type(exc).__name__}: {exc}"
                self.close()
                self._nvml = None
        return LoadSample(
            t_ns=t_ns,
            process_cpu_pct=float(self._process.cpu_percent(None)),
            system_cpu_pct=sum(per_core) / len(per_core) if per_core else math.nan,
            per_core_cpu_pct=per_core,
            process_rss_bytes=int(self._process.memory_info().rss),
            system_mem_used_bytes=int(mem.total - mem.available),
            system_mem_total_bytes=int(mem.total),
            gpus=gpus,
        )

    def _run(self) -> None:
        try:
            # the first sample after one interval: psutil's CPU figures need one to cover
            next_at = time.monotonic() + self.interval_s
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                s = self.sample()
                with self._lock:
                    self._latest = s
                self.samples_taken += 1
                if self.on_sample is not None:
                    self.on_sample(s)
                # a slow sample (PCIe reads) skips ticks instead of bursting to catch up
                next_at = max(next_at + self.interval_s, time.monotonic())
        except BaseException as exc:  # recorded; the pipeline decides what it means
            log.debug("load sampler failed", exc_info=exc)
            if self.on_error is not None:
                self.on_error(exc)
        finally:
            self.close()

    def close(self) -> None:
        """Release NVML (idempotent; the thread does it when it ends)."""
        with self._lock:
            nvml = None if self._closed else self._nvml
            self._closed = True
        if nvml is not None:
            nvml.close()
