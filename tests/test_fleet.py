"""Fleet replay on Ray (drivepercept.fleet): many drives, one report, faults survived.

Ray starts once for this module (a local instance of 2 CPUs); the CLI tests start their own
in their process. Drives are small simulated clips (2 cameras, 1 s at 10 fps) with the bundled
model their rig names.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import children
import pytest

ray = pytest.importorskip("ray")

from drivepercept.fleet import FleetOptions, run_fleet  # noqa: E402
from drivepercept.fleet.drives import Drive, resolve_drives  # noqa: E402
from drivepercept.fleet.scheduler import size_workers  # noqa: E402
from drivepercept.run import RunOptions, run  # noqa: E402
from drivepercept.sim.clip import simulate_clip  # noqa: E402
from drivepercept.sim.config import SimulationConfig  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
QUIET: dict[str, Any] = {"report_formats": ("json",)}  # drives' reports: the JSON only (faster)


def _clip(out: Path, seed: int, seconds: float = 1.0) -> Path:
    config = SimulationConfig(
        out_dir=out, cameras=2, seconds=seconds, fps=10.0, width=320, height=192, seed=seed
    )
    simulate_clip(config)
    return out


@pytest.fixture(scope="module")
def drives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drives")
    made = {f"d{s}": _clip(root / f"d{s}", seed=100 + s) for s in range(1, 5)}
    corrupt = root / "corrupt"
    shutil.copytree(made["d1"], corrupt)
    (corrupt / "front.mp4").write_bytes(os.urandom(20_000))  # not a video any more
    made["corrupt"] = corrupt
    return made


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _frames(path: Path) -> list[tuple[Any, ...]]:
    """detections.jsonl without its timing: (camera, frame, classes, scores, boxes), sorted."""
    rows = []
    for line in path.read_text().splitlines():
        f = json.loads(line)
        rows.append((f["camera"], f["frame_index"], f["class_names"], f["scores"], f["boxes"]))
    return sorted(rows, key=lambda r: (r[0], r[1]))


def _same_detections(a: Path, b: Path) -> None:
    fa, fb = _frames(a), _frames(b)
    assert [r[:3] for r in fa] == [r[:3] for r in fb]
    for ra, rb in zip(fa, fb, strict=True):
        # the fleet's workers run torch with one thread each: sums in another order
        assert ra[3] == pytest.approx(rb[3], abs=2e-4)
        for box_a, box_b in zip(ra[4], rb[4], strict=True):
            assert box_a == pytest.approx(box_b, abs=0.02)


def test_four_drives_and_a_corrupt_one(
    drives: dict[str, Path], ray_session: None, tmp_path: Path
) -> None:
    # given four good drives and a corrupt one, on two workers of one CPU each
    order = ["d1", "d2", "corrupt", "d3", "d4"]
    options = FleetOptions(
        drives=tuple(str(drives[n]) for n in order), out=tmp_path / "out", run=QUIET
    )
    # when the fleet runs
    result = run_fleet(options)
    # then the corrupt drive failed alone, and says why
    status = {o.drive: o.status for o in result.outcomes}
    assert status == {
        "d1": "complete",
        "d2": "complete",
        "corrupt": "failed",
        "d3": "complete",
        "d4": "complete",
    }
    why = result.failure()
    assert why is not None and why.startswith("drive corrupt failed: ") and "front" in why
    # and each good drive's detections equal a replay of it alone, with the same options
    for name in ("d1", "d2", "d3", "d4"):
        alone = run(
            RunOptions(
                sources=(str(drives[name] / "rig.toml"),),
                out_root=tmp_path / "alone",
                name=name,
                **QUIET,
            )
        )
        _same_detections(
            tmp_path / "out" / name / "detections.jsonl", alone.run_dir / "detections.jsonl"
        )
        assert (tmp_path / "out" / name / "eval.json").is_file()  # labelled: scored
    # and fleet.json's totals are the sums of its drives
    record = json.loads(result.fleet_json.read_text())
    rows, totals = record["drives"], record["totals"]
    assert [r["drive"] for r in rows] == order
    assert totals["frames"] == sum(r["frames"] for r in rows) == 4 * 2 * 10
    assert totals["retries"] == sum(r["retries"] for r in rows) == 0
    assert (totals["complete"], totals["failed"]) == (4, 1)
    assert record["failures"] == [
        {"drive": "corrupt", "status": "failed", "error": result.outcomes[2].error}
    ]
    assert record["workers"]["count"] == 2 and len(record["per_worker"]) == 2
    assert sum(w["drives"] for w in record["per_worker"]) == 5
    acc = totals["accuracy"]
    assert acc["drives"] == 4 and 0.0 < acc["map_50"] <= 1.0
    assert totals["latency_ms"]["p50"] <= totals["latency_ms"]["p99"] <= totals["latency_ms"]["max"]
    html = result.fleet_html.read_text()
    assert "corrupt" in html and "data:image/png;base64" in html  # the worker timeline
    assert not (tmp_path / "out" / "_fleet" / "partial").exists()


@pytest.mark.slow  # 10 s of Ray; CI's slow stage runs it
def test_a_killed_worker_has_its_drive_retried(
    drives: dict[str, Path], ray_session: None, tmp_path: Path
) -> None:
    # given one worker, and a watcher that kills its process as soon as the drive starts
    out = tmp_path / "out"
    marker = out / "_fleet" / "attempts" / "d2" / "1.json"
    killed: list[int] = []

    def kill_first_attempt() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not marker.exists():
            time.sleep(0.01)
        time.sleep(0.3)  # mid-drive: the pipeline has begun
        pid = json.loads(marker.read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    watcher = threading.Thread(target=kill_first_attempt, name="killer", daemon=True)
    watcher.start()
    options = FleetOptions(drives=(str(drives["d2"]),), out=out, run=QUIET, workers=1)
    # when the fleet runs
    result = run_fleet(options)
    watcher.join(timeout=5)
    # then the worker was killed once, and the drive completed on the retry
    assert len(killed) == 1
    (outcome,) = result.outcomes
    assert (outcome.status, outcome.attempt) == ("complete", 2)
    assert outcome.worker.split(":")[-1] != str(killed[0])  # another process
    assert result.record["totals"]["retries"] == 1
    # and its folder is whole: one run, every frame once
    folder = out / "d2"
    assert json.loads((folder / "run.json").read_text())["status"] == "complete"
    frames = _frames(folder / "detections.jsonl")
    assert len(frames) == len({(f[0], f[1]) for f in frames}) == 20
    assert not (out / "_fleet" / "partial").exists()


def _cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return children.cli("fleet", "--no-progress", *args, env=env)


@pytest.mark.slow  # 23 s; the quick suite's fleet run is test_four_drives_and_a_corrupt_one
def test_ctrl_c_then_resume_runs_only_the_unfinished(
    drives: dict[str, Path], ray_session: None, tmp_path: Path
) -> None:
    # given a fleet of four drives on one worker, from the command line
    out = tmp_path / "out"
    names = ["d1", "d2", "d3", "d4"]
    proc = _cli(
        *(str(drives[n]) for n in names), "--out", str(out), "--workers", "1", "--report", "json"
    )
    # when Ctrl-C comes after the first drive has finished
    deadline = time.monotonic() + 120
    while not (out / "d1" / "fleet_drive.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # then it stops (exit 130) and its report holds what finished
    assert proc.returncode == 130, err
    record = json.loads((out / "_fleet" / "fleet.json").read_text())
    assert record["status"] == "interrupted"
    finished = {r["drive"] for r in record["drives"] if r["status"] == "complete"}
    assert "d1" in finished and finished < set(names)
    stamps = {n: (out / n / "detections.jsonl").stat().st_mtime_ns for n in finished}
    # when the fleet is run again with --resume
    options = FleetOptions(
        drives=tuple(str(drives[n]) for n in names), out=out, run=QUIET, resume=True
    )
    result = run_fleet(options)
    # then only the unfinished drives ran; the finished ones were left as they were
    assert {o.drive for o in result.outcomes if o.resumed} == finished
    assert all(o.status == "complete" for o in result.outcomes)
    assert {n: (out / n / "detections.jsonl").stat().st_mtime_ns for n in finished} == stamps
    assert result.record["totals"]["resumed"] == len(finished)
    assert result.record["totals"]["frames"] == 4 * 20


@pytest.mark.slow  # 13 s; resume is covered by test_ctrl_c_then_resume_runs_only_the_unfinished
def test_resume_runs_a_drive_again_when_the_options_differ(
    drives: dict[str, Path], ray_session: None, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = run_fleet(FleetOptions(drives=(str(drives["d3"]),), out=out, run=QUIET))
    assert first.outcomes[0].status == "complete"
    other = {**QUIET, "settings": {"score_threshold": 0.5}}
    again = run_fleet(FleetOptions(drives=(str(drives["d3"]),), out=out, run=other, resume=True))
    assert not again.outcomes[0].resumed and again.outcomes[0].status == "complete"
    same = run_fleet(FleetOptions(drives=(str(drives["d3"]),), out=out, run=other, resume=True))
    assert same.outcomes[0].resumed


@pytest.mark.slow  # 18 s; the corrupt drive itself is covered by test_four_drives_and_a_corrupt_one
def test_cli_names_the_corrupt_drive(drives: dict[str, Path], tmp_path: Path) -> None:
    proc = _cli(
        str(drives["d4"]), str(drives["corrupt"]), "--out", str(tmp_path / "o"), "--report", "json"
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err
    assert (
        err.strip().splitlines()[-1].startswith("drivepercept fleet: error: drive corrupt failed: ")
    )
    assert "Traceback" not in err
    assert "fleet: 1/2 drives complete, 20 frames" in out


# --- without Ray workers: the plan, the sizing, bad input


def test_drive_lists_names_and_missing_paths(drives: dict[str, Path], tmp_path: Path) -> None:
    listing = tmp_path / "drives.txt"
    listing.write_text(f"# two drives\n{drives['d1']}\n\n{drives['d1'] / 'rig.toml'}  # again\n")
    plan = resolve_drives([str(listing), str(drives["d2"])])
    assert [d.name for d in plan] == ["d1", "d1_2", "d2"]
    assert plan[0].sources == (str(drives["d1"] / "rig.toml"),)
    assert plan[0].ground_truth == drives["d1"] / "ground_truth.json"
    videos = tmp_path / "cams"
    videos.mkdir()
    for cam in ("front", "back"):
        shutil.copy(drives["d1"] / f"{cam}.mp4", videos / f"{cam}.mp4")
    (folder,) = resolve_drives([str(videos)])
    assert folder.sources == (str(videos / "back.mp4"), str(videos / "front.mp4"))
    assert folder.ground_truth is None
    from drivepercept.errors import ConfigError

    with pytest.raises(ConfigError, match=r"no such drive: .*nowhere"):
        resolve_drives([str(tmp_path / "nowhere")])


def test_workers_are_sized_from_the_cluster() -> None:
    opts = FleetOptions(drives=("x",), out=Path("o"))
    assert size_workers(opts, 20, {"CPU": 16.0}).workers == 16
    assert size_workers(opts, 3, {"CPU": 16.0}).workers == 3  # no idle worker
    gpu = size_workers(opts, 10, {"CPU": 16.0, "GPU": 2.0})
    assert (gpu.workers, gpu.num_gpus) == (2, 1.0)
    two = FleetOptions(drives=("x",), out=Path("o"), cpus_per_worker=2, workers=3)
    assert size_workers(two, 10, {"CPU": 16.0}).workers == 3
    from drivepercept.errors import ConfigError

    with pytest.raises(ConfigError, match="no worker fits"):
        size_workers(FleetOptions(drives=("x",), out=Path("o"), cpus_per_worker=4), 1, {"CPU": 2.0})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/nowhere/rig.toml"], "not found: /nowhere/rig.toml"),
        (["{d1}", "--workers", "0"], "workers must be >= 1, got 0"),
        (["{d1}", "--cpus-per-worker", "0"], "cpus per worker must be > 0"),
        (["{d1}", "--precision", "fp64"], "precision"),
    ],
)
def test_bad_input_is_one_line(
    drives: dict[str, Path],
    tmp_path: Path,
    args: list[str],
    says: str,
    in_process: Callable[[list[str]], tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["fleet", *(a.format(d1=drives["d1"]) for a in args), "--out", str(tmp_path / "o")]
    if args[0].startswith("/nowhere"):
        # the real command once (no test_the_real_command_prints_one_line case runs fleet),
        # without the OpenCV settings an in-process `main` may have left in this environment
        for name in ("OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL"):
            monkeypatch.delenv(name, raising=False)
        proc = subprocess.run(
            [sys.executable, "-m", "drivepercept", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, err = proc.returncode, proc.stderr
    else:
        code, err = in_process(argv)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("drivepercept fleet: error: ") and says in line


def test_drive_names_are_path_components_of_their_own(
    drives: dict[str, Path], tmp_path: Path
) -> None:
    # given rig files whose stems are ".", "..", a hidden name and an ordinary one
    folder = tmp_path / "rigs"
    folder.mkdir()
    rig = (drives["d1"] / "rig.toml").read_text()
    for stem in ("..", ".", ".hidden", "plain"):
        (folder / f"{stem}.toml").write_text(rig)
    plan = resolve_drives([str(folder / f"{s}.toml") for s in ("..", ".", ".hidden", "plain")])
    # then none is "." or "..", or hidden: each is a folder of its own under the fleet's
    names = [d.name for d in plan]
    assert names == ["drive", "drive_2", "hidden", "plain"], names
    from drivepercept.errors import ConfigError

    with pytest.raises(ConfigError, match="not starting with"):
        Drive("..", folder, ("x",))


def test_a_fifo_as_a_video_is_refused_in_one_line(tmp_path: Path) -> None:
    import os

    from drivepercept.sources.readers import SourceError, open_reader

    fifo = tmp_path / "front.mp4"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match=r"a pipe, socket or device"):
        open_reader(fifo)
