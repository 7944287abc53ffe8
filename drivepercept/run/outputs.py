"""A run's outputs, kept safe: never written over an input or over each other (checked before
anything is opened), written whole at the end (interrupts held back), and the metrics
endpoint's last minutes.

`check_outputs` compares the output files a run will write (`--mcap`, `--rerun-save`) with
every input (the rig file, videos, image folders and their files, recordings, ROS 2 bag
folders and their storage files), with each other, and, where `--name` names it in advance,
with the run folder: by `os.path.samefile` where both exist (a hard link or a symlink to an
input is that input), else by their resolved paths, equal or one inside the other. A clash
is a `ConfigError` naming both, before a reader or a writer is opened: an `--mcap` over the
replayed drive would otherwise truncate it. The run folder itself (`--out`) is not compared
with the inputs: `make_run_dir` always makes a new folder, so nothing in it can be an input
(`cd frames && drivepercept replay .` keeps its runs in `frames/runs`; image folders list
their own files only, bags their storage files by name).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from drivepercept.errors import ConfigError
from drivepercept.rig import CameraConfig
from drivepercept.run.options import RunOptions

log = logging.getLogger(__name__)

# the entries of an input folder compared by identity (hard links) at most: the rest of a
# huge folder is still covered by its path
MAX_FOLDER_ENTRIES = 100_000


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the path as written, made absolute
        return path.absolute()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


class _Input:
    """One input path: a file, or a folder (with the identities of the files in it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.resolved = _resolved(path)
        self.identity = _identity(path)
        self.folder = path.is_dir()
        self.entries: set[tuple[int, int]] = set()
        if self.folder:
            with contextlib.suppress(OSError):
                for k, entry in enumerate(os.scandir(path)):
                    if k >= MAX_FOLDER_ENTRIES:
                        break
                    with contextlib.suppress(OSError):
                        st = entry.stat()
                        self.entries.add((st.st_dev, st.st_ino))

    def clash(self, out: Path, *, folder: bool = False) -> str | None:
        """How output `out` would write over this path (None: it would not): "is" the path,
        or "is inside" it where it is a folder (or, `folder`, one still to be made)."""
        resolved, identity = _resolved(out), _identity(out)
        if resolved == self.resolved or (identity is not None and identity == self.identity):
            return "is"
        if (self.folder or folder) and (
            resolved.is_relative_to(self.resolved) or identity in self.entries
        ):
            return "is inside"
        return None


def input_paths(options: RunOptions, cams: Sequence[CameraConfig]) -> list[Path]:
    """The paths a run reads: its sources that are paths (a rig file, a video, a folder, a
    recording) and each camera's recorded video, image folder or recording, and live source
    where that is a path (a device node), each once."""
    found: dict[str, Path] = {}
    candidates = [*options.sources, *(c.video for c in cams), *(c.source for c in cams)]
    for item in candidates:
        if item is None or "://" in str(item):
            continue
        path = Path(item)
        with contextlib.suppress(OSError, ValueError):
            if path.exists():
                found.setdefault(str(_resolved(path)), path)
    return list(found.values())


def output_files(options: RunOptions) -> list[tuple[str, Path]]:
    """(flag, path) of every output file the run writes outside its run folder."""
    outs = []
    if options.mcap is not None:
        outs.append(("--mcap", options.mcap))
    if options.rerun is not None and options.rerun.path is not None:
        outs.append(("--rerun-save", options.rerun.path))
    return outs


def check_outputs(options: RunOptions, cams: Sequence[CameraConfig]) -> None:
    """Refuse a run whose output files would write over one of its inputs, over each other or
    into its own run folder (the module docstring). Called once the sources are resolved,
    before any reader or writer opens.

    Raises:
        ConfigError: one line naming the output and the input (or the other output).
    """
    inputs = [_Input(p) for p in input_paths(options, cams)]
    files = output_files(options)
    for flag, out in files:
        for source in inputs:
            how = source.clash(out)
            if how:
                where = "the input" if how == "is" else "the input folder"
                raise ConfigError(
                    f"{flag} {out} {how} {where} {source.path}: an output is never written "
                    "over an input"
                )
    if options.name is not None:  # the run folder's name is known before it is made
        run_dir = options.out_root / options.name
        own = _Input(run_dir)
        for flag, out in files:
            how = own.clash(out, folder=True)
            if how:
                raise ConfigError(
                    f"{flag} {out} {how} the run folder {run_dir} (--out "
                    f"{options.out_root} --name {options.name}), whose files the run writes: "
                    "put it outside"
                )
    for k, (flag, out) in enumerate(files):
        for other_flag, other in files[k + 1 :]:
            if _Input(other).clash(out) is not None or _Input(out).clash(other) is not None:
                raise ConfigError(f"{flag} {out} is also {other_flag} {other}: one path each")


def linger_metrics(seconds: float) -> None:
    """Keep the metrics endpoint up `seconds` after the run (it serves on its own thread). A
    Ctrl-C or SIGTERM ends the wait, not the run: its files are written by now, and the
    run ends as it would have."""
    if seconds <= 0:
        return
    log.info("keeping /metrics up for %.1f s", seconds)
    try:
        threading.Event().wait(seconds)  # a signal interrupts it (bounded: MAX_LINGER_S)
    except KeyboardInterrupt:
        log.warning("interrupted: /metrics taken down %.0f s early", seconds)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Holds SIGINT and SIGTERM back while the block writes the run's last files (record,
    report), then raises `KeyboardInterrupt` if one came: an interrupt never leaves them half
    written. Only the main thread can do so; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: came.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if came:
        log.warning("interrupted while writing the run's files: they were finished first")
        raise KeyboardInterrupt
