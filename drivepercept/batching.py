"""The batcher: frames of all cameras -> batches in the staging ring, with a timeout.

In the spirit of DeepStream's nvstreammux: a batch takes the next frame of each camera and is
sent when every live camera has one, or when `batch_timeout_ms` has passed since the oldest
of its frames was queued, whichever comes first. A late camera therefore delays the others by
at most the timeout, an ended camera not at all, and a camera whose frames have been waiting
longer than the timeout (a fast camera in replay) never waits. Frames are copied straight into
a pre-allocated ring slot; the batch records which cameras are present and their capture
spread.

Each taken frame is prepared into its row (`preparing.FramePreparer`; deferred frames in
parallel); one that fails is left out of its batch and counted per camera
(`failed_by_camera`: the pipeline adds it to the camera's undecodable frames).

In time order (replay, `align=True`): a recorded drive's cameras are replayed as fast as they
decode, and a camera whose decoder started a little late would otherwise stay some frames
behind the others for the whole run (every batch holding frames 0.2-0.5 s apart, which the
tracker's rig steps then treat as one instant). So a replay batch waits for every live
camera's next frame (a camera with none queued is waited for up to `ALIGN_WAIT_S`, then
left out: a stalled decoder delays the others, but does not stop them), and takes, of the
waiting frames, those within one frame period of the earliest one by their own times
(stamp, else pts; `TimeAligner`); the others wait for a later batch. The frames of a batch
are then less than one frame period apart, as the cameras' own clocks allow.

With a detection interval (`detect_every` N > 1) each batch is split: the frames the model
sees come first in its slot, the others last (`Batch.predicted` of them), and the engine
runs the model on the first rows only; the tracking stage answers the rest. Camera c's k-th
frame is detected when k is 0 or (k + c) is a multiple of N (staggered: with N or more
cameras in step, each batch has some detected frames and the model's work per batch stays
about even; with fewer, some batches have none and pass the device by), and when it comes
over a second after the camera's previous frame (a reconnect, a stall: stale tracks).

With a deadline (`config.deadline_ms`) no frame is dropped for a newer one: each round takes
every waiting frame, the scheduler beside it (`schedule.DeadlineScheduler`) picks the cameras
whose newest frame the model sees, and the rest go first as batches without rows, which the
tracking stage answers as soon as the batch ahead of them is out (`_scheduled_round`). While
the batcher waits for the engine (live), a frame past its chance of the model goes on the
same way at once (`aging`, `_aging_round`).

Just in time: with deferred frames and a second staging slot, the batcher does not take the
next batch the moment a slot is free (its frames would then age for a whole inference in
the slot); given `free_at` (when the engine will take its next batch), it waits until that
time less its own preparation time (a moving average), then takes each camera's newest
frame. The preparation overlaps the end of the compute, and the batch is ready just as the
engine is.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from drivepercept.aging import aged_before_ns, aged_count
from drivepercept.alignment import Spreads, TimeAligner, after_gap
from drivepercept.buffers import StagingRing
from drivepercept.config import detect_due
from drivepercept.preparing import FramePreparer
from drivepercept.queues import CameraQueues, put_until_stopped
from drivepercept.schedule import Candidate, DeadlineScheduler
from drivepercept.types import NO_SLOT, Batch, QueuedFrame

log = logging.getLogger(__name__)
Rounds = dict[int, list[tuple[QueuedFrame, int]]]  # camera index -> frames taken, oldest first

_POLL_S = 0.1
PREDICTED_AHEAD = 16  # batches without rows the engine's inbox holds beyond the model's
ALIGN_WAIT_S = 1.0  # how long a replay batch waits for a camera that has no frame queued


class Batcher:
    """The `batcher` thread. Sends `None` on its output queue when it is done."""

    def __init__(
        self,
        *,
        queues: CameraQueues,
        ring: StagingRing,
        out: queue.Queue[Batch | None],
        timeout_ms: float,
        stop: threading.Event,
        on_error: Callable[[BaseException], None] | None = None,
        free_at: Callable[[], int] | None = None,
        behind: Callable[[], int] | None = None,
        align: bool = False,
        detect_every: int | Sequence[int] = 1,
        scheduler: DeadlineScheduler | None = None,
    ) -> None:
        self.queues = queues
        n = len(queues.cameras)  # one interval for all cameras, or one each
        self.detect_every = (
            (detect_every,) * n if isinstance(detect_every, int) else tuple(detect_every)
        )
        self.scheduler = scheduler
        self._since_detected: dict[int, int] = {}  # scheduler: frames since the last detected
        self._taken: dict[int, int] = {}  # per camera index: frames taken so far
        self._last_source_ns: dict[int, int] = {}  # per camera index: its latest frame's time
        self._resuming: set[int] = set()  # cameras back after a gap, not yet detected again
        self.aligner = TimeAligner() if align else None
        self._incomplete_since_ns: int | None = None  # align: since when a camera is awaited
        self._stalled: set[int] = set()  # align: cameras waited out, until they deliver
        self.spreads = Spreads()  # each batch's spread of its frames' own times
        self.free_at = free_at
        self.behind = behind  # how long the model batch in progress has overrun (ns)
        self.ring = ring
        self.out = out
        self.timeout_ns = int(timeout_ms * 1e6)
        self.stop = stop
        self.on_error = on_error
        self.batches = 0
        self.partial_batches = 0
        self.prep = FramePreparer(queues.cameras)  # each frame into its row, or its meta
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="batcher", daemon=True)

    @property
    def failed_by_camera(self) -> dict[int, int]:
        """Deferred frames that could not be prepared (corrupt), per camera index."""
        return self.prep.failed_by_camera

    def start(self) -> None:
        self.thread.start()

    def _wait_for_batch(self) -> bool:
        """With the lock held: wait until a batch should be sent. False when all is done."""
        qs = self.queues
        n = len(qs.cameras)
        while True:
            if self.stop.is_set():
                return False
            waiting = [c for c in range(n) if qs.waiting(c)]
            if not waiting:
                if qs.all_done():
                    return False
                qs.cond.wait(timeout=_POLL_S)
                continue
            live = [c for c in range(n) if qs.waiting(c) or not qs.ended(c)]
            if len(waiting) == len(live):
                self._incomplete_since_ns = None
                return True
            now = time.monotonic_ns()
            if self.aligner is not None:  # replay: wait for the camera, up to ALIGN_WAIT_S
                missing = {c for c in live if not qs.waiting(c)}
                self._stalled &= missing  # one that delivered again is waited for again
                if not missing - self._stalled:
                    self._incomplete_since_ns = None
                    return True
                if self._incomplete_since_ns is None:
                    self._incomplete_since_ns = now
                since = self._incomplete_since_ns
                remaining_ns = since + max(self.timeout_ns, int(ALIGN_WAIT_S * 1e9)) - now
                if remaining_ns <= 0:  # a stalled decoder: not waited for until it delivers
                    self._stalled |= missing
                    self._incomplete_since_ns = None
                    return True
                qs.cond.wait(timeout=min(remaining_ns / 1e9, _POLL_S))
                continue
            oldest = min(qs.oldest_queued_ns(c) or 0 for c in waiting)
            remaining_ns = oldest + self.timeout_ns - now
            if remaining_ns <= 0:
                return True
            qs.cond.wait(timeout=min(remaining_ns / 1e9, _POLL_S))

    def _run(self) -> None:
        qs = self.queues
        try:
            while True:
                with qs.cond:
                    if not self._wait_for_batch():
                        return
                slot = None
                while slot is None:
                    if self.stop.is_set():
                        return
                    slot = self.ring.acquire(timeout=self._wait_s())
                    if slot is None and not self._aging_round():
                        return
                if not self._just_in_time():
                    self.ring.release(slot)
                    return
                if self.scheduler is not None:
                    if not self._scheduled_round(slot, self.scheduler):
                        return
                    continue
                with qs.cond:
                    n = len(qs.cameras)
                    live = self._live()
                    waiting = [c for c in range(n) if qs.waiting(c)]
                    if self.aligner is not None:
                        heads = {c: _head_ns(qs.head(c)) for c in waiting}
                        waiting = self.aligner.choose(heads)
                    taken = [qs.take(c) for c in waiting]
                detect, predict = self._schedule(taken)
                metas = self.prep.fill(self.ring.arrays[slot], detect + predict)  # one round
                skipped = {frame.camera_index for frame, _ in predict}  # one frame a camera
                predicted = [m for m in metas if m.camera_index in skipped] if predict else []
                if not metas:  # every frame of it failed to prepare
                    self.ring.release(slot)
                    continue
                batch = Batch(
                    batch_index=self.batches,
                    slot=slot,
                    frames=tuple(metas),
                    batched_ns=time.monotonic_ns(),
                    complete=len(metas) == live,
                    predicted=len(predicted),
                )
                self.batches += 1
                self.partial_batches += 0 if batch.complete else 1
                self.spreads.add(metas)
                if not put_until_stopped(self.out, batch, self.stop):
                    self.ring.release(slot)
                    return
        except BaseException as exc:  # recorded; the pipeline re-raises it on the main thread
            self.error = exc
            if self.on_error is not None:
                self.on_error(exc)
        finally:
            self.prep.close()
            put_until_stopped(self.out, None, self.stop)

    def _scheduled_round(self, slot: int, scheduler: DeadlineScheduler) -> bool:
        """One round with a deadline (`schedule`): every waiting frame of every camera is
        taken and answered; the scheduler picks the cameras whose newest frame the model
        sees (a camera that must be detected, `_must_detect`, gives that frame, its later
        frames wait). The others go first, as batches without rows (one frame a camera
        each), answered by the tracking stage as soon as the batch before them is out; then
        the model's batch in `slot`. False when stopped."""
        qs = self.queues
        now = time.monotonic_ns()
        with qs.cond:
            n = len(qs.cameras)
            live = self._live()
            rounds: Rounds = {}
            forced: list[int] = []
            waiting = {c: f for c in range(n) if (f := qs.waiting_frames(c))}
            musts = {c: self._must_detect(c, f, scheduler) for c, f in waiting.items()}
            first = [c for c, m in musts.items() if m and not scheduler.has_detected(c)]
            later = scheduler.first_later(first)  # their first frames wait for the next batch
            for cam, frames in ((c, f) for c, f in waiting.items() if c not in later):
                must = musts[cam]
                if must is not None:
                    forced.append(cam)
                    if must[1]:
                        self._resuming.add(cam)
                rounds[cam] = qs.take_oldest(cam, len(frames) if must is None else must[0] + 1)
        if not rounds:  # (`_aging_round` sent every waiting frame on meanwhile)
            self.ring.release(slot)
            return not self.stop.is_set()
        candidates = []
        for cam, taken in rounds.items():
            newest = taken[-1][0]
            since = self._since_detected.get(cam, 0) + len(taken)
            if cam in forced or since >= self.detect_every[cam]:
                candidates.append(Candidate(cam, newest.capture_ns, forced=cam in forced))
        start = self.free_at() if self.free_at is not None else now
        prep = self.prep.ema_ns
        chosen = set(scheduler.choose(candidates, now_ns=now, start_ns=start, prepare_ns=prep))
        detect = [rounds[c][-1] for c in sorted(chosen)]
        done = max(now, start) + prep + scheduler.service.estimate_ns(len(detect))
        unseen = self._taken_by(rounds, chosen)  # camera -> frames since its last detected
        predicted = self._put_predicted(rounds, chosen, live)
        if predicted is None:
            self.ring.release(slot)
            return False
        metas = self.prep.fill(self.ring.arrays[slot], detect) if detect else []
        for cam in chosen - {m.camera_index for m in metas}:  # its frame failed to prepare
            self._since_detected[cam] = unseen[cam]
        index = self.batches if metas else None
        resumed = self._resuming & {m.camera_index for m in metas}
        self._resuming -= resumed
        scheduler.decided(
            batch_index=index,
            detected=[(m.camera_index, m.capture_ns) for m in metas],
            predicted=predicted,
            forced=[m.camera_index for m in metas if m.camera_index in forced],
            resumed=sorted(resumed),
            expected_done_ns=int(done),
            now_ns=now,
        )
        if not metas:
            self.ring.release(slot)
            return not self.stop.is_set()
        batch = Batch(
            self.batches, slot, tuple(metas), time.monotonic_ns(), complete=len(rounds) == live
        )
        self.batches += 1
        self.partial_batches += 0 if batch.complete else 1
        self.spreads.add(metas)
        if not put_until_stopped(self.out, batch, self.stop):
            self.ring.release(slot)
            return False
        return True

    def _live(self) -> int:
        """With the queues' lock held: the cameras with frames waiting or still to come."""
        qs = self.queues
        return sum(1 for c in range(len(qs.cameras)) if qs.waiting(c) or not qs.ended(c))

    @property
    def _aging(self) -> bool:
        """Whether frames aging in the queues go on (`_aging_round`): live with a deadline."""
        return self.scheduler is not None and self.aligner is None

    def _taken_by(self, rounds: Rounds, chosen: set[int]) -> dict[int, int]:
        """Note each camera's taken frames (its latest own time; frames since its last
        detected one, none if `chosen`); returns the frames since, as if not chosen."""
        unseen: dict[int, int] = {}
        for cam, taken in rounds.items():
            unseen[cam] = self._since_detected.get(cam, 0) + len(taken)
            self._since_detected[cam] = 0 if cam in chosen else unseen[cam]
            for frame, _ in taken:
                if frame.source_ns is not None:
                    self._last_source_ns[cam] = frame.source_ns
        return unseen

    def _put_predicted(self, rounds: Rounds, chosen: set[int], live: int) -> list[int] | None:
        """Each camera's taken frames but a `chosen` camera's last (the model's), sent as
        batches without rows, one frame a camera each, oldest first; the cameras of the
        frames sent (None: stopped). The cameras' newest frames share the last batch (each
        batch a rig step: with a camera's frames counted from its oldest, one with fewer
        would put its newest frame in the first, before the others' older ones)."""
        before = {cam: taken[:-1] if cam in chosen else taken for cam, taken in rounds.items()}
        depth = max((len(b) for b in before.values()), default=0)
        layers: list[list[tuple[QueuedFrame, int]]] = [[] for _ in range(depth)]
        for items in before.values():
            for k, item in enumerate(items, start=depth - len(items)):
                layers[k].append(item)
        predicted: list[int] = []
        for layer in layers:
            metas = self.prep.metas_only(layer)
            if not metas:
                continue
            now = time.monotonic_ns()
            complete = len(metas) == live
            batch = Batch(self.batches, NO_SLOT, tuple(metas), now, complete, len(metas))
            predicted += [m.camera_index for m in metas]
            self.batches += 1
            if not put_until_stopped(self.out, batch, self.stop):
                return None
        return predicted

    def _aging_round(self) -> bool:
        """While the batcher waits for the engine (a free slot, or its time to prepare) in a
        live run with a deadline, the waiting frames that age past their chance of the model
        go to the engine's inbox at once, as frames without rows (`aging`). False when
        stopped."""
        scheduler, qs = self.scheduler, self.queues
        if scheduler is None or not self._aging:
            return not self.stop.is_set()
        with qs.cond:
            if not any(qs.waiting(c) for c in range(len(qs.cameras))):
                return not self.stop.is_set()
        now = time.monotonic_ns()
        start = self.free_at() if self.free_at is not None else now
        stalled = self.behind is not None and self.behind() > 0
        before = aged_before_ns(
            scheduler, now_ns=now, start_ns=start, prepare_ns=self.prep.ema_ns, stalled=stalled
        )
        room = (self.out.maxsize if self.out.maxsize > 0 else 1 << 20) - self.out.qsize()
        rounds: Rounds = {}
        with qs.cond:  # (only this thread puts in the inbox: the room stays)
            live = self._live()
            for cam in range(len(qs.cameras)):
                frames = qs.waiting_frames(cam)
                must = self._must_detect(cam, frames, scheduler) if frames else None
                count = min(aged_count(frames, None if must is None else must[0], before), room)
                if count > 0:
                    rounds[cam] = qs.take_oldest(cam, count)
        if not rounds:
            return not self.stop.is_set()
        self._taken_by(rounds, set())
        if (predicted := self._put_predicted(rounds, set(), live)) is None:
            return False
        scheduler.decided(
            batch_index=None,
            detected=[],
            predicted=predicted,
            forced=[],
            expected_done_ns=now,
            now_ns=now,
        )
        return True

    def _wait_s(self) -> float:
        """How long the batcher waits for the engine before it looks again: in a live run
        with a deadline, an eighth of the budget at most, 2 ms at least (`_aging_round`)."""
        if self.scheduler is None or not self._aging:
            return _POLL_S
        return min(_POLL_S, max(0.002, self.scheduler.budget_ns / 8e9))

    def _must_detect(
        self, cam: int, frames: list[QueuedFrame], scheduler: DeadlineScheduler
    ) -> tuple[int, bool] | None:
        """Which of a camera's waiting frames (oldest first) the model must see, if one
        must, and whether for a gap: the first the scheduler says is due (none detected
        yet: nothing to predict from; or the starvation bound), or that comes over a second
        after its previous frame by their own times (`after_gap`: a reconnect, a stall)."""
        last = self._last_source_ns.get(cam)
        for k, frame in enumerate(frames):
            t = frame.source_ns
            if after_gap(t, last):
                return k, True
            if scheduler.due(cam, frame.capture_ns):
                return k, False
            last = t if t is not None else last
        return None

    def _schedule(
        self, taken: list[tuple[QueuedFrame, int]]
    ) -> tuple[list[tuple[QueuedFrame, int]], list[tuple[QueuedFrame, int]]]:
        """The taken frames the model sees and those the tracker answers (`detect_every`):
        camera c's k-th frame is detected when k is 0 or (k + c) is a multiple of its
        interval (the cameras staggered, so that batches share the work), or when it comes over
        a second after the camera's previous one (`after_gap`: its tracks are stale)."""
        if max(self.detect_every, default=1) <= 1:
            return taken, []
        detect: list[tuple[QueuedFrame, int]] = []
        predict: list[tuple[QueuedFrame, int]] = []
        for item in taken:
            frame = item[0]
            cam = frame.camera_index
            k = self._taken.get(cam, 0)
            t, last = frame.source_ns, self._last_source_ns.get(cam)
            due = detect_due(k, cam, self.detect_every[cam])
            (detect if after_gap(t, last) or due else predict).append(item)
            self._taken[cam] = k + 1
            if t is not None:
                self._last_source_ns[cam] = t
        return detect, predict

    def source_spread_ms(self) -> dict[str, float] | None:
        """p50 / p99 / max of the batches' spreads of their frames' own times (`Spreads`)."""
        return self.spreads.figures()

    def _just_in_time(self) -> bool:
        """With deferred frames, wait until the engine is about to be free less the time a
        preparation takes (see the module docstring); False if stopped meanwhile."""
        if self.free_at is None or self.prep.ema_ns == 0:
            return not self.stop.is_set()  # eager frames, or no preparation timed yet
        while (wait_ns := self.free_at() - int(self.prep.ema_ns) - time.monotonic_ns()) > 0:
            if self.stop.wait(min(wait_ns / 1e9, self._wait_s())) or not self._aging_round():
                return False
        return not self.stop.is_set()


def _head_ns(frame: QueuedFrame | None) -> int | None:
    return None if frame is None else frame.source_ns
