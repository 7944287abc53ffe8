"""What a fleet is asked to do: `FleetOptions`, and each drive's `RunOptions` made from them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.fleet.drives import Drive, resolve_drives
from drivepercept.run.options import Mode, RunOptions
from drivepercept.rundir import FleetDir

# RunOptions fields a fleet sets per drive, or that make no sense without a terminal
_PER_DRIVE = frozenset({"sources", "out_root", "name", "mode", "show", "command", "duration_s"})
_SHARED = frozenset(f.name for f in dataclasses.fields(RunOptions)) - _PER_DRIVE
# the fleet's own folder, beside the drives' (a drive's name never starts with "_")


@dataclass(frozen=True)
class FleetOptions:
    """A fleet: the drives, where they go, the replay options every drive runs with, and how
    the work is spread.

    Attributes:
        drives: DRIVE arguments (rig files, folders of camera files, lists of drives).
        out: the fleet's folder; each drive's run folder is out/<drive name>, the fleet's
            report out/_fleet/. Every worker must reach it (a shared path on a cluster).
        run: `RunOptions` keyword arguments every drive shares (model, weights, settings,
            report_formats, ...; not sources, out_root, name or mode: the fleet's).
        address: None starts a local Ray instance sized to this machine; "auto" or
            "ray://host:port" joins a running cluster.
        workers: at most this many workers (None: as many as the resources allow).
        cpus_per_worker: CPUs each worker asks Ray for (CPU-only workers: one per this many).
        gpus_per_worker: GPUs each worker asks for; None: 1 where the cluster has GPUs, else 0.
        max_retries: how often a drive whose worker died is retried (Ray's actor restarts and
            task retries).
        resume: skip drives whose run folder is complete and was made with the same options.
    """

    drives: tuple[str, ...]
    out: Path
    run: Mapping[str, Any] = field(default_factory=dict)
    address: str | None = None
    workers: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None
    max_retries: int = 2
    resume: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "drives", tuple(str(d) for d in self.drives))
        object.__setattr__(self, "out", Path(self.out))
        unknown = sorted(set(self.run) - _SHARED)
        if unknown:
            raise ConfigError(
                f"fleet: these replay options are the fleet's own or unknown: {unknown}"
            )
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if not self.cpus_per_worker > 0:
            raise ConfigError(f"cpus per worker must be > 0, got {self.cpus_per_worker:g}")
        if self.gpus_per_worker is not None and not self.gpus_per_worker >= 0:
            raise ConfigError(f"gpus per worker must be >= 0, got {self.gpus_per_worker:g}")
        if not 0 <= self.max_retries <= 100:
            raise ConfigError(f"max retries must be 0..100, got {self.max_retries}")

    def plan(self) -> tuple[Drive, ...]:
        """The drives, resolved; each drive's options checked before anything runs.

        Raises:
            ConfigError: no drive, a missing path, a bad option (one line).
        """
        drives = resolve_drives(self.drives)
        for drive in drives:
            self.drive_options(drive).pipeline()  # settings checked here, not on a worker
        return drives

    @property
    def folder(self) -> FleetDir:
        """The fleet's output folder: the drives' run folders and the fleet's own files."""
        return FleetDir(self.out)

    def drive_options(self, drive: Drive, *, out_root: Path | None = None) -> RunOptions:
        """The replay options of one drive (its run folder is out_root/<drive name>)."""
        return RunOptions(
            sources=drive.sources,
            mode=Mode.REPLAY,
            out_root=out_root or self.out,
            name=drive.name,
            command="fleet",
            **self.run,
        )


def fingerprint(options: RunOptions) -> str:
    """What a drive's results depend on, as a short hash: `--resume` reuses a finished drive
    only when the options it was made with hash the same (not the folder it was written to)."""
    chosen = {
        k: v
        for k, v in dataclasses.asdict(options).items()
        if k not in ("out_root", "name", "metrics_port", "metrics_linger_s", "onnx_cache")
    }
    # the same files however they were named (relative, absolute, through a link)
    chosen["sources"] = [str(Path(s).resolve()) if Path(s).exists() else s for s in options.sources]
    text = json.dumps(chosen, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def shared_run(template: RunOptions, *, model: str | None) -> dict[str, Any]:
    """`FleetOptions.run` from one drive's worth of parsed options (what the CLI builds for
    replay); `model` None lets each drive's rig name its model, as replay does."""
    shared = {name: getattr(template, name) for name in sorted(_SHARED)}
    shared["model"] = model
    return shared
