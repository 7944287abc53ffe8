"""The third-party fixtures of ../shared are reached through `tests/thirdparty.py` alone, so
that hiding it (DRIVEPERCEPT_TEST_SHARED=none, as `.ci/run` does) hides it from every test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import thirdparty

TESTS = Path(__file__).resolve().parent
# a path into ../shared spelled in a test: `/ "shared"`, "shared/models", "../shared/..."
SPELLED = re.compile(r"""/\s*["']shared["']|["'](?:\.\./)?shared/""")


def test_no_test_spells_its_own_path_into_shared() -> None:
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(TESTS.glob("*.py"))
        if path.name not in ("thirdparty.py", "test_thirdparty.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SPELLED.search(line)
    ]
    assert offenders == [], "use tests/thirdparty.py's paths: " + ", ".join(offenders)


def test_hiding_points_every_path_at_nothing() -> None:
    code = (
        "import thirdparty as t; "
        "print(all(not t.present(p) for p in (t.SHARED, t.REAL_VIDEOS, t.REAL_LABELED, "
        "t.YOLOX_NANO_ONNX, t.DEIMV2_ATTO, t.DEIMV2_FEMTO)))"
    )
    env = {"DRIVEPERCEPT_TEST_SHARED": "none", "PYTHONPATH": str(TESTS)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"
    assert TESTS.parents[1] / "shared" == thirdparty.DEFAULT
