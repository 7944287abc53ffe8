"""Outputs never over inputs, and outputs that fail (issue 43): `--mcap` or `--rerun-save`
equal to an input or to each other is refused in one line, exit 2, before anything is opened
for writing (the input byte for byte unchanged); an MCAP that cannot be finished is set aside,
named, exit 3; native libraries' stderr lines do not follow our error line."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivepercept.errors import OutputError
from drivepercept.sinks.base import Sink
from drivepercept.sinks.fanout import OnFailure, SinkPolicy, SinkSet
from drivepercept.types import FrameResult

pytestmark = pytest.mark.timeout(180)

Cli = Callable[[list[str]], tuple[int, str]]
SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
T0_NS = 1_767_225_600 * 1_000_000_000
_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (WARNING|ERROR) ")  # our log's lines
TINY = ["--model", "drivepercept-tiny", "--weights", "none", "--no-progress", "--no-report"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _jpeg(value: int) -> bytes:
    image = np.full((48, 64, 3), value, np.uint8)
    image[8:24, 8:40] = 255 - value
    return cv2.imencode(".jpg", image)[1].tobytes()


def _drive(path: Path) -> Path:
    """A small MCAP drive: two cameras, three CompressedImage frames each."""
    pytest.importorskip("mcap")
    pytest.importorskip("rosbags")
    from drivepercept.recording import messages as msgs
    from drivepercept.recording.mcapfile import McapOut

    with McapOut(path, profile="ros2") as out:
        for k in range(3):
            for cam in ("front", "back"):
                stamp = T0_NS + k * 66_666_667
                m = msgs.compressed_image(stamp, cam, "jpeg", _jpeg(60 * k))
                out.ros2(
                    f"/{cam}/image_raw/compressed", msgs.COMPRESSED_IMAGE, m, log_time_ns=stamp
                )
    return path


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ outputs over inputs


def test_mcap_over_the_replayed_drive_is_refused_and_the_drive_unchanged(
    in_process: Cli, tmp_path: Path
) -> None:
    drive = _drive(tmp_path / "drive.mcap")
    before = _sha(drive)
    for same in (drive, tmp_path / "." / "drive.mcap"):
        code, err = in_process(
            ["replay", str(drive), "--mcap", str(same), "--out", str(tmp_path / "runs"), *TINY]
        )
        assert code == 2, err
        line = _one_line(err)
        assert f"--mcap {same} is the input {drive}" in line, line
    assert _sha(drive) == before
    assert not (tmp_path / "runs").exists()  # refused before the run folder


def test_mcap_or_rerun_save_over_an_input_video_is_refused(in_process: Cli, tmp_path: Path) -> None:
    video = tmp_path / "front.mp4"
    shutil.copy(SAMPLE / "front.mp4", video)
    link = tmp_path / "link.mp4"
    os.link(video, link)  # the same file under another name
    symlink = tmp_path / "sym.mp4"
    symlink.symlink_to(video)
    before = _sha(video)
    cases = [
        (["--mcap", str(video)], f"--mcap {video} is the input {video}"),
        (["--mcap", str(link)], f"--mcap {link} is the input {video}"),
        (["--mcap", str(symlink)], f"--mcap {symlink} is the input {video}"),
        (["--rerun-save", str(video)], f"--rerun-save {video} is the input {video}"),
    ]
    for flags, phrase in cases:
        code, err = in_process(
            ["replay", str(video), *flags, "--out", str(tmp_path / "runs"), *TINY]
        )
        assert code == 2 and phrase in _one_line(err), err
    assert _sha(video) == before


def test_output_files_inside_an_input_folder_or_over_each_other_are_refused(
    in_process: Cli, tmp_path: Path
) -> None:
    images = _folder(tmp_path / "images", {f"{k:03d}.jpg": _jpeg(40 * k) for k in range(3)})
    drive = _drive(tmp_path / "drive.mcap")
    out = tmp_path / "x.mcap"
    cases = [
        (
            ["--mcap", str(images / "new.mcap")],
            f"--mcap {images / 'new.mcap'} is inside the input folder {images}",
        ),
        (["--mcap", str(images / "000.jpg")], "is inside the input folder"),
        (
            ["--mcap", str(out), "--rerun-save", str(out)],
            f"--mcap {out} is also --rerun-save {out}",
        ),
    ]
    sums = {p: _sha(p) for p in [drive, *images.iterdir()]}
    for flags, phrase in cases:
        argv = ["replay", str(images), str(drive), "--out", str(tmp_path / "runs"), *flags, *TINY]
        code, err = in_process(argv)
        assert code == 2 and phrase in _one_line(err), err
    assert {p: _sha(p) for p in sums} == sums
    assert sorted(p.name for p in images.iterdir()) == ["000.jpg", "001.jpg", "002.jpg"]
    assert not out.exists() and not (tmp_path / "runs").exists()


def _ros2_bag(path: Path) -> Path:
    """A ROS 2 bag folder (MCAP storage): one camera, three CompressedImage frames."""
    pytest.importorskip("rosbags")
    from rosbags.rosbag2 import StoragePlugin, Writer

    from drivepercept.recording import messages as msgs

    store = msgs.typestore()
    with Writer(path, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection(
            "/front/image_raw/compressed", msgs.COMPRESSED_IMAGE, typestore=store
        )
        for k in range(3):
            stamp = T0_NS + k * 66_666_667
            m = msgs.compressed_image(stamp, "front", "jpeg", _jpeg(60 * k))
            w.write(conn, stamp, store.serialize_cdr(m, msgs.COMPRESSED_IMAGE))
    return path


def test_mcap_over_a_bag_folder_storage_file_is_refused(in_process: Cli, tmp_path: Path) -> None:
    bag = _ros2_bag(tmp_path / "bag")
    storage = next(bag.glob("*.mcap"))
    sums = {p: _sha(p) for p in bag.iterdir()}
    for target in (storage, bag / "metadata.yaml", bag):
        code, err = in_process(
            ["replay", str(bag), "--mcap", str(target), "--out", str(tmp_path), *TINY]
        )
        assert code == 2, err
        assert f"--mcap {target} is " in _one_line(err) and str(bag) in err, err
    assert {p: _sha(p) for p in bag.iterdir()} == sums


def test_a_rig_file_is_an_input_too(in_process: Cli, tmp_path: Path) -> None:
    rig = tmp_path / "rig.toml"
    shutil.copy(SAMPLE / "rig.toml", rig)
    text = rig.read_text()
    rig.write_text(text.replace('video = "', f'video = "{SAMPLE}/'))
    before = _sha(rig)
    code, err = in_process(["replay", str(rig), "--mcap", str(rig), "--out", str(tmp_path), *TINY])
    assert code == 2 and f"--mcap {rig} is the input {rig}" in _one_line(err), err
    assert _sha(rig) == before


def test_the_run_folder_inside_an_input_folder_is_fine(
    in_process: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an image folder and a ROS 2 bag folder
    images = _folder(tmp_path / "images", {f"{k:03d}.jpg": _jpeg(40 * k) for k in range(2)})
    bag = _ros2_bag(tmp_path / "bag")
    sums = {p: _sha(p) for p in [*images.iterdir(), *bag.iterdir()]}
    # when each is replayed with its runs kept inside it: `cd images && drivepercept replay .`
    # with the default --out, and --out the bag folder itself
    monkeypatch.chdir(images)
    code, err = in_process(["replay", ".", "--name", "r", *TINY])
    assert code == 0, err
    code, err = in_process(["replay", str(bag), "--out", str(bag), "--name", "r", *TINY])
    assert code == 0, err
    # then each run is written in a new folder there, and every input is unchanged
    assert (images / "runs" / "r" / "run.json").is_file() and (bag / "r" / "run.json").is_file()
    assert {p: _sha(p) for p in sums} == sums


def test_an_output_file_inside_the_named_run_folder_is_refused(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a run named r under runs/, and an earlier run of that name whose files exist
    images = _folder(tmp_path / "images", {f"{k:03d}.jpg": _jpeg(40 * k) for k in range(2)})
    runs = tmp_path / "runs"
    (runs / "old").mkdir(parents=True)
    (runs / "old" / "run.json").write_text("{}")
    (runs / "old" / "link").symlink_to(runs / "r", target_is_directory=True)
    cases = [
        (["--mcap", str(runs / "r" / "detections.jsonl")], "detections.jsonl is inside"),
        (["--rerun-save", str(runs / "r" / "run.json")], "run.json is inside"),
        (["--mcap", str(runs / "r")], f"--mcap {runs / 'r'} is the run folder"),
        (["--mcap", str(runs / "old" / "link" / "x.mcap")], "x.mcap is inside"),
    ]
    for flags, phrase in cases:
        # when --mcap or --rerun-save names a file inside the run folder the run will write
        code, err = in_process(
            ["replay", str(images), "--out", str(runs), "--name", "r", *flags, *TINY]
        )
        # then it is refused in one line naming both, before anything is written
        assert code == 2, err
        line = _one_line(err)
        assert phrase in line and f"the run folder {runs / 'r'} (--out {runs} --name r)" in line
        assert sorted(p.name for p in runs.iterdir()) == ["old"]
    # and an output file outside it (in the earlier run's folder) is fine
    code, err = in_process(
        ["replay", str(images), "--out", str(runs), "--name", "r",
         "--mcap", str(runs / "old" / "x.mcap"), *TINY]
    )  # fmt: skip
    assert code == 0 and (runs / "old" / "x.mcap").is_file(), err


def test_an_output_beside_its_inputs_is_fine(in_process: Cli, tmp_path: Path) -> None:
    images = _folder(tmp_path / "images", {f"{k:03d}.jpg": _jpeg(40 * k) for k in range(2)})
    code, err = in_process(
        ["replay", str(images), "--mcap", str(tmp_path / "out.mcap"), "--out", str(tmp_path), *TINY]
    )
    assert code == 0, err
    assert (tmp_path / "out.mcap").stat().st_size > 0


# ------------------------------------------------------------------ an output that fails


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_mcap_that_cannot_be_finished_names_the_file() -> None:
    pytest.importorskip("mcap")
    from drivepercept.recording.mcapfile import McapOut

    out = McapOut("/dev/full")
    out.metadata("x", {"a": "b"})
    with pytest.raises(OutputError, match="cannot finish /dev/full: No space left on device"):
        out.close()
    out.close()  # a second close does nothing


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_mcap_to_a_full_disk_is_set_aside_exit_3(in_process: Cli, tmp_path: Path) -> None:
    images = _folder(tmp_path / "images", {f"{k:03d}.jpg": _jpeg(40 * k) for k in range(2)})
    code, err = in_process(
        ["replay", str(images), "--mcap", "/dev/full", "--out", str(tmp_path), *TINY]
    )
    assert code == 3, err
    assert "drivepercept replay: error: output(s) failed and were set aside" in err
    assert "mcap: OutputError: cannot finish /dev/full: No space left on device" in err
    assert "Traceback" not in err


class _FailsToClose(Sink):
    def write(self, result: FrameResult) -> None:
        pass

    def close(self) -> None:
        raise OutputError("cannot finish out.bin: No space left on device")


def test_a_sink_that_fails_to_close_follows_its_policy() -> None:
    sinks = SinkSet()
    sinks.add(_FailsToClose(), SinkPolicy(), name="aside")
    sinks.add(_FailsToClose(), SinkPolicy(on_failure=OnFailure.STOP), name="essential")
    sinks.start()
    errors = sinks.close()
    assert [str(e) for e in errors] == ["cannot finish out.bin: No space left on device"]
    report = sinks.report()
    assert report["aside"].failed == "OutputError: cannot finish out.bin: No space left on device"
    assert report["essential"].failed is None  # the run fails for it instead


# ------------------------------------------------------------------ native stderr


def _fd2() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def _quiet_args() -> argparse.Namespace:
    return argparse.Namespace(verbose=False, debug=False, command="replay")


def test_native_stderr_goes_to_the_log_and_comes_back(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivepercept.run.console import quiet_native

    for name in ("OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL", "RUST_LOG"):  # put back after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    fd2, stderr = _fd2(), sys.stderr
    with caplog.at_level(logging.INFO, logger="drivepercept.native"), quiet_native(_quiet_args()):
        assert _fd2() != fd2  # (a pipe)
        os.write(2, b"Corrupt JPEG data: 1 extraneous bytes before marker 0xdb\n")
        os.write(2, b"\x1b[33mWARN\x1b[0m re_sdk: a coloured line\n")
        os.write(2, b"terminate called after throwing an instance of 'c10::Error'\npartial")
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "drivepercept.native"
    ]
    # then known noise is logged at INFO (hidden), anything else at WARNING (shown)
    assert said == [
        ("INFO", "native stderr: Corrupt JPEG data: 1 extraneous bytes before marker 0xdb"),
        ("INFO", "native stderr: WARN re_sdk: a coloured line"),
        ("WARNING", "native stderr: terminate called after throwing an instance of 'c10::Error'"),
        ("WARNING", "native stderr: partial"),
    ]
    assert os.environ["RUST_LOG"]  # set for Rerun, unless it was
    # and file descriptor 2 and sys.stderr are back as they were
    assert _fd2() == fd2 and sys.stderr is stderr


def test_native_stderr_is_left_alone_when_no_pipe_can_be_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from drivepercept.run.console import native_stderr_logged

    def no_pipe() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    # given a process out of file descriptors (EMFILE)
    monkeypatch.setattr(os, "pipe", no_pipe)
    fds, fd2, stderr = set(Path("/proc/self/fd").iterdir()), _fd2(), sys.stderr
    # when native stderr would be logged, then nothing is moved and no descriptor leaks
    with native_stderr_logged():
        assert _fd2() == fd2 and sys.stderr is stderr
    assert set(Path("/proc/self/fd").iterdir()) == fds and _fd2() == fd2 and sys.stderr is stderr


def test_a_drain_that_does_not_end_is_said(caplog: pytest.LogCaptureFixture) -> None:
    from drivepercept.run.console import native_stderr_logged

    # given a child process that holds the pipe past the block
    with caplog.at_level(logging.WARNING), native_stderr_logged():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        # then it is said that the thread is left to that child
        said = [r.getMessage() for r in caplog.records]
        assert any("native-stderr did not end within 1 s" in line for line in said), said
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_log_handler_on_file_descriptor_2_does_not_feed_the_drain() -> None:
    # given a process whose logging was set up before the CLI's, on file descriptor 2 itself
    # (not through sys.stderr), and a handler made inside the block on it
    script = (
        "import argparse, logging, os, sys\n"
        "logging.basicConfig(stream=open(2, 'w', closefd=False), format='before %(message)s')\n"
        "from drivepercept.run.console import quiet_native\n"
        "args = argparse.Namespace(verbose=False, debug=False, command='replay')\n"
        "with quiet_native(args):\n"
        "    inside = logging.StreamHandler(open(2, 'w', closefd=False))\n"
        "    logging.getLogger().addHandler(inside)\n"
        "    os.write(2, b'a native line\\nanother\\n')\n"
    )
    # when native code writes to it
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    # then each native line is said once by each handler, and the process ends: the one set
    # up before writes to the real stderr, the record of the one made inside comes back
    # through the pipe and is written as it is, once
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == [
        "before native stderr: a native line",
        "before native stderr: another",
        "native stderr: a native line",
        "native stderr: another",
    ], proc.stderr


def test_a_crash_while_native_stderr_is_logged_still_reaches_the_real_stderr() -> None:
    # given a process whose native stderr goes to the log, as the CLI's does
    crash = (
        "import argparse, faulthandler\n"
        "from drivepercept.run.console import quiet_native\n"
        "args = argparse.Namespace(verbose=False, debug=False, command='replay')\n"
        "with quiet_native(args):\n"
        "    faulthandler._sigsegv()\n"
    )
    # when native code crashes it (a segmentation fault)
    proc = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, timeout=60, check=False
    )
    # then the crash's traceback is on the real stderr, not lost in the pipe with the process
    assert proc.returncode != 0
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr
    assert "<string>" in proc.stderr  # where it crashed


@pytest.mark.slow  # two command-line runs in children: ~10 s of CPU
def test_a_cli_run_on_a_damaged_jpeg_prints_one_error_line_and_no_libjpeg(tmp_path: Path) -> None:
    from hostile import with_junk

    # given an image folder: good JPEGs, one with a junk byte after APP0 (libjpeg warns and
    # decodes it), one that is not a JPEG at all
    images = _folder(
        tmp_path / "images",
        {"000.jpg": _jpeg(0), "001.jpg": with_junk(_jpeg(80), b"\x42"), "002.jpg": b"not a jpeg",
         "003.jpg": _jpeg(160)},
    )  # fmt: skip
    # when replayed from the command line
    argv = [sys.executable, "-m", "drivepercept", "replay", str(images), "--out", str(tmp_path)]
    proc = subprocess.run([*argv, *TINY], capture_output=True, text=True, timeout=120, check=False)
    # then stderr holds our lines (the log's, then one error line, last), nothing of libjpeg's
    assert proc.returncode == 3, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("drivepercept replay: error:")]
    assert errors == lines[-1:] and "undecodable frames skipped (images: 1)" in errors[0], lines
    assert all(_LOG_LINE.match(line) for line in lines[:-1]), lines
    assert "Corrupt JPEG data" not in proc.stderr and "extraneous" not in proc.stderr
    # and with -v libjpeg's lines are shown as they come
    verbose = subprocess.run(
        [argv[0], *argv[1:3], "-v", *argv[3:], *TINY],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "Corrupt JPEG data: 1 extraneous bytes before marker 0xdb" in verbose.stderr
