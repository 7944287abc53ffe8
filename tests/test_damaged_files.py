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
    said = f"undecodable frames skipped (damaged: {skipped})"
    assert len(lines) == 1 and said in lines[0], err
    record = json.loads((tmp_path / "d" / "run.json").read_text())
    cam = record["summary"]["cameras"]["damaged"]
    assert cam["frames"] == decodable and cam["frames_undecodable"] == skipped
    assert cam["frames_missing_from_source"] == 0


def test_an_image_folder_skips_and_counts_what_it_cannot_use(
    in_process: Cli, tmp_path: Path
) -> None:
    import numpy as np

    from drivepercept.sources.readers import ImageFolderReader

    # given a folder whose later entries are an undecodable file, a PNG claiming 9000x9000
    # and a directory named like an image, between good images
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("000.png", "002.png", "005.png"):
        cv2.imwrite(str(folder / name), np.zeros((48, 64, 3), np.uint8))
    (folder / "001.png").write_bytes(b"not a png")
    huge = bytearray((folder / "000.png").read_bytes())
    huge[16:24] = (9000).to_bytes(4, "big") * 2  # the IHDR's width and height
    (folder / "003.png").write_bytes(bytes(huge))
    (folder / "004.png").mkdir()
    # then the reader gives the three good images, skipping two and not counting the folder
    reader = ImageFolderReader(folder)
    got = []
    while (frame := reader.read()) is not None:
        got.append(frame.image_bgr.shape)
    assert got == [(48, 64, 3)] * 3 and reader.undecodable == 2
    # and a replay says so, exit 3 ("004.png" the folder is not an entry: a first entry like it
    # is skipped too, rather than failing the run)
    code, err = in_process(
        ["replay", str(folder), "--model", "drivepercept-tiny", "--out", str(tmp_path),
         "--no-progress", "--no-report"]
    )  # fmt: skip
    assert code == 3 and "undecodable frames skipped (images: 2)" in err, err
    for name in ("000.png", "001.png"):
        (folder / name).unlink()
    (folder / "0000.png").mkdir()
    assert ImageFolderReader(folder).info.width == 64  # 002.png is first now
