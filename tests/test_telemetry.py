"""Telemetry: the statistics (against hand-computed values), the timeline and the load sampler."""

from __future__ import annotations

import json
import math
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from drivepercept.telemetry import (
    STAGE_SPANS,
    GpuRef,
    LatencyHistogram,
    LoadSampler,
    Timeline,
    batch_fill,
    capture_spread_ms,
    deadline_misses,
    fill_missing_stamps,
    frame_index_gaps,
    latency_stats,
    rate_fps,
    recent_window,
    source_spread_ms,
    throttle_names,
    windowed_rate,
)
from drivepercept.types import STAMPS

pytestmark = pytest.mark.timeout(60)


# --- latency statistics ---------------------------------------------------------------------


def test_latency_stats_match_hand_computed_percentiles() -> None:
    # linear interpolation between ranks: p90 of 10..50 sits at rank 3.6 -> 40 + 0.6 * 10
    s = latency_stats([50.0, 10.0, 40.0, 20.0, 30.0])
    assert s.count == 5
    assert s.mean_ms == 30.0
    assert s.p50_ms == 30.0
    assert s.p90_ms == pytest.approx(46.0)
    assert s.p95_ms == pytest.approx(48.0)
    assert s.p99_ms == pytest.approx(49.6)
    assert s.max_ms == 50.0


def test_latency_stats_of_one_and_of_no_frame() -> None:
    one = latency_stats([7.5])
    assert (one.count, one.p50_ms, one.p99_ms, one.max_ms, one.mean_ms) == (1, 7.5, 7.5, 7.5, 7.5)
    empty = latency_stats([])
    assert empty.count == 0
    assert math.isnan(empty.p50_ms) and math.isnan(empty.max_ms)
    # JSON gets null, not a made-up zero
    assert empty.as_dict()["p95_ms"] is None
    assert empty.as_dict()["count"] == 0


def test_latency_histogram_is_within_one_percent_and_bounded() -> None:
    h = LatencyHistogram()
    values = np.random.default_rng(1).lognormal(mean=4.0, sigma=0.8, size=20_000)
    for v in values:
        h.add(float(v))
    assert h.count == 20_000 and h.max_ms == values.max()
    for q in (50, 95, 99):
        exact = float(np.percentile(values, q, method="inverted_cdf"))
        assert exact <= h.percentile(q) <= exact * 1.0101, q
    assert h.percentile(100) == values.max()
    # memory does not grow with the number of frames
    size = h._counts.nbytes
    for _ in range(10_000):
        h.add(12.0)
    assert h._counts.nbytes == size < 16_000
    empty = LatencyHistogram()
    assert math.isnan(empty.percentile(50))
    one = LatencyHistogram()
    one.add(7.5)
    assert one.percentile(99) == 7.5
    one.add(0.0)  # below the range: the first bucket
    assert one.percentile(50) <= 0.11


def test_latency_histograms_merge_into_the_histogram_of_all_frames() -> None:
    # given frames split over three histograms (three drives of a fleet), sent as JSON
    rng = np.random.default_rng(2)
    parts = [
        rng.lognormal(mean=m, sigma=0.5, size=n) for m, n in ((3.0, 500), (6.5, 20), (3.0, 2000))
    ]
    whole, merged = LatencyHistogram(), LatencyHistogram()
    for part in parts:
        h = LatencyHistogram()
        for v in part:
            h.add(float(v))
            whole.add(float(v))
        merged.merge(json.loads(json.dumps(h.to_json())))
    # then the merge is the histogram of every frame: the same percentiles, count and maximum
    assert merged.to_json() == whole.to_json()
    every = np.concatenate(parts)
    exact = float(np.percentile(every, 99, method="inverted_cdf"))
    assert exact <= merged.percentile(99) <= exact * 1.0101
    # not the mean of the parts' percentiles (the slow middle drive is 20 frames of 2,520)
    mean_p99 = float(np.mean([np.percentile(p, 99) for p in parts]))
    assert abs(merged.percentile(99) - mean_p99) > 0.2 * exact
    empty = LatencyHistogram()
    merged.merge(empty.to_json())
    assert merged.count == every.size
    # a histogram with other buckets, or damaged, is refused
    with pytest.raises(ValueError, match="other buckets"):
        merged.merge(LatencyHistogram(resolution=0.05).to_json())
    bad = {**h.to_json(), "count": h.count + 1}
    with pytest.raises(ValueError, match="count"):
        merged.merge(bad)


