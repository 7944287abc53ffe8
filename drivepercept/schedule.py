"""The deadline scheduler: per camera and frame, detect or predict, so that every frame is
answered within a latency budget even when the machine is short.

It sits beside the batcher (`batching.Batcher` asks it, once a batch round, which cameras'
newest frames the model sees; every other frame taken that round is answered by the
tracking stage with its tracks moved on to the frame's capture time). It knows:

- the engine's service time, measured as it runs (`service_times.ServiceTimes`: each model
  batch's rows and compute time; a line through them, less the batches that stalled, scaled
  by how far the latest ones ran over it, so that a machine that turns slow, another process
  or throttling, is seen within a few batches);
- how late the answers actually came against its estimates (`observe`: their
  99th percentile is kept as a margin, which takes in what it does not
  model: preparation, post-processing, the completion thread; a batch of n rows keeps at
  least the margin each size up to n has shown alone, as errors grow with a batch's size);
- each camera's priority (rig.toml `priority`, default 1) and when its last detected frame
  was captured.

A round (`choose`): the cameras whose frame must be detected come first (its first frame,
after a reconnect, or the camera has gone `max_gap_ms` without a detection: the starvation
bound); then the others by priority times how long each has gone without a detection. A
camera joins the batch when every detected frame of it would still be answered within the
budget (less the margin), and while the batch is at most one row larger than the largest
measured lately (the line through small batches says little of a large one); the frames
predicted meanwhile are answered as soon as the batch
before them is out, so they are in time too. A camera that does not fit is predicted this
round and waits its turn, which comes sooner the longer it waits. Two exceptions:

- when nothing fits, the camera longest without a detection for its priority, once past
  half its bound, is detected alone if that answers within the whole budget (`_early`:
  the margin spent rather than every camera forced in one late round at the bound);
- at a run's start, the first frames go in two batches, the higher half by priority first
  (`first_later`): all at once they take longer than the budget.

Its decisions are data (`figures`): per camera the frames detected and predicted, the
longest gap between detections, and a timeline per second, bounded.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from drivepercept.config import PipelineConfig
from drivepercept.service_times import ServiceTimes

# the margin: the 99th percentile of how late the latest answers came against their estimate.
# The target is a p99, so the margin must know the tail, and the tail is rare: on the 2-core
# host one model batch in 50-100 takes 25-30 ms longer than its estimate (the camera server
# or the decoders taking the cores), so a window of 48 forgot it between two such batches and
# 2 % of frames came late; 200 batches (20-40 s) keep it.
ERRORS_KEPT = 200
MARGIN_PERCENTILE = 99
COLD_ERRORS = 8  # until this many answers are measured the margin is at least COLD_MARGIN
COLD_MARGIN = 0.1  # of the budget
TIMELINE_KEPT = 3600  # seconds of decisions kept for the timeline (an hour)
DEFAULT_MAX_GAP_MS = 1000.0
# a camera this far into its starvation bound may be detected early, alone, when nothing else
# is (`DeadlineScheduler._early`)
EARLY_AFTER = 0.5


@dataclass(frozen=True)
class Candidate:
    """A camera's frame the model may see this round."""

    camera: int
    capture_ns: int
    forced: bool = False  # must be detected (first frame, reconnect, starvation bound)


@dataclass
class _Second:
    """One second of decisions (the timeline)."""

    t_s: float
    detected: list[int]
    predicted: list[int]
    service_ms: list[float] = field(default_factory=list)
    margin_ms: float = 0.0


