"""Frame preparation (letterbox) and readers."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivepercept.config import ReconnectPolicy
from drivepercept.sources.open import open_cameras, resolve_sources
from drivepercept.sources.prepare import plan_letterbox, prepare
from drivepercept.sources.readers import (
    AUTO_THREADS,
    ImageFolderReader,
    SourceError,
    VideoReader,
    decode_threads,
)
from drivepercept.types import InputSpec, Pacing


@pytest.mark.parametrize(
    ("frame", "size"),
    [
        ((640, 360), (320, 320)),
        ((300, 500), (320, 192)),
        ((97, 61), (128, 128)),
        ((64, 48), (64, 48)),
    ],
)
def test_letterbox_puts_pixels_where_its_geometry_says(
    frame: tuple[int, int], size: tuple[int, int]
) -> None:
    # given a frame with a bright rectangle
    w, h = frame
    image = np.zeros((h, w, 3), np.uint8)
    rect = np.array([0.2 * w, 0.3 * h, 0.7 * w, 0.8 * h]).round()
    x0, y0, x1, y1 = rect.astype(int)
    image[y0:y1, x0:x1] = (0, 0, 255)  # red in BGR
    # when it is prepared for the model
    out, box = prepare(image, InputSpec(size=size, pad_value=0))
    # then it is RGB at the model size, and the rectangle sits where to_input maps it
    assert out.shape == (size[1], size[0], 3)
    red = out[..., 0] > 127
    ys, xs = np.nonzero(red)
    found = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
    np.testing.assert_allclose(found, box.to_input(rect[None])[0], atol=1.0)
    assert out[..., 2].max() < 128  # no blue: the channels were swapped
    # and mapping back lands on the original rectangle
    np.testing.assert_allclose(
        box.to_original(found[None])[0], rect, atol=1.0 / min(box.scale_x, box.scale_y) + 1e-6
    )


def test_stretch_mode_has_no_padding() -> None:
    box = plan_letterbox((640, 360), InputSpec(size=(320, 320), letterbox=False))
    assert (box.pad_x, box.pad_y) == (0.0, 0.0)
    assert (box.scale_x, box.scale_y) == (0.5, 320 / 360)


def test_readers_refuse_what_they_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not found"):
        VideoReader(tmp_path / "none.mp4")
    with pytest.raises(SourceError, match="folder"):
        VideoReader(tmp_path)
    with pytest.raises(SourceError, match="no images"):
        ImageFolderReader(tmp_path)
    (tmp_path / "junk.txt").write_text("x")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 1000)
    with pytest.raises(SourceError, match="cannot open"):
        VideoReader(bad)


def test_cameras_share_the_cores_out_among_their_decoders() -> None:
    # given a number of cameras and of cores: each decoder's threads
    assert decode_threads(1, cores=2) == AUTO_THREADS  # one camera: OpenCV's default
    assert decode_threads(6, cores=2) == 1  # never fewer than one each
    assert decode_threads(2, cores=2) == 1
    assert decode_threads(6, cores=16) == 2
    assert decode_threads(3, cores=16) == 5


def test_one_decoder_thread_reads_the_same_frames_as_opencvs_default() -> None:
    # given a bundled video opened twice, on OpenCV's default decoder threads and on one
    video = Path(__file__).resolve().parents[1] / "sample_videos" / "front.mp4"
    readers = [VideoReader(video, threads=t) for t in (AUTO_THREADS, 1)]
    try:
        # then the one asked for one decodes on one, and both read the same frames
        assert readers[1].threads == 1 and readers[0].threads >= 1
        for k in range(40):
            auto, one = (r.read() for r in readers)
            assert auto is not None and one is not None, k
            assert auto.pts_s == one.pts_s
            assert np.array_equal(auto.image_bgr, one.image_bgr), k
    finally:
        for r in readers:
            r.close()


def test_a_replayed_rig_decodes_each_video_on_its_share_of_the_cores() -> None:
    # given the six bundled videos opened as a replay opens them
    videos = sorted((Path(__file__).resolve().parents[1] / "sample_videos").glob("*.mp4"))
    cams = resolve_sources([str(v) for v in videos])
    readers = open_cameras(
        cams, pacing=Pacing.AS_FAST_AS_POSSIBLE, policy=ReconnectPolicy(), stop=threading.Event()
    )
    try:
        # then every one decodes on the threads decode_threads gives six cameras here
        assert len(readers) == 6
        assert [r.threads for r in readers] == [decode_threads(6)] * 6  # type: ignore[attr-defined]
    finally:
        for r in readers:
            r.close()


def test_image_folder_reads_in_name_order_and_skips_broken_files(tmp_path: Path) -> None:
    for k in (2, 0, 1):
        cv2.imwrite(str(tmp_path / f"{k}.png"), np.full((8, 10, 3), k, np.uint8))
    (tmp_path / "3.png").write_bytes(b"broken")
    reader = ImageFolderReader(tmp_path, fps=5.0)
    got = []
    while (item := reader.read()) is not None:
        got.append((int(item.image_bgr[0, 0, 0]), item.pts_s))
    assert got == [(0, 0.0), (1, 0.2), (2, 0.4)]
    assert reader.info.width == 10 and reader.info.height == 8
