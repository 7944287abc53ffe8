"""Hostile recordings (issue 43): MCAP files and bags crafted to take memory, time or a
traceback (bombs, lying indexes and counts, FIFOs where files go). Each is refused in one
line at open (exit 2) or skipped and counted while the rest is read (exit 3), with valid
outputs; the bombs replay in a child process whose peak RSS stays under 1.5 GB.

The inputs are made here (tests/craftedrecordings.py), each a few hundred KB.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcap")
pytest.importorskip("rosbags")

import children
import craftedrecordings as cr

from drivepercept.recording import messages as msgs
from drivepercept.sources.containers import open_container
from drivepercept.sources.readers import SourceError
from drivepercept.sources.recordings import RecordingReader
from drivepercept.sources.untrusted import RefusedError, inflate

Cli = Callable[[list[str]], tuple[int, str]]
PEAK_LIMIT_MB = 1536
FRONT = cr.FRONT


# ------------------------------------------------------------------ running a replay


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("drivepercept")]


def _replay(in_process: Cli, source: Path | str, out: Path, name: str = "r") -> tuple[int, str]:
    """`drivepercept replay SOURCE` in this process: (exit code, stderr), never a traceback."""
    code, err = in_process(
        ["replay", str(source), "--model", "drivepercept-tiny", "--out", str(out),
         "--name", name, "--no-progress", "--no-report"]
    )  # fmt: skip
    _no_traceback(err)
    return code, err


def _outputs(run: Path) -> dict[str, list[int]]:
    """camera -> its frames' stamps, from a run folder whose files parse (run.json,
    detections.jsonl)."""
    json.loads((run / "run.json").read_text())
    frames: dict[str, list[int]] = {}
    for line in (run / "detections.jsonl").read_text().splitlines():
        d = json.loads(line)
        frames.setdefault(d["camera"], []).append(d["stamp_ns"])
    return frames


def _undecodable(run: Path) -> dict[str, int]:
    cams = json.loads((run / "run.json").read_text())["summary"]["cameras"]
    return {name: c["frames_undecodable"] for name, c in cams.items()}


@dataclass(frozen=True)
class Child:
    code: int
    err: str
    peak_mb: float
    seconds: float


def _replay_child(source: Path, out: Path, name: str = "r", timeout_s: float = 240) -> Child:
    """`drivepercept replay SOURCE` in a child process; its own peak RSS (VmHWM, which a
    killed child does not write: the test then fails on it)."""
    err_path, peak = out / f"{name}.stderr", out / f"{name}.peak"
    out.mkdir(parents=True, exist_ok=True)
    with err_path.open("w") as err:
        started = time.monotonic()
        argv = children.peak_command(
            peak, "replay", str(source), "--model", "drivepercept-tiny", "--out", str(out),
            "--name", name, "--no-progress", "--no-report",
        )  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        took = time.monotonic() - started
    text = err_path.read_text()
    peak_mb = children.read_peak(peak) / 2**20 if peak.exists() else float("inf")
    print(f"{source.name}: exit {proc.returncode}, peak {peak_mb:.0f} MB, {took:.1f} s")
    return Child(proc.returncode, text, peak_mb, took)


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# ------------------------------------------------------------------ bounded inflation


def test_inflate_takes_no_more_than_it_declares() -> None:
    import zstandard

    zeros = cr.compress([cr.Zeros(64 * cr.MiB)], "zstd")
    # a frame that holds 64 MiB, declared as 1000 bytes: refused after 1001
    with pytest.raises(RefusedError, match="more than the 1000 bytes it declares"):
        inflate(zeros, "zstd", 1000)
    with pytest.raises(RefusedError, match="over the 1000"):
        inflate(zeros, "zstd", 2000, cap=1000)
    with pytest.raises(RefusedError, match="less than"):
        inflate(zstandard.compress(b"x" * 10), "zstd", 11)
    with pytest.raises(RefusedError, match="unknown compression"):
        inflate(b"", "brotli", 0)
    with pytest.raises(RefusedError, match="does not decompress"):
        inflate(b"garbage", "lz4", 10)
    assert inflate(cr.compress([b"abc" * 100], "lz4"), "lz4", 300) == b"abc" * 100


def _bombs(compression: str) -> Callable[[cr.McapCraft, dict[str, int]], None]:
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        t = cr.stamp(9)
        if compression == "zstd":  # 2 GiB images: one declared as such, one as 1000 bytes
            big = cr.big_image(9, "front", 2 * cr.GiB)
            craft.chunk([(ids["front"], t + 1, big)])
            craft.chunk([(ids["front"], t + 2, big)], declare=1000)
        else:  # lz4 holds 255:1 at most: its 64 MiB in 260 KB, declared 2 GiB and 1000 bytes
            data = cr.compress([cr.Zeros(64 * cr.MiB)], "lz4")
            big = cr.big_image(9, "front", 64 * cr.MiB)
            craft.chunk(
                [(ids["front"], t + 1, big)], compression="lz4", data=data, declare=2 * cr.GiB
            )
            craft.chunk([(ids["front"], t + 2, big)], compression="lz4", data=data, declare=1000)

    return middle


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_chunk_bomb_is_refused_and_the_drive_read_on(tmp_path: Path, compression: str) -> None:
    # given a 20-frame drive of two cameras with two chunks halfway that each hold a front
    # image inflating to 2 GiB (zstd; lz4: 64 MiB), one declaring that, one 1000 bytes
    craft, _ = cr.drive(tmp_path / "bomb.mcap", middle=_bombs(compression))
    path = craft.finish()
    assert path.stat().st_size < 1_000_000
    # when it is replayed in a child process
    got = _replay_child(path, tmp_path)
    # then neither chunk was inflated: the run stays small, every frame around them was
    # read, and the two are counted (exit 3, one line)
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and len(_lines(got.err)) == 1, got.err
    assert "undecodable frames skipped (front: 2)" in _lines(got.err)[0]
    assert "declares 2147483" in got.err and "more than the 1000 bytes it declares" in got.err
    frames = _outputs(tmp_path / "r")
    assert {cam: len(s) for cam, s in frames.items()} == {"front": 20, "back": 20}
    assert _undecodable(tmp_path / "r") == {"front": 2, "back": 0}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overlapping_1_gib_chunks_are_not_all_inflated(tmp_path: Path) -> None:
    # given four chunks that overlap in time, each holding a 1 GiB front image (and a back
    # frame at its end), between the frames of a 20-frame drive
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        for i in range(4):
            big = cr.big_image(8, "front", cr.GiB)
            small = [cr.image_message(12, "back")]
            craft.chunk(
                [(ids["front"], cr.stamp(8) + i, big), (ids["back"], cr.stamp(12) + i, small)]
            )

    craft, _ = cr.drive(tmp_path / "overlap.mcap", middle=middle)
    path = craft.finish()
    assert path.stat().st_size < 1_000_000
    got = _replay_child(path, tmp_path)
    # then none of them is inflated (over the chunk limit), the rest is read, they are
    # counted
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and "undecodable frames skipped (front: 4, back: 4)" in got.err, got.err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {"front": 20, "back": 20}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chunks_at_the_limit_are_inflated_one_at_a_time(tmp_path: Path) -> None:
    # given four cameras whose drives hold, halfway, four chunks each at the chunk limit (a
    # 250 MiB image of zeros, which a camera may hold, each declared honestly)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        for i in range(4):
            for cam, ch in ids.items():
                big = cr.big_image(9, cam, 250 * cr.MiB)
                craft.chunk([(ch, cr.stamp(9) + 1 + i, big)])

    craft, _ = cr.drive(tmp_path / "atcap.mcap", cameras=("a", "b", "c", "d"), middle=middle)
    path = craft.finish()
    got = _replay_child(path, tmp_path)
    # then the four cameras' readers inflate them one at a time (each inflated chunk and its
    # message are 2 x 250 MiB; four at once took 2.8 GB with two cameras), and the images,
    # which no decoder can size, are refused and counted
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and "(a: 4, b: 4, c: 4, d: 4)" in got.err, got.err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_six_cameras_at_the_chunk_limit_hold_one_chunk_at_a_time(tmp_path: Path) -> None:
    # given six cameras whose drives hold, halfway, four chunks each at the chunk limit
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        for i in range(4):
            for cam, ch in ids.items():
                craft.chunk([(ch, cr.stamp(9) + 1 + i, cr.big_image(9, cam, 250 * cr.MiB))])

    cams = ("a", "b", "c", "d", "e", "f")
    craft, _ = cr.drive(tmp_path / "six.mcap", cameras=cams, middle=middle)
    got = _replay_child(craft.finish(), tmp_path)
    # then each camera's chunk and its message keep their room until the message is given
    # and decoded: the cameras hold about one chunk between them, whatever their number
    # (four cameras took 1.35 GB when the room was given back once a chunk was inflated)
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and "(a: 4, b: 4, c: 4, d: 4, e: 4, f: 4)" in got.err, got.err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {c: 20 for c in cams}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cameras_with_slow_consumers_hold_one_room_of_messages_between_them(
    tmp_path: Path,
) -> None:
    import threading
    import tracemalloc

    # given six cameras whose chunks each hold two 64 MiB messages, two chunks a camera
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        for i in range(2):
            for cam, ch in ids.items():
                t = cr.stamp(1) + 1 + 2 * i
                craft.chunk([(ch, t + j, cr.big_image(1, cam, 64 * cr.MiB)) for j in (0, 1)])

    cams = ("a", "b", "c", "d", "e", "f")
    craft, _ = cr.drive(tmp_path / "slow.mcap", cameras=cams, frames=2, middle=middle)
    path = craft.finish()
    given: dict[str, int] = {}

    def consume(cam: str) -> None:  # a camera whose pipeline takes 0.2 s a message
        rec = open_container(path)
        messages = rec.messages(f"/{cam}/image_raw/compressed", lambda why, lost: None)
        while (message := next(messages, None)) is not None:
            del message
            time.sleep(0.2)
            given[cam] = given.get(cam, 0) + 1
        rec.close()

    # when each camera reads them on its own thread, holding each message a while
    tracemalloc.start()
    try:
        threads = [threading.Thread(target=consume, args=(c,), name=f"decode-{c}") for c in cams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not any(t.is_alive() for t in threads)
    # then their messages keep their part of the room until given: the cameras hold about
    # a chunk at the limit between them (each holding its chunk's messages: 6 x 128 MiB)
    print(f"six cameras, slow consumers: peak {peak / cr.MiB:.0f} MiB allocated")
    assert given == {c: 6 for c in cams}
    assert peak < 384 * cr.MiB


def test_overlapping_chunks_are_each_read_once_in_stamp_order(tmp_path: Path) -> None:
    # given chunks whose times interleave (two writers' chunks, each with every other frame)
    craft = cr.McapCraft(tmp_path / "interleaved.mcap")
    ch = craft.channel(FRONT, craft.schema())
    for first in (0, 1, 20, 21):
        craft.chunk(
            [(ch, cr.stamp(k), [cr.image_message(k, "front")]) for k in range(first, first + 20, 2)]
        )
    reader = RecordingReader(craft.finish(), FRONT)
    # when it is read
    stamps = []
    while (frame := reader.read()) is not None:
        stamps.append(frame.stamp_ns)
    reader.close()
    # then every frame once, in stamp order (two chunks merged at a time, the reorder window
    # for the rest)
    assert stamps == [cr.stamp(k) for k in range(40)]
    assert reader.undecodable == 0 and reader.chunks_skipped == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ros1_bz2_chunk_that_inflates_past_its_size_is_refused(tmp_path: Path) -> None:
    # given a 20-frame ROS 1 bag whose 11th chunk holds its frame and, in its bz2 data only,
    # 2 GiB more (its header declares the frame's size)
    path = cr.ros1_bag(tmp_path / "bomb.bag", bomb_at=10, bomb=cr.bz2_zeros(2 * cr.GiB))
    assert path.stat().st_size < 1_000_000
    got = _replay_child(path, tmp_path)
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and "undecodable frames skipped (front: 1)" in got.err, got.err
    assert "more than the" in got.err
    assert len(_outputs(tmp_path / "r")["front"]) == 19


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ros2_bag_of_mcap_storage_with_a_bomb_is_read_under_the_limits(tmp_path: Path) -> None:
    # given a ROS 2 bag folder (written by rosbags) whose MCAP storage file is a drive with
    # two 2 GiB chunk bombs
    bag = cr.ros2_bag(tmp_path / "bag")
    (storage,) = cr.storage_files(bag)
    craft, _ = cr.drive(storage, cameras=("front",), middle=_bombs("zstd"))
    craft.finish()
    got = _replay_child(bag, tmp_path)
    _no_traceback(got.err)
    assert got.peak_mb < PEAK_LIMIT_MB, got
    assert got.code == 3 and "undecodable frames skipped (front: 2)" in got.err, got.err
    assert len(_outputs(tmp_path / "r")["front"]) == 20


def test_a_file_compressed_ros2_bag_is_refused_in_one_line(in_process: Cli, tmp_path: Path) -> None:
    bag = cr.ros2_bag(tmp_path / "bag", compression="file")
    started = time.monotonic()
    code, err = _replay(in_process, bag, tmp_path / "out")
    # refused before rosbags inflates anything (into the system's temp folder, on each open)
    assert code == 2 and len(_lines(err)) == 1, err
    assert "compression_mode: file" in err and "ros2 bag convert" in err
    assert time.monotonic() - started < 30
    _no_traceback(err)


def test_a_message_compressed_ros2_bag_is_inflated_message_by_message(
    in_process: Cli, tmp_path: Path
) -> None:
    bag = cr.ros2_bag(tmp_path / "bag", compression="message")
    code, err = _replay(in_process, bag, tmp_path)
    assert code == 0, err
    assert _outputs(tmp_path / "r") == {"front": [cr.stamp(k) for k in range(4)]}


# ------------------------------------------------------------------ untrusted structure


def test_a_chunk_index_listed_2000_times_replays_its_frames_once(
    in_process: Cli, tmp_path: Path
) -> None:
    craft, _ = cr.drive(tmp_path / "dup.mcap")
    path = craft.finish(repeat={0: 2000})
    code, err = _replay(in_process, path, tmp_path)
    assert code == 0, err
    frames = _outputs(tmp_path / "r")
    assert frames == {cam: [cr.stamp(k) for k in range(20)] for cam in ("front", "back")}


def test_a_chunk_of_millions_of_empty_records_costs_seconds(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a chunk holding a front frame and then 2 million empty records (zstd: 18 MB in
    # a few KB)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        empty = b"\x10" + bytes(8)
        padding = [empty * 2_000_000]
        craft.chunk(
            [(ids["front"], cr.stamp(9) + 1, [cr.image_message(9, "front")])], padding=padding
        )

    craft, _ = cr.drive(tmp_path / "flood.mcap", middle=middle)
    path = craft.finish()
    started = time.process_time()
    reader = RecordingReader(path, FRONT)
    while reader.read() is not None:
        pass
    reader.close()
    # then its walk stops at the record limit: counted as damaged, in seconds of CPU
    assert time.process_time() - started < 5
    assert reader.chunks_skipped == 1 and reader.undecodable == 1
    code, err = _replay(in_process, path, tmp_path)
    assert code == 3 and "undecodable frames skipped (front: 1)" in _lines(err)[0], err
    assert "holds more than 1000000 records" in err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {"front": 20, "back": 20}


def test_statistics_claiming_10_to_the_12_messages_are_a_hint(
    in_process: Cli, tmp_path: Path
) -> None:
    craft, ids = cr.drive(tmp_path / "stats.mcap")
    path = craft.finish(counts={ids["front"]: 10**12})
    reader = RecordingReader(path, FRONT)
    assert reader.info.frame_count == -1  # unknown: the file cannot hold that many
    reader.close()
    code, err = _replay(in_process, path, tmp_path)
    assert code == 0 and "missing" not in err, err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {"front": 20, "back": 20}


@pytest.mark.parametrize("read", ["indexed", "front to back"])
def test_a_damaged_chunk_is_skipped_and_the_frames_after_it_read(
    in_process: Cli, tmp_path: Path, read: str
) -> None:
    # given a drive with a chunk halfway whose zstd data is garbage (its summary whole, or
    # cut so that the file is read front to back)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        frame = [(ids["front"], cr.stamp(9) + 1, [cr.image_message(9, "front")])]
        craft.chunk(frame, data=b"\x28\xb5\x2f\xfd not zstd after all", declare=4000)

    craft, _ = cr.drive(tmp_path / "damaged.mcap", middle=middle)
    code, err = _replay(in_process, craft.finish(cut_summary=read != "indexed"), tmp_path)
    # then it is skipped and counted (its message index says: one front frame), and every
    # frame after it is read
    assert code == 3 and len(_lines(err)) == 1, err
    assert "undecodable frames skipped (front: 1)" in _lines(err)[0]
    assert "does not decompress" in err
    frames = _outputs(tmp_path / "r")
    assert frames["front"] == [cr.stamp(k) for k in range(20)]  # those after it too
    assert _undecodable(tmp_path / "r") == {"front": 1, "back": 0}


def test_a_damaged_chunk_paced_in_real_time_is_counted_too(in_process: Cli, tmp_path: Path) -> None:
    # given the drive with a damaged chunk halfway, replayed at its own pace (each camera's
    # reader inside a paced source)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        frame = [(ids["front"], cr.stamp(9) + 1, [cr.image_message(9, "front")])]
        craft.chunk(frame, data=b"\x28\xb5\x2f\xfd not zstd after all", declare=4000)

    craft, _ = cr.drive(tmp_path / "damaged.mcap", middle=middle)
    code, err = in_process(
        ["replay", str(craft.finish()), "--realtime", "--model", "drivepercept-tiny",
         "--out", str(tmp_path), "--name", "r", "--no-progress", "--no-report"]
    )  # fmt: skip
    _no_traceback(err)
    # then the damage is counted as in a plain replay (the paced source passes its reader's
    # count on), not lost with an exit 0
    assert code == 3, err
    assert "undecodable frames skipped (front: 1)" in _lines(err)[0]
    assert _undecodable(tmp_path / "r") == {"front": 1, "back": 0}


@pytest.mark.parametrize("lie", ["offset", "size", "outside", "compression", "left out"])
def test_a_summary_whose_chunk_indexes_disagree_with_the_file_is_read_front_to_back(
    tmp_path: Path, lie: str, caplog: pytest.LogCaptureFixture
) -> None:
    # given a drive whose summary lies about one chunk (its offset, size or compression), or
    # leaves it out
    craft, _ = cr.drive(tmp_path / "lies.mcap", cameras=("front",), frames=5)
    index = craft.indexes[2]
    if lie == "offset":  # into the middle of the chunk
        index.offset += 7
    elif lie == "size":
        index.uncompressed += 1
    elif lie == "outside":
        index.offset = 10**12
    elif lie == "compression":
        index.compression = "brotli"
    else:
        del craft.indexes[2]
    path = craft.finish()
    # when it is read
    reader = RecordingReader(path, FRONT)
    stamps = []
    while (frame := reader.read()) is not None:
        stamps.append(frame.stamp_ns)
    reader.close()
    # then its indexes are checked against the file before anything is read, and the file
    # is read front to back: every frame, and a warning saying why
    assert stamps == [cr.stamp(k) for k in range(5)]
    assert reader.undecodable == 0 and reader.chunks_skipped == 0
    assert reader.info.frame_count == -1  # (its counts are not believed either)
    assert "its summary disagrees with the file" in caplog.text


def test_a_first_frame_that_cannot_be_used_is_skipped_and_counted(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a camera whose first two frames are not images, then one whose first 40 are not
    craft = cr.McapCraft(tmp_path / "first.mcap")
    ch = craft.channel(FRONT, craft.schema())
    for k in range(6):
        data = b"\xff\xd8 not a jpeg" if k < 2 else cr.jpeg(k)
        m = msgs.compressed_image(cr.stamp(k), "front", "jpeg", data)
        craft.chunk([(ch, cr.stamp(k), [msgs.serialize(m, msgs.COMPRESSED_IMAGE)])])
    code, err = _replay(in_process, craft.finish(), tmp_path)
    # then the size comes from the first that decodes; the two are counted (exit 3)
    assert code == 3 and "undecodable frames skipped (front: 2)" in _lines(err)[0], err
    assert _outputs(tmp_path / "r")["front"] == [cr.stamp(k) for k in range(2, 6)]
    bad = cr.McapCraft(tmp_path / "bad.mcap")
    ch = bad.channel(FRONT, bad.schema())
    m = msgs.compressed_image(cr.stamp(0), "front", "jpeg", b"\xff\xd8 not a jpeg")
    for k in range(40):
        bad.chunk([(ch, cr.stamp(k), [msgs.serialize(m, msgs.COMPRESSED_IMAGE)])])
    code, err = _replay(in_process, bad.finish(), tmp_path / "out")
    assert code == 2 and len(_lines(err)) == 1, err
    assert "none of the 40 images read can be used (the last: CorruptFrameError" in err
    _no_traceback(err)


def test_a_cut_summary_with_every_frame_read_is_not_a_failure(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a drive whose file ends in the middle of its summary (every chunk whole)
    craft, _ = cr.drive(tmp_path / "cutsummary.mcap")
    path = craft.finish(cut_summary=True)
    code, err = _replay(in_process, path, tmp_path)
    # then it is read front to back to its data's end: every frame, a run without fault
    assert code == 0, err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {"front": 20, "back": 20}


def test_a_huge_metadata_yaml_is_refused_by_its_size(in_process: Cli, tmp_path: Path) -> None:
    bag = cr.ros2_bag(tmp_path / "bag")
    with (bag / "metadata.yaml").open("r+b") as f:
        f.truncate(15 * cr.MiB)  # 15 MB (sparse: nothing written)
    started = time.monotonic()
    code, err = _replay(in_process, bag, tmp_path / "out")
    assert code == 2 and len(_lines(err)) == 1, err
    assert "more than the 1048576 a bag's metadata may be" in err
    assert time.monotonic() - started < 10
    _no_traceback(err)


def test_colliding_topic_names_give_numbered_cameras(in_process: Cli, tmp_path: Path) -> None:
    craft = cr.McapCraft(tmp_path / "collide.mcap")
    schema = craft.schema()
    a, b = craft.channel("/a/b/image", schema), craft.channel("/a_b/image", schema)
    for k in range(3):
        craft.chunk(
            [
                (a, cr.stamp(k), [cr.image_message(k, "x")]),
                (b, cr.stamp(k), [cr.image_message(k, "y")]),
            ]
        )
    code, err = _replay(in_process, craft.finish(), tmp_path)
    assert code == 0, err
    assert {c: len(s) for c, s in _outputs(tmp_path / "r").items()} == {"a_b": 3, "a_b_2": 3}


# ------------------------------------------------------------------ bounded reads and decodes


@dataclass(frozen=True)
class Read:
    stamps: list[int]
    undecodable: int
    chunks_skipped: int
    peak_bytes: int  # what Python and numpy allocated at most while it was read
    seconds: float


def _read_all(path: Path, topic: str = FRONT) -> Read:
    """Every frame of `topic`, read in this process under tracemalloc (which sees every
    bytes object and numpy array the readers build: a read of a sparse gigabyte shows)."""
    import tracemalloc

    started = time.monotonic()
    tracemalloc.start()
    try:
        reader = RecordingReader(path, topic)
        stamps = []
        while (frame := reader.read()) is not None:
            stamps.append(frame.stamp_ns or 0)
        reader.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    took = time.monotonic() - started
    print(f"{path.name}: peak {peak / cr.MiB:.1f} MiB allocated, {took:.2f} s")
    return Read(stamps, reader.undecodable, reader.chunks_skipped, peak, took)


@pytest.mark.parametrize("read", ["indexed", "front to back"])
@pytest.mark.parametrize("lie", ["over the limit", "data length"])
def test_a_chunk_record_is_checked_before_it_is_read(tmp_path: Path, read: str, lie: str) -> None:
    # given a 20-frame drive with a chunk halfway whose record is 4 GiB (over the limit), or
    # 200 MiB of which its header and index say 10 bytes are data: a sparse file, a few KB on
    # disk, whose index and chunk header agree
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        frame = [(ids["front"], cr.stamp(9) + 1, [cr.image_message(9, "front")])]
        if lie == "over the limit":
            craft.chunk(frame, hole=4 * cr.GiB)
        else:
            craft.chunk(frame, hole=200 * cr.MiB, data_length=10)

    craft, _ = cr.drive(tmp_path / "sparse.mcap", cameras=("front",), middle=middle)
    path = craft.finish(cut_summary=read != "indexed")
    assert path.stat().st_blocks * 512 < 1_000_000
    # when it is read
    got = _read_all(path)
    # then the chunk is refused from its record's head alone, never read: counted, the rest
    # read, and the reading allocates what a 20-frame drive does
    assert got.stamps == [cr.stamp(k) for k in range(20)]
    assert got.undecodable == 1 and got.chunks_skipped == 1
    assert got.peak_bytes < 32 * cr.MiB and got.seconds < 10, got


def test_a_cdr_image_whose_schema_adds_a_junk_field_is_one_undecodable_frame(
    tmp_path: Path,
) -> None:
    # given a drive whose front topic holds, beside its 20 frames, one message of a channel
    # whose CompressedImage schema adds `junk_msgs/Nothing[] junk`: 16 MiB of empty messages
    # (16 M Python objects, about 2 GB, decoded by that schema)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        schema = craft.schema(msgs.COMPRESSED_IMAGE, cr.junk_schema())
        junk = craft.channel(FRONT, schema)
        craft.chunk([(junk, cr.stamp(9) + 1, cr.junk_message(9, "front", 16 * cr.MiB))])

    craft, _ = cr.drive(tmp_path / "junk.mcap", cameras=("front",), middle=middle)
    got = _read_all(craft.finish())
    # then it is decoded by the standard definition, which it does not fit: one undecodable
    # frame, read in a moment with no more memory than its bytes
    assert got.stamps == [cr.stamp(k) for k in range(20)]
    assert got.undecodable == 1 and got.chunks_skipped == 0
    assert got.peak_bytes < 64 * cr.MiB and got.seconds < 10, got


def test_a_non_standard_image_type_with_a_sequence_of_messages_is_not_decoded() -> None:
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from drivepercept.sources.untrusted import decoder_for

    store = get_typestore(Stores.EMPTY)
    name = "foxglove_msgs/msg/CompressedImage"  # (not in rosbags' standard store)
    store.register(get_types_from_msg(cr.junk_schema().decode(), name))
    decode = decoder_for(name, ros1=False, own=lambda: store)
    with pytest.raises(RefusedError, match="a sequence junk of junk_msgs/msg/Nothing"):
        decode(b"".join(p for p in cr.junk_message(1, "front", 0) if isinstance(p, bytes)))


def test_json_images_are_checked_before_they_are_parsed(tmp_path: Path) -> None:
    # given a Foxglove JSON front topic of 20 frames, and halfway one whose data is 8 MiB of
    # `{},` (2.8 M dicts: 220 MB parsed) and one stamped 10^30 s
    craft = cr.McapCraft(tmp_path / "json.mcap")
    schema = craft.schema("foxglove.CompressedImage", b"{}", "jsonschema")
    ch = craft.channel(FRONT, schema, "json")
    for k in range(20):
        craft.chunk([(ch, cr.stamp(k), [cr.json_image(k)])])
        if k == 9:
            dicts = b"[" + b"{}," * (8 * cr.MiB // 3) + b"{}]"
            craft.chunk([(ch, cr.stamp(k) + 1, [cr.json_image(k, data=dicts)])])
            craft.chunk([(ch, cr.stamp(k) + 2, [cr.json_image(k, sec=10**30)])])
    got = _read_all(craft.finish())
    # then neither is built: two undecodable frames, the other 20 read
    assert got.stamps == [cr.stamp(k) for k in range(20)]
    assert got.undecodable == 2
    assert got.peak_bytes < 64 * cr.MiB and got.seconds < 10, got


def test_protobuf_images_are_decoded_only_by_a_schema_that_cannot_build_more(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mcap_protobuf")

    # given a front topic of 20 CDR frames, one protobuf frame of a Foxglove schema, and one
    # of a schema that adds `repeated Nothing junk` (a million empty messages, 2 MB)
    def middle(craft: cr.McapCraft, ids: dict[str, int]) -> None:
        for junk in (False, True):
            schema = craft.schema("foxglove.CompressedImage", cr.protobuf_schema(junk), "protobuf")
            ch = craft.channel(FRONT, schema, "protobuf")
            message = cr.protobuf_image(9, junk=1_000_000 if junk else 0)
            craft.chunk([(ch, cr.stamp(9) + 1 + junk, [message])])

    craft, _ = cr.drive(tmp_path / "protobuf.mcap", cameras=("front",), middle=middle)
    got = _read_all(craft.finish())
    # then the first is read (stamped as frame 9), the second is one undecodable frame,
    # never decoded
    assert got.stamps == sorted([cr.stamp(k) for k in range(20)] + [cr.stamp(9)])
    assert got.undecodable == 1
    assert got.peak_bytes < 64 * cr.MiB and got.seconds < 10, got


def test_a_ros1_image_whose_definition_adds_a_junk_field_is_one_undecodable_frame(
    tmp_path: Path,
) -> None:
    # given a ROS 1 bag whose 11th frame is of a connection whose CompressedImage definition
    # adds `junk_msgs/Nothing[] junk` with 10 million of them (4 bytes in ROS 1: an empty
    # message takes none)
    path = cr.ros1_bag(tmp_path / "junk.bag", junk_at=10, junk=10_000_000)
    got = _read_all(path)
    # then it is decoded by the standard definition: one undecodable frame
    assert len(got.stamps) == 19 and cr.stamp(10) not in got.stamps
    assert got.undecodable == 1
    assert got.peak_bytes < 64 * cr.MiB and got.seconds < 10, got


def test_a_topic_that_is_not_an_image_topic_is_refused_at_open(tmp_path: Path) -> None:
    # given a drive whose topic /notes is std_msgs/String (a rig may name any topic)
    craft, _ = cr.drive(tmp_path / "d.mcap", cameras=("front",), frames=2)
    notes = craft.channel("/notes", craft.schema("std_msgs/msg/String"))
    craft.chunk(
        [
            (
                notes,
                cr.stamp(0),
                [
                    msgs.serialize(
                        msgs.typestore().types["std_msgs/msg/String"](data="hi"),
                        "std_msgs/msg/String",
                    )
                ],
            )
        ]
    )
    path = craft.finish()
    # then reading it as a camera is one line naming its type and the image topics
    with pytest.raises(SourceError) as raised:
        RecordingReader(path, "/notes")
    assert str(raised.value) == (
        f"{path}: topic /notes is std_msgs/msg/String, not an image topic (its image topics: "
        f"{FRONT})"
    )


@pytest.mark.parametrize("read", ["indexed", "front to back"])
def test_an_attachment_is_read_in_one_piece_and_checked(tmp_path: Path, read: str) -> None:
    from mcap.writer import Writer

    from drivepercept.sources import mcapindex
    from drivepercept.sources.recordings import read_attachment

    # given a drive with a ground truth attachment (its summary whole, or cut off)
    path = tmp_path / "a.mcap"
    truth = b'{"images": []}' * 1000
    with path.open("wb") as f:
        w = Writer(f)
        w.start()
        w.add_attachment(1, 1, "other.bin", "application/octet-stream", b"x")
        w.add_attachment(1, 1, "ground_truth.json", "application/json", truth)
        w.finish()  # type: ignore[no-untyped-call]
    if read != "indexed":
        with path.open("r+b") as f:
            index = mcapindex.read_index(f, path.stat().st_size)
            assert index is not None
            f.truncate(index.data_end)
    # then it is found by name; a name it does not hold is None
    assert read_attachment(path, "ground_truth.json") == truth
    assert read_attachment(path, "missing.json") is None
    # and one whose data length lies is not read (nothing allocated for what it claims)
    data = bytearray(path.read_bytes())
    at = data.index(b"application/json") + len("application/json")
    data[at : at + 8] = (2**40).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    assert read_attachment(path, "ground_truth.json") is None


def test_a_metadata_yaml_alias_bomb_is_refused_at_once(in_process: Cli, tmp_path: Path) -> None:
    # given a ROS 2 bag whose metadata.yaml is 500 bytes of aliases of aliases (9 levels of
    # 10: 10^9 strings once expanded)
    bag = cr.ros2_bag(tmp_path / "bag")
    lines = ["a: &a [" + ",".join("x" * 10) + "]"]
    for this, last in zip("bcdefghi", "abcdefgh", strict=True):
        lines.append(f"{this}: &{this} [" + ",".join([f"*{last}"] * 10) + "]")
    lines.append("rosbag2_bagfile_information: {storage_identifier: *i, relative_file_paths: *i}")
    (bag / "metadata.yaml").write_text("\n".join(lines) + "\n")
    assert (bag / "metadata.yaml").stat().st_size < 500
    started = time.monotonic()
    code, err = _replay(in_process, bag, tmp_path / "out")
    took = time.monotonic() - started
    # then it is refused before anything is expanded, in one line
    assert code == 2 and len(_lines(err)) == 1, err
    assert "uses YAML anchors or aliases" in _lines(err)[0]
    assert took < 5, took  # (the whole replay command; the parse itself takes milliseconds)


@pytest.mark.parametrize("what", ["4 GiB of zeros", "a flood of unknown records"])
def test_a_file_without_a_summary_that_is_not_mcap_data_ends_its_walk(
    tmp_path: Path, what: str
) -> None:
    # given a 20-frame drive without a summary, whose data goes on after its frames with
    # 4 GiB of zeros (sparse; 477 M empty records of opcode 0) or 200,000 empty records of a
    # private opcode (1.8 MB)
    craft, _ = cr.drive(tmp_path / "walk.mcap", cameras=("front",))
    if what.startswith("4 GiB"):
        craft.out.truncate(craft.out.tell() + 4 * cr.GiB)
    else:
        craft.out.write((b"\x80" + bytes(8)) * 200_000)
    craft.out.close()
    # when it is read front to back
    started = time.monotonic()
    reader = RecordingReader(craft.path, FRONT)
    stamps = []
    with pytest.raises(SourceError, match="cut short or damaged after 20 frames") as raised:
        while (frame := reader.read()) is not None:
            stamps.append(frame.stamp_ns)
    reader.close()
    # then the walk stops there at once, every frame before it read (the run exits 3)
    assert stamps == [cr.stamp(k) for k in range(20)]
    assert "which is not MCAP data" in str(raised.value)
    assert time.monotonic() - started < 10


def test_a_ros1_chunk_listed_many_times_replays_its_frames_once(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a 20-frame ROS 1 bag whose index lists its first chunk's info 50 times
    path = cr.ros1_bag(tmp_path / "dup.bag", repeat_first_chunk=50)
    reader = RecordingReader(path, FRONT)
    assert reader.info.frame_count == 20  # each message counted once
    reader.close()
    code, err = _replay(in_process, path, tmp_path)
    assert code == 0, err
    assert _outputs(tmp_path / "r") == {"front": [cr.stamp(k) for k in range(20)]}


def test_a_ros1_chunk_header_is_peeked_before_it_is_read(tmp_path: Path) -> None:
    from drivepercept.sources.bagread import Ros1Bag

    # given a bag opened by rosbags, whose 4th chunk's header length then says 4 GiB - 1
    path = cr.ros1_bag(tmp_path / "header.bag", frames=6)
    bag = Ros1Bag(path)
    pos = sorted({e.chunk_pos for entries in bag._bag.indexes.values() for e in entries})[3]
    with path.open("r+b") as f:
        f.seek(pos)
        f.write(b"\xff\xff\xff\xff")
    # when its frames are read
    damaged: list[str] = []
    got = list(bag.messages(FRONT, lambda why, lost: damaged.append(why)))
    bag.close()
    # then the header is not read (rosbags would read 4 GiB): the chunk is skipped, reported
    assert len(got) == 5
    assert damaged == [f"chunk at byte {pos} skipped: a record header of 4294967295 bytes"]


def test_a_topic_of_damaged_chunks_only_names_the_damage(tmp_path: Path) -> None:
    # given a camera whose every chunk is garbage
    craft = cr.McapCraft(tmp_path / "damaged.mcap")
    ch = craft.channel(FRONT, craft.schema())
    for k in range(3):
        frame = [(ch, cr.stamp(k), [cr.image_message(k, "front")])]
        craft.chunk(frame, data=b"\x28\xb5\x2f\xfd not zstd after all", declare=4000)
    path = craft.finish()
    with pytest.raises(SourceError) as raised:
        RecordingReader(path, FRONT)
    message = str(raised.value)
    assert "none of the 3 images read can be used (the last: chunk at byte" in message
    assert "does not decompress" in message


# ------------------------------------------------------------------ not recordings


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo.mcap", "fifo.bag", "fifo-storage", "folder.mcap"])
def test_what_is_not_a_regular_recording_is_refused_at_once(
    in_process: Cli, tmp_path: Path, kind: str
) -> None:
    # given a FIFO named .mcap or .bag, a ROS 2 bag whose storage file is a FIFO, a folder
    # named x.mcap (nothing writes to the FIFOs: an open for reading would wait forever)
    if kind == "fifo-storage":
        path = cr.ros2_bag(tmp_path / "bag")
        (storage,) = cr.storage_files(path)
        storage.unlink()
        os.mkfifo(storage)
        says = "is a FIFO, not a regular file"
    elif kind == "folder.mcap":
        path = tmp_path / "x.mcap"
        path.mkdir()
        says = "is a folder without a metadata.yaml, not a recording"
    else:
        path = tmp_path / f"x.{kind.split('.')[1]}"
        os.mkfifo(path)
        says = "is a FIFO, not a recording"
    started = time.monotonic()
    code, err = _replay(in_process, path, tmp_path / "out")
    assert code == 2 and len(_lines(err)) == 1 and says in _lines(err)[0], err
    assert time.monotonic() - started < 30
    _no_traceback(err)
    with pytest.raises(SourceError, match=says):
        open_container(path)


@pytest.mark.parametrize("video", ["a video", "a folder"])
def test_a_rig_topic_on_what_is_not_a_recording_is_one_line(
    in_process: Cli, tmp_path: Path, video: str
) -> None:
    source = Path(__file__).resolve().parents[1] / "sample_videos" / "front.mp4"
    if video == "a folder":
        source = tmp_path / "images"
        source.mkdir()
        (source / "0.jpg").write_bytes(cr.jpeg(0))
    rig = tmp_path / "rig.toml"
    rig.write_text(f'[[cameras]]\nname = "front"\nvideo = "{source}"\ntopic = "/front/image"\n')
    code, err = _replay(in_process, rig, tmp_path / "out")
    assert code == 2 and len(_lines(err)) == 1, err
    assert "not a recording" in _lines(err)[0]
    _no_traceback(err)


@pytest.mark.parametrize("drive", ["fifo", "/dev/null", "list-of-fifo"])
def test_fleet_refuses_a_drive_that_is_not_a_file_or_folder(
    in_process: Cli, tmp_path: Path, drive: str
) -> None:
    fifo = tmp_path / "drive.mcap"
    os.mkfifo(fifo)
    given = {"fifo": str(fifo), "/dev/null": "/dev/null"}.get(drive)
    if given is None:
        listing = tmp_path / "drives.txt"
        listing.write_text("drive.mcap\n")
        given = str(listing)
    code, err = in_process(["fleet", given, "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 2 and len(_lines(err)) == 1, err
    assert ("is a FIFO" if drive != "/dev/null" else "is a character device") in err
    _no_traceback(err)


@pytest.mark.parametrize(
    "what, says",
    [
        ("garbage.bag", "cannot read bag"),
        ("zeros.bag", "is not a ROS 1 bag"),
        ("cut.bag", "cannot read bag"),
        ("yaml-not-yaml", "is not a rosbag2 metadata file"),
        ("yaml-no-files", "is not a rosbag2 metadata file"),
        ("yaml-storage", "is not read"),
        ("video.mcap", "is not an MCAP file"),
    ],
)
def test_what_a_library_raises_at_open_is_one_line(
    in_process: Cli, tmp_path: Path, what: str, says: str
) -> None:
    if what.endswith(".bag"):
        path = tmp_path / "x.bag"
        data = cr.ros1_bag(tmp_path / "good.bag", frames=3).read_bytes()
        if what == "zeros.bag":  # 4 GiB without a line end (sparse): rosbags read it whole
            with path.open("wb") as f:
                f.truncate(4 * cr.GiB)
        else:
            garbage = b"#ROSBAG V2.0\n" + os.urandom(5000)
            path.write_bytes(garbage if what == "garbage.bag" else data[:-40])
    elif what.startswith("yaml"):
        path = cr.ros2_bag(tmp_path / "bag")
        yaml = path / "metadata.yaml"
        text = yaml.read_text()
        if what == "yaml-not-yaml":
            text = "rosbag2_bagfile_information: [unclosed\n"
        elif what == "yaml-no-files":
            text = text.replace("relative_file_paths", "some_other_key")
        else:
            text = text.replace("storage_identifier: mcap", "storage_identifier: ../../etc")
        yaml.write_text(text)
    else:
        path = tmp_path / "x.mcap"
        path.write_bytes(
            (Path(__file__).resolve().parents[1] / "sample_videos" / "front.mp4").read_bytes()[
                :4096
            ]
        )
    code, err = _replay(in_process, path, tmp_path / "out")
    assert code == 2 and len(_lines(err)) == 1 and says in _lines(err)[0], err
    _no_traceback(err)


def test_a_recording_is_parsed_once_for_all_its_cameras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivepercept.sources import mcapindex, recordings

    craft, _ = cr.drive(tmp_path / "d.mcap", cameras=("a", "b", "c"), frames=3)
    path = craft.finish()
    calls = []
    real = mcapindex.read_index

    def counted(f: Any, size: int) -> Any:
        calls.append(size)
        return real(f, size)

    monkeypatch.setattr(mcapindex, "read_index", counted)
    cams = recordings.recording_cameras(path)
    readers = [RecordingReader(path, c.topic or "") for c in cams]
    for r in readers:
        r.close()
    assert len(cams) == 3 and len(calls) == 1


def test_a_bags_metadata_is_parsed_once_for_all_its_cameras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivepercept.sources import bagread, recordings

    bag = cr.ros2_bag(tmp_path / "bag")
    calls = []
    real = bagread._parse

    def counted(text: bytes, path: Path) -> Any:
        calls.append(path)
        return real(text, path)

    monkeypatch.setattr(bagread, "_parse", counted)
    cams = recordings.recording_cameras(bag)
    for reader in [RecordingReader(bag, c.topic or "") for c in cams * 3]:
        reader.close()
    assert len(calls) == 1
