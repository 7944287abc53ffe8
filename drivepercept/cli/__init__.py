"""The `drivepercept` command line: parse, merge the config file and the flags, call a job,
print. Decisions (policies, devices, file names) are the jobs' (`drivepercept.run`).

Every error a user can cause ends in one line on stderr and a non-zero exit code; tracebacks
are for bugs (run with `--debug` to see them for any error).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from drivepercept.cli.parser import build_parser
from drivepercept.errors import DrivePerceptError, StageError, one_line, redacting_handler

__all__ = ["main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drivepercept` console script and `python -m drivepercept`. The
    handlers load after parsing: --help and usage errors load no torch, OpenCV or ORT."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    from drivepercept.cli import commands  # the jobs: only once there is a command to run
    from drivepercept.run.console import quiet_native

    # OpenCV, FFmpeg, libjpeg and Rerun print lines for every bad file; ours say it in one: theirs
    # go through the log (-v: as they are) until the block ends; then our error line, after them.
    with quiet_native(args):
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
            handlers=[redacting_handler()],  # camera URLs in messages lose their credentials
        )
        try:
            return commands.HANDLERS[args.command](args)
        except DrivePerceptError as exc:
            if args.debug:
                raise
            line = f"drivepercept {args.command}: error: {one_line(str(exc))}"
            code = commands.EXIT_INTERNAL if isinstance(exc, StageError) else commands.EXIT_INPUT
        except KeyboardInterrupt:
            line, code = f"drivepercept {args.command}: interrupted", commands.EXIT_INTERRUPTED
    print(line, file=sys.stderr)
    return code


def run() -> NoReturn:
    """The console script: `main()`, then a fast exit.

    Every output is closed by the time `main()` returns; what is left is the interpreter's
    teardown of torch's and OpenCV's native libraries, which takes about a second (measured:
    1.0-1.4 s) and would delay the end of a run stopped with Ctrl-C. So the streams and
    logging are flushed and the process exits at once.
    """
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
