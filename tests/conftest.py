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
