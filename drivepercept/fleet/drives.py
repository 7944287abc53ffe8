"""The drives a fleet replays: what each DRIVE argument names, and each drive's folder name.

A DRIVE is a rig file, a folder of camera files (its rig.toml when it has one, else every
video in it is a camera named after its file), or a text file listing drives, one per line
(blank lines and `#` comments skipped; relative paths are relative to the list). Only that
each path exists and is a regular file or a folder (not a FIFO, which would block, or a
device such as /dev/null) is checked here: a drive whose files are unreadable fails alone
when it runs, so one corrupt drive never stops the planning of a thousand.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from drivepercept.errors import ConfigError
from drivepercept.rig import VIDEO_SUFFIXES
from drivepercept.sources.untrusted import file_kind

LIST_SUFFIXES = (".txt", ".list")
GROUND_TRUTH_FILE = "ground_truth.json"  # what `simulate` writes beside a rig file


@dataclass(frozen=True)
class Drive:
    """One recorded drive.

    Attributes:
        name: its folder under the fleet's output (unique in the fleet, made file-safe).
        path: the rig file or camera folder given.
        sources: what `RunOptions.sources` gets (the rig file, or the folder's videos).
        ground_truth: the drive's labels (a simulated clip's ground_truth.json), or None.
    """

    name: str
    path: Path
    sources: tuple[str, ...]
    ground_truth: Path | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name) or self.name.startswith(("_", ".")):
            # "." and ".." would be the fleet's folder and its parent
            raise ConfigError(
                "drive name must be letters, digits, '.', '_', '-', not starting with '.' or "
                f"'_', got {self.name!r}"
            )
        if not self.sources:
            raise ConfigError(f"drive {self.name}: no source")


def _listed(path: Path) -> list[Path]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the drive list {path}: {exc}") from None
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [path.parent / line for line in lines if line]


def _expand(items: Sequence[str | Path]) -> list[Path]:
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.suffix.lower() in LIST_SUFFIXES and path.is_file():
            paths += _listed(path)
        else:
            paths.append(path)
    return paths


def _drive_name(path: Path) -> str:
    """A rig file is named after its folder (rig.toml) or its stem; a folder after itself."""
    if path.name == "rig.toml":
        base = path.parent.resolve().name
    else:
        base = path.stem if path.is_file() else path.resolve().name
    # a path component of its own: no "." or ".." (the fleet's folder, its parent), no
    # hidden folder
    return re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip("._").rstrip("_") or "drive"


def _drive(path: Path, name: str) -> Drive:
    rig = path / "rig.toml" if path.is_dir() and (path / "rig.toml").is_file() else path
    if rig.is_file():
        truth = rig.parent / GROUND_TRUTH_FILE
        return Drive(name, path, (str(rig),), truth if truth.is_file() else None)
    # a folder of camera files: every video in it is a camera, named after its file (what
    # `serve-cameras` makes of a folder); no video in it is the drive's own failure, at run time
    videos = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
    return Drive(name, path, tuple(str(v) for v in videos) or (str(path),))


def resolve_drives(items: Sequence[str | Path]) -> tuple[Drive, ...]:
    """DRIVE arguments -> drives, in order, each with a unique name (`_2`, `_3`, ... on a clash).

    Raises:
        ConfigError: no drive, a path that does not exist or is neither a regular file nor a
            folder (a FIFO, a device such as /dev/null), an unreadable drive list.
    """
    paths = _expand(items)
    if not paths:
        raise ConfigError("give at least one DRIVE: a rig file, a folder of camera files or a list")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"no such drive: {missing[0]}{more}")
    for path in paths:  # a FIFO would block the planning, a device be read forever
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ConfigError(
                f"drive {path} is {file_kind(mode)}: a drive is a rig file, a recording, a folder "
                "of camera files or a list of drives"
            )
    drives: list[Drive] = []
    taken: set[str] = set()
    for path in paths:
        base = _drive_name(path)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        drives.append(_drive(path, name))
    return tuple(drives)
