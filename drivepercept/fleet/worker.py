"""One fleet worker: it builds the detector once and replays drives one after another through
the normal pipeline (`drivepercept.run.run`), each into its own run folder.

A drive is written into a staging folder of its own attempt (`_fleet/partial/<drive>.<n>/`)
and moved to `<out>/<drive>/` only when it has ended, so a worker killed mid-drive leaves a
staging folder behind and never a half-written drive folder; the retry writes a new one and
replaces whatever an earlier run left. Each attempt leaves a marker
(`_fleet/attempts/<drive>/<n>.json`: worker, pid, start): the fleet counts retries from them.

This module does not import Ray: the scheduler makes `DriveWorker` a Ray actor, and the class
runs as it is in a test or a plain loop.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drivepercept.errors import DrivePerceptError, one_line
from drivepercept.fleet.drives import Drive
from drivepercept.fleet.options import FleetOptions, fingerprint
from drivepercept.models.base import Detector
from drivepercept.run.evaluation import score_run
from drivepercept.run.groundtruth import read_ground_truth
from drivepercept.run.job import RunResult, load_model, run
from drivepercept.run.options import ModelOptions, RunOptions
from drivepercept.rundir import RunDir, write_json
from drivepercept.sinks.fanout import SinkPolicy
from drivepercept.telemetry.stats import LatencyHistogram
from drivepercept.types import FrameResult, RunProgress

# how a drive ended: complete, failed (its own input or the model), cancelled (the fleet was
# stopped), lost (its worker died more often than the retries allow)
STATUSES = ("complete", "failed", "cancelled", "lost")


@dataclass(frozen=True)
class DriveOutcome:
    """What one drive's replay came to (the drive folder's fleet_drive.json holds the same)."""

    drive: str
    status: str
    attempt: int = 1  # 1 + retries
    worker: str = ""  # host:pid of the worker that ran the last attempt
    started_unix: float = 0.0
    wall_s: float = 0.0  # the worker's time on the drive, opening and scoring included
    frames: int = 0
    elapsed_s: float = 0.0  # the pipeline's own run time
    throughput_fps: float = 0.0
    latency: Mapping[str, Any] | None = field(default=None, repr=False)  # LatencyHistogram
    map_50: float | None = None  # with ground truth: mAP@.5 at the run's score threshold
    error: str | None = None
    fingerprint: str = ""
    resumed: bool = False  # found complete by --resume, not run again

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"drive status must be one of {STATUSES}, got {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = dict(self.latency) if self.latency is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriveOutcome:
        """Raises ValueError (or KeyError, TypeError) for a damaged record."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class _LatencySink:
    """Every frame's capture-to-result latency into one histogram (on the completion thread)."""

    def __init__(self) -> None:
        self.histogram = LatencyHistogram()

    def write(self, result: FrameResult) -> None:
        self.histogram.add(result.timing.end_to_end_ms)

    def close(self) -> None:
        pass


def read_drive_record(folder: Path) -> DriveOutcome | None:
    """A drive folder's fleet_drive.json, or None when it has none or it is damaged."""
    try:
        data = json.loads(RunDir(folder).fleet_drive_json.read_text(encoding="utf-8"))
        return DriveOutcome.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _new_attempt(marks: Path, record: dict[str, Any]) -> int:
    """The next attempt number of a drive, claimed by creating its marker (exclusive)."""
    marks.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            with (marks / f"{n}.json").open("x", encoding="utf-8") as f:
                json.dump({"attempt": n, **record}, f)
            return n
        except FileExistsError:
            n += 1


def publish(staged: Path, final: Path, trash: Path) -> None:
    """Move a finished drive folder into place, replacing an earlier one whole (rename, so a
    reader sees the old folder or the new one, never a mix)."""
    if final.exists():
        shutil.rmtree(trash, ignore_errors=True)
        final.rename(trash)
    staged.rename(final)
    shutil.rmtree(trash, ignore_errors=True)


