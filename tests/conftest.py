"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "realvideos"


@pytest.fixture
def real_videos() -> Path:
    """The folder of real third-party clips beside the project; skips when it is absent."""
    if not REAL_VIDEOS.is_dir():
        pytest.skip(f"real clips not found at {REAL_VIDEOS}")
    return REAL_VIDEOS


SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def yolox_nano_onnx() -> Path:
    """The released YOLOX-nano ONNX export beside the project (../shared/models); skips
    when it is absent."""
    path = SHARED / "models" / "yolox_nano" / "yolox_nano.onnx"
    if not path.is_file():
        pytest.skip(f"YOLOX-nano ONNX export not found at {path}")
    pytest.importorskip("onnx")
    return path


@pytest.fixture
def real_labeled() -> Path:
    """Real labelled images beside the project (../shared/reallabeled); skips when absent."""
    path = SHARED / "reallabeled"
    if not path.is_dir():
        pytest.skip(f"real labelled images not found at {path}")
    return path
