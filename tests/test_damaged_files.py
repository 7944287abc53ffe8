"""A video damaged in the middle (issue 26, case 6): the decoder skips what it cannot decode
and goes on while frames can still be read, counts what it skipped, and the run says so with
exit 3. The damage is made here: the sample clip with bytes flipped in its middle."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import cv2

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos" / "front.mp4"
Cli = Callable[[list[str]], tuple[int, str]]


def _damaged(folder: Path) -> Path:
    clip = folder / "damaged.mp4"
    shutil.copy(SAMPLE, clip)
    size = clip.stat().st_size
    with clip.open("r+b") as f:
        f.seek(size // 2)
        data = f.read(16384)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in data))
    return clip


def _opencv_decodes(clip: Path) -> tuple[int, int]:
    """(frames OpenCV decodes when read past its failures, failures followed by a frame)."""
    cap = cv2.VideoCapture(str(clip))
    frames = skipped = pending = 0
    while pending < 64:
        ok, _ = cap.read()
        if ok:
            frames, skipped, pending = frames + 1, skipped + pending, 0
        else:
            pending += 1
    cap.release()
    return frames, skipped


def test_a_damaged_clip_replays_every_frame_opencv_can_decode(
    in_process: Cli, tmp_path: Path
) -> None:
    # given the sample clip with 16 KiB flipped in its middle
    clip = _damaged(tmp_path)
    decodable, skipped = _opencv_decodes(clip)
    total = int(cv2.VideoCapture(str(SAMPLE)).get(cv2.CAP_PROP_FRAME_COUNT))
    assert skipped > 0 and decodable + skipped == total  # damage in the middle, frames after
    # when it is replayed
    code, err = in_process(
        ["replay", str(clip), "--model", "drivepercept-tiny", "--out", str(tmp_path),
         "--name", "d", "--no-progress", "--no-report"]
    )  # fmt: skip
    # then every decodable frame was processed, the skipped ones counted, and the run says so
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.startswith("drivepercept")]
    assert (
        len(lines) == 1
        and f"undecodable frames skipped in damaged video(s) (damaged: {skipped})" in lines[0]
    ), err
    record = json.loads((tmp_path / "d" / "run.json").read_text())
    cam = record["summary"]["cameras"]["damaged"]
    assert cam["frames"] == decodable and cam["frames_undecodable"] == skipped
    assert cam["frames_missing_from_source"] == 0
