"""The jobs, and drivepercept's Python API.

    from drivepercept.run import RunOptions, run

    result = run(RunOptions(sources=("sample_videos/rig.toml",), settings={"device": "cpu"}))
    print(result.stats.throughput_fps, result.run_dir)
    for frame in result.detections():  # one dict per camera frame
        print(frame["camera"], frame["frame_index"], frame["class_names"])

`run` replays recorded cameras (`Mode.REPLAY`), replays them at their own pace
(`Mode.REALTIME`) or reads live cameras (`Mode.LIVE`); `evaluate` scores a clip with ground
truth; `bench` compares the model alone, the pipeline and a naive loop, and `run_bench`
runs any of the benchmark suite's modes (`BENCH_MODES`: ceiling, live, capacity, sweep, ...).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivepercept.config import ReconnectPolicy
    from drivepercept.eval import EvalThresholds
    from drivepercept.run.bench_capacity import SIMULATED
    from drivepercept.run.bench_live import SimCameras
    from drivepercept.run.bench_suite import (
        BENCH_MODES,
        BenchReport,
        BenchRequest,
        run_bench,
        write_bench_json,
        write_bench_plot,
    )
    from drivepercept.run.bench_sweep import SweepGrid, SweepResult, sweep
    from drivepercept.run.benchmark import BenchResult, bench
    from drivepercept.run.evaluation import EvaluateResult, evaluate
    from drivepercept.run.export import export_model
    from drivepercept.run.job import RunResult, run
    from drivepercept.run.options import (
        DEFAULT_MODEL,
        ONNX_KEYS,
        PIPELINE_KEYS,
        RUN_KEYS,
        Mode,
        RunOptions,
        environment_settings,
        read_settings_file,
    )
    from drivepercept.run.quantize import QuantizeResult, quantize_model
    from drivepercept.sinks.fanout import OnFailure, SinkPolicy

# where each name lives: imported on first use, so that `drivepercept --help` (and anything
# else that needs only options) does not load torch, OpenCV and matplotlib
_HOMES = {
    "ReconnectPolicy": "drivepercept.config",
    "EvalThresholds": "drivepercept.eval",
    "SIMULATED": "drivepercept.run.bench_capacity",
    "SimCameras": "drivepercept.run.bench_live",
    "BENCH_MODES": "drivepercept.run.bench_suite",
    "BenchReport": "drivepercept.run.bench_suite",
    "BenchRequest": "drivepercept.run.bench_suite",
    "run_bench": "drivepercept.run.bench_suite",
    "write_bench_json": "drivepercept.run.bench_suite",
    "write_bench_plot": "drivepercept.run.bench_suite",
    "SweepGrid": "drivepercept.run.bench_sweep",
    "SweepResult": "drivepercept.run.bench_sweep",
    "sweep": "drivepercept.run.bench_sweep",
    "BenchResult": "drivepercept.run.benchmark",
    "bench": "drivepercept.run.benchmark",
    "EvaluateResult": "drivepercept.run.evaluation",
    "evaluate": "drivepercept.run.evaluation",
    "export_model": "drivepercept.run.export",
    "RunResult": "drivepercept.run.job",
    "run": "drivepercept.run.job",
    "QuantizeResult": "drivepercept.run.quantize",
    "quantize_model": "drivepercept.run.quantize",
    "DEFAULT_MODEL": "drivepercept.run.options",
    "environment_settings": "drivepercept.run.options",
    "ONNX_KEYS": "drivepercept.run.options",
    "PIPELINE_KEYS": "drivepercept.run.options",
    "RUN_KEYS": "drivepercept.run.options",
    "Mode": "drivepercept.run.options",
    "RunOptions": "drivepercept.run.options",
    "read_settings_file": "drivepercept.run.options",
    "OnFailure": "drivepercept.sinks.fanout",
    "SinkPolicy": "drivepercept.sinks.fanout",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'drivepercept.run' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found here from now on
    return value


__all__ = [
    "BENCH_MODES",
    "DEFAULT_MODEL",
    "ONNX_KEYS",
    "PIPELINE_KEYS",
    "RUN_KEYS",
    "SIMULATED",
    "BenchReport",
    "BenchRequest",
    "BenchResult",
    "EvalThresholds",
    "EvaluateResult",
    "Mode",
    "OnFailure",
    "QuantizeResult",
    "ReconnectPolicy",
    "RunOptions",
    "RunResult",
    "SimCameras",
    "SinkPolicy",
    "SweepGrid",
    "SweepResult",
    "bench",
    "environment_settings",
    "evaluate",
    "export_model",
    "quantize_model",
    "read_settings_file",
    "run",
    "run_bench",
    "sweep",
    "write_bench_json",
    "write_bench_plot",
]
