"""Opening a rig's cameras, the way a mode reads them."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from drivepercept.config import ReconnectPolicy
from drivepercept.rig import CameraConfig, camera_source
from drivepercept.sources.live import LiveSource
from drivepercept.sources.readers import FrameReader, open_reader
from drivepercept.types import Pacing


def open_cameras(
    cams: Sequence[CameraConfig],
    *,
    pacing: Pacing,
    policy: ReconnectPolicy,
    stop: threading.Event,
) -> list[FrameReader]:
    """Every camera's reader, opened on this thread so that a bad file fails here, with a
    clear error, before any thread starts.

    `Pacing.AS_FAST_AS_POSSIBLE` (replay): each file or image folder as fast as it decodes.
    `PACED` and `LIVE`: reconnecting `LiveSource`s; a file among them plays at its own frame
    rate, and a device or stream connects on its decoder thread (a failure there is a state,
    not an exception). `LIVE` reads a camera's live source where it has one, not its
    recorded video.
    """
    live = pacing is Pacing.LIVE
    readers: list[FrameReader] = []
    try:
        for cam in cams:
            if pacing.paced:
                source = camera_source(cam, live=live)
                readers.append(
                    LiveSource(
                        camera=cam.name, source=source, policy=policy, stop=stop, realtime=True
                    )
                )
            else:
                readers.append(open_reader(camera_source(cam, live=live)))
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers
