"""Fleet replay: many recorded drives across a Ray cluster (or this machine), one report.

    from drivepercept.fleet import FleetOptions, run_fleet

    options = FleetOptions(drives=("drives.txt",), out="fleet-out", run={"model": "yolox-nano"})
    result = run_fleet(options)
    print(result.fleet_json, [o.status for o in result.outcomes])

Ray is the `[fleet]` extra; without it `run_fleet` says so in one line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivepercept.fleet.drives import Drive, resolve_drives
    from drivepercept.fleet.job import FleetResult, run_fleet
    from drivepercept.fleet.options import FleetOptions
    from drivepercept.fleet.worker import DriveOutcome

# imported on first use: the options need neither torch nor Ray
_HOMES = {
    "Drive": "drivepercept.fleet.drives",
    "resolve_drives": "drivepercept.fleet.drives",
    "FleetResult": "drivepercept.fleet.job",
    "run_fleet": "drivepercept.fleet.job",
    "FleetOptions": "drivepercept.fleet.options",
    "DriveOutcome": "drivepercept.fleet.worker",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'drivepercept.fleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = ["Drive", "DriveOutcome", "FleetOptions", "FleetResult", "resolve_drives", "run_fleet"]
