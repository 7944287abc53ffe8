"""Shared fixtures, and the suite's checks of where it runs."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

# the checkout these tests belong to: the package they test is its drivepercept/
CHECKOUT = Path(__file__).resolve().parents[1]


def _origin(where: str | None) -> str:
    """Where `import drivepercept` finds the package (resolved, so a checkout reached through
    a symlink is itself): in this process (`where` None), or in a fresh interpreter started
    in the folder `where`, as the suite's subprocesses start (`python -m drivepercept ...`,
    whose cwd is often a test's tmp_path)."""
    if where is None:
        spec = importlib.util.find_spec("drivepercept")
        origin = spec.origin if spec and spec.origin else ""
    else:
        probe = "import importlib.util as u; s = u.find_spec('drivepercept'); print(s and s.origin)"
        origin = subprocess.run(
            [sys.executable, "-c", probe], cwd=where, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    return str(Path(origin).resolve().parent) if origin not in ("", "None") else "nowhere"


def _refuse(why: str) -> NoReturn:
    # one line and out: pytest.exit here would come wrapped in a conftest traceback
    print(f"error: {why}", file=sys.stderr)
    raise SystemExit(4)


def _refuse_another_checkout() -> None:
    """Stops the run at once, in one line, when `drivepercept` is not this checkout's package:
    a venv whose editable install points at another clone makes a green run of the wrong
    code (it happened three sessions running). Both the suite's own import and that of its
    subprocesses (a fresh interpreter in an empty folder) are checked."""
    expected = str(CHECKOUT / "drivepercept")
    with tempfile.TemporaryDirectory(prefix="drivepercept-checkout-") as empty:
        for who, where in (("this process", None), ("a subprocess", empty)):
            try:
                found = _origin(where)
            except subprocess.TimeoutExpired:
                _refuse(f"a fresh interpreter took over 60 s to find drivepercept ({who})")
            if found != expected:
                _refuse(
                    f"tests of {CHECKOUT} would test the drivepercept of {found} ({who}'s "
                    f"import), not {expected}: run `python3 -m pip install -e '.[dev]'` in "
                    f"{CHECKOUT}"
                )


_refuse_another_checkout()  # before anything below imports drivepercept

import cv2
import thirdparty
from standins import (
    REAL_NAMES,
    RoadClips,
    make_road_clips,
    make_yolox_nano_export,
    real_road_clips,
)
from thirdparty import REAL_LABELED, REAL_VIDEOS, YOLOX_NANO_ONNX, present

from drivepercept.cli import main

# fixtures that read ../shared when it is there
SHARED_FIXTURES = frozenset(
    {"real_videos", "road_clips", "yolox_nano_onnx", "released_yolox_nano_onnx", "real_labeled"}
)


# ../shared as the tests see it, and where it is beside the checkout (a module that spells
# its own path there still counts when the folder is hidden)
ROOTS = (thirdparty.SHARED, thirdparty.DEFAULT)


def _reads_shared(module: object) -> bool:
    """Whether a test module takes paths from `thirdparty` (what ../shared holds)."""
    return any(
        getattr(value, "__module__", None) == thirdparty.__name__
        or (isinstance(value, Path) and any(map(value.is_relative_to, ROOTS)))
        for value in vars(module).values()
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `shared` every test that may read ../shared, through a fixture or its module's
    paths: `.ci/run` runs those once more with the folder hidden (DRIVEPERCEPT_TEST_SHARED
    =none), so that a test passing only with the real fixtures cannot land."""
    reads: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        name = getattr(module, "__name__", "")
        if name not in reads:
            reads[name] = module is not None and _reads_shared(module)
        if reads[name] or SHARED_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.shared)


# how the tests that need a desktop tool went (marked `desktop`), said at the end of the run:
# CI's log shows that they ran, not only that they did not fail
_DESKTOP: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "desktop" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _DESKTOP[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for nodeid, outcome in _DESKTOP.items():
        terminalreporter.write_line(f"desktop test {outcome.upper()}: {nodeid}")


@pytest.fixture
def real_videos() -> Path:
    """The folder of real third-party clips (../shared/realvideos); skips when it is absent.
    Prefer `road_clips`, which stands in made clips there."""
    if not present(REAL_VIDEOS):
        pytest.skip(f"real clips not found at {REAL_VIDEOS}")
    return REAL_VIDEOS


@pytest.fixture(scope="session")
def road_clips(tmp_path_factory: pytest.TempPathFactory) -> RoadClips:
    """Three road clips of different sizes, rates and containers: the real third-party ones
    where ../shared has them, else clips made from the sample rig at the same sizes."""
    if all(present(REAL_VIDEOS / name) for name in REAL_NAMES):
        return real_road_clips(REAL_VIDEOS)
    return make_road_clips(tmp_path_factory.mktemp("road_clips"))


@pytest.fixture(scope="session")
def yolox_nano_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A YOLOX-nano ONNX export structured as the official release: the released file where
    ../shared/models has it, else a made one with seeded random weights (tests that need
    its real detections use `released_yolox_nano_onnx`)."""
    pytest.importorskip("onnx")
    if present(YOLOX_NANO_ONNX):
        return YOLOX_NANO_ONNX
    return make_yolox_nano_export(tmp_path_factory.mktemp("yolox") / "yolox_nano.onnx")


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
def released_yolox_nano_onnx() -> Path:
    """The released YOLOX-nano ONNX export itself (../shared/models), for tests that need
    its real detections; skips when it is absent."""
    if not present(YOLOX_NANO_ONNX):
        pytest.skip(
            f"needs the released YOLOX-nano weights ({YOLOX_NANO_ONNX} absent): seeded random "
            "weights give no real detections"
        )
    pytest.importorskip("onnx")
    return YOLOX_NANO_ONNX


@pytest.fixture
def real_labeled() -> Path:
    """Real labelled images beside the project (../shared/reallabeled); skips when absent."""
    if not present(REAL_LABELED):
        pytest.skip(f"real labelled images not found at {REAL_LABELED}")
    return REAL_LABELED


@pytest.fixture
def in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[str]], tuple[int, str]]:
    """`drivepercept ARGV` in this process: (exit code, stderr). Logging is set up by `main`
    as on the command line (a handler on stderr), and taken down again afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for name in ("OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL", "RUST_LOG"):  # main sets them:
        monkeypatch.setenv(name, "")  # put back after (delenv of an unset name would record
        monkeypatch.delenv(name)  # nothing to undo)

    opencv_level = cv2.utils.logging.getLogLevel()  # main lowers it too

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
            cv2.utils.logging.setLogLevel(opencv_level)
        return code, capsys.readouterr().err

    return call
