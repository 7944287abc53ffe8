"""The jobs, and drivepercept's Python API.

    from drivepercept.run import RunOptions, run

    result = run(RunOptions(sources=("sample_videos/rig.toml",), settings={"device": "cpu"}))
    print(result.stats.throughput_fps, result.run_dir)
    for frame in result.detections():  # one dict per camera frame
        print(frame["camera"], frame["frame_index"], frame["class_names"])

`run` replays recorded cameras (`Mode.REPLAY`), replays them at their own pace
(`Mode.REALTIME`) or reads live cameras (`Mode.LIVE`); `evaluate_clip` scores a clip with ground
truth. The benchmark suite over these jobs is `drivepercept.bench`.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The public face, as one table: a name and the module it lives in, a line each. Type checkers
# read these imports (`name as name`: a re-export); at run time `_homes` reads them, and a name
# is imported from its module on first use, so that `drivepercept --help` (and anything else
# that needs only options) does not load torch, OpenCV and matplotlib.
if TYPE_CHECKING:
    from drivepercept.config import ReconnectPolicy as ReconnectPolicy
    from drivepercept.eval import EvalThresholds as EvalThresholds
    from drivepercept.run.evaluation import EvaluateResult as EvaluateResult
    from drivepercept.run.evaluation import evaluate_clip as evaluate_clip
    from drivepercept.run.export import export_model as export_model
    from drivepercept.run.job import RunResult as RunResult
    from drivepercept.run.job import run as run
    from drivepercept.run.options import DEFAULT_MAX_GAP_S as DEFAULT_MAX_GAP_S
    from drivepercept.run.options import DEFAULT_MODEL as DEFAULT_MODEL
    from drivepercept.run.options import ONNX_KEYS as ONNX_KEYS
    from drivepercept.run.options import PIPELINE_KEYS as PIPELINE_KEYS
    from drivepercept.run.options import RUN_KEYS as RUN_KEYS
    from drivepercept.run.options import Mode as Mode
    from drivepercept.run.options import ModelOptions as ModelOptions
    from drivepercept.run.options import RunOptions as RunOptions
    from drivepercept.run.options import environment_settings as environment_settings
    from drivepercept.run.options import priorities_setting as priorities_setting
    from drivepercept.run.options import read_settings_file as read_settings_file
    from drivepercept.run.options import rerun_target as rerun_target
    from drivepercept.run.options import topics_setting as topics_setting
    from drivepercept.run.quantize import QuantizeResult as QuantizeResult
    from drivepercept.run.quantize import quantize_model as quantize_model
    from drivepercept.sinks.fanout import OnFailure as OnFailure
    from drivepercept.sinks.fanout import SinkPolicy as SinkPolicy
    from drivepercept.sinks.rerun import RerunTarget as RerunTarget


def _homes() -> dict[str, str]:
    """Name -> home module: the imports under TYPE_CHECKING above, read from this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    table = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: node.module
        for node in table.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_HOMES = _homes()
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'drivepercept.run' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found here from now on
    return value
