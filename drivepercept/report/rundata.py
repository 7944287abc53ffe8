"""Reading a run folder back: run.json, frames.csv and load.csv, whatever state they are in.

A run that was killed mid-way, a line cut short, a file someone edited: the reader keeps every
row it can parse and names each problem (file, line, what was wrong), so the report covers
what is there and says what is not. Only a folder with nothing to report on is an error.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from drivepercept.errors import DrivePerceptError
from drivepercept.rundir import RunDir, RunRecord
from drivepercept.telemetry.stats import FloatArray, IntArray
from drivepercept.telemetry.timeline import Timeline, fill_missing_stamps
from drivepercept.types import STAMPS

MAX_LISTED_PROBLEMS = 5  # per file; the rest are counted

_INT_COLUMNS = ("camera_index", "frame_index", "batch_index", "batch_size", "detections")
_REQUIRED = ("camera", *_INT_COLUMNS[:4], "capture_ns", "emitted_ns")


class ReportError(DrivePerceptError):
    """The folder cannot be reported on at all (missing, not a run folder, no frames file)."""


@dataclass(frozen=True, eq=False)
class LoadTable:
    """load.csv as columns (NaN where a value was empty)."""

    t_ns: IntArray
    columns: dict[str, FloatArray]

    def __len__(self) -> int:
        return int(self.t_ns.shape[0])

    def column(self, name: str) -> FloatArray | None:
        return self.columns.get(name)

    @property
    def gpu_count(self) -> int:
        return sum(1 for name in self.columns if re.fullmatch(r"gpu\d+_util_pct", name))

    @property
    def core_count(self) -> int:
        return sum(1 for name in self.columns if re.fullmatch(r"cpu\d+_pct", name))


@dataclass(frozen=True, eq=False)
class RunData:
    """Everything the report needs from a run folder, and what was wrong with it."""

    run_dir: Path
    record: RunRecord  # run.json (an empty "unknown" record when missing or unreadable)
    timeline: Timeline
    load: LoadTable | None
    problems: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def status(self) -> str:
        return self.record.status


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self._per_file: dict[str, int] = {}

    def add(self, text: str, *, file: str | None = None) -> None:
        if file is not None:
            n = self._per_file.get(file, 0) + 1
            self._per_file[file] = n
            if n > MAX_LISTED_PROBLEMS:
                return
        self.items.append(text)

    def finish(self) -> tuple[str, ...]:
        out = list(self.items)
        for file, n in self._per_file.items():
            if n > MAX_LISTED_PROBLEMS:
                out.append(f"{file}: {n - MAX_LISTED_PROBLEMS} more bad lines not listed")
        return tuple(out)


def _read_run_json(path: Path, problems: _Problems) -> RunRecord:
    unknown = RunRecord(command="unknown", mode="unknown", status="unknown")
    if not path.is_file():
        problems.add(f"{path.name} is missing: no config, environment or drop counts")
        return unknown
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.add(f"{path.name} is unreadable ({type(exc).__name__}: {exc})")
        return unknown
    record, found = RunRecord.from_json(data)
    for problem in found:
        problems.add(f"{path.name}: {problem}")
    if record.status == "running":
        problems.add(
            f"the run did not finish ({path.name} still says 'running': killed, or still going)"
        )
    elif record.status == "failed":
        problems.add(f"the run failed: {record.error or 'no error recorded'}")
    return record


def _lines(path: Path) -> tuple[list[str], bool]:
    """The file's complete lines, and whether a cut last line (a write cut short) was left
    out."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    return lines[:-1], lines[-1] != ""  # after the last "\n": "" (complete) or a cut line


