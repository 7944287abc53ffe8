"""The soak's sampling: this process and the run every few seconds on a `soak-sampler`
thread, and the thread counts taken around the run."""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import psutil

if TYPE_CHECKING:
    from drivepercept.sim.serve import CameraServer
    from drivepercept.types import RunProgress

MB = 1024 * 1024
CLIENTS_GONE_S = 5.0  # how long the server's client handlers may take to notice we left

log = logging.getLogger("soak")


# ---------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class CameraSample:
    name: str
    served: int
    read: int
    processed: int
    dropped: int
    state: str

    @property
    def in_transit(self) -> int:
        """Served and not read yet at this sample (read a moment after served)."""
        return self.served - self.read


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the run was started
    rss_mb: float
    py_threads: int
    os_threads: int
    cameras: tuple[CameraSample, ...] = field(default=())
    # CPU seconds so far: this process (user + system), the whole host busy, and stolen by
    # the hypervisor; their differences between samples say who slowed the run down
    process_cpu_s: float = 0.0
    host_busy_s: float = 0.0
    host_steal_s: float = 0.0

    @property
    def processed(self) -> int:
        return sum(c.processed for c in self.cameras)


class Sampler:
    """Samples this process and the run every `every_s` on its own `soak-sampler` thread.

    The run's readings come through `attach` (its progress callback, called on the main
    thread every half second once capture has started), each with the frames the server had
    sent at that moment, so that a sample's served and read counts are of one moment; a
    sample holds the newest reading (at most half a second old).
    """

    def __init__(self, server: CameraServer, *, every_s: float) -> None:
        self._process = psutil.Process()
        self._server = server
        self._every_s = every_s
        self._latest: tuple[RunProgress, dict[str, int]] | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self.capture_started_s: float | None = None  # since start(): the first progress call
        self.samples: list[Sample] = []
        self.thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def attach(self, progress: RunProgress) -> None:
        if self._latest is None:
            self.capture_started_s = time.monotonic() - self._t0
        served = {s.name: self._server.frames_sent(s.name) for s in progress.cameras}
        self._latest = (progress, served)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10.0)
        if self.thread.is_alive():
            log.error("the soak-sampler thread did not stop")

    def take(self) -> Sample:
        cams: tuple[CameraSample, ...] = ()
        latest = self._latest  # one read: attach replaces it whole
        if latest is not None:
            progress, served = latest
            cams = tuple(
                CameraSample(
                    name=s.name,
                    served=served[s.name],
                    read=s.read,
                    processed=s.frames,
                    dropped=s.dropped,
                    state=s.state.value,
                )
                for s in progress.cameras
            )
        own = self._process.cpu_times()
        host = psutil.cpu_times()
        # busy: running anything (guest time is in user already; steal is counted apart)
        not_busy = host.idle + sum(
            getattr(host, k, 0.0) for k in ("iowait", "steal", "guest", "guest_nice")
        )
        return Sample(
            t_s=round(time.monotonic() - self._t0, 3),
            rss_mb=round(self._process.memory_info().rss / MB, 2),
            py_threads=threading.active_count(),
            os_threads=self._process.num_threads(),
            cameras=cams,
            process_cpu_s=round(own.user + own.system, 3),
            host_busy_s=round(sum(host) - not_busy, 3),
            host_steal_s=round(getattr(host, "steal", 0.0), 3),
        )

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                sample = self.take()
            except Exception:  # a failed sample must not end the soak; it is logged
                log.exception("sample failed")
                continue
            self.samples.append(sample)
            log.info(
                "t=%6.0f s  rss %7.1f MB  threads %3d py / %3d os  processed %7d  in transit %s",
                sample.t_s,
                sample.rss_mb,
                sample.py_threads,
                sample.os_threads,
                sample.processed,
                [c.in_transit for c in sample.cameras],
            )


def in_transit(samples: Sequence[Sample]) -> dict[str, dict[str, int]]:
    """Per camera, the served-but-unread backlog seen while the run went: max and median."""
    by_cam: dict[str, list[int]] = collections.defaultdict(list)
    for s in samples:
        for c in s.cameras:
            by_cam[c.name].append(c.in_transit)
    return {
        name: {"max": max(v), "median": int(np.median(v)), "samples": len(v)}
        for name, v in by_cam.items()
    }


@dataclass(frozen=True)
class HostLoad:
    """CPU cores in use between samples, mean and most: this process, every other process,
    and the hypervisor's steal."""

    process_mean: float
    others_mean: float
    others_max: float
    steal_mean: float
    steal_max: float


def host_load(samples: Sequence[Sample]) -> HostLoad | None:
    """What the host's CPU did between consecutive samples; None with fewer than two."""
    rows = []
    for a, b in itertools.pairwise(samples):
        dt = b.t_s - a.t_s
        if dt <= 0:
            continue
        own = (b.process_cpu_s - a.process_cpu_s) / dt
        busy = (b.host_busy_s - a.host_busy_s) / dt
        rows.append((own, max(0.0, busy - own), (b.host_steal_s - a.host_steal_s) / dt))
    if not rows:
        return None
    own_v, others, steal = np.asarray(rows, dtype=np.float64).T
    return HostLoad(
        process_mean=round(float(own_v.mean()), 3),
        others_mean=round(float(others.mean()), 3),
        others_max=round(float(others.max()), 3),
        steal_mean=round(float(steal.mean()), 3),
        steal_max=round(float(steal.max()), 3),
    )


# ---------------------------------------------------------------------- thread counts


def _python_threads() -> tuple[str, ...]:
    return tuple(sorted(t.name for t in threading.enumerate()))


def _os_threads(process: psutil.Process, *, readings: int = 10, every_s: float = 0.1) -> int:
    """The process's OS thread count, the most common of a few readings: a served camera
    that reaches the end of its clip reopens it, and its FFmpeg decoder threads come and go
    for a moment."""
    counts = []
    for k in range(readings):
        if k:
            time.sleep(every_s)
        counts.append(int(process.num_threads()))
    return collections.Counter(counts).most_common(1)[0][0]


def _os_thread_ids(
    process: psutil.Process, *, every: bool, readings: int = 10, every_s: float = 0.1
) -> frozenset[int]:
    """The ids of the process's OS threads over a few readings: those in `every` reading
    (the threads that stay), else those in any (the baseline, so that a decoder thread that
    came and went then is not taken for new later)."""
    seen: list[set[int]] = []
    for k in range(readings):
        if k:
            time.sleep(every_s)
        seen.append({t.id for t in process.threads()})
    return frozenset(set.intersection(*seen) if every else set.union(*seen))


def _wait_clients_gone(server: CameraServer, names: Sequence[str]) -> bool:
    """Wait for the server's client handlers to notice our client left (they do at their
    next write, within a frame period); False if some are still there after CLIENTS_GONE_S."""
    deadline = time.monotonic() + CLIENTS_GONE_S
    while time.monotonic() < deadline:
        handlers = [t for t in threading.enumerate() if t.name.startswith("serve-client-")]
        if not handlers and all(server.clients(n) == 0 for n in names):
            return True
        time.sleep(0.05)
    return False
