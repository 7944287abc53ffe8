"""Shared fixtures."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from drivepercept.cli import main

REAL_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "realvideos"


@pytest.fixture
def real_videos() -> Path:
    """The folder of real third-party clips beside the project; skips when it is absent."""
    if not REAL_VIDEOS.is_dir():
        pytest.skip(f"real clips not found at {REAL_VIDEOS}")
    return REAL_VIDEOS


SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(autouse=True)
def onnx_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ONNX export cache of runs with the default runtime (auto): one folder for the
    session, never the user's (~/.cache/drivepercept/onnx). The CLI, in-process or not,
    finds it in $DRIVEPERCEPT_ONNX_CACHE; the Python API through its default."""
    folder = tmp_path_factory.getbasetemp() / "onnx-cache"
    monkeypatch.setenv("DRIVEPERCEPT_ONNX_CACHE", str(folder))
    monkeypatch.setattr("drivepercept.run.job.default_onnx_cache", lambda environ: folder)
    return folder


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


@pytest.fixture
def in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[str]], tuple[int, str]]:
    """`drivepercept ARGV` in this process: (exit code, stderr). Logging is set up by `main`
    as on the command line (a handler on stderr), and taken down again afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for name in ("OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL"):  # main sets them
        monkeypatch.delenv(name, raising=False)

    def call(argv: list[str]) -> tuple[int, str]:
        capsys.readouterr()
        root.handlers[:] = []  # so that main's logging.basicConfig takes effect
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
        return code, capsys.readouterr().err

    return call