def test_rate_fps() -> None:
    assert rate_fps(30, 0, 2_000_000_000) == 15.0
    assert rate_fps(0, 0, 1_000_000_000) == 0.0
    assert rate_fps(1, 5, 5) == 0.0  # a single instant has no rate


# --- throughput windows ---------------------------------------------------------------------


def test_windowed_rate_counts_each_window_and_cuts_the_last() -> None:
    s = 1_000_000_000
    # events at 0.1, 0.2, 0.9 | 1.5 | (nothing in 2..3) | 3.1 s; the run ends at 3.5 s
    times = [int(0.1 * s), int(0.2 * s), int(0.9 * s), int(1.5 * s), int(3.1 * s)]
    w = windowed_rate(times, origin_ns=0, end_ns=int(3.5 * s), window_s=1.0)
    assert w.start_s.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert w.counts.tolist() == [3, 1, 0, 1]
    # the last window is 0.5 s long: 1 event in it is 2 events/s
    assert w.rate_per_s.tolist() == pytest.approx([3.0, 1.0, 0.0, 2.0])


def test_windowed_rate_edges() -> None:
    s = 1_000_000_000
    # an event exactly at the end belongs to the last window; events outside are ignored
    w = windowed_rate([-5, 0, s, 2 * s, 3 * s], origin_ns=0, end_ns=2 * s, window_s=1.0)
    assert w.counts.tolist() == [1, 2]
    assert windowed_rate([], origin_ns=0, end_ns=0).counts.size == 0
    with pytest.raises(ValueError, match="window_s"):
        windowed_rate([1], origin_ns=0, end_ns=10, window_s=0)


# --- drops, deadlines, batches --------------------------------------------------------------


def test_frame_index_gaps() -> None:
    assert frame_index_gaps([0, 1, 2, 3]) == 0
    assert frame_index_gaps([0, 2, 5]) == 3  # 1, 3, 4 missing
    assert frame_index_gaps([3, 4]) == 3  # 0, 1, 2 never arrived
    assert frame_index_gaps([1, 1, 2]) == 1  # duplicates are not frames
    assert frame_index_gaps([]) == 0


def test_deadline_misses_are_strictly_over_budget() -> None:
    d = deadline_misses([50.0, 100.0, 100.001, 250.0], budget_ms=100.0)
    assert (d.frames, d.misses, d.rate) == (4, 2, 0.5)
    assert deadline_misses([], budget_ms=100.0).rate == 0.0
    with pytest.raises(ValueError, match="budget"):
        deadline_misses([1.0], budget_ms=0.0)


def test_batch_fill_counts_each_batch_once() -> None:
    # batches 0 (3 frames), 1 (1 frame), 2 (3 frames), rows in any order
    fill = batch_fill([0, 1, 0, 2, 2, 0, 2], [3, 1, 3, 3, 3, 3, 3], cameras=3)
    assert fill.batches == 3
    assert fill.mean_size == pytest.approx(7 / 3)
    assert fill.full_share == pytest.approx(2 / 3)
    assert fill.size_counts == {1: 1, 3: 2}
    empty = batch_fill([], [], cameras=3)
    assert empty.batches == 0 and math.isnan(empty.mean_size)


def test_capture_spread_per_batch() -> None:
    ms = 1_000_000
    spread = capture_spread_ms(
        [1, 0, 0, 1, 2, 0],
        [12 * ms, 3 * ms, 1 * ms, 10 * ms, 7 * ms, 2 * ms],
    )
    # batch 0: 1..3 ms, batch 1: 10..12 ms, batch 2: one frame
    assert spread.tolist() == [2.0, 2.0, 0.0]
    assert capture_spread_ms([], []).size == 0


def test_source_spread_per_batch_leaves_out_batches_without_times() -> None:
    spread = source_spread_ms([0, 0, 1, 1, 2, 2], [1.0, 1.25, 2.0, 2.0, 3.0, float("nan")])
    assert spread.tolist() == [250.0, 0.0]  # batch 2 has a frame with no time
    assert source_spread_ms([], []).size == 0
    assert source_spread_ms([0], [float("nan")]).size == 0


