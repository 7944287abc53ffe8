"""One camera's tracker: a `ByteTracker` (ByteTrack with recovery by motion and by looks)
of that camera alone, for callers that track one stream of boxes (the tracker benchmark's
re-run, tests, a user's own loop)."""

from __future__ import annotations

from drivepercept.tracking.appearance import Features
from drivepercept.tracking.bytetrack import ByteTracker, FloatArray, IntArray
from drivepercept.tracking.kalman import BoxKalman
from drivepercept.tracking.track_table import CameraBoxes
from drivepercept.tracking.track_types import TrackInfo, TrackParams, TrackUpdate


class CameraTracker:
    """ByteTrack for one camera: a `ByteTracker` of that camera alone.

    Args:
        params: the tracker's settings.
        kalman: the motion model's constants.
    """

    def __init__(
        self, params: TrackParams | None = None, *, kalman: BoxKalman | None = None
    ) -> None:
        self._core = ByteTracker(params, kalman=kalman)

    @property
    def params(self) -> TrackParams:
        return self._core.params

    @property
    def kalman(self) -> BoxKalman:
        return self._core.kalman

    def update(
        self,
        xyxy: FloatArray,
        scores: FloatArray,
        labels: IntArray,
        t_s: float,
        *,
        features: Features | None = None,
        kinds: IntArray | None = None,
    ) -> TrackUpdate:
        """Track one frame's boxes (`CameraBoxes` says what each argument is).

        Raises:
            ValueError: arrays of mismatched shapes, or `t_s` not after the previous one.
        """
        frame = CameraBoxes(0, xyxy, scores, labels, t_s, features, kinds)
        return self._core.update([frame])[0]

    def tracks(self) -> tuple[TrackInfo, ...]:
        """The live confirmed tracks (tracked and lost), by id."""
        return self._core.tracks(0)

    def lifetimes_s(self) -> tuple[float, ...]:
        """How long each confirmed track, ended or live, has lasted, in seconds, by id."""
        return self._core.lifetimes_s(0)

    @property
    def ended_count(self) -> int:
        """How many confirmed tracks have ended (lost too long, or merged)."""
        return self._core.ended_count(0)

    @property
    def died_young(self) -> int:
        """How many tracks ended unconfirmed (a box that got no second one)."""
        return self._core.died_young(0)
