"""The command line as a child process that a test stops with a signal, as a user would.

Ctrl-C reaches a program as SIGINT. A suite started as a background job of a non-interactive
shell (`pytest ... &` in a script, some CI runners) inherits SIGINT *ignored*, and so would
every child it starts: Python then installs no KeyboardInterrupt handler and the signal does
nothing, so a Ctrl-C test would fail for the wrong reason. `cli` starts the child with
Python's KeyboardInterrupt handler on SIGINT, as a terminal's foreground job has it, so the
test checks the program, not how the suite was launched. (The program itself leaves an
ignored SIGINT alone: a background job is meant not to see Ctrl-C.) The handler is set by the
child's first statement, not by a `preexec_fn` between fork and exec, which Python calls
unsafe in a parent with threads (a test's camera server).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

# How long a run may take to stop after SIGINT or SIGTERM, measured from the signal to the
# process's exit: the program's own promise (docs/REPLAY.md: within 2 s) and a margin
# for a busy 2-core host, where the interpreter's exit and the last report can wait behind
# other processes (a run of the whole suite beside a benchmark).
STOP_S = 2.0
BUSY_HOST_MARGIN_S = 3.0


# `python -m drivepercept`, with SIGINT raising KeyboardInterrupt whatever was inherited
_INTERRUPTIBLE = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('drivepercept', run_name='__main__', alter_sys=True)"
)


def cli(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """`python -m drivepercept ARGS` that Ctrl-C interrupts (see the module's docstring); its
    stdout and stderr piped as text unless `popen` says otherwise."""
    options: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    options.update(popen)
    return subprocess.Popen([sys.executable, "-c", _INTERRUPTIBLE, *args], **options)


# `drivepercept ARGS` in a child that, as it exits, writes its own peak resident memory to a
# file. The peak is the kernel's VmHWM (/proc/self/status), the high-water mark of the memory
# the child mapped after exec: `getrusage`'s ru_maxrss (RUSAGE_SELF in the child, or wait4's
# for it) also holds the parent's RSS at the fork, so a child of a 1.9 GB test process
# reported 1.9 GB for a report that took 85 MB.
_PEAK = """
import logging, os, sys
from drivepercept.cli import main
code = 1
try:
    code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 2
finally:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(sys.argv[1], "w") as f:
        f.write(str(kib * 1024))
os._exit(code)
"""


def peak_command(peak_file: Path, *args: str) -> list[str]:
    """The argv of `drivepercept ARGS` that writes its peak resident bytes to `peak_file` as
    it exits (`read_peak`)."""
    return [sys.executable, "-c", _PEAK, str(peak_file), *args]


def read_peak(peak_file: Path) -> int:
    """The peak resident bytes a `peak_command` child wrote (the child must have exited)."""
    return int(peak_file.read_text())


def cli_peak(folder: Path, *args: str, timeout_s: float = 120.0) -> tuple[int, str, int]:
    """`drivepercept ARGS` in a child: (exit code, stderr, its peak resident bytes), the peak
    written to `folder`/peak."""
    peak = folder / "peak"
    proc = subprocess.run(
        peak_command(peak, *args), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return proc.returncode, proc.stderr, read_peak(peak)
