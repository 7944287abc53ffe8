"""When the engine will take its next batch (`BusyClock.free_at_ns`): what the live batcher
waits for, to make each batch just in time (`batching.Batcher`).

On a CPU the launch is the compute, so the engine is busy until the compute in progress
ends, and then for each batch waiting in its inbox. Without a deadline every batch is about
the rig's size and takes the moving average of the latest computes; with one, batches of
every size come (and batches of predicted frames only, which take no time at all), so each
is reckoned by its rows through the deadline scheduler's measure of the model
(`ServiceClock`, `service_times.ServiceTimes`), which the engine feeds. On CUDA launching returns
at once, so the engine is about free at once: only a CPU engine makes the batcher wait.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Protocol

from drivepercept.types import Batch


class ServiceClock(Protocol):
    """What measures the model's service time (`service_times.ServiceTimes`)."""

    def add(self, rows: int, ns: int, *, provisional: bool = False) -> None: ...

    def estimate_ns(self, rows: int) -> float: ...


class BusyClock:
    """The engine's compute in progress and the batches waiting for it (see the module
    docstring). The engine thread marks each compute's start and end; any thread asks."""

    def __init__(self, inbox: queue.Queue[Batch | None], service: ServiceClock | None) -> None:
        self.inbox = inbox
        self.service = service
        self._since_ns = 0  # when the compute in progress began (0: none)
        self._rows = 0  # its rows
        self.ema_ns = 0.0  # a moving average of how long one takes
        self.held = False  # a batch taken from the inbox, not yet computing
        self._held_rows = 0  # its rows
        self._lock = threading.Lock()

    def hold(self, rows: int) -> None:
        """A batch of `rows` for the model is taken from the inbox, not yet computing."""
        with self._lock:
            self.held, self._held_rows = True, rows

    def began(self, rows: int) -> int:
        """A compute of `rows` starts now; returns now (monotonic ns)."""
        now = time.monotonic_ns()
        with self._lock:
            self._since_ns, self._rows, self.held = now, rows, False
        return now

    def ended(self, took_ns: int) -> None:
        """The compute in progress is over, after `took_ns`."""
        with self._lock:
            self.ema_ns = took_ns if self.ema_ns == 0 else 0.5 * (self.ema_ns + took_ns)
            self._since_ns = 0

    def served(self, rows: int, times_ns: dict[str, int], *, provisional: bool = False) -> None:
        """A model batch's compute time (device time on CUDA) to the service clock
        (`provisional`: a warm-up's, kept only until the run measures its own)."""
        if self.service is not None and rows:
            took = times_ns["inference_done"] - times_ns["compute_start"]
            self.service.add(rows, took, provisional=provisional)

    def behind_ns(self) -> int:
        """How long the compute in progress has run past its estimate (0: none running, or
        within it): a model batch that stalls."""
        with self._lock:
            since, rows = self._since_ns, self._rows
        if not since or self.service is None:
            return 0
        return max(0, time.monotonic_ns() - since - int(self.service.estimate_ns(rows)))

    def free_at_ns(self) -> int:
        """When the engine is expected to take its next batch (monotonic ns)."""
        with self._lock:
            since, rows, ema, held = self._since_ns, self._rows, int(self.ema_ns), self.held
            held_rows = self._held_rows if held and not since else 0
        now = time.monotonic_ns()
        if self.service is not None:  # by rows: batches of every size, and none (passed)
            with self.inbox.mutex:
                waiting = [b.detected for b in self.inbox.queue if b is not None]
            waiting.append(held_rows)
            free = max(now, since + int(self.service.estimate_ns(rows))) if since else now
            return free + int(sum(self.service.estimate_ns(r) for r in waiting))
        free = max(now, since + ema) if since else now
        count = self.inbox.qsize() + (1 if held and not since else 0)
        return free + ema * count  # and each batch waiting for it
