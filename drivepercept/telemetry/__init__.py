"""Telemetry: the run's timeline (per-frame stage timestamps), the load sampler (`gpu-monitor`:
NVML GPU load, CPU, memory) and the statistics over them, as small pure functions.

Telemetry receives timestamps; it never reaches into the engine to get them.
"""

from __future__ import annotations

from drivepercept.telemetry.sampler import (
    DEFAULT_RATE_HZ,
    GpuInfo,
    GpuRef,
    LoadSampler,
    SamplerInfo,
    throttle_names,
)
from drivepercept.telemetry.stats import (
    MAX_WINDOWS,
    BatchFill,
    DeadlineMisses,
    LatencyHistogram,
    LatencyStats,
    Windows,
    batch_fill,
    capture_spread_ms,
    deadline_misses,
    frame_index_gaps,
    latency_stats,
    rate_fps,
    recent_window,
    source_spread_ms,
    window_width_s,
    windowed_rate,
)
from drivepercept.telemetry.timeline import (
    STAGE_SPANS,
    Span,
    Timeline,
    fill_missing_stamps,
)

__all__ = [
    "DEFAULT_RATE_HZ",
    "MAX_WINDOWS",
    "STAGE_SPANS",
    "BatchFill",
    "DeadlineMisses",
    "GpuInfo",
    "GpuRef",
    "LatencyHistogram",
    "LatencyStats",
    "LoadSampler",
    "SamplerInfo",
    "Span",
    "Timeline",
    "Windows",
    "batch_fill",
    "capture_spread_ms",
    "deadline_misses",
    "fill_missing_stamps",
    "frame_index_gaps",
    "latency_stats",
    "rate_fps",
    "recent_window",
    "source_spread_ms",
    "throttle_names",
    "window_width_s",
    "windowed_rate",
]
