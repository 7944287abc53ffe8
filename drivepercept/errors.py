"""Errors a user can cause; the CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class DrivePerceptError(Exception):
    """Base class for every error drivepercept raises on purpose."""


class ConfigError(DrivePerceptError, ValueError):
    """A configuration value, flag or file is invalid; the message names expected and actual."""


class OutputError(DrivePerceptError, OSError):
    """An output location cannot be created or written."""
