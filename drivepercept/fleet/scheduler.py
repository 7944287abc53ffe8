"""Drives onto Ray workers: connect (or start a local instance), size the workers from the
cluster's resources, hand each idle worker the next drive, and collect outcomes as they come.

Faults: a worker process that dies mid-drive is restarted by Ray and the drive retried on it
(`max_restarts` / `max_task_retries`, both `FleetOptions.max_retries`); when the retries are
spent the drive is `lost` and a fresh worker takes the next drive. Ctrl-C kills the workers
(their drives are `cancelled`, staged output discarded) and returns what finished.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError, one_line
from drivepercept.fleet.drives import Drive
from drivepercept.fleet.options import FleetOptions
from drivepercept.fleet.worker import DriveOutcome, DriveWorker, read_drive_record

try:
    import ray
    from ray.exceptions import RayActorError, RayTaskError
except ImportError:  # the [fleet] extra is not installed: said when a fleet is asked for
    ray = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
POLL_S = 0.5


@dataclass(frozen=True)
class Sizing:
    """How many workers, and what each asks Ray for."""

    workers: int
    num_cpus: float
    num_gpus: float
    cluster: dict[str, float]


@dataclass(frozen=True)
class FleetProgress:
    """A snapshot for a progress display."""

    drives: int
    done: int
    failed: int
    running: tuple[str, ...]
    frames: int  # processed so far, drives in progress included
    elapsed_s: float


def connect(address: str | None) -> bool:
    """Join the cluster at `address`, or start a local Ray instance sized to this machine (or
    use the one this process already runs). True when this call started it (and owns it).

    Raises:
        ConfigError: Ray is not installed, or the cluster cannot be reached.
    """
    if ray is None:
        raise ConfigError("fleet needs Ray: pip install 'drivepercept[fleet]'")
    if ray.is_initialized():
        return False
    # no dashboard (it needs ray[default]); workers' logs stay in Ray's session folder (a
    # drive's errors come back in its outcome)
    quiet: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    try:
        if address is None:
            ray.init(num_cpus=os.cpu_count() or 1, **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address}: {one_line(str(exc))}"
        ) from None
    return True


def size_workers(options: FleetOptions, drives: int, cluster: dict[str, float]) -> Sizing:
    """One worker per GPU (or per `gpus_per_worker`), or on CPU-only clusters one per
    `cpus_per_worker` CPUs; never more than `options.workers` or the drives to run.

    Raises:
        ConfigError: not even one worker fits the cluster.
    """
    cpus, gpus = float(cluster.get("CPU", 0)), float(cluster.get("GPU", 0))
    per_gpu = options.gpus_per_worker
    if per_gpu is None:
        per_gpu = 1.0 if gpus >= 1 else 0.0
    per_cpu = options.cpus_per_worker
    fits = math.floor(cpus / per_cpu + 1e-9)
    if per_gpu > 0:
        fits = min(fits, math.floor(gpus / per_gpu + 1e-9))
    n = min(fits, options.workers or fits, max(drives, 1))
    if n < 1:
        raise ConfigError(
            f"no worker fits the cluster ({cpus:g} CPUs, {gpus:g} GPUs) asking for "
            f"{per_cpu:g} CPUs and {per_gpu:g} GPUs each"
        )
    return Sizing(workers=n, num_cpus=per_cpu, num_gpus=per_gpu, cluster=cluster)


def _attempts(options: FleetOptions, drive: Drive) -> int:
    marks = options.folder.attempts(drive.name)
    return len(list(marks.glob("*.json"))) if marks.is_dir() else 0


def dispatch(
    options: FleetOptions,
    drives: Sequence[Drive],
    sizing: Sizing,
    *,
    on_progress: Callable[[FleetProgress], None] | None = None,
    on_start: Callable[[Sequence[Any]], None] | None = None,
) -> tuple[list[DriveOutcome], bool]:
    """Run `drives` on `sizing.workers` Ray actors; (outcomes in finishing order, interrupted).

    `on_start` receives the actor handles once they are made (tests use it to find a
    worker's process).
    """
    assert ray is not None
    actor_class: Any = ray.remote(DriveWorker).options(
        num_cpus=sizing.num_cpus,
        num_gpus=sizing.num_gpus,
        max_restarts=options.max_retries,
        max_task_retries=options.max_retries,
        max_concurrency=2,  # run_drive and progress on two threads
    )
    actors: list[Any] = [actor_class.remote(options) for _ in range(sizing.workers)]
    if on_start is not None:
        on_start(actors)
    pending = deque(drives)
    running: dict[Any, tuple[Any, Drive]] = {}
    idle = list(actors)
    outcomes: list[DriveOutcome] = []
    started, started_unix = time.monotonic(), time.time()
    frames_done = 0
    try:
        while pending or running:
            while idle and pending:
                actor, drive = idle.pop(), pending.popleft()
                running[actor.run_drive.remote(drive)] = (actor, drive)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            for ref in ready:
                # still running until its outcome is recorded: a Ctrl-C while its result is
                # fetched finds it there (its published folder then says how it ended)
                actor, drive = running[ref]
                try:
                    outcome = ray.get(ref)
                    idle.append(actor)
                except RayActorError as exc:  # died more often than the restarts allow
                    why = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    outcome = DriveOutcome(
                        drive=drive.name,
                        status="lost",
                        attempt=max(_attempts(options, drive), 1),
                        error=f"its worker died on every attempt: {why}",
                    )
                    idle.append(actor_class.remote(options))  # a fresh one for the rest
                except RayTaskError as exc:  # a bug outside the drive's own error handling
                    outcome = DriveOutcome(
                        drive=drive.name, status="failed", error=one_line(str(exc.cause))
                    )
                    idle.append(actor)
                outcomes.append(outcome)
                del running[ref]
                frames_done += outcome.frames
            if on_progress is not None:
                on_progress(_snapshot(drives, outcomes, running, frames_done, started))
    except KeyboardInterrupt:
        _stop([a for a, _ in running.values()])
        recorded = {o.drive for o in outcomes}  # one whose outcome came just before Ctrl-C
        for _, drive in running.values():
            if drive.name not in recorded:
                done = _finished_anyway(options, drive, started_unix)
                outcomes.append(done or _cancelled(drive))
        outcomes += [_cancelled(d) for d in pending]
        return outcomes, True
    finally:
        for actor in actors + idle:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already dead
                log.debug("worker already gone: %s", exc)
    return outcomes, False


def _cancelled(drive: Drive) -> DriveOutcome:
    return DriveOutcome(drive=drive.name, status="cancelled", error="the fleet was stopped")


def _stop(actors: Sequence[Any], wait_s: float = 5.0) -> None:
    """Kill workers and wait (bounded) until they are gone: a drive a worker was about to
    publish is then either in place or not, and no longer moving."""
    assert ray is not None
    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + wait_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.pid.remote(), timeout=max(deadline - time.monotonic(), 0.01))
            except Exception:  # dead (RayActorError), or the wait is over
                break
            time.sleep(0.05)


def settle(
    options: FleetOptions,
    drives: Sequence[Drive],
    outcomes: Sequence[DriveOutcome],
    since_unix: float,
) -> list[DriveOutcome]:
    """After an interrupted fleet's workers are all gone (Ray shut down): a drive said to be
    cancelled whose folder was published all the same (a worker that outlived `_stop`'s
    bounded wait on a busy host) is reported as its folder says, so that fleet.json and the
    drive folders agree, and `--resume` skips exactly what fleet.json calls complete."""
    by_name = {d.name: d for d in drives}
    settled = []
    for outcome in outcomes:
        drive = by_name.get(outcome.drive)
        if outcome.status == "cancelled" and drive is not None:
            outcome = _finished_anyway(options, drive, since_unix) or outcome
        settled.append(outcome)
    return settled


def _finished_anyway(options: FleetOptions, drive: Drive, since_unix: float) -> DriveOutcome | None:
    """A drive whose worker published it between Ctrl-C and its end: its folder's record."""
    done = read_drive_record(options.folder.drive(drive.name).path)
    if done is None or done.started_unix < since_unix or done.attempt != _attempts(options, drive):
        return None
    return done


def _snapshot(
    drives: Sequence[Drive],
    outcomes: Sequence[DriveOutcome],
    running: dict[Any, tuple[Any, Drive]],
    frames_done: int,
    started: float,
) -> FleetProgress:
    assert ray is not None
    frames_now = 0
    for actor, _ in running.values():
        try:
            _, frames = ray.get(actor.progress.remote(), timeout=0.2)
            frames_now += int(frames)
        except Exception:  # a worker busy restarting: its frames show next time
            continue
    return FleetProgress(
        drives=len(drives),
        done=len(outcomes),
        failed=sum(o.status != "complete" for o in outcomes),
        running=tuple(d.name for _, d in running.values()),
        frames=frames_done + frames_now,
        elapsed_s=time.monotonic() - started,
    )


def shutdown(owned: bool) -> None:
    """Stop the local Ray instance this fleet started (a joined cluster is left running)."""
    if owned and ray is not None and ray.is_initialized():
        ray.shutdown()


def cluster_resources() -> dict[str, float]:
    assert ray is not None
    resources: dict[str, Any] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return {k: float(v) for k, v in resources.items()}


def staging_root(options: FleetOptions) -> Path:
    return options.folder.partial
