"""Crafted clocks (issue 43): a recording whose cameras' clocks are 54 years apart, a stamp that
jumps 10^9 s, and a run folder with one capture time 54 years off. Real-time replay paces on one
sane clock per recording, never waits longer than --max-gap-s, and every per-time-bin structure
of the report is bounded."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import children
import hostile
import pytest

from drivepercept.errors import ConfigError
from drivepercept.run import RunOptions
from drivepercept.sinks import FrameTimingCsvSink
from drivepercept.sources.pacing import (
    CameraPace,
    PaceClock,
    clock_groups,
    plan_clocks,
    span_words,
)
from drivepercept.telemetry.stats import MAX_WINDOWS, window_width_s, windowed_rate
from drivepercept.types import Detections, FrameMeta, FrameResult, FrameTiming, Letterbox

pytestmark = pytest.mark.timeout(180)

S = 1_000_000_000
YEARS_54 = round(54 * 365.25 * 86_400) * S
T0_NS = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
PERIOD_NS = 66_666_667  # 15 frames/s
PEAK_LIMIT = 1.5 * 2**30


# ------------------------------------------------------------------ the pure parts


def test_cameras_whose_first_stamps_are_far_apart_get_clocks_of_their_own() -> None:
    # given a recording's cameras: two in 2026, one 54 years earlier
    firsts = {"front": T0_NS, "back": T0_NS + 50_000_000, "old": T0_NS - YEARS_54}
    # when they are grouped with the default 10 s
    plan, said = plan_clocks("drive.mcap", firsts, max_apart_ns=10 * S)
    # then the two of 2026 share the recording's clock from the earliest first stamp, the
    # other plays on its own, and one line says so and by how much
    assert plan["front"] == plan["back"] == ("drive.mcap", T0_NS)
    assert plan["old"] == ("drive.mcap#clock2", T0_NS - YEARS_54)
    assert said is not None and "\n" not in said
    assert "old 54.0 years before front, back" in said and "--max-gap-s 10 s): old" in said
    # and cameras within the limit of each other all share it, with no warning
    near = {"a": T0_NS, "b": T0_NS + 9 * S, "c": T0_NS + 17 * S}  # chained: 9 s, 8 s
    assert clock_groups(near, max_apart_ns=10 * S) == [["a", "b", "c"]]
    assert plan_clocks("x", near, max_apart_ns=10 * S)[1] is None
    # of two equal groups the earlier keeps the recording's clock
    assert clock_groups({"new": 2 * YEARS_54, "old": 0}, max_apart_ns=S) == [["old"], ["new"]]


def test_span_words() -> None:
    assert span_words(12.34) == "12.3 s"
    assert span_words(270) == "4.5 min"
    assert span_words(YEARS_54 / S) == "54.0 years"
    assert span_words(-2 * 86_400) == "2.0 days"


def test_a_stamp_jump_waits_at_most_the_max_gap_and_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given a camera whose stamps jump 10^9 s after its third frame, max gap 10 s
    pace = CameraPace(PaceClock(max_gap_s=10.0), key="drive.mcap", camera="front")
    now = 1_000 * S
    dues = []
    with caplog.at_level(logging.WARNING, logger="drivepercept.sources.pacing"):
        for stamp in [0, PERIOD_NS, 2 * PERIOD_NS, 10**18, 10**18 + PERIOD_NS]:
            due = pace.due_ns(T0_NS + stamp, now)
            dues.append(due)
            now = max(now, due)  # each frame read once it fell due
        pace.close()
    # then the jump waits 10 s after the frame before it, the rest is skipped and counted,
    # and the frames after it keep their own spacing
    assert dues[3] - dues[2] == 10 * S
    assert dues[4] - dues[3] == PERIOD_NS
    assert pace.gaps_skipped == 0  # (close said them and started over)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert (
        "front: its next frame is 31.7 years ahead" in said[0] and "plays 10.0 s after" in said[0]
    )
    assert "1 gap(s)" in said[1] and "31.7 years in all" in said[1]


def test_a_stamp_jump_back_re_anchors_the_clock_and_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given a camera whose stamps jump 54 years back after its third frame, max gap 10 s
    pace = CameraPace(PaceClock(max_gap_s=10.0), key="drive.mcap", camera="front")
    now = 1_000 * S
    dues = []
    with caplog.at_level(logging.WARNING, logger="drivepercept.sources.pacing"):
        for stamp in [0, PERIOD_NS, 2 * PERIOD_NS, -YEARS_54, -YEARS_54 + PERIOD_NS]:
            due = pace.due_ns(T0_NS + stamp, now)
            dues.append(due)
            now = max(now, due)  # each frame read once it fell due
        # then the frame after the jump plays right after the one before it, and the frames
        # after it keep their own spacing: paced, not all due 54 years ago
        assert dues[3] == dues[2]
        assert dues[4] - dues[3] == PERIOD_NS
        assert pace.jumps_back == 1 and pace.back_ns == YEARS_54 + 2 * PERIOD_NS
        pace.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "front: its next frame is stamped 54.0 years before the frame before it" in said[0]
    assert "1 jump(s) back in its stamps longer than --max-gap-s" in said[1]
    assert "54.0 years in all" in said[1]
    assert pace.jumps_back == 0  # (close said them and started over)
    # and a jump back within the max gap is played as it comes (late), not re-anchored
    near = CameraPace(PaceClock(max_gap_s=10.0), key="d", camera="c")
    assert [near.due_ns(s, 0) for s in (20 * S, 11 * S)] == [0, -9 * S]
    assert near.jumps_back == 0


def test_cameras_whose_stamps_jump_back_together_stay_in_step() -> None:
    clock = PaceClock(max_gap_s=1.0)
    clock.start("d", 3_600 * S)
    stamps = [3_600 * S, 3_600 * S + PERIOD_NS, 0, PERIOD_NS]  # both jump an hour back
    dues: dict[str, list[int]] = {}
    for name, late_ns in (("front", 0), ("back", 30_000_000)):
        pace = CameraPace(clock, key="d", camera=name)
        now, dues[name] = 5 * S + late_ns, []
        for stamp in stamps:
            dues[name].append(pace.due_ns(stamp, now))
            now = dues[name][-1] + late_ns
    assert dues["front"] == dues["back"]
    assert dues["front"][2] == dues["front"][1] and dues["front"][3] - dues["front"][2] == PERIOD_NS


def test_cameras_whose_stamps_jump_together_stay_in_step() -> None:
    clock = PaceClock(max_gap_s=1.0)
    clock.start("d", 0)
    stamps = [0, PERIOD_NS, 3_600 * S, 3_600 * S + PERIOD_NS]  # both jump by an hour
    dues: dict[str, list[int]] = {}
    # the front camera reads each frame as the one before it falls due, the back one 30 ms
    # late each time
    for name, late_ns in (("front", 0), ("back", 30_000_000)):
        pace = CameraPace(clock, key="d", camera=name)
        now, dues[name] = 5 * S + late_ns, []
        for stamp in stamps:
            dues[name].append(pace.due_ns(stamp, now))
            now = dues[name][-1] + late_ns
    assert dues["front"] == dues["back"]
    assert dues["front"][2] - dues["front"][1] == S


def test_a_wait_never_overflows_and_the_limits_are_checked() -> None:
    # given the longest max gap and a frame stamped at the end of time
    pace = CameraPace(PaceClock(max_gap_s=86_400.0), key="d", camera="c")
    pace.due_ns(0, 0)
    due = pace.due_ns(2**63 - 1, 0)
    assert due <= 86_400 * S and (due / 1e9) < threading.TIMEOUT_MAX
    for bad in (0.0, -1.0, float("inf"), float("nan"), 86_401.0):
        with pytest.raises(ValueError, match="max_gap_s"):
            PaceClock(max_gap_s=bad)
        with pytest.raises(ConfigError, match="max gap"):
            RunOptions(sources=("x.mp4",), model="drivepercept-tiny", max_gap_s=bad)


def test_windows_are_bounded_and_widened_on_a_long_span() -> None:
    assert window_width_s(3_600 * S, 1.0) == 1.0
    assert window_width_s(MAX_WINDOWS * S, 1.0) == 1.0
    assert window_width_s(MAX_WINDOWS * S + 1, 1.0) == 2.0
    assert window_width_s(YEARS_54, 1.0) == 200_000.0
    w = windowed_rate([0, 1, YEARS_54], origin_ns=0, end_ns=YEARS_54, window_s=1.0)
    assert w.width_s == 200_000.0 and w.counts.size <= MAX_WINDOWS
    assert w.counts.sum() == 3 and w.counts[0] == 2
    # a span past int64 (stamps at both ends of it) still bins right
    ends = [-(2**62), 2**62]
    w = windowed_rate(ends, origin_ns=ends[0], end_ns=ends[1], window_s=1.0)
    assert w.counts.size <= MAX_WINDOWS and list(w.counts[[0, -1]]) == [1, 1]


# ------------------------------------------------------------------ a run folder 54 years long


def _frame(cam: int, frame: int, capture_ns: int) -> FrameResult:
    stamps = [capture_ns + k * 1_000_000 for k in range(11)]
    timing = FrameTiming(
        capture_ns=stamps[0], decoded_ns=stamps[1], preprocessed_ns=stamps[2],
        queued_ns=stamps[3], batched_ns=stamps[4], copy_start_ns=stamps[5],
        copy_done_ns=stamps[6], compute_start_ns=stamps[7], inference_done_ns=stamps[8],
        postprocessed_ns=stamps[9], emitted_ns=stamps[10],
    )  # fmt: skip
    box = Letterbox((64, 48), (64, 48), 1.0, 1.0, 0.0, 0.0)
    name = ("front", "back")[cam]
    meta = FrameMeta(name, cam, frame, frame / 15, stamps[0], stamps[1], stamps[2], box)
    return FrameResult(
        meta=meta, batch_index=frame, batch_size=1, detections=Detections.empty(("car",)),
        timing=timing,
    )  # fmt: skip


def test_report_of_a_run_with_one_capture_54_years_off_is_written_in_bounded_memory(
    tmp_path: Path,
) -> None:
    # given a run folder whose back camera's one frame was captured 54 years before the rest
    run = tmp_path / "run"
    run.mkdir()
    base = 1_000 * S
    frames = [_frame(0, k, base + k * PERIOD_NS) for k in range(20)]
    frames.append(_frame(1, 0, base - YEARS_54))
    with FrameTimingCsvSink(run / "frames.csv") as sink:
        for f in frames:
            sink.write(f)
    record = {"status": "complete", "command": "replay", "model": {"name": "hand-made"}}
    (run / "run.json").write_text(json.dumps(record))
    # when it is reported
    code, err, peak = children.cli_peak(tmp_path, "report", str(run))
    # then the report is written, with windows wide enough to cover the span in <= 10,000
    assert code == 0, err
    assert "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["window_s"] == 200_000.0 == summary["throughput"]["window_s"]
    assert len(summary["throughput"]["start_s"]) <= MAX_WINDOWS
    assert summary["frames"] == 21
    assert (run / "report.html").stat().st_size > 0
    assert peak < PEAK_LIMIT, peak


# ------------------------------------------------------------------ real-time replay, crafted


def _drive(path: Path, stamps: dict[str, list[int]], *, logged_in_order: bool = False) -> Path:
    """An MCAP of CompressedImage topics, camera -> its frames' stamps; logged at those stamps,
    or (`logged_in_order`) at T0_NS + k periods, so that the file keeps the stamps' order."""
    pytest.importorskip("mcap")
    pytest.importorskip("rosbags")
    from drivepercept.recording import messages as msgs
    from drivepercept.recording.mcapfile import McapOut

    with McapOut(path, profile="ros2") as out:
        for cam, cam_stamps in stamps.items():
            for k, stamp in enumerate(cam_stamps):
                m = msgs.compressed_image(stamp, cam, "jpeg", hostile.jpeg(value=40 * k % 255))
                topic = f"/{cam}/image_raw/compressed"
                logged = T0_NS + k * PERIOD_NS if logged_in_order else stamp
                out.ros2(topic, msgs.COMPRESSED_IMAGE, m, log_time_ns=logged)
    return path


