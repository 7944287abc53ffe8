"""The jobs, and drivepercept's Python API.

    from drivepercept.run import RunOptions, run

    result = run(RunOptions(sources=("sample_videos/rig.toml",), settings={"device": "cpu"}))
    print(result.stats.throughput_fps, result.run_dir)
    for frame in result.detections():  # one dict per camera frame
        print(frame["camera"], frame["frame_index"], frame["class_names"])

`run` replays recorded cameras (`Mode.REPLAY`), replays them at their own pace
(`Mode.REALTIME`) or reads live cameras (`Mode.LIVE`); `evaluate` scores a clip with ground
truth; `bench` compares the model alone, the pipeline and a naive loop.
"""

from __future__ import annotations

from drivepercept.config import ReconnectPolicy
from drivepercept.eval import EvalThresholds
from drivepercept.run.bench import BenchResult, bench
from drivepercept.run.evaluate import EvaluateResult, evaluate
from drivepercept.run.job import RunResult, run
from drivepercept.run.options import (
    DEFAULT_MODEL,
    PIPELINE_KEYS,
    RUN_KEYS,
    Mode,
    RunOptions,
    read_settings_file,
)
from drivepercept.sinks.fanout import OnFailure, SinkPolicy

__all__ = [
    "DEFAULT_MODEL",
    "PIPELINE_KEYS",
    "RUN_KEYS",
    "BenchResult",
    "EvalThresholds",
    "EvaluateResult",
    "Mode",
    "OnFailure",
    "ReconnectPolicy",
    "RunOptions",
    "RunResult",
    "SinkPolicy",
    "bench",
    "evaluate",
    "read_settings_file",
    "run",
]
