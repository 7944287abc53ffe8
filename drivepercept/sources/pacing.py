"""The clocks of a real-time replay: when each recorded frame falls due, and what a replay does
with stamps that cannot be honoured.

A file replayed in real time plays its frames at their own times (a recorded stamp, else the
pts) from when it starts. The cameras of one recording share one clock, so they play in step;
a recording's stamps are untrusted, though, and two things could stall or flood the replay:

* **Cameras whose clocks are far apart** (one camera stamped in 1970, another in 2024): on one
  clock, the later camera would wait 54 years for its first frame, or the earlier one would
  fall 54 years behind. The cameras of a recording are grouped by their first stamps
  (`clock_groups`): the largest group keeps the recording's clock, each other group plays on
  a clock of its own from when the replay starts, and one warning says so and by how much.
* **A stamp that jumps far ahead** (10^9 s) within a camera: the wait for its next frame is
  capped at `max_gap_s`; the rest of the gap is skipped over (the camera's later frames come
  that much earlier), counted, and said in a warning (`CameraPace`).
* **A stamp that jumps far back** (years) within a camera: every later frame would be due in
  the past, so the camera would play unpaced, as fast as it decodes, for the rest of the
  drive (its frames' latencies years long). A jump back of more than `max_gap_s` re-anchors
  the camera's clock instead (a negative skip: the frame plays right after the one before
  it, the later frames that much later), counted and said like a jump ahead.

Waits are therefore bounded by `max_gap_s` (at most `MAX_GAP_LIMIT_S`), and a wait never
reaches `threading.TIMEOUT_MAX`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping

from drivepercept.errors import RepeatedWarning

log = logging.getLogger(__name__)

DEFAULT_MAX_GAP_S = 10.0
MAX_GAP_LIMIT_S = 86_400.0  # --max-gap-s at most: a day
NOTICE_S = 5.0  # a wait longer than this is said, even within max_gap_s


def span_words(seconds: float) -> str:
    """A duration a person reads at a glance: 12.3 s, 4.5 min, 3.2 h, 5.1 days, 54.0 years."""
    s = abs(seconds)
    for unit, size in (("years", 365.25 * 86_400), ("days", 86_400), ("h", 3_600), ("min", 60)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


class PaceClock:
    """The time origins of a real-time replay, one per clock: a clock's first frame falls due
    when the first of its frames is asked for (or, where `start` gave it one, the frame
    stamped with its origin then), and each frame at that origin plus its time since. The
    cameras of one recording share its clock (`key`: the recording), so they play in step,
    paired by real time; sources with clocks of their own (a video file's pts from 0,
    another recording's stamps) each start when they start. Thread-safe: each camera's
    decoder thread asks it.

    Args:
        max_gap_s: the longest a camera waits for its next frame (`CameraPace`); also how far
            apart two neighbouring first stamps of a recording's cameras may be and still
            share its clock (`clock_groups`: a chain, so 0, 9, 18 and 27 s share one at 10 s).
    """

    def __init__(self, *, max_gap_s: float = DEFAULT_MAX_GAP_S) -> None:
        if not (math.isfinite(max_gap_s) and 0 < max_gap_s <= MAX_GAP_LIMIT_S):
            raise ValueError(f"max_gap_s must be in (0, {MAX_GAP_LIMIT_S:g}], got {max_gap_s}")
        self.max_gap_ns = round(max_gap_s * 1e9)
        self._lock = threading.Lock()
        self._origins: dict[str, tuple[int, int]] = {}  # key -> (monotonic ns, frame ns)
        self._starts: dict[str, int] = {}  # key -> the frame time its origin is (`start`)

    def start(self, key: str, first_ns: int) -> None:
        """Give clock `key` its origin stamp before any frame is read: the earliest first
        stamp of the cameras on it, so the camera that starts first plays first, whichever
        camera's thread asks first."""
        with self._lock:
            self._starts.setdefault(key, first_ns)

    def due_ns(self, key: str, frame_ns: int, now_ns: int) -> int:
        """When a frame of clock `key` whose own time is `frame_ns` falls due on the
        monotonic clock."""
        with self._lock:
            if key not in self._origins:
                self._origins[key] = (now_ns, self._starts.get(key, frame_ns))
            mono, first = self._origins[key]
        return mono + (frame_ns - first)


class CameraPace:
    """One camera's place on a `PaceClock`: its clock (`key`), and the gaps in its stamps
    skipped so far. Used by the camera's decoder thread only.

    A frame due more than the clock's `max_gap_ns` from now is brought forward so that it
    falls due `max_gap_ns` after the camera's previous frame (after now, for a first frame):
    the camera's later frames come that much earlier too (`skipped_ns`). Measured from the
    previous frame's due time, not from now, so the cameras of one clock whose stamps jump
    together skip the same amount and stay in step. Symmetrically, a frame due more than
    `max_gap_ns` before the previous frame's due time (a jump back in the stamps) is put off
    to fall due with that previous frame (a negative skip): the later frames come that much
    later, so the camera stays paced rather than playing every frame late from then on.
    """

    def __init__(self, clock: PaceClock, *, key: str, camera: str) -> None:
        self.clock = clock
        self.key = key
        self.camera = camera
        self.skipped_ns = 0  # net: forward gaps skipped less jumps back re-anchored
        self.gaps_skipped = 0
        self.ahead_skipped_ns = 0  # the forward gaps skipped, in all
        self.jumps_back = 0
        self.back_ns = 0  # the jumps back re-anchored, in all (positive)
        self._last_due: int | None = None
        self._warning = RepeatedWarning(log)
        self._back_warning = RepeatedWarning(log)

    def due_ns(self, frame_ns: int | None, now_ns: int) -> int:
        """When the frame whose own time is `frame_ns` falls due (now for a frame without
        one), with long gaps skipped and long jumps back re-anchored (the class docstring)."""
        if frame_ns is None:
            due = now_ns
        else:
            due = self.clock.due_ns(self.key, frame_ns, now_ns) - self.skipped_ns
        wait, limit = due - now_ns, self.clock.max_gap_ns
        previous = now_ns if self._last_due is None else self._last_due
        if wait > limit:
            base = min(previous, now_ns)
            skip = due - base - limit
            self.skipped_ns += skip
            self.ahead_skipped_ns += skip
            self.gaps_skipped += 1
            due -= skip
            self._warning.warn(
                "camera %s: its next frame is %s ahead (a jump in its stamps); it plays %s "
                "after the frame before it (--max-gap-s), the rest of the gap is skipped",
                self.camera,
                span_words(wait / 1e9),
                span_words(limit / 1e9),
            )
        elif due < previous - limit:
            back = previous - due
            self.skipped_ns -= back
            self.back_ns += back
            self.jumps_back += 1
            due = previous
            self._back_warning.warn(
                "camera %s: its next frame is stamped %s before the frame before it (a jump "
                "back in its stamps, more than --max-gap-s %s); it plays right after it, its "
                "clock set back by the jump",
                self.camera,
                span_words(back / 1e9),
                span_words(limit / 1e9),
            )
        elif wait > NOTICE_S * 1e9:
            self._warning.warn(
                "camera %s: its next frame is %s ahead (a gap in its stamps); waiting for it",
                self.camera,
                span_words(wait / 1e9),
            )
        self._last_due = due
        return due

    def close(self) -> None:
        """Say what was skipped and re-anchored in all (once the camera ends)."""
        self._warning.close()
        self._back_warning.close()
        if self.gaps_skipped:
            log.warning(
                "camera %s: %d gap(s) in its stamps longer than --max-gap-s skipped, %s in all",
                self.camera,
                self.gaps_skipped,
                span_words(self.ahead_skipped_ns / 1e9),
            )
            self.gaps_skipped, self.ahead_skipped_ns = 0, 0
        if self.jumps_back:
            log.warning(
                "camera %s: %d jump(s) back in its stamps longer than --max-gap-s re-anchored, "
                "%s in all",
                self.camera,
                self.jumps_back,
                span_words(self.back_ns / 1e9),
            )
            self.jumps_back, self.back_ns = 0, 0


def clock_groups(firsts: Mapping[str, int], *, max_apart_ns: int) -> list[list[str]]:
    """The cameras of one recording grouped by their first stamps (`firsts`: camera -> ns):
    in stamp order, a new group wherever two neighbours are more than `max_apart_ns` apart.
    A chain, not a window: first stamps 0, 9, 18 and 27 s share one group at 10 s. That keeps
    a rig whose cameras came up one after another on one clock, in step; a window would cut
    it at an arbitrary camera and put the rest out of step. No camera of a group waits more
    than the max gap for its first frame either way (`CameraPace`). The largest group comes
    first (of equal ones, the earliest): it keeps the recording's clock. Pure."""
    ordered = sorted(firsts, key=lambda c: firsts[c])
    groups: list[list[str]] = []
    for cam in ordered:
        if groups and firsts[cam] - firsts[groups[-1][-1]] <= max_apart_ns:
            groups[-1].append(cam)
        else:
            groups.append([cam])
    return sorted(groups, key=len, reverse=True)  # stable: equal sizes stay in stamp order


def plan_clocks(
    source: str, firsts: Mapping[str, int], *, max_apart_ns: int
) -> tuple[dict[str, tuple[str, int]], str | None]:
    """The clock of each camera of recording `source` (camera -> (clock key, origin stamp)),
    and the warning to log where some cameras play on clocks of their own (None when they
    all share the recording's). Pure."""
    groups = clock_groups(firsts, max_apart_ns=max_apart_ns)
    plan: dict[str, tuple[str, int]] = {}
    for k, group in enumerate(groups):
        key = source if k == 0 else f"{source}#clock{k + 1}"
        origin = min(firsts[c] for c in group)
        plan.update(dict.fromkeys(group, (key, origin)))
    if len(groups) < 2:
        return plan, None
    main = min(firsts[c] for c in groups[0])
    details = ", ".join(
        f"{', '.join(g)} {span_words((min(firsts[c] for c in g) - main) / 1e9)} "
        f"{'after' if min(firsts[c] for c in g) > main else 'before'}"
        for g in groups[1:]
    )
    others = ", ".join(c for g in groups[1:] for c in g)
    said = (
        f"{source}: the cameras' clocks are far apart (first stamps of {details} "
        f"{', '.join(groups[0])}; more than --max-gap-s {max_apart_ns / 1e9:g} s): {others} "
        "played on a clock of its own from the start of the replay, not in step"
    )
    return plan, said
