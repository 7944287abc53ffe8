"""Sources -> cameras -> readers, the way a mode reads them."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path

from drivepercept.config import ReconnectPolicy
from drivepercept.rig import CameraConfig, camera_source, resolve_cameras
from drivepercept.sources.capture import open_live_reader
from drivepercept.sources.live import LiveSource, PaceClock
from drivepercept.sources.readers import FrameReader, decode_threads, open_reader
from drivepercept.types import Pacing


def resolve_sources(
    items: Sequence[str], *, live: bool = False, topics: Sequence[str] = ()
) -> tuple[CameraConfig, ...]:
    """`drivepercept.rig.resolve_cameras`, with recorded drives read for their cameras: a
    `.mcap`, a ROS 1 `.bag` or a ROS 2 bag folder gives one camera per image topic (or per
    topic of `topics`, in that order; see `drivepercept.sources.recordings`).

    Raises:
        ConfigError: as `resolve_cameras`; a recording without image topics; `topics` given
            with no recording among the sources, or naming a topic a recording lacks.
        SourceError: a recording that cannot be read.
    """
    from drivepercept.sources import recordings

    expanded: list[str | CameraConfig] = []
    any_recording = False
    for item in items:
        if "://" not in item and "=" not in item and recordings.is_recording(item):
            any_recording = True
            expanded += recordings.recording_cameras(item, topics=topics)
        else:
            expanded.append(item)
    if topics and not any_recording:
        from drivepercept.errors import ConfigError

        raise ConfigError(
            "--topics picks cameras of a recording (.mcap, .bag, bag folder): none given"
        )
    return resolve_cameras(expanded, live=live)


def _open_file(cam: CameraConfig, source: str, threads: int) -> FrameReader:
    if cam.topic is not None:
        from drivepercept.sources.recordings import RecordingReader

        return RecordingReader(Path(source), cam.topic)
    return open_reader(source, threads=threads)


def _open_topic(
    cam: CameraConfig, threads: int, source: str, policy: ReconnectPolicy
) -> FrameReader:
    return _open_file(cam, source, threads)


def open_cameras(
    cams: Sequence[CameraConfig],
    *,
    pacing: Pacing,
    policy: ReconnectPolicy,
    stop: threading.Event,
) -> list[FrameReader]:
    """Every camera's reader, opened on this thread so that a bad file fails here, with a
    clear error, before any thread starts.

    `Pacing.AS_FAST_AS_POSSIBLE` (replay): each file, image folder or recorded topic as fast
    as it decodes. `PACED` and `LIVE`: reconnecting `LiveSource`s; a file among them plays at
    its own frame rate (a recorded topic at its stamps), on one `PaceClock` so that the
    cameras of one recording play in step, and a device or stream connects on its decoder thread (a
    failure there is a state, not an exception). `LIVE` reads a camera's live source where
    it has one, not its recorded video. Video files decode on `decode_threads` FFmpeg
    threads each.
    """
    live = pacing is Pacing.LIVE
    threads = decode_threads(len(cams))
    clock = PaceClock()
    readers: list[FrameReader] = []
    try:
        for cam in cams:
            source = camera_source(cam, live=live)
            if pacing.paced:
                recorded = cam.topic is not None and not (live and cam.source is not None)
                readers.append(
                    LiveSource(
                        camera=cam.name,
                        source=source,
                        policy=policy,
                        stop=stop,
                        realtime=True,
                        clock=clock,
                        opener=functools.partial(_open_topic, cam, threads)
                        if recorded
                        else functools.partial(open_live_reader, threads=threads),
                    )
                )
            else:
                readers.append(_open_file(cam, source, threads))
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers


__all__ = ["open_cameras", "resolve_sources"]
