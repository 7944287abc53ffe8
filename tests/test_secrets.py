"""Credentials in camera URLs never reach an output: not the log, not an error line, not a
file of the run folder (issue 13, part 1). The real URL is used only to open the camera."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivepercept.sim.serve import CameraServer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_videos"
PASSWORD = "S3cretPass"
TOKEN = "T0kenXYZ42"
SECRETS = (PASSWORD, TOKEN)


@pytest.fixture
def server() -> Iterator[CameraServer]:
    with CameraServer([("front", SAMPLE / "front.mp4")], fps=15.0) as srv:
        yield srv


def _leaks(run_dir: Path, *texts: str) -> list[str]:
    """Where a secret shows: the files of the run folder (all of them) and the given texts."""
    found = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.name}: {s}" for s in SECRETS if s.encode() in data]
    for k, text in enumerate(texts):
        found += [f"text {k}: {s}" for s in SECRETS if s in text]
    return found


@pytest.mark.integration
def test_live_with_credentialed_urls_leaks_no_secret(tmp_path: Path, server: CameraServer) -> None:
    good = server.url("front").replace("http://", f"http://admin:{PASSWORD}@") + f"?token={TOKEN}"
    bad = f"rtsp://admin:{PASSWORD}@127.0.0.1:1/stream?password={PASSWORD}&key={TOKEN}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drivepercept",
            "-v",
            "live",
            "--model",
            "drivepercept-tiny",
            f"--camera=good={good}",
            f"--camera=bad={bad}",
            "--duration",
            "4",
            "--reconnect-initial-s",
            "0.1",
            "--reconnect-attempts",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "creds",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    run_dir = tmp_path / "creds"
    assert (run_dir / "run.json").exists(), proc.stderr
    assert "good" in proc.stdout and "bad" in proc.stderr  # the run went on and said so
    assert (run_dir / "report.html").exists() and (run_dir / "trace.json").exists()
    assert "***" in (run_dir / "run.json").read_text()  # redacted, not dropped
    assert _leaks(run_dir, proc.stdout, proc.stderr) == []


def test_errors_of_a_credentialed_source_leak_no_secret(tmp_path: Path) -> None:
    from drivepercept.errors import DrivePerceptError
    from drivepercept.run import RunOptions, run

    url = f"http://admin:{PASSWORD}@127.0.0.1:1/cam.mjpg?access_token={TOKEN}"
    with pytest.raises(DrivePerceptError) as err:
        run(
            RunOptions(
                sources=(url,),
                model="drivepercept-tiny",
                out_root=tmp_path,
                report_formats=(),
            )
        )
    assert _leaks(tmp_path, str(err.value), repr(err.value)) == []
