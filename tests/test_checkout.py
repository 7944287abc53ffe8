"""The suite tests this checkout or nothing (tests/conftest.py): a `drivepercept` imported
from elsewhere stops the run at once, in one line that names both folders and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("how", ["python -m pytest", "pytest in another folder"])
def test_a_drivepercept_from_another_folder_stops_the_suite_in_one_line(
    tmp_path: Path, how: str
) -> None:
    # given another folder's drivepercept first on the path, as an editable install made in
    # another clone puts it
    other = tmp_path / "other"
    (other / "drivepercept").mkdir(parents=True)
    (other / "drivepercept" / "__init__.py").write_text('"""another clone"""\n')
    env = {"PYTHONPATH": str(other), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    # when the suite is started on this checkout's tests
    cwd = CHECKOUT if how == "python -m pytest" else tmp_path
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(CHECKOUT / "tests"), "-p", "no:cacheprovider"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # then it stops before collecting anything: exit 4, one line naming both and the fix
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert len(lines) == 1, lines
    assert str(other / "drivepercept") in lines[0] and str(CHECKOUT / "drivepercept") in lines[0]
    assert "pip install -e '.[dev]'" in lines[0]