def read_frames_csv(path: Path, problems: _Problems, cameras: list[str]) -> Timeline:
    """frames.csv -> Timeline; bad rows are skipped and named. `cameras` (from run.json, in
    camera-index order) is extended with names only seen in the file.

    Raises:
        ReportError: the file is missing, unreadable or has no usable header.
    """
    name = path.name
    if not path.is_file():
        raise ReportError(f"{path.parent} has no {name}: not a drivepercept run folder?")
    try:
        lines, cut = _lines(path)
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror}") from None
    if cut:
        problems.add(f"{name}: the last line is cut short (the run was killed mid-write)")
    if not lines:
        raise ReportError(f"{path} is empty: no header, no frames")
    header = next(csv.reader([lines[0]]))
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise ReportError(f"{path} has no column(s) {missing}: not a drivepercept {name}")
    col = {c: i for i, c in enumerate(header)}
    stamp_cols = [s for s in STAMPS if f"{s}_ns" in col]
    ints: dict[str, list[int]] = {c: [] for c in (*_INT_COLUMNS, *stamp_cols)}
    pts: list[float] | None = [] if "pts_s" in col else None
    names_by_index: dict[int, str] = dict(enumerate(cameras))
    for lineno, line in enumerate(lines[1:], start=2):
        # one line at a time: a stray quote must not swallow the lines after it
        row = next(csv.reader([line]), [])
        if not row:
            continue
        if len(row) != len(header):
            problems.add(
                f"{name} line {lineno}: expected {len(header)} fields, got {len(row)}; skipped",
                file=name,
            )
            continue
        try:
            values = {c: int(row[col[c]]) if c in col else 0 for c in _INT_COLUMNS} | {
                s: int(row[col[f"{s}_ns"]]) for s in stamp_cols
            }
            pts_s = float(row[col["pts_s"]]) if pts is not None else math.nan
        except ValueError as exc:
            problems.add(f"{name} line {lineno}: {exc}; skipped", file=name)
            continue
        cam_index, cam = values["camera_index"], row[col["camera"]]
        if not 0 <= cam_index < 10_000:
            problems.add(f"{name} line {lineno}: camera_index {cam_index}; skipped", file=name)
            continue
        known = names_by_index.setdefault(cam_index, cam)
        if known != cam:
            problems.add(
                f"{name} line {lineno}: camera {cam!r} at index {cam_index}, which is "
                f"{known!r} elsewhere; skipped",
                file=name,
            )
            continue
        for c, v in values.items():
            ints[c].append(v)
        if pts is not None:
            pts.append(pts_s)
    count = max(names_by_index, default=-1) + 1
    names = tuple(names_by_index.get(i, f"camera{i}") for i in range(count))
    arrays = {c: np.asarray(v, dtype=np.int64) for c, v in ints.items()}
    stamps = fill_missing_stamps({s: arrays[s] for s in stamp_cols})
    return Timeline(
        cameras=names,
        camera_index=arrays["camera_index"],
        frame_index=arrays["frame_index"],
        batch_index=arrays["batch_index"],
        batch_size=arrays["batch_size"],
        detections=arrays["detections"],
        stamps=stamps,
        source_s=None if pts is None else np.asarray(pts, dtype=np.float64),
    )


def read_load_csv(path: Path, problems: _Problems) -> LoadTable | None:
    """load.csv -> LoadTable (None when the run had no sampler); bad rows skipped and named."""
    name = path.name
    if not path.is_file():
        return None
    try:
        lines, cut = _lines(path)
    except OSError as exc:
        problems.add(f"cannot read {path}: {exc.strerror}")
        return None
    if cut:
        problems.add(f"{name}: the last line is cut short (the run was killed mid-write)")
    if not lines:
        return LoadTable(np.zeros(0, dtype=np.int64), {})
    header = lines[0].split(",")
    if not header or header[0] != "t_ns":
        problems.add(f"{name}: no t_ns column; load samples ignored")
        return None
    t_ns: list[int] = []
    rows: list[list[float]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        if len(fields) != len(header):
            problems.add(
                f"{name} line {lineno}: expected {len(header)} fields, got {len(fields)}; skipped",
                file=name,
            )
            continue
        try:
            t = int(fields[0])
            values = [float(v) if v else math.nan for v in fields[1:]]
        except ValueError as exc:
            problems.add(f"{name} line {lineno}: {exc}; skipped", file=name)
            continue
        t_ns.append(t)
        rows.append(values)
    table = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(header) - 1)
    return LoadTable(
        t_ns=np.asarray(t_ns, dtype=np.int64),
        columns={c: table[:, i] for i, c in enumerate(header[1:])},
    )


def load_run(run_dir: Path | str) -> RunData:
    """Read a run folder.

    Raises:
        ReportError: the folder does not exist, is not a folder, or has no usable frames.csv.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ReportError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a folder (give a run folder, e.g. runs/replay-...)")
    problems = _Problems()
    folder = RunDir(run_dir)
    record = _read_run_json(folder.run_json, problems)
    timeline = read_frames_csv(folder.frames_csv, problems, record.camera_names)
    load = read_load_csv(folder.load_csv, problems)
    if not len(timeline):
        problems.add(f"{folder.FRAMES_CSV} holds no frames")
    return RunData(
        run_dir=run_dir, record=record, timeline=timeline, load=load, problems=problems.finish()
    )
