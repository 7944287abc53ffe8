"""Sources -> cameras -> readers, the way a mode reads them."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from drivepercept.config import ReconnectPolicy
from drivepercept.rig import CameraConfig, camera_source, resolve_cameras
from drivepercept.sources.capture import open_live_reader
from drivepercept.sources.live import LiveSource
from drivepercept.sources.pacing import DEFAULT_MAX_GAP_S, PaceClock, plan_clocks
from drivepercept.sources.readers import FrameReader, decode_threads, open_reader
from drivepercept.types import Pacing

log = logging.getLogger(__name__)


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
    max_gap_s: float = DEFAULT_MAX_GAP_S,
) -> list[FrameReader]:
    """Every camera's reader, opened on this thread so that a bad file fails here, with a
    clear error, before any thread starts.

    `Pacing.AS_FAST_AS_POSSIBLE` (replay): each file, image folder or recorded topic as fast
    as it decodes. `PACED` and `LIVE`: reconnecting `LiveSource`s; a file among them plays at
    its own frame rate (a recorded topic at its stamps), on one `PaceClock` so that the
    cameras of one recording play in step (grouped by their first stamps, a new group where
    two neighbours are more than `max_gap_s` apart, each other group on a clock of its own,
    said in a warning; no camera waits longer than `max_gap_s` for its next frame, and a jump
    back of more re-anchors its clock: `drivepercept.sources.pacing`), and a device or stream
    connects on its decoder thread (a failure there is a state, not an exception). `LIVE`
    reads a camera's live source where it has one, not its recorded video. Video files decode
    on `decode_threads` FFmpeg threads each.
    """
    live = pacing is Pacing.LIVE
    threads = decode_threads(len(cams))
    clock = PaceClock(max_gap_s=max_gap_s)
    readers: list[FrameReader] = []
    recorded_sources: dict[str, list[LiveSource]] = {}  # recording -> its paced cameras
    try:
        for cam in cams:
            source = camera_source(cam, live=live)
            if pacing.paced:
                recorded = cam.topic is not None and not (live and cam.source is not None)
                paced = LiveSource(
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
                readers.append(paced)
                if recorded:
                    recorded_sources.setdefault(source, []).append(paced)
            else:
                readers.append(_open_file(cam, source, threads))
        for source, cameras in recorded_sources.items():
            _put_on_clocks(source, cameras, clock)
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers


def _put_on_clocks(source: str, cameras: list[LiveSource], clock: PaceClock) -> None:
    """The cameras of recording `source` on its clock, from the earliest first stamp, or on
    clocks of their own where their first stamps are far from the others' (one warning)."""
    firsts = {c.camera: s for c in cameras if (s := c.first_stamp_ns()) is not None}
    plan, said = plan_clocks(source, firsts, max_apart_ns=clock.max_gap_ns)
    if said:
        log.warning("%s", said)
    for cam in cameras:
        if cam.camera in plan:
            cam.pace.key, origin = plan[cam.camera]
            clock.start(cam.pace.key, origin)


__all__ = ["open_cameras", "resolve_sources"]
