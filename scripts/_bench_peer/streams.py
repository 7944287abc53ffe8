"""bench_peer's streams: the clips, Ultralytics' `.streams` file, and the decode time of a
served frame."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov")


# ---------------------------------------------------------------------- streams


def clip_paths(videos: Path, streams: int) -> list[Path]:
    """`streams` video files: the clips of `videos` (sorted), cycled."""
    clips = sorted(p for p in videos.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
    if not clips:
        raise FileNotFoundError(f"expected video files in {videos}, found none")
    return [clips[i % len(clips)].resolve() for i in range(streams)]


def decodable_frames(path: Path) -> int:
    """Frames OpenCV actually decodes from `path` (containers may announce more)."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    count = 0
    try:
        while capture.grab():
            count += 1
    finally:
        capture.release()
    return count


def streams_file(folder: Path, sources: Sequence[str]) -> Path:
    """Ultralytics' multi-stream source: a `.streams` text file, one source a line."""
    path = folder / f"bench-{len(sources)}.streams"
    path.write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    return path


def jpeg_decode_ms(paths: Sequence[Path], *, quality: int = 80) -> float:
    """Median time to decode one served frame (JPEG at the server's quality) with OpenCV:
    the part of the peer's latency its arrival stamp leaves out."""
    import cv2

    times = []
    for path in dict.fromkeys(paths):
        capture = cv2.VideoCapture(str(path))
        ok, frame = capture.read()
        capture.release()
        if not ok:
            continue
        jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])[1]
        for _ in range(20):
            t = time.perf_counter_ns()
            cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
            times.append((time.perf_counter_ns() - t) / 1e6)
    return float(statistics.median(times)) if times else math.nan