def _realtime(tmp_path: Path, drive: Path, *flags: str) -> tuple[int, str, int, float]:
    started = time.monotonic()
    code, err, peak = children.cli_peak(
        tmp_path, "replay", str(drive), "--realtime", "--model", "drivepercept-tiny",
        "--weights", "none", "--out", str(tmp_path), "--name", "r", "--no-progress",
        "--report", "json", *flags,
    )  # fmt: skip
    return code, err, peak, time.monotonic() - started


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.slow
def test_realtime_replay_of_two_clocks_54_years_apart_plays_each_on_its_own(
    tmp_path: Path,
) -> None:
    # given a drive whose back camera is stamped 54 years before its front camera
    front = [T0_NS + k * PERIOD_NS for k in range(8)]
    back = [s - YEARS_54 for s in front]
    drive = _drive(tmp_path / "two-clocks.mcap", {"front": front, "back": back})
    # when it is replayed in real time
    code, err, peak, took = _realtime(tmp_path, drive)
    # then both cameras play, each on its own clock, said in one warning line, and the
    # report covers half a second, not 54 years
    assert code == 0, err
    warned = [line for line in _lines(err) if "clocks are far apart" in line]
    assert len(warned) == 1 and "front 54.0 years after back" in warned[0], err
    assert len(_lines(err)) == 1, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["window_s"] == 1.0  # (live policies: a frame may be dropped for a newer)
    for cam in ("front", "back"):
        got = summary["cameras"][cam]
        assert got["frames"] > 0 and got["frames"] + (got["dropped"] or 0) == 8, got
    assert summary["span_s"] < 10.0
    assert peak < PEAK_LIMIT, peak
    assert took < 60.0


