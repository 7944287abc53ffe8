"""`run_fleet(options)`: many drives through Ray workers into one folder and one report."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import OutputError
from drivepercept.fleet import scheduler
from drivepercept.fleet.drives import Drive
from drivepercept.fleet.options import FleetOptions, fingerprint
from drivepercept.fleet.report import write_fleet_html
from drivepercept.fleet.summary import fleet_record
from drivepercept.fleet.worker import DriveOutcome, read_drive_record
from drivepercept.rundir import write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetResult:
    """How a fleet ended: every drive's outcome (in the order given) and the report's files."""

    outcomes: tuple[DriveOutcome, ...]
    record: dict[str, Any]
    fleet_json: Path
    fleet_html: Path
    interrupted: bool

    @property
    def failures(self) -> tuple[DriveOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status != "complete")

    def failure(self) -> str | None:
        """One line naming the drives that did not complete; None when all did."""
        bad = [o for o in self.failures if o.status != "cancelled"]
        if not bad:
            return None
        first = bad[0]
        more = f" (and {len(bad) - 1} more drive(s), see {self.fleet_json})" if len(bad) > 1 else ""
        return f"drive {first.drive} {first.status}: {first.error}{more}"


def resumable(options: FleetOptions, drive: Drive) -> DriveOutcome | None:
    """The drive's earlier outcome when its folder is complete and made with these options."""
    folder = options.folder.drive(drive.name)
    done = read_drive_record(folder.path)
    if done is None or done.status != "complete":
        return None
    if done.fingerprint != fingerprint(options.drive_options(drive)):
        return None
    try:
        if folder.read_record().status != "complete":
            return None
    except Exception:  # run.json missing or damaged: run it again
        return None
    return DriveOutcome(**{**done.to_json(), "resumed": True})


def run_fleet(
    options: FleetOptions,
    *,
    on_progress: Callable[[scheduler.FleetProgress], None] | None = None,
    on_start: Callable[[Sequence[Any]], None] | None = None,
) -> FleetResult:
    """Replay every drive on Ray workers; write out/<drive>/ for each and out/_fleet/ with
    fleet.json and fleet.html (also when interrupted: what finished is reported).

    Raises:
        ConfigError: bad options or drives, Ray missing or unreachable (nothing is run).
    """
    drives = options.plan()
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    started_unix = time.time()
    try:
        options.folder.state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {options.folder.state}: {exc.strerror}") from None
    earlier = {d.name: resumable(options, d) for d in drives} if options.resume else {}
    todo = [d for d in drives if earlier.get(d.name) is None]
    outcomes: list[DriveOutcome] = [o for o in earlier.values() if o is not None]
    workers: dict[str, Any] = {"count": 0}
    interrupted = False
    if todo:
        owned = scheduler.connect(options.address)
        try:
            sizing = scheduler.size_workers(options, len(todo), scheduler.cluster_resources())
            workers = {
                "count": sizing.workers,
                "num_cpus": sizing.num_cpus,
                "num_gpus": sizing.num_gpus,
                "cluster": sizing.cluster,
                "address": options.address or "local",
            }
            ran, interrupted = scheduler.dispatch(
                options, todo, sizing, on_progress=on_progress, on_start=on_start
            )
            outcomes += ran
        finally:
            scheduler.shutdown(owned)
        if interrupted:  # every worker is gone now: what they published is final
            outcomes = scheduler.settle(options, todo, outcomes, started_unix)
    # staged attempts of killed or cancelled workers: never part of a drive folder
    shutil.rmtree(scheduler.staging_root(options), ignore_errors=True)
    wall_s = time.monotonic() - t0
    record = fleet_record(
        options,
        drives,
        outcomes,
        wall_s=wall_s,
        started=started,
        interrupted=interrupted,
        workers=workers,
    )
    fleet_json, fleet_html = options.folder.fleet_json, options.folder.fleet_html
    write_json(fleet_json, record)
    write_fleet_html(fleet_html, record)
    order = {d.name: i for i, d in enumerate(drives)}
    return FleetResult(
        outcomes=tuple(sorted(outcomes, key=lambda o: order[o.drive])),
        record=record,
        fleet_json=fleet_json,
        fleet_html=fleet_html,
        interrupted=interrupted,
    )
