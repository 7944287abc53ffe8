"""Errors a user can cause; the CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class DrivePerceptError(Exception):
    """Base class for every error drivepercept raises on purpose."""


class ConfigError(DrivePerceptError, ValueError):
    """A configuration value, flag or file is invalid; the message names expected and actual."""


class OutputError(DrivePerceptError, OSError):
    """An output location cannot be created or written."""


class ModelError(DrivePerceptError):
    """A model cannot be built or its weights cannot be loaded."""


def one_line(text: str, *, limit: int = 400) -> str:
    """Collapse whitespace and newlines, and cut to `limit` characters (for error lines)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
