"""Where the third-party test fixtures are: `../shared` beside the checkout, or nowhere.

`../shared` (real road clips, real labelled images, released ONNX models) is there on the
project's own machines and in CI, but not on a stranger's fresh clone. Every test that
reads it takes its paths from here, so that one switch hides it from all of them at once:

    DRIVEPERCEPT_TEST_SHARED=none python3 -m pytest     # as on a clone without ../shared
    DRIVEPERCEPT_TEST_SHARED=/elsewhere python3 -m pytest

`.ci/run` runs the tests that touch it once more with it hidden, so a test that passes only
with the real fixtures cannot land. Tests read this module's constants, never the
environment themselves.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "DRIVEPERCEPT_TEST_SHARED"
HIDDEN = ("none", "off", "hidden", "0")


# where ../shared is beside a checkout, hidden or not
DEFAULT = Path(__file__).resolve().parents[2] / "shared"


def _root() -> Path:
    """The shared folder the tests are to use (a path that does not exist when hidden)."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in HIDDEN:
        return Path("/nonexistent/drivepercept-shared-hidden")
    if value:
        return Path(value).expanduser().resolve()
    return DEFAULT


SHARED = _root()
REAL_VIDEOS = SHARED / "realvideos"
REAL_LABELED = SHARED / "reallabeled"
SHARED_MODELS = SHARED / "models"
YOLOX_NANO_ONNX = SHARED_MODELS / "yolox_nano" / "yolox_nano.onnx"
DEIMV2_FEMTO = SHARED_MODELS / "deimv2" / "deimv2_hgnetv2_femto_coco.onnx"
DEIMV2_ATTO = SHARED_MODELS / "deimv2" / "deimv2_hgnetv2_atto_coco.onnx"


def present(path: Path) -> bool:
    """Whether a shared fixture is there (False for every path when the folder is hidden)."""
    return path.exists()