def test_recent_window() -> None:
    s = 1_000_000_000
    recent = [(int(0.5 * s), 900.0), (int(9.2 * s), 10.0), (int(9.6 * s), 30.0)]
    fps, p95 = recent_window(recent, now_ns=10 * s, window_s=1.0)
    assert fps == 2.0
    assert p95 == pytest.approx(29.0)  # 10 + 0.95 * 20
    fps, p95 = recent_window(recent, now_ns=20 * s, window_s=1.0)
    assert fps == 0.0 and math.isnan(p95)


# --- timeline -------------------------------------------------------------------------------


def _timeline(rows: list[tuple[int, int, int, list[int]]], cameras: tuple[str, ...]) -> Timeline:
    """rows: (camera_index, frame_index, batch_index, stamps in STAMPS order)."""
    stamps = {
        name: np.array([r[3][k] for r in rows], dtype=np.int64) for k, name in enumerate(STAMPS)
    }
    col = np.array
    return Timeline(
        cameras=cameras,
        camera_index=col([r[0] for r in rows], dtype=np.int64),
        frame_index=col([r[1] for r in rows], dtype=np.int64),
        batch_index=col([r[2] for r in rows], dtype=np.int64),
        batch_size=col([2 for _ in rows], dtype=np.int64),
        detections=col([0 for _ in rows], dtype=np.int64),
        stamps=stamps,
    )


def test_stage_spans_add_up_to_end_to_end() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(20):
        steps = np.cumsum(rng.integers(0, 5_000_000, size=len(STAMPS)))
        rows.append((i % 2, i // 2, i // 2, [int(v) + i * 10**8 for v in steps]))
    tl = _timeline(rows, ("a", "b"))
    total = sum(tl.span(span) for span in STAGE_SPANS)
    np.testing.assert_allclose(total, tl.end_to_end_ms)
    assert len(tl.camera(1)) == 10
    assert "frames=20" in repr(tl)


def test_timeline_rejects_mismatched_columns() -> None:
    tl = _timeline([(0, 0, 0, list(range(len(STAMPS))))], ("a",))
    with pytest.raises(ValueError, match="frame_index: expected shape"):
        Timeline(
            cameras=("a",),
            camera_index=tl.camera_index,
            frame_index=np.zeros(2, dtype=np.int64),
            batch_index=tl.batch_index,
            batch_size=tl.batch_size,
            detections=tl.detections,
            stamps=tl.stamps,
        )
    with pytest.raises(ValueError, match=r"camera_index: expected 0\.\.0"):
        Timeline(
            cameras=("a",),
            camera_index=np.ones(1, dtype=np.int64),
            frame_index=tl.frame_index,
            batch_index=tl.batch_index,
            batch_size=tl.batch_size,
            detections=tl.detections,
            stamps=tl.stamps,
        )


def test_missing_stamps_take_the_previous_one() -> None:
    # an older frames.csv without the device span starts, and a stage stamped 0
    given = {name: np.array([100 * (k + 1)], dtype=np.int64) for k, name in enumerate(STAMPS)}
    del given["copy_start"], given["compute_start"]
    given["decoded"] = np.array([0], dtype=np.int64)
    filled = fill_missing_stamps(given)
    assert filled["copy_start"][0] == filled["batched"][0]
    assert filled["compute_start"][0] == filled["copy_done"][0]
    assert filled["decoded"][0] == filled["capture"][0]
    with pytest.raises(ValueError, match="capture"):
        fill_missing_stamps({})


# --- load sampler ---------------------------------------------------------------------------


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_cpu_sampler_runs_at_its_rate_and_stops(stop: threading.Event) -> None:
    # given a 50 Hz sampler on a CPU run
    got: list[Any] = []
    sampler = LoadSampler(rate_hz=50, stop=stop, on_sample=got.append)
    assert sampler.info.gpu_unavailable == "the run did not use a GPU"
    assert sampler.thread.name == "gpu-monitor"
    t0 = time.monotonic_ns()
    sampler.start()
    # when it runs for 0.5 s while this thread keeps a core busy (in BLAS, without the GIL,
    # like the pipeline's workers in torch and OpenCV)
    a = np.random.default_rng(0).random((400, 400))
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        a = a @ a
        a /= np.abs(a).max()
    stop.set()
    sampler.thread.join(timeout=2)
    # then it stopped, took about 25 samples on the frames' clock, and saw the busy core
    assert not sampler.thread.is_alive()
    assert 10 <= len(got) <= 30
    assert all(t0 < s.t_ns <= time.monotonic_ns() for s in got)
    assert [s.t_ns for s in got] == sorted(s.t_ns for s in got)
    assert max(s.process_cpu_pct for s in got) > 30
    assert all(len(s.per_core_cpu_pct) >= 1 and s.process_rss_bytes > 10 << 20 for s in got)
    assert got[-1].gpus == () and sampler.latest is got[-1]


def test_sampler_rejects_a_bad_rate(stop: threading.Event) -> None:
    with pytest.raises(ValueError, match="rate"):
        LoadSampler(rate_hz=0, stop=stop)


def test_without_nvml_the_reason_is_given(stop: threading.Event) -> None:
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x17, pci_device=0)

    def missing() -> Any:
        raise ImportError("No module named 'pynvml'")

    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=missing)
    assert sampler.info.gpu_unavailable is not None
    assert "nvidia-ml-py" in sampler.info.gpu_unavailable
    # and the CPU is still sampled
    assert sampler.sample().process_rss_bytes > 0


