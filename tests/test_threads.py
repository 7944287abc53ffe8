"""drivepercept/_threads.py: torch's OpenMP threads wait passively unless the user chose, or
torch was loaded first (libgomp reads the setting once, when torch loads it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOW = "import os; print(os.environ.get('OMP_WAIT_POLICY'))"


def _policy_after(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), clean.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", f"{code}; {SHOW}"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_importing_drivepercept_first_makes_the_waits_passive() -> None:
    assert _policy_after("import drivepercept") == "PASSIVE"


def test_a_policy_the_user_set_is_kept() -> None:
    assert _policy_after("import drivepercept", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_torch_loaded_first_is_left_alone() -> None:
    # too late to matter: saying PASSIVE then would be a claim about threads that spin
    assert _policy_after("import torch; import drivepercept") == "None"


def test_the_run_record_says_which_wait_the_threads_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from drivepercept.run.record import environment

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert environment("cpu")["omp_wait_policy"] == "PASSIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert environment("cpu")["omp_wait_policy"] == "default (spin, then sleep)"
