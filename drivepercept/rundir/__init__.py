"""The run folder and the fleet folder: their file names, the `run.json` record, and
redaction of secrets.

Every module that writes or reads a run folder takes its names from here (`RunDir`, and
`FleetDir` for a fleet's folder of drives), and
`run.json` is written and read only as a `RunRecord`: one schema, versioned, in one place.

    runs/<name>/
        run.json            RunRecord: command, model, config, sources, environment, status,
                            summary (the pipeline's own counts), live cameras, sinks
        detections.jsonl    one line per camera frame (boxes in original pixels)
        frames.csv          per-frame stage timestamps
        load.csv            GPU / CPU / memory samples
        summary.json, latency.csv, report.html, trace.json   the latency report
        eval.json           accuracy, for `eval` runs
        video/              annotated videos (--save-video)

Camera URLs carry credentials; `redact` is the one place that hides them before a source is
written into a record (and so into every report made from it).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError, OutputError
from drivepercept.errors import redact as redact


@dataclass(frozen=True)
class RunDir:
    """A run folder and the paths of what it holds."""

    path: Path

    RUN_JSON = "run.json"
    DETECTIONS_JSONL = "detections.jsonl"
    OBJECTS_JSONL = "objects.jsonl"  # the rig's tracked objects (`--track`)
    FRAMES_CSV = "frames.csv"
    LOAD_CSV = "load.csv"
    SUMMARY_JSON = "summary.json"
    LATENCY_CSV = "latency.csv"
    REPORT_HTML = "report.html"
    TRACE_JSON = "trace.json"
    EVAL_JSON = "eval.json"
    FLEET_DRIVE_JSON = "fleet_drive.json"  # a fleet's record of the drive this run replayed
    VIDEO_DIR = "video"

    @property
    def run_json(self) -> Path:
        return self.path / self.RUN_JSON

    @property
    def detections_jsonl(self) -> Path:
        return self.path / self.DETECTIONS_JSONL

    @property
    def objects_jsonl(self) -> Path:
        """The rig's tracked objects, one line per rig time step (`--track`)."""
        return self.path / self.OBJECTS_JSONL

    @property
    def frames_csv(self) -> Path:
        return self.path / self.FRAMES_CSV

    @property
    def load_csv(self) -> Path:
        return self.path / self.LOAD_CSV

    @property
    def summary_json(self) -> Path:
        return self.path / self.SUMMARY_JSON

    @property
    def eval_json(self) -> Path:
        return self.path / self.EVAL_JSON

    @property
    def fleet_drive_json(self) -> Path:
        return self.path / self.FLEET_DRIVE_JSON

    @property
    def video_dir(self) -> Path:
        return self.path / self.VIDEO_DIR

    def comparison_html(self, other: str) -> Path:
        """Where the comparison of this run (A) with run `other` (B) goes."""
        return self.path / f"compare-{other}.html"

    def read_record(self) -> RunRecord:
        """run.json as a record (ConfigError when it is missing or not a run record)."""
        try:
            data = json.loads(self.run_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {self.run_json}: {exc}") from None
        record, problems = RunRecord.from_json(data)
        if problems:
            raise ConfigError(f"{self.run_json}: {problems[0]}")
        return record

    def write_record(self, record: RunRecord) -> None:
        write_json(self.run_json, record.to_json())


@dataclass(frozen=True)
class FleetDir:
    """A fleet's output folder: one run folder per drive, and the fleet's own files.

    <out>/<drive>/              the drive's run folder (`RunDir`, with fleet_drive.json)
    <out>/_fleet/fleet.json     the fleet's record; fleet.html its report
    <out>/_fleet/attempts/<drive>/<n>.json   one mark per attempt at a drive
    <out>/_fleet/partial/<drive>.<n>/        an attempt's staging folder
    """

    path: Path

    STATE_DIR = "_fleet"
    FLEET_JSON = "fleet.json"
    FLEET_HTML = "fleet.html"
    ATTEMPTS_DIR = "attempts"
    PARTIAL_DIR = "partial"

    @property
    def state(self) -> Path:
        """The fleet's own folder (beside the drives' run folders)."""
        return self.path / self.STATE_DIR

    @property
    def fleet_json(self) -> Path:
        return self.state / self.FLEET_JSON

    @property
    def fleet_html(self) -> Path:
        return self.state / self.FLEET_HTML

    @property
    def partial(self) -> Path:
        """Where attempts stage their drives."""
        return self.state / self.PARTIAL_DIR

    def drive(self, name: str) -> RunDir:
        """The finished run folder of drive `name`."""
        return RunDir(self.path / name)

    def attempts(self, drive: str) -> Path:
        """The folder of a drive's attempt marks."""
        return self.state / self.ATTEMPTS_DIR / drive

    def staging(self, drive: str, attempt: int) -> Path:
        """Attempt `attempt`'s staging folder for `drive`."""
        return self.partial / f"{drive}.{attempt}"

    def trash(self, drive: str, attempt: int) -> Path:
        """Where a replaced run folder of `drive` goes while attempt `attempt` publishes."""
        return self.partial / f"{drive}.{attempt}.old"


def make_run_dir(root: Path, name: str | None, *, prefix: str = "replay") -> RunDir:
    """A new folder under root: `name`, or <prefix>-<date>-<time>, made unique with -2, -3..."""
    base = name or time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", base):
        raise ConfigError(f"run name may use letters, digits, '.', '_', '-', got {base!r}")
    for i in range(1, 1000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir(parents=True, exist_ok=False)
            return RunDir(path)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OutputError(f"cannot create run folder {path}: {exc.strerror}") from None
    raise OutputError(f"too many runs named {base!r} in {root}")


def write_text(path: Path, text: str) -> None:
    """Written whole (a temporary name, then renamed): a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk leaves an empty one behind
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    except BaseException:  # an interrupt mid-write: no half file left under any name
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Strict JSON (no NaN), written whole."""
    write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


# (re-exported: run.json's record and its sections, in their own modules)
from drivepercept.rundir.record import RUN_SCHEMA_VERSION as RUN_SCHEMA_VERSION  # noqa: E402
from drivepercept.rundir.record import RunRecord as RunRecord  # noqa: E402
