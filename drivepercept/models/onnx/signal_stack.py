"""The calling thread's alternate signal stack, kept as it was across a native call that
replaces it (Linux; elsewhere a no-op).

Why: OpenVINO's CPU plugin (2026.4), when it is first loaded in a process (the first
`compile_model` or `get_property` for "CPU"), gives the thread that loads it an alternate
signal stack of its own (11568 bytes), and frees that memory when the plugin goes away, the
last compiled model freed, without taking it off that thread. CPython installs its signal
handlers with `SA_ONSTACK`, so the next signal that thread takes (a Ctrl-C, SIGTERM, an
alarm) runs its handler on freed memory: SIGSEGV. A program that runs a model on OpenVINO,
frees it and goes on (the Python API, `bench`, a fleet worker, pytest) crashed on its next
signal. Put back after each call, the thread keeps the stack it had (none, or faulthandler's),
and the plugin's memory is never in use when it is freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

SS_DISABLE = 2  # <signal.h>, Linux (every architecture)


class StackT(ctypes.Structure):
    """`stack_t` of <signal.h> on Linux (the same layout on x86-64 and aarch64)."""

    _fields_ = [
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    ]

    def key(self) -> tuple[int, int, int]:
        """Where the stack is, whether it is off, and its size (what a change changes)."""
        return (int(self.ss_sp or 0), int(self.ss_flags) & SS_DISABLE, int(self.ss_size))


Sigaltstack = Callable[[object, object], int]


def _sigaltstack() -> Sigaltstack | None:
    """libc's `sigaltstack`, or None where there is none to call (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sigaltstack
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.POINTER(StackT), ctypes.POINTER(StackT)]
    call.restype = ctypes.c_int
    return call


SIGALTSTACK = _sigaltstack()


def current() -> StackT | None:
    """The calling thread's alternate signal stack (None where it cannot be read)."""
    if SIGALTSTACK is None:
        return None
    stack = StackT()
    if SIGALTSTACK(None, ctypes.byref(stack)) != 0:
        return None
    return stack


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Runs the block; if it changed the calling thread's alternate signal stack, puts the
    one from before back (see the module docstring). Two or three system calls: cheap next to
    any call into a runtime."""
    before = current()
    try:
        yield
    finally:
        after = current()
        if before is not None and after is not None and after.key() != before.key():
            restore = StackT(before.ss_sp, int(before.ss_flags) & SS_DISABLE, before.ss_size)
            assert SIGALTSTACK is not None  # (current() read it)
            if SIGALTSTACK(ctypes.byref(restore), None) == 0:
                log.debug(
                    "put back the thread's alternate signal stack (a native call set one of "
                    "%d bytes)",
                    after.ss_size,
                )
            else:
                log.debug("could not put back the thread's alternate signal stack")
