"""Names a user chooses from before anything runs: the command line's choices and defaults.

They live here, apart from the modules that act on them (which re-export them), so that the
parser, and with it `drivepercept --help`, `--version` and every usage error, loads nothing
but the standard library: no numpy, torch, OpenCV or ONNX Runtime (tests/test_cli.py times
it in a fresh interpreter). Imports nothing of ours, and of the standard library only
`collections.abc` and `types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# The real-road default: a pretrained COCO detector (its official weights are downloaded once).
# A synthetic rig's rig.toml names the model trained on it instead (drivepercept-tiny).
# Owner: drivepercept.run.options.
DEFAULT_MODEL = "yolox-nano"

# `drivepercept bench --mode`. Owner: drivepercept.bench.suite.
BENCH_MODES: tuple[str, ...] = (
    "default",
    "ceiling",
    "pipeline",
    "naive",
    "live",
    "capacity",
    "sweep",
)

# `drivepercept quantize --format`: the forms of a statically quantized ONNX model -> ONNX
# Runtime's `QuantFormat` member of each. Owner: drivepercept.models.onnx.quantize.
QUANT_FORMATS: Mapping[str, str] = MappingProxyType({"qdq": "QDQ", "qoperator": "QOperator"})