class DeadlineScheduler:
    """See the module docstring. The batcher calls `choose`, the engine `service.add`, the
    completion side `observe`; `figures` may be read from any thread."""

    def __init__(
        self,
        cameras: Sequence[str],
        *,
        budget_ms: float,
        priorities: Sequence[float] | None = None,
        max_gap_ms: float = DEFAULT_MAX_GAP_MS,
    ) -> None:
        if not (math.isfinite(budget_ms) and budget_ms > 0):
            raise ValueError(f"budget_ms must be a positive number, got {budget_ms!r}")
        if not (math.isfinite(max_gap_ms) and max_gap_ms > 0):
            raise ValueError(f"max_gap_ms must be a positive number, got {max_gap_ms!r}")
        self.cameras = tuple(cameras)
        n = len(self.cameras)
        self.priorities = tuple(float(p) for p in (priorities or [1.0] * n))
        if len(self.priorities) != n or not all(
            math.isfinite(p) and 0 < p <= 1000.0 for p in self.priorities
        ):
            raise ValueError(f"priorities must be {n} numbers in (0, 1000]")
        self.budget_ns = budget_ms * 1e6
        self.max_gap_ns = max_gap_ms * 1e6
        self.service = ServiceTimes()
        self._lock = threading.Lock()
        self._last_detected_ns: list[int | None] = [None] * n  # capture time
        self._longest_gap_ns = [0] * n
        self._detected, self._predicted, self._forced = [0] * n, [0] * n, [0] * n
        self._overdue = [0] * n  # detected frames answered by prediction (`engine.overdue`)
        self._forced_in: collections.OrderedDict[int, frozenset[int]] = collections.OrderedDict()
        # (rows, ns late against the estimate) of the latest answers
        self._errors: collections.deque[tuple[int, float]] = collections.deque(maxlen=ERRORS_KEPT)
        self._expected: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._timeline: collections.deque[_Second] = collections.deque(maxlen=TIMELINE_KEPT)
        self._start_ns: int | None = None
        self._split = False  # the run's first frames were split (`first_later`)

    @classmethod
    def for_config(
        cls, cameras: Sequence[str], config: PipelineConfig, priorities: Sequence[float] | None
    ) -> DeadlineScheduler | None:
        """The scheduler of a pipeline with `config` (None without a deadline)."""
        if not config.deadline_ms:
            return None
        gap = config.max_detect_gap_ms
        return cls(cameras, budget_ms=config.deadline_ms, priorities=priorities, max_gap_ms=gap)

    # ------------------------------------------------------------------ deciding

    def margin_ns(self, rows: int = 0) -> float:
        """How much later than estimated the latest answers came (`MARGIN_PERCENTILE`, at
        least 0, at least `COLD_MARGIN` of the budget before `COLD_ERRORS` answers, at most
        half the budget); for a batch of `rows`, at least the same percentile of each size up
        to `rows` alone (of a size seen a few times only: its latest worst). The errors grow
        with a batch's size and the large batches are few: on the 2-core host under load,
        batches of 2 rows came 4-8 ms early (median), of 3 about on time, of 4 5-21 ms late
        (p90 22-41 ms), and a margin over all of them let the 4-row batches come late: most
        of the late frames after a run's first second."""
        return self.margins_ns(rows)[rows]

    def margins_ns(self, up_to: int) -> list[float]:
        """`margin_ns(r)` for r = 0 .. `up_to`, from one read of the errors (a round's)."""
        with self._lock:
            kept = list(self._errors)
        by_size: dict[int, list[float]] = {}
        for r, e in kept:
            by_size.setdefault(r, []).append(e)
        measured = float(np.percentile([e for _, e in kept], MARGIN_PERCENTILE)) if kept else 0.0
        floor = COLD_MARGIN * self.budget_ns if len(kept) < COLD_ERRORS else 0.0
        out = []
        for rows in range(max(up_to, 0) + 1):
            if rows in by_size:
                measured = max(measured, float(np.percentile(by_size[rows], MARGIN_PERCENTILE)))
            out.append(float(min(max(measured, floor), self.budget_ns / 2)))
        return out

    def has_detected(self, camera: int) -> bool:
        """Whether a frame of the camera has been sent to the model."""
        with self._lock:
            return self._last_detected_ns[camera] is not None

    def due(self, camera: int, capture_ns: int) -> bool:
        """Whether a camera's frame must be detected: none of it yet, or its last detected
        frame is `max_gap_ms` older (the starvation bound)."""
        with self._lock:
            last = self._last_detected_ns[camera]
        return last is None or capture_ns - last >= self.max_gap_ns

    def first_later(self, cameras: Sequence[int]) -> set[int]:
        """Of `cameras`, whose first frames must be detected this round, those whose first
        frame waits for the next batch: at a run's start (no camera detected yet), the half
        of lowest priority (the later of equals), if a batch of them all would not be
        answered within the budget. Every camera's first frame goes to the model, and six
        at once under load took 140-150 ms: all six late, and each camera's next frame,
        waiting for its tracks, late too. In two batches the first half is answered within
        the budget, and so are most of the second half's next frames."""
        with self._lock:
            started = self._split or any(t is not None for t in self._last_detected_ns)
        if started or len(cameras) < 2:
            return set()
        if self.service.estimate_ns(len(cameras)) <= self.budget_ns - self.margin_ns(len(cameras)):
            return set()
        ranked = sorted(cameras, key=lambda c: (-self.priorities[c], c))
        with self._lock:
            self._split = True  # once: not again if the first half's frames failed to prepare
        return set(ranked[(len(ranked) + 1) // 2 :])

    def choose(
        self, candidates: Sequence[Candidate], *, now_ns: int, start_ns: int, prepare_ns: float
    ) -> list[int]:
        """The cameras (of `candidates`, one frame each) whose frame the model sees in the
        batch that starts computing at `start_ns` after `prepare_ns` of preparation; the
        others are predicted. Forced ones are always in."""
        start = max(now_ns, start_ns) + prepare_ns
        chosen = [c for c in candidates if c.forced]
        with self._lock:
            last, detected = list(self._last_detected_ns), list(self._detected)

        def waited(c: Candidate) -> tuple[float, float]:
            """Priority times the wait; between equals (cameras detected together), the one
            detected least for its priority (else the first cameras would always win)."""
            since, weight = last[c.camera], self.priorities[c.camera]
            wait = weight * (now_ns - since if since is not None else 1e18)
            return wait, -detected[c.camera] / weight

        # a batch grows by one row at most beyond the largest measured lately: the line
        # through small batches says little of a large one on a machine that turned busy
        largest = max(self.service.largest_recent() + 1, len(chosen))
        margins = self.margins_ns(largest)  # per batch size
        for cand in sorted((c for c in candidates if not c.forced), key=waited, reverse=True):
            trial = [*chosen, cand]
            if len(trial) > largest:
                break
            done = start + self.service.estimate_ns(len(trial))
            slack = self.budget_ns - margins[len(trial)]
            # the forced frames' deadlines count too: a forced frame already late alone (a
            # run's deferred first frames) takes no company, as every row added delays the
            # frames predicted behind the batch (waiting for its tracks) past theirs
            if all(done - c.capture_ns <= slack for c in trial):
                chosen = trial
        if not chosen:
            chosen = self._early(candidates, last, start, key=waited)
        return [c.camera for c in chosen]

    def _early(
        self,
        candidates: Sequence[Candidate],
        last: Sequence[int | None],
        start: float,
        *,
        key: Callable[[Candidate], tuple[float, float]],
    ) -> list[Candidate]:
        """With nothing chosen: of the cameras past `EARLY_AFTER` of the starvation bound,
        the one longest without a detection for its priority whose frame alone would be
        answered within the whole budget (the margin spent). Without it, a machine whose
        margin and estimates have grown (a busy spell's late batches) detects nothing but
        what the bound forces, every camera in the same round, and that round's late batch
        keeps the margin high: a replay under load stuck at one detection a camera a second,
        its forced rounds 120-240 ms late. One frame is the cheapest detection there is, and
        a new measure of what one costs."""
        bound = EARLY_AFTER * self.max_gap_ns
        late = [
            c
            for c in candidates
            if (since := last[c.camera]) is not None and c.capture_ns - since >= bound
        ]
        done = start + self.service.estimate_ns(1)
        for cand in sorted(late, key=key, reverse=True):
            if done - cand.capture_ns <= self.budget_ns:
                return [cand]
        return []

    def decided(
        self,
        *,
        batch_index: int | None,
        detected: Sequence[tuple[int, int]],
        predicted: Sequence[int],
        forced: Sequence[int],
        expected_done_ns: int,
        now_ns: int,
        resumed: Sequence[int] = (),
    ) -> None:
        """Record a round: `detected` (camera, capture ns) in model batch `batch_index`
        (None: none), of them the cameras `forced` and those `resumed` after a break in their
        frames (the gap since their previous detection spans it: not counted), the cameras
        of the frames `predicted`, and when the model batch's answers are expected."""
        with self._lock:
            if self._start_ns is None:
                self._start_ns = now_ns
            # a batch with a camera's first frame is no measure of the margin: the first
            # batches of a run come 55-70 ms later than estimated (the model's first calls at
            # their sizes), and the margin, a 99th percentile of 200, kept that for a run
            firsts = any(self._last_detected_ns[cam] is None for cam, _ in detected)
            for cam, capture in detected:
                before = self._last_detected_ns[cam]
                if before is not None and cam not in resumed:
                    self._longest_gap_ns[cam] = max(self._longest_gap_ns[cam], capture - before)
                self._last_detected_ns[cam] = capture if before is None else max(capture, before)
                self._detected[cam] += 1
            for cam in predicted:
                self._predicted[cam] += 1
            for cam in forced:
                self._forced[cam] += 1
            if batch_index is not None and forced:  # they wait for the model (`must_wait`)
                self._forced_in[batch_index] = frozenset(forced)
                if len(self._forced_in) > 64:
                    self._forced_in.popitem(last=False)
            if batch_index is not None and detected and not firsts:
                self._expected[batch_index] = (expected_done_ns, len(detected))
                while len(self._expected) > 64:  # answers that never came (a failed batch)
                    self._expected.popitem(last=False)
            second = self._second(now_ns)
            for cam, _ in detected:
                second.detected[cam] += 1
            for cam in predicted:
                second.predicted[cam] += 1
        if detected:
            estimate = self.service.estimate_ns(len(detected)) / 1e6
            with self._lock:
                second.service_ms.append(estimate)

    def _second(self, now_ns: int) -> _Second:
        """With the lock held: the timeline's entry for the second of `now_ns`."""
        start = self._start_ns if self._start_ns is not None else now_ns
        t_s = float(math.floor((now_ns - start) / 1e9))
        if not self._timeline or t_s > self._timeline[-1].t_s:
            n = len(self.cameras)
            self._timeline.append(_Second(t_s, [0] * n, [0] * n))
        return self._timeline[-1]

    def observe(self, batch_index: int, emitted_ns: int) -> None:
        """A model batch's answers came out at `emitted_ns`: how late against the estimate
        (the margin's data)."""
        with self._lock:
            expected = self._expected.pop(batch_index, None)
            if expected is None:
                return
            self._errors.append((expected[1], float(emitted_ns - expected[0])))
        margin = self.margin_ns() / 1e6
        with self._lock:
            if self._timeline:
                self._timeline[-1].margin_ms = max(self._timeline[-1].margin_ms, margin)

    def must_wait(self, batch_index: int, camera: int) -> bool:
        """Whether a camera's frame in a model batch was forced (first, reconnect, starvation
        bound): it waits for the model's boxes, however late."""
        with self._lock:
            return camera in self._forced_in.get(batch_index, ())

    def overdue(self, cameras: Sequence[int]) -> None:
        """These cameras' frames were answered by prediction at their deadline, the model
        late with them (`figures`: detected, and `overdue`; their boxes went to the tracks)."""
        with self._lock:
            for cam in cameras:
                self._overdue[cam] += 1

    # ------------------------------------------------------------------ reporting

    def figures(self) -> dict[str, object]:
        """What run.json keeps of the schedule: settings, per camera counts and the longest
        gap between detections (capture times), and the timeline per second."""
        with self._lock:
            cams = {
                name: {
                    "priority": self.priorities[i],
                    "detected": self._detected[i],
                    "predicted": self._predicted[i],
                    "detected_share": round(
                        self._detected[i] / max(1, self._detected[i] + self._predicted[i]), 4
                    ),
                    "forced": self._forced[i],
                    "overdue": self._overdue[i],
                    "longest_gap_ms": round(self._longest_gap_ns[i] / 1e6, 3),
                }
                for i, name in enumerate(self.cameras)
            }
            timeline = [
                {
                    "t_s": s.t_s,
                    "detected": list(s.detected),
                    "predicted": list(s.predicted),
                    "service_ms": round(max(s.service_ms), 3) if s.service_ms else None,
                    "margin_ms": round(s.margin_ms, 3),
                }
                for s in self._timeline
            ]
        return {
            "budget_ms": self.budget_ns / 1e6,
            "max_gap_ms": self.max_gap_ns / 1e6,
            "cameras": cams,
            "timeline": timeline,
        }