class _NvmlError(Exception):
    pass


def _fake_nvml(
    *, power_supported: bool = True, by_bus_id: bool = True, forbidden: tuple[int, ...] = ()
) -> Any:
    """A stand-in for pynvml with two GPUs, for the code paths around NVML (the real library
    is exercised by the cuda tests). `forbidden` GPUs refuse to open (outside this process's
    cgroup, say); `by_bus_id=False` is an older binding without the bus-id lookup. The GPUs
    opened are recorded in `.opened`."""
    pci = [
        types.SimpleNamespace(domain=0, bus=0x17, device=0, busId=b"00000000:17:00.0"),
        types.SimpleNamespace(domain=0, bus=0x65, device=0, busId=b"00000000:65:00.0"),
    ]
    opened: list[int] = []

    def power(h: int) -> int:
        if not power_supported:
            raise _NvmlError("Not Supported")
        return 210_500 + h

    def by_index(i: int) -> int:
        if i in forbidden:
            raise _NvmlError("Insufficient Permissions")
        opened.append(i)
        return i

    def by_bus(bus_id: str) -> int:
        for i, p in enumerate(pci):
            if p.busId.decode().lower() == bus_id.lower():
                return by_index(i)
        raise _NvmlError("Not Found")

    extra = {"nvmlDeviceGetHandleByPciBusId": by_bus} if by_bus_id else {}
    return types.SimpleNamespace(
        opened=opened,
        nvmlDeviceGetIndex=lambda h: h,
        **extra,
        NVMLError=_NvmlError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.1",
        nvmlSystemGetNVMLVersion=lambda: "13.580",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetPciInfo=lambda h: pci[h],
        nvmlDeviceGetName=lambda h: f"Fake GPU {h}",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 << 30, total=80 << 30),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=41),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=lambda h, kind: 61,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 1 else 2619,
        nvmlDeviceGetPcieThroughput=lambda h, kind: 1024 if kind == 0 else 2048,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4 | 0x1,
    )


def test_nvml_sample_of_the_gpu_in_use_by_pci_address(stop: threading.Event) -> None:
    # given CUDA device 0 is NVML device 1 (CUDA_VISIBLE_DEVICES renumbering)
    nvml = _fake_nvml()
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x65, pci_device=0)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    info = sampler.info
    assert info.gpu_unavailable is None
    assert [(g.index, g.cuda_index, g.name) for g in info.gpus] == [(1, 0, "Fake GPU 1")]
    assert info.gpus[0].power_limit_w == 700.0
    (g,) = sampler.sample().gpus
    assert (g.index, g.util_pct, g.mem_util_pct) == (1, 87.0, 41.0)
    assert g.mem_used_bytes == 3 << 30 and g.mem_total_bytes == 80 << 30
    assert g.power_w == pytest.approx(210.501)
    assert (g.temperature_c, g.sm_clock_mhz, g.mem_clock_mhz) == (61.0, 1980.0, 2619.0)
    assert (g.pcie_tx_bytes_s, g.pcie_rx_bytes_s) == (1 << 20, 2 << 20)
    assert throttle_names(g.throttle_reasons) == ("gpu_idle", "sw_power_cap")


