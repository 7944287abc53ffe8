"""The calling thread's alternate signal stack, kept as it was across a native call that
replaces it (Linux on x86-64 or aarch64; elsewhere a no-op).

Why: OpenVINO's CPU plugin (2026.4.1 here) gives the thread on which an `ov.Core` first
uses the CPU (its first `compile_model` or `get_property` for "CPU") an alternate signal
stack of its own (11568 bytes on this machine). When that Core goes, it puts the thread's
previous stack back only if it is freed on that same thread; freed on another one (an
engine lane, the background compile thread, a garbage collection there) it frees the
memory and leaves it installed. CPython installs its signal handlers with `SA_ONSTACK`, so
the next signal the first thread takes (a Ctrl-C, SIGTERM, an alarm) runs its handler on
freed memory: SIGSEGV. A program that ran a model on OpenVINO, dropped it and went on (the
Python API, `bench`, a fleet worker, pytest) crashed on its next signal. Put back after
each such call, the thread keeps the stack it had (none, or faulthandler's), and the
plugin's memory is never in use when it is freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import sys
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

SS_DISABLE = 2  # <signal.h>, Linux (every architecture)
SS_AUTODISARM = 1 << 31  # Linux 4.7+: the stack is off while a handler runs on it
KEPT_FLAGS = SS_DISABLE | SS_AUTODISARM  # what a stack is set with (SS_ONSTACK is read only)
# `StackT`'s layout (pointer, int, size_t) is these architectures' (MIPS orders it otherwise)
ARCHITECTURES = ("x86_64", "aarch64")


class StackT(ctypes.Structure):
    """`stack_t` of <signal.h> on Linux, x86-64 and aarch64."""

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
    """libc's `sigaltstack`, or None where there is none to call as `StackT` says."""
    if not sys.platform.startswith("linux") or platform.machine() not in ARCHITECTURES:
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


def _set(stack: StackT) -> str | None:
    """Install `stack` on the calling thread: None, or why it could not be."""
    assert SIGALTSTACK is not None
    if SIGALTSTACK(ctypes.byref(stack), None) == 0:
        return None
    return os.strerror(ctypes.get_errno())


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Runs the block; if it changed the calling thread's alternate signal stack, puts the
    one from before back (see the module docstring); where that fails, turns the thread's
    stack off, as a stack the block installed may be freed under it. Two or three system
    calls (3.6 us a block): for the calls that can set one, not for every inference."""
    before = current()
    try:
        yield
    finally:
        after = current()
        if before is not None and after is not None and after.key() != before.key():
            flags = int(before.ss_flags) & KEPT_FLAGS
            why = _set(StackT(before.ss_sp, flags, before.ss_size))
            if why is None:
                log.debug(
                    "put back the thread's alternate signal stack (a native call had set "
                    "one of %d bytes)",
                    after.ss_size,
                )
            else:
                off = _set(StackT(None, SS_DISABLE, 0))
                log.warning(
                    "could not put back this thread's alternate signal stack (%s); %s",
                    why,
                    "it is off now" if off is None else f"nor turn it off ({off})",
                )
