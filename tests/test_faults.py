"""Faults injected into real runs, each with the behaviour the table in docs/FAULTS.md
promises: a full disk, a read-only output folder, a camera that stalls without closing,
and a camera that changes resolution mid-stream (MJPEG, read frame by frame).

(A decoder or a model raising, and slow or failing outputs, are in test_pipeline.py and
test_run.py, against fakes that raise on cue; SIGKILL in test_report.py.)"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import children
import cv2
import pytest

from drivepercept.config import ReconnectPolicy
from drivepercept.errors import OutputError
from drivepercept.models.oracle import make_oracle
from drivepercept.run import Mode, RunOptions, run
from drivepercept.sim.serve import CameraServer
from drivepercept.sinks import _lines

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_videos"

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drivepercept", *args],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )


@contextlib.contextmanager
def _tmpfs(path: Path, *options: str) -> Iterator[Path]:
    """A real small filesystem at `path` (needs root and mount(8)); skips the test without."""
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join(options)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mount(8) is not available")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


def _check_valid_outputs(run_dir: Path) -> tuple[int, int]:
    """Every output file of a run folder parses; (detections lines, frames.csv rows)."""
    data = (run_dir / "detections.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-80:]  # whole lines only
    detections = [json.loads(line) for line in data.decode().splitlines()]
    for name in ("frames.csv", "load.csv"):
        if (run_dir / name).exists():
            with (run_dir / name).open(newline="") as fh:
                rows = list(csv.reader(fh))
            assert len({len(r) for r in rows}) <= 1, f"{name} has a cut row"
    with (run_dir / "frames.csv").open(newline="") as fh:
        frame_rows = len(list(csv.DictReader(fh)))
    json.loads((run_dir / "run.json").read_text())
    assert not list(run_dir.glob("*.tmp")), "a temporary file was left behind"
    return len(detections), frame_rows


# --------------------------------------------------------------------------- outputs


class _FullDisk(io.FileIO):
    """A file on a disk with `room` bytes left: the write that reaches the end takes part
    of its chunk, the next raises ENOSPC (what write(2) does on a full filesystem)."""

    room = 300

    def write(self, data: Any) -> int:
        left = _FullDisk.room - self.tell()
        if left <= 0:
            raise OSError(28, "No space left on device")
        return super().write(bytes(data)[:left])


def test_a_chunk_cut_short_by_a_full_disk_is_cut_back_to_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_lines, "open_for_writing", lambda path, what: _FullDisk(path, "w"))
    path = tmp_path / "d.jsonl"
    lines = _lines.LineFile(path, what="detections file", flush_bytes=100)
    written = []
    with pytest.raises(OutputError, match="No space left on device"):
        for k in range(100):
            line = json.dumps({"frame": k, "pad": "x" * 30}) + "\n"
            lines.append(line)
            written.append(line)
    lines.close()
    text = path.read_text()
    # the partly written chunk is cut back: the file is the whole lines before it
    assert text.endswith("\n") and len(text) <= _FullDisk.room
    assert text == "".join(written[: text.count("\n")])
    assert [json.loads(line)["frame"] for line in text.splitlines()] == list(
        range(text.count("\n"))
    )


def test_a_full_disk_mid_run_stops_it_and_every_file_stays_valid(tmp_path: Path) -> None:
    # given a run folder on a real 128 KiB filesystem, which fills up during the replay
    with _tmpfs(tmp_path / "disk", "size=128k") as disk:
        proc = _cli(
            "replay", str(SAMPLE / "rig.toml"), "--model", "drivepercept-tiny",
            "--out", str(disk), "--name", "r", "--no-progress",
        )  # fmt: skip
        # then the run stops with one line naming the file and the reason, exit 1
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1, proc.stderr
        assert last.startswith("drivepercept replay: error: OutputError: cannot write")
        assert "No space left on device" in last and "Traceback" not in proc.stderr
        # and what was written before is valid, whole lines: nothing processed is corrupt
        detections, rows = _check_valid_outputs(disk / "r")
        assert detections > 0 and rows > 0


def test_a_read_only_output_folder_is_bad_input_before_anything_runs(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "ro", "size=64k", "ro") as folder:
        proc = _cli(
            "replay", str(SAMPLE / "rig.toml"), "--model", "drivepercept-tiny",
            "--out", str(folder / "runs"), "--no-progress",
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"drivepercept replay: error: cannot create run folder {folder}/runs")
    assert line.endswith(": Read-only file system"), line


# --------------------------------------------------------------------------- cameras


def _live_run(
    tmp_path: Path, server: CameraServer, names: tuple[str, ...], duration_s: float, **kw: Any
) -> Any:
    options = RunOptions(
        sources=tuple(f"{n}={server.url(n)}" for n in names),
        mode=Mode.LIVE,
        model="oracle",
        weights=None,
        settings={"device": "cpu", "sample_hz": 0.0},
        out_root=tmp_path,
        name="live",
        duration_s=duration_s,
        reconnect=ReconnectPolicy(
            initial_s=0.1, max_s=0.5, max_attempts=0, open_timeout_s=2.0, read_timeout_s=1.0
        ),
        report_formats=(),
        **kw,
    )
    # an oracle that "sees" its whole input: its box, mapped back, is the whole frame
    detector = make_oracle(size=(160, 96), boxes=[[0.0, 0.0, 160.0, 96.0]])
    return run(options, detector=detector)


def _frames(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "detections.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 11 s; test_hostile_camera.py's quick tests reconnect cameras too
def test_a_camera_that_stalls_without_closing_is_reconnected_and_the_other_goes_on(
    tmp_path: Path,
) -> None:
    # given two served cameras; "back" sends nothing from 3 s to 6 s but keeps its connection
    with CameraServer([(n, SAMPLE / f"{n}.mp4") for n in ("front", "back")], fps=15.0) as srv:
        threading.Timer(3.0, srv.stall, ("back",)).start()
        threading.Timer(6.0, srv.stall, ("back", False)).start()
        t0 = time.monotonic_ns()
        result = _live_run(tmp_path, srv, ("front", "back"), duration_s=11.0)
    # then the stalled camera is noticed after the read timeout (1 s), reconnected, and
    # streams again; the run is a success
    live = result.record.live
    states = [c.state for c in live["back"].changes]
    assert states[:4] == ["connecting", "streaming", "reconnecting", "streaming"], states
    details = [c.detail for c in live["back"].changes]
    # with the reason: nothing arrived within the read timeout
    lost = "the stream stopped delivering frames: the read timeout passed"
    assert any(d.startswith(lost) for d in details), details
    assert result.failure() is None and live["front"].changes[-1].state == "ended"
    # and "front" went on at its pace through the stall (15 fps: 37 frames in 2.5 s)
    frames = _frames(result.run_dir)
    front = [f for f in frames if f["camera"] == "front"]
    during = [
        f for f in front if 3.5e9 <= f["timestamps"]["capture_ns"] - t0 < 6.0e9
    ]  # fmt: skip
    assert len(during) >= 25, len(during)
    back_after = [
        f for f in frames if f["camera"] == "back" and f["timestamps"]["capture_ns"] - t0 > 6.5e9
    ]
    assert len(back_after) >= 15


def _right_edges(frames: list[dict[str, Any]]) -> set[int]:
    return {round(max(box[2] for box in f["boxes"])) for f in frames}


def test_a_served_camera_that_changes_resolution_gets_boxes_in_each_frames_pixels(
    tmp_path: Path,
) -> None:
    # given a 640x360 MJPEG camera that switches to 320x180 after 3 s (the JPEGs on the wire
    # change), with annotated video
    with CameraServer([("front", SAMPLE / "front.mp4")], fps=15.0) as srv:
        threading.Timer(3.0, srv.resize, ("front", (320, 180))).start()
        t0 = time.monotonic_ns()
        result = _live_run(tmp_path, srv, ("front",), duration_s=6.0, save_video=True)
    frames = _frames(result.run_dir)
    before = [f for f in frames if f["timestamps"]["capture_ns"] - t0 < 2.5e9]
    after = [f for f in frames if f["timestamps"]["capture_ns"] - t0 > 3.5e9]
    # then the run goes on without a reconnect, each frame letterboxed on its own: its box
    # (the whole frame) is in its own pixels
    assert len(after) >= 25 and result.failure() is None
    assert _right_edges(before) == {640} and _right_edges(after) == {320}
    assert [c.state for c in result.record.live["front"].changes] == [
        "connecting",
        "streaming",
        "ended",
    ]
    # and the annotated video keeps its first size (later frames resized), every frame in it
    video = cv2.VideoCapture(str(result.run_dir / "video" / "front.mp4"))
    size = (video.get(cv2.CAP_PROP_FRAME_WIDTH), video.get(cv2.CAP_PROP_FRAME_HEIGHT))
    assert size == (640, 360)
    assert video.get(cv2.CAP_PROP_FRAME_COUNT) >= len(before) + len(after)
    video.release()


def test_a_reader_whose_frames_change_size_gets_boxes_in_each_frames_own_pixels(
    tmp_path: Path,
) -> None:
    from fakereaders import FakeReader

    from drivepercept.config import PipelineConfig
    from drivepercept.pipeline import Pipeline
    from drivepercept.sinks import AnnotatedVideoSink, DetectionsJsonlSink
    from drivepercept.sinks.base import Sink
    from drivepercept.sources.readers import RawFrame, SourceInfo

    class Shrinking(FakeReader):
        """640x360 frames, then 320x180 from frame 10 on (a reader that reports it)."""

        def read(self) -> RawFrame | None:
            if self.index == 10:
                self.info = SourceInfo(320, 180, self.info.fps, self.info.frame_count)
            return super().read()

    detector = make_oracle(size=(160, 96), boxes=[[0.0, 0.0, 160.0, 96.0]])
    sinks: list[Sink] = [
        DetectionsJsonlSink(tmp_path / "d.jsonl"),
        AnnotatedVideoSink(tmp_path, fps=15.0),
    ]
    with Pipeline(
        cameras=[("cam", Shrinking(size=(640, 360), frames=20))],
        detector=detector,
        config=PipelineConfig(device="cpu", sample_hz=0.0),
        sinks=sinks,
        keep_original=True,
    ) as pipeline:
        stats = pipeline.run()
    assert stats.frames == 20
    frames = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    # each frame is letterboxed on its own: its box maps back to its own size
    assert _right_edges(frames[:10]) == {640} and _right_edges(frames[10:]) == {320}
    # and the annotated video keeps its first size, every frame in it
    video = cv2.VideoCapture(str(tmp_path / "cam.mp4"))
    size = (video.get(cv2.CAP_PROP_FRAME_WIDTH), video.get(cv2.CAP_PROP_FRAME_HEIGHT))
    assert size == (640, 360) and video.get(cv2.CAP_PROP_FRAME_COUNT) == 20
    video.release()


@pytest.mark.integration
def test_repeated_ctrl_c_is_still_an_interruption_and_leaves_whole_files(tmp_path: Path) -> None:
    import signal

    # given a replay of the sample rig, its frames flowing
    proc = children.cli(
        "replay", str(SAMPLE / "rig.toml"), "--out", str(tmp_path), "--name", "r", "--no-progress"
    )
    detections = tmp_path / "r" / "detections.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        not detections.exists() or detections.stat().st_size < 20_000
    ):
        time.sleep(0.05)
    # when Ctrl-C comes three times in quick succession (the stop, its drain, the files)
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.15)
    _, err = proc.communicate(timeout=60)
    # then the run ends as interrupted, its record and report whole, no temporary left
    assert proc.returncode == 130, err
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["status"] == "interrupted", record.get("error")
    assert "KeyboardInterrupt" not in (record.get("error") or "")
    assert (tmp_path / "r" / "report.html").is_file()
    assert not list((tmp_path / "r").glob("*.tmp")), list((tmp_path / "r").iterdir())