@pytest.mark.parametrize("by_bus_id", [True, False])
def test_a_gpu_this_process_may_not_open_does_not_cost_the_metrics_of_ours(
    stop: threading.Event, by_bus_id: bool
) -> None:
    # given NVML GPU 0 belongs to another job (permission denied) and ours is GPU 1
    nvml = _fake_nvml(forbidden=(0,), by_bus_id=by_bus_id)
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x65, pci_device=0)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    assert sampler.info.gpu_unavailable is None
    assert [g.index for g in sampler.info.gpus] == [1]
    (g,) = sampler.sample().gpus
    assert g.util_pct == 87.0
    # and by bus id no other GPU is even opened
    assert nvml.opened == [1]


def test_unsupported_nvml_metric_is_nan_and_named(stop: threading.Event) -> None:
    nvml = _fake_nvml(power_supported=False)
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x17, pci_device=0)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    (g,) = sampler.sample().gpus
    assert math.isnan(g.power_w)
    assert g.util_pct == 87.0
    assert sampler.info.unsupported == ("power_w",)


def test_a_gpu_nvml_does_not_list_is_a_reason_not_a_crash(stop: threading.Event) -> None:
    ref = GpuRef(cuda_index=3, pci_domain=0, pci_bus=0x99, pci_device=0)
    nvml = _fake_nvml()
    shutdowns: list[bool] = []
    nvml.nvmlShutdown = lambda: shutdowns.append(True)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    assert "no GPU at PCI" in (sampler.info.gpu_unavailable or "")
    assert sampler.sample().gpus == ()
    assert shutdowns == [True]  # NVML was initialised, so it is shut down again


def test_no_utilization_and_no_power_limit_are_nan_and_json_null(stop: threading.Event) -> None:
    # given a GPU (a MIG instance, say) without utilization or an enforced power limit
    nvml = _fake_nvml()

    def unsupported(h: int) -> Any:
        raise _NvmlError("Not Supported")

    nvml.nvmlDeviceGetUtilizationRates = unsupported
    nvml.nvmlDeviceGetEnforcedPowerLimit = unsupported
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x17, pci_device=0)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    (g,) = sampler.sample().gpus
    assert math.isnan(g.util_pct) and math.isnan(g.power_limit_w)
    assert g.mem_used_bytes == 3 << 30 and g.temperature_c == 61.0
    info = sampler.info.as_dict()
    assert info["gpus"][0]["power_limit_w"] is None
    assert "util_pct" in info["unsupported"]
    json.dumps(info, allow_nan=False)


def test_a_gpu_that_breaks_mid_run_stops_gpu_sampling_not_the_run(
    stop: threading.Event,
) -> None:
    nvml = _fake_nvml()
    ref = GpuRef(cuda_index=0, pci_domain=0, pci_bus=0x17, pci_device=0)
    sampler = LoadSampler(stop=stop, gpus=[ref], nvml_importer=lambda: nvml)
    assert len(sampler.sample().gpus) == 1

    def gone(h: int) -> Any:
        raise RuntimeError("GPU has fallen off the bus")

    nvml.nvmlDeviceGetMemoryInfo = gone
    later = sampler.sample()
    assert later.gpus == () and later.process_rss_bytes > 0
    assert "fallen off the bus" in (sampler.info.gpu_unavailable or "")


def test_throttle_names() -> None:
    assert throttle_names(0) == ()
    assert throttle_names(-1) == ()
    assert throttle_names(0x40 | 0x1000) == ("hw_thermal", "other_0x1000")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_nvml_samples_the_gpu_in_use(stop: threading.Event) -> None:
    from drivepercept.telemetry.sampler import gpu_refs

    refs = gpu_refs(torch.device("cuda", 0))
    sampler = LoadSampler(stop=stop, gpus=refs, rate_hz=20)
    assert sampler.info.gpu_unavailable is None, sampler.info.gpu_unavailable
    assert sampler.info.gpus[0].name == torch.cuda.get_device_name(0)
    x = torch.randn(4096, 4096, device="cuda")
    samples = []
    for _ in range(10):
        for _ in range(20):
            x = x @ x
            x = x / x.norm()
        samples.append(sampler.sample())
    torch.cuda.synchronize()
    gpus = [s.gpus[0] for s in samples]
    assert max(g.util_pct for g in gpus) > 0
    assert all(g.mem_used_bytes > 0 and g.mem_total_bytes > g.mem_used_bytes for g in gpus)
    assert all(10 < g.temperature_c < 110 for g in gpus if not math.isnan(g.temperature_c))
    assert any(g.sm_clock_mhz > 0 for g in gpus)
    print("NVML sample:", gpus[-1], "unsupported:", sampler.info.unsupported)
