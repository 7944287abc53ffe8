"""Errors a user can cause; the CLI prints them as one line and exits non-zero.

Secrets stop here: camera URLs carry credentials (`rtsp://user:password@...`, `?token=...`),
and a message that names a source would carry them into logs, error lines and the run folder.
`redact` hides them; every `DrivePerceptError` shows its message redacted, and the CLI's log
handler redacts every record (`RedactingFilter`). The real URL is used only to open a camera.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

# scheme://USERINFO@host: the userinfo runs to the authority's last "@" (a password may hold
# "@", ":" or anything but the path, query and fragment delimiters)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# a query or form parameter: its key, then its value up to the next separator
_PARAMETER = re.compile(r"(?P<key>[?&;](?P<name>[^=?&;#\s]*)=)[^&;#\s\"'<>]*")
# a key that names a secret, whatever its case and separators (auth_token, access-token,
# X-Amz-Signature, X-Amz-Credential, apiKey, sig, passwd, ...)
_SECRET_NAME = re.compile(r"token|key|secret|sig|pass|pwd|auth|credential|session", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the credentials of any URL in it hidden, by the URL's structure: the whole
    userinfo (`scheme://user:password@host`, `scheme://token@host`) becomes `***@`, and the
    value of every query parameter whose key names a secret (token, key, secret, signature,
    password, auth, credential, in any case, with `-` or `_`) becomes `***`."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _PARAMETER.sub(_hide_secret_value, text)


def _hide_secret_value(match: re.Match[str]) -> str:
    if _SECRET_NAME.search(match.group("name")):
        return match.group("key") + "***"
    return match.group(0)


class RedactingFilter(logging.Filter):
    """A handler filter that redacts every record's message (arguments merged in first) and
    shows its control characters escaped (`printable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = printable(redact(message))
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def redacting_handler() -> logging.Handler:
    """A stderr log handler whose records are redacted (what the CLI logs through)."""
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    return handler


class DrivePerceptError(Exception):
    """Base class for every error drivepercept raises on purpose. Its message is shown
    redacted (`str`, `repr`), whatever the caller put in it."""

    def __str__(self) -> str:
        return redact(super().__str__())

    def __repr__(self) -> str:
        return redact(super().__repr__())


class StageError(DrivePerceptError):
    """A stage of a running pipeline failed: an internal error, not the input's (the CLI
    exits 1 for it, 2 for the other errors, which are bad input)."""


class ConfigError(DrivePerceptError, ValueError):
    """A configuration value, flag or file is invalid; the message names expected and actual."""


class OutputError(DrivePerceptError, OSError):
    """An output location cannot be created or written."""


class ModelError(DrivePerceptError):
    """A model cannot be built or its weights cannot be loaded."""


def printable(text: str) -> str:
    """`text` with its control characters (terminal escape sequences, carriage returns,
    newlines, ...) shown as `\\xNN`: a file or camera name cannot move the cursor, retitle
    the terminal or forge a log line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str, *, limit: int = 400) -> str:
    """Collapse whitespace and newlines, show other control characters escaped, and cut to
    `limit` characters (for error lines)."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RepeatedWarning:
    """One warning that may repeat for every frame (a damaged message, a refused frame):
    logged for its first `first` occurrences, then once every `every_s` seconds with how many
    were not logged since, so a camera of bad frames costs a few lines, not one a frame.
    Thread-safe: the decoder threads of several cameras may share one. `close()` logs what
    is still unsaid, with the last of it (call it when the source ends).

    Args:
        logger: where the lines go.
        first: occurrences logged each before the throttling starts.
        every_s: the throttled interval.
        clock: monotonic time in ns (`time.monotonic_ns`; a test passes its own).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        first: int = 3,
        every_s: float = 10.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._log, self._first, self._every_s = logger, first, every_s
        self._every_ns, self._clock = round(every_s * 1e9), clock
        self._lock = threading.Lock()
        self.count = 0  # occurrences in all, logged or not
        self._unsaid = 0
        self._next_ns = 0
        self._last: tuple[str, tuple[object, ...]] = ("", ())  # the last one not logged

    def warn(self, message: str, *args: object) -> None:
        with self._lock:
            self.count += 1
            now_ns = self._clock()
            if self.count < self._first:
                suffix = ""
            elif self.count == self._first:
                suffix = f" (more like it: one line every {self._every_s:g} s)"
                self._next_ns = now_ns + self._every_ns
            elif now_ns >= self._next_ns:
                suffix = f" ({self._unsaid} more like it since)" if self._unsaid else ""
                self._unsaid, self._next_ns = 0, now_ns + self._every_ns
            else:
                self._unsaid += 1
                self._last = (message, args)
                return
        self._log.warning("%s%s", message % args if args else message, suffix)

    def close(self) -> None:
        with self._lock:
            unsaid, self._unsaid = self._unsaid, 0
            message, args = self._last
        if unsaid:
            last = message % args if args else message
            self._log.warning("%s (%d more like it not logged, this the last)", last, unsaid)