class DriveWorker:
    """Replays drives with one detector per model, built on first use and kept.

    Thread-safety: Ray runs `run_drive` and `progress` on two threads of the actor
    (max_concurrency=2) so that progress can be read mid-drive; they share two counters
    under a lock.
    """

    def __init__(self, options: FleetOptions) -> None:
        self._options = options
        self._detectors: dict[ModelOptions, Detector] = {}
        self._lock = threading.Lock()
        self._frames_now = 0
        self._drive_now: str | None = None
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def progress(self) -> tuple[str | None, int]:
        """(the drive being replayed, its frames so far)."""
        with self._lock:
            return self._drive_now, self._frames_now

    def pid(self) -> int:
        return os.getpid()

    def _detector(self, options: RunOptions) -> Detector:
        key = options.model_options  # the settings are the fleet's, shared by its drives
        if key not in self._detectors:
            self._detectors[key] = load_model(options)
        return self._detectors[key]

    def _on_progress(self, progress: RunProgress) -> None:
        with self._lock:
            self._frames_now = progress.frames_done

    def run_drive(self, drive: Drive) -> DriveOutcome:
        """Replay one drive into <out>/<drive>/ and say how it went; the drive's own errors
        are its outcome (status failed, one line), never an exception."""
        folder = self._options.folder
        started = time.time()
        t0 = time.monotonic()
        attempt = _new_attempt(
            folder.attempts(drive.name),
            {"worker": self.name, "pid": os.getpid(), "started_unix": started},
        )
        staging = folder.staging(drive.name, attempt)
        shutil.rmtree(staging, ignore_errors=True)
        with self._lock:
            self._drive_now, self._frames_now = drive.name, 0
        base: dict[str, Any] = {"drive": drive.name, "attempt": attempt, "worker": self.name}
        base["started_unix"] = started
        sink = _LatencySink()
        result: RunResult | None = None
        try:
            options = self._options.drive_options(drive, out_root=staging)
            base["fingerprint"] = fingerprint(options)
            result = run(
                options,
                detector=self._detector(options),
                sinks=[(sink, SinkPolicy())],
                progress=self._on_progress,
            )
            error = result.failure()
            map_50 = None if error else self._score(drive, result, options)
        except DrivePerceptError as exc:
            error, map_50 = one_line(str(exc)), None
        except Exception as exc:  # a bug, but the drive fails alone and says why
            error, map_50 = one_line(f"{type(exc).__name__}: {exc}"), None
        finally:
            with self._lock:
                self._drive_now = None
        stats = result.stats if result is not None else None
        status = "failed" if error else "complete"
        if stats is not None and stats.interrupted and not error:
            status = "cancelled"
        outcome = DriveOutcome(
            **base,
            status=status,
            wall_s=round(time.monotonic() - t0, 3),
            frames=stats.frames if stats else 0,
            elapsed_s=round(stats.elapsed_s, 4) if stats else 0.0,
            throughput_fps=round(stats.throughput_fps, 3) if stats else 0.0,
            latency=sink.histogram.to_json() if stats else None,
            map_50=map_50,
            error=error,
        )
        staged = staging / drive.name
        if staged.is_dir():  # the run began: its folder (whole, however it ended) goes in place
            write_json(RunDir(staged).fleet_drive_json, outcome.to_json())
            trash = folder.trash(drive.name, attempt)
            publish(staged, folder.drive(drive.name).path, trash)
        shutil.rmtree(staging, ignore_errors=True)
        return outcome

    def _score(self, drive: Drive, result: RunResult, options: RunOptions) -> float | None:
        """mAP@.5 of a labelled drive's detections (eval.json in its folder); None unlabelled."""
        if drive.ground_truth is None:
            return None
        truth = read_ground_truth(drive.sources[0], annotations=drive.ground_truth)
        limit = int(options.settings.get("max_frames", 0))
        # the whole drive and each class; per camera (a COCO evaluation more for each, as
        # much time again as the drive's scoring a camera) is `drivepercept eval`'s
        report = score_run(truth, result, limit=limit, by_camera=False)
        write_json(
            RunDir(result.run_dir).eval_json,
            {**report.to_json(), "model": options.model, "ground_truth": str(truth.path)},
        )
        return round(report.map_50, 6) if report.map_50 >= 0 else None