@pytest.mark.slow
def test_realtime_replay_skips_a_stamp_jump_past_the_max_gap(tmp_path: Path) -> None:
    # given a camera whose stamps jump 10^9 s (31.7 years) after its third frame
    start = T0_NS - YEARS_54  # (a ROS stamp's seconds are an int32: stay before 2038)
    stamps = [start + k * PERIOD_NS for k in range(3)]
    stamps += [start + 10**18 + k * PERIOD_NS for k in range(3)]
    drive = _drive(tmp_path / "jump.mcap", {"front": stamps})
    # when it is replayed in real time with a max gap of half a second
    code, err, peak, took = _realtime(tmp_path, drive, "--max-gap-s", "0.5")
    # then it waits half a second there, says so, and counts the skip when the camera ends
    assert code == 0, err
    said = " ".join(_lines(err))
    assert "front: its next frame is 31.7 years ahead" in said and "plays 0.5 s after" in said
    assert "1 gap(s) in its stamps longer than --max-gap-s skipped" in said
    front = json.loads((tmp_path / "r" / "summary.json").read_text())["cameras"]["front"]
    assert front["frames"] + (front["dropped"] or 0) == 6, front  # (live policies: drops)
    assert peak < PEAK_LIMIT, peak
    assert took < 60.0


@pytest.mark.slow
def test_realtime_replay_re_anchors_a_stamp_jump_back_past_the_max_gap(tmp_path: Path) -> None:
    # given a camera whose stamps jump 54 years back after its tenth frame (the reader's
    # reorder window of 8 frames plays the last 7 before the jump after the ones after it:
    # a jump back, then one ahead)
    stamps = [T0_NS + k * PERIOD_NS for k in range(10)]
    stamps += [T0_NS - YEARS_54 + k * PERIOD_NS for k in range(5)]
    drive = _drive(tmp_path / "back.mcap", {"front": stamps}, logged_in_order=True)
    # when it is replayed in real time
    code, err, peak, took = _realtime(tmp_path, drive, "--max-gap-s", "0.5")
    # then the jump back is said and counted, and the frames after it are paced: their
    # latency is the run's, not 54 years
    assert code == 0, err
    said = " ".join(_lines(err))
    assert "front: its next frame is stamped 54.0 years before the frame before it" in said
    assert "1 jump(s) back in its stamps longer than --max-gap-s re-anchored" in said
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    front = summary["cameras"]["front"]
    assert front["frames"] + (front["dropped"] or 0) == 15, front  # (live policies: drops)
    assert summary["end_to_end_ms"]["max_ms"] < 60_000, summary["end_to_end_ms"]
    assert summary["span_s"] < 10.0
    assert peak < PEAK_LIMIT, peak
    assert took < 60.0


