"""scripts/gpu_check.sh: runnable on the lent GPU machine as it is, and within its time.

The GPU run itself needs a GPU; its dry run does every step on the CPU with tiny sizes, so a
broken step shows up here, not in the few minutes a GPU is lent.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _code_lines() -> list[str]:
    """The script without comments (its header explains how to fill .whl with pip, here)."""
    return [line.split("#", 1)[0] for line in SCRIPT.read_text().splitlines()]


# what the step names' variables are in a dry run (the script sets them)
DRY_RUN_NAMES = {
    "$HALF": "bf16",
    "$HD_SIZE": "320x180",
    "$SPEED_FLAGS": "--no-compile --no-cuda-graphs",
}


def _dry_run_name(name: str) -> str:
    for variable, value in DRY_RUN_NAMES.items():
        name = name.replace(variable, value)
    return name


def _steps() -> list[tuple[str, int]]:
    steps = []
    for line in _code_lines():
        found = re.match(r'\s*step ("[^"]+"|\S+) (\d+) ', line)
        if found:
            steps.append((found.group(1).strip('"'), int(found.group(2))))
    return steps


def test_the_script_never_calls_pip() -> None:
    assert not [line for line in _code_lines() if re.search(r"\bpip\b", line)]


def test_step_limits_with_their_kill_grace_add_up_to_at_most_480_s() -> None:
    text = "\n".join(_code_lines())
    kill_after = int(re.search(r"KILL_AFTER=(\d+)", text).group(1))  # type: ignore[union-attr]
    steps = _steps()
    assert len(steps) >= 10
    total = sum(limit + kill_after for _, limit in steps)
    assert total <= 480, (total, steps)
    assert 'timeout -k "$KILL_AFTER" "$limit"' in text


@pytest.mark.slow  # 2-3 min: the whole script on the CPU; the step limits are checked above
@pytest.mark.integration
@pytest.mark.timeout(660)
def test_dry_run_runs_every_step_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    # in a session of its own, so that a run past its time is stopped whole (its benches
    # and camera server too, not only bash)
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--dry-run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    # a failing step named with its own output (the log's tail is the last steps')
    failed = re.findall(r"^== (.+): exit ([1-9]\d*) after (\d+) s$", log, re.M)
    parts = [log[log.index(f"== {name} (limit") :][:3000] for name, _, _ in failed]
    assert proc.returncode == 0, f"failed steps {failed}\n" + "\n".join(parts or [log[-4000:]])
    for name, _ in _steps():
        name = _dry_run_name(name)
        assert "$" not in name, name  # a variable DRY_RUN_NAMES does not know
        assert re.search(rf"== {re.escape(name)}: exit 0 after \d+ s", log), name
    assert "gpu_check: passed" in log
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert re.search(r"replay-fp32: 36 frames", summary), summary
    assert "warm-up [{'batch_size': 6" in summary
    # every bench says its speed options and the load it saw (no GPU here: n/a, and why)
    benches = ("ssdlite-bf16", "yolox-nano-bf16", "hd-ceiling", "hd-pipeline", "hd-speed")
    for bench in (*benches, "hd-live", "hd-capacity"):
        # channels_last is torch's: a bench that runtime auto put on OpenVINO (bf16 on a CPU
        # with bf16 units, the [openvino] extra installed) runs without it
        table = summary.split(f"\nbench-{bench}:\n", 1)[-1].split("\nbench-", 1)[0]
        layout = not re.search(r"^speed: openvino,", table, re.M)
        head = rf"^bench-{bench} \(\w+\): bf16, channels_last {layout}, compile False"
        assert re.search(head, summary, re.M), bench
    assert "  best batch " in summary and "  capacity 0 camera(s) at 320x180" in summary
    assert "GPU n/a (the run did not use a GPU), CPU " in summary
    assert "speed: bf16, channels_last on, compile off, cuda graphs off" in summary
    with tarfile.open(tmp_path / "out" / "results.tgz") as tar:
        names = tar.getnames()
    for run in ("replay-fp32", "replay-bf16", "live"):
        assert f"results/{run}/summary.json" in names, names
    assert "results/replay-fp32/compare-replay-bf16.html" in names, names
    for bench in (*benches, "hd-live", "hd-capacity"):
        assert f"results/bench-{bench}.json" in names, names
    # no more files than the device tool brings back (8)
    assert len(list((tmp_path / "out").iterdir())) <= 8


def test_a_wrong_argument_is_refused() -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--fast"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "usage" in proc.stderr