def test_bad_max_gap_and_linger_are_one_line(in_process: Any, tmp_path: Path) -> None:
    video = Path(__file__).resolve().parents[1] / "sample_videos" / "front.mp4"
    for flags, phrase in (
        (["--realtime", "--max-gap-s", "0"], "max gap must be > 0 and <= 86400 s, got 0"),
        (["--max-gap-s", "1e6"], "max gap must be > 0 and <= 86400 s, got 1e+06"),
        (["--metrics-linger-s", "1e10"], "metrics linger must be 0..3600 s, got 1e+10"),
    ):
        code, err = in_process(["replay", str(video), "--out", str(tmp_path), *flags])
        assert code == 2 and phrase in err and len(_lines(err)) == 1, err
    assert not list(tmp_path.iterdir())  # refused before any run folder


def test_the_metrics_linger_ends_on_an_interrupt_not_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import signal

    from drivepercept.run.outputs import linger_metrics

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="drivepercept.run.outputs"):
            linger_metrics(60.0)  # returns, does not raise
        assert 0.15 < time.monotonic() - started < 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert any("taken down" in r.getMessage() for r in caplog.records)  # the one warning


# ------------------------------------------------------------------ a camera that keeps failing


def test_a_camera_that_keeps_failing_to_connect_says_so_in_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from drivepercept.config import ReconnectPolicy
    from drivepercept.sources.live import LiveSource
    from drivepercept.sources.readers import SourceError

    def refuse(source: str, policy: ReconnectPolicy) -> Any:
        raise SourceError("connection refused")

    # given a live camera that refuses 40 connections in a row
    policy = ReconnectPolicy(initial_s=0.001, max_s=0.002, max_attempts=40)
    stop = threading.Event()
    camera = LiveSource(
        camera="cam", source="rtsp://nowhere/x", policy=policy, stop=stop, opener=refuse
    )
    with caplog.at_level(logging.WARNING, logger="drivepercept.sources.live"):
        assert camera.read() is None
        camera.close()
    # then the first reconnects are said, the rest counted, and the failure said
    said = [r.getMessage() for r in caplog.records]
    assert camera.failed_attempts == 40
    assert len(said) <= 8, said
    assert sum("reconnecting" in line for line in said) == 6, said
    assert "attempt 40 failed" in said[-2] and "35 more" in said[-2]
    assert "failed (gave up after 40 failed attempts" in said[-1]
