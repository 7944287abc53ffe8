"""A run in words, for a terminal: the progress bar and status line, the summary table, the
report's key figures. The CLI prints these; a Python caller may too. And the terminal kept
for them: native libraries' own stderr lines go through the log (`quiet_native`)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TextIO, TypeAlias

from drivepercept.report import ReportResult
from drivepercept.types import CameraSnapshot, LoadSample, RunProgress

if TYPE_CHECKING:  # torch: `drivepercept report` prints report lines without loading it
    from drivepercept.run.job import RunResult

log = logging.getLogger("drivepercept")
native_log = logging.getLogger("drivepercept.native")

_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colours (Rerun's WARN lines)
MAX_NATIVE_LINE = 4096  # bytes of a native stderr line logged at most
DRAIN_JOIN_S = 1.0  # how long the end of the block waits for the drain to log the last lines


def quiet_opencv() -> None:
    """OpenCV's and FFmpeg's logs at errors only, unless the environment says otherwise.
    OpenCV reads its variable once, when it loads: it is usually loaded by now (the sources
    import it), so its level is also set through its API."""
    if "OPENCV_LOG_LEVEL" not in os.environ:
        os.environ["OPENCV_LOG_LEVEL"] = "ERROR"
        cv2 = sys.modules.get("cv2")
        if cv2 is not None:
            cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")


@contextlib.contextmanager
def quiet_native(args: argparse.Namespace) -> Iterator[None]:
    """The CLI's stderr kept for its own lines, unless `--verbose` or `--debug`: OpenCV and
    FFmpeg log errors only (`quiet_opencv`), Rerun's Rust logger too (`RUST_LOG=error`
    unless set: it is read when rerun is imported), and what native code still writes
    straight to file descriptor 2 goes through the log (`native_stderr_logged`): known noise
    (libjpeg's "Corrupt JPEG data: 1 extraneous bytes before marker 0xdb" for a JPEG it
    decodes anyway, Rerun's WARN lines) at INFO, hidden; anything else (a C++ error, a
    library's complaint) at WARNING, shown in our log's format.
    Not for `fleet` (its workers log on their own), nor with `--rerun`, whose spawned viewer
    outlives the run and must keep the terminal's stderr."""
    if args.verbose or args.debug:
        yield
        return
    quiet_opencv()
    os.environ.setdefault("RUST_LOG", "error")
    if args.command == "fleet" or getattr(args, "rerun", False):
        yield
        return
    with native_stderr_logged():
        yield


@contextlib.contextmanager
def native_stderr_logged() -> Iterator[None]:
    """File descriptor 2 points at a pipe for the block, drained by the thread
    `native-stderr` into the log (`drivepercept.native`, one record a line, colours taken
    out: known noise at INFO, the rest at WARNING, `native_level`), while `sys.stderr` and
    every log handler that wrote to file descriptor 2 write to a duplicate of the real
    stderr (else the drain would log into the pipe it reads, forever). Put back as it was
    at the end. Does nothing where there is no file descriptor 2, or no pipe can be made
    (EMFILE): native lines then reach the terminal as they are.

    The drain is joined at the end; if it does not end (a child process still holds the
    pipe) it is said, and left to log that child's lines (a daemon thread). A crash (a
    fatal signal in native code, an abort) ends the process before the drain can log the
    last lines before it: for the block, Python's faulthandler writes the crash's traceback
    of every thread to the real stderr (unless it was already on); `-v` leaves stderr as it
    is, to see a native abort's own message."""
    moved = _redirected()
    if moved is None:
        yield
        return
    real, read_end, swapped, previous, handlers = moved
    crash_report = not faulthandler.is_enabled()
    if crash_report:
        faulthandler.enable(file=real, all_threads=True)
    echo = _dup(real)  # the drain's own: it may outlive the block
    drain = threading.Thread(
        target=_drain, args=(read_end, echo), name="native-stderr", daemon=True
    )
    drain.start()
    try:
        yield
    finally:
        swapped.flush()
        if crash_report:
            faulthandler.disable()
        os.dup2(real, 2)  # the pipe's last writer in this process: the drain reads its end
        drain.join(timeout=DRAIN_JOIN_S)  # (it closes the pipe's end and its `echo` itself)
        stuck = drain.is_alive()
        _put_back(handlers, swapped, previous)
        if sys.stderr is swapped:
            sys.stderr = previous
        swapped.close()
        os.close(real)
        if stuck:
            log.warning(
                "native stderr: the thread native-stderr did not end within %g s (a child "
                "process still holds its pipe); left to log that child's lines",
                DRAIN_JOIN_S,
            )


# log handlers moved off file descriptor 2, with the stream each had
_Handlers: TypeAlias = "dict[logging.StreamHandler[TextIO], TextIO | None]"


def _redirected() -> tuple[int, int, TextIO, TextIO, _Handlers] | None:
    """File descriptor 2 on a new pipe, `sys.stderr` and the handlers on fd 2 on a duplicate
    of it: (the duplicate, the pipe's read end, the stream on the duplicate, the
    `sys.stderr` before, the handlers moved with their streams before). None, with nothing
    moved or left open, where a descriptor cannot be had (no fd 2, EMFILE)."""
    try:
        real = os.dup(2)
    except OSError:
        return None
    try:
        read_end, write_end = os.pipe()
    except OSError:
        os.close(real)
        return None
    previous = sys.stderr
    swapped: TextIO = open(  # noqa: SIM115 (closed at the end of the block)
        real, "w", buffering=1, encoding=getattr(previous, "encoding", None) or "utf-8",
        errors="backslashreplace", closefd=False,
    )  # fmt: skip
    # before the dup2: whatever writes to fd 2 through Python now writes to the duplicate
    handlers = {h: h.setStream(swapped) for h in _handlers_on_fd2()}
    ours = _on_fd2(previous)
    if ours:
        previous.flush()
    try:
        os.dup2(write_end, 2)
    except OSError:
        _put_back(handlers, swapped, previous)
        swapped.close()
        for fd in (read_end, write_end, real):
            os.close(fd)
        return None
    os.close(write_end)
    if ours:
        sys.stderr = swapped
    return real, read_end, swapped, previous, handlers


def _on_fd2(stream: object) -> bool:
    try:
        return stream is not None and stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # captured, replaced or closed
        return False


def _stream_handlers() -> list[logging.StreamHandler[TextIO]]:
    """Every StreamHandler on the root logger or any other (a copy: loggers may be added)."""
    loggers = [logging.getLogger(), *list(logging.Logger.manager.loggerDict.values())]
    found: dict[int, logging.StreamHandler[TextIO]] = {}
    for logger in loggers:
        for handler in getattr(logger, "handlers", [])[:]:  # (a PlaceHolder has none)
            if isinstance(handler, logging.StreamHandler):
                found.setdefault(id(handler), handler)
    return list(found.values())


def _handlers_on_fd2() -> list[logging.StreamHandler[TextIO]]:
    return [h for h in _stream_handlers() if _on_fd2(h.stream)]


def _put_back(moved: _Handlers, swapped: TextIO, previous: TextIO) -> None:
    """Every handler on `swapped` back on its stream: the one it had (`moved`), or, for one
    made during the block on `sys.stderr`, the `sys.stderr` from before it."""
    for handler in _stream_handlers():
        if handler.stream is swapped:
            handler.setStream(moved.get(handler) or previous)


# What native libraries write to fd 2 that says nothing our own lines do not: libjpeg's
# warnings on a damaged JPEG it decodes anyway (the frame is counted if it is refused), libpng's
# warnings, FFmpeg's log lines about the file it reads ("[mov,mp4,m4a @ 0x55d0] moov atom not
# found": our own line says the video cannot be opened, or counts the frame), and log lines
# below error of Rerun (Rust: "[<time> WARN re_sdk] ...") and OpenCV ("[ WARN:0@1.2] ...").
# Logged at INFO; any other line at WARNING.
NATIVE_NOISE = re.compile(
    r"Corrupt JPEG data: |Premature end of JPEG file|libpng warning: "
    r"|^\[[\w,.-]+ @ 0x[0-9a-fA-F]+\] "
    r"|^(?:\[\s*(?:\S+\s+)?)?(?:WARN|INFO|DEBUG|TRACE)\b"
)
_OWN = b"native stderr: "  # the message prefix of the drain's records


def native_level(text: str) -> int:
    """The level a native stderr line is logged at: INFO for known noise, else WARNING. Pure."""
    return logging.INFO if NATIVE_NOISE.search(text) else logging.WARNING


def _dup(fd: int) -> int | None:
    try:
        return os.dup(fd)
    except OSError:
        return None


def _drain(fd: int, echo: int | None) -> None:
    """Log each line read from `fd` until its end (the `native-stderr` thread). A line that
    holds the prefix of the drain's own records is one of them come back (a handler made
    during the block on file descriptor 2 itself): it is written to `echo` (the real
    stderr) as it is, not logged again, which would loop forever. Closes both at the end."""
    try:
        _drain_lines(fd, echo)
    finally:
        os.close(fd)
        if echo is not None:
            os.close(echo)


def _drain_lines(fd: int, echo: int | None) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > MAX_NATIVE_LINE:
            lines.append(pending)
            pending = b""
        for line in lines:
            _say(line, echo)
    _say(pending, echo)


def _say(line: bytes, echo: int | None) -> None:
    if _OWN in line:  # a record of ours come back
        if echo is not None:
            with contextlib.suppress(OSError):
                os.write(echo, line[: MAX_NATIVE_LINE * 2] + b"\n")
        return
    text = _ESCAPES.sub(b"", line[:MAX_NATIVE_LINE]).decode("utf-8", "replace").strip()
    if text:
        native_log.log(native_level(text), "native stderr: %s", text)


def status_line(cameras: Sequence[CameraSnapshot], load: LoadSample | None) -> str:
    """Per-camera fps and p95 latency over the last second, and the load: one line."""
    cams = " ".join(
        f"{c.name} {c.fps:.1f}/{'-' if math.isnan(c.p95_ms) else f'{c.p95_ms:.0f}'}"
        for c in cameras
    )
    if load is None:
        tail = ""
    elif load.gpus:
        tail = " | " + " ".join(
            f"GPU{k} {g.util_pct:.0f}% {g.mem_used_bytes / 2**20:.0f} MB"
            for k, g in enumerate(load.gpus)
        )
    else:
        tail = f" | CPU {load.system_cpu_pct:.0f}% of {len(load.per_core_cpu_pct)} cores"
    return f"fps/p95 ms: {cams}{tail}"


class Progress:
    """Progress on stderr: a bar and, once a second, a status line. Drawn in place on a
    terminal; with `log_status` and no terminal, the status line is logged instead."""

    def __init__(
        self, *, enabled: bool, log_status: bool = False, out: TextIO | None = None
    ) -> None:
        self.total: int | None = None
        self.enabled = enabled
        self.log_status = log_status and not enabled
        self.out = out or sys.stderr  # (sys.stderr now: `quiet_native` may have moved it)
        self.started = time.monotonic()
        self.last_status = 0.0
        self.status = ""
        self.drawn = False

    def __call__(self, progress: RunProgress) -> None:
        if not (self.enabled or self.log_status):
            return
        now = time.monotonic()
        if now - self.last_status >= 1.0:
            self.last_status = now
            self.status = status_line(progress.cameras, progress.load)
            if self.log_status:
                log.info("%s", self.status)
        if not self.enabled:
            return
        if self.total is None:
            self.total = progress.expected_frames
        done = progress.frames_done
        elapsed = max(now - self.started, 1e-9)
        if self.total and self.total > 0:
            bar = "#" * int(min(done / self.total, 1.0) * 30)
            text = f"[{bar:<30}] {done}/{self.total} frames"
        else:
            text = f"{done} frames"
        # two lines, redrawn in place: the bar, then the status line; the cursor goes back up
        self.out.write(
            f"\r\x1b[K{text}  {done / elapsed:6.1f} frames/s\n\x1b[K{self.status}\x1b[1A\r"
        )
        self.out.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.enabled and self.drawn:
            self.out.write("\n\n")


def summary_table(result: RunResult) -> str:
    """Per camera frames, fps and latency percentiles, and a line for the whole run."""
    width = max(6, *(len(c.name) for c in result.stats.cameras))
    rows = [
        f"{'camera':<{width}} {'frames':>7} {'fps':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    ]
    for cam in result.stats.cameras:
        lat = cam.latency_ms
        p50, p95, p99 = (
            "-" if math.isnan(lat[k]) else f"{lat[k]:.1f}" for k in ("p50", "p95", "p99")
        )
        rows.append(
            f"{cam.name:<{width}} {cam.frames:>7d} {cam.fps:>7.1f} {p50:>8} {p95:>8} {p99:>8}"
        )
    s = result.stats
    rows.append(
        f"{'all':<{width}} {s.frames:>7d} {s.throughput_fps:>7.1f}   "
        f"({s.batches} batches, {s.partial_batches} partial, mean size "
        f"{s.mean_batch_size:.2f}, device {s.device})"
    )
    failed = {n: r.failed for n, r in (result.record.sinks or {}).items() if r.failed}
    rows += [f"output {name} failed (set aside): {why}" for name, why in failed.items()]
    return "\n".join(rows)


def report_lines(report: ReportResult) -> list[str]:
    """Where the report went and its key figures."""
    lines = [f"report: {', '.join(p.name for p in report.files)} in {report.run_dir}"]
    s = report.summary
    e2e, deadline = s["end_to_end_ms"], s["deadline"]
    if e2e["count"]:
        lines.append(
            f"end-to-end p50 {e2e['p50_ms']:.1f} ms, p99 {e2e['p99_ms']:.1f} ms; "
            f"{deadline['misses']}/{deadline['frames']} frames over {deadline['budget_ms']:g} ms"
        )
    reason = s["load"]["gpu_unavailable"]
    if reason:
        lines.append(f"GPU metrics unavailable: {reason}")
    return lines


def say_dropped(snapshots: Sequence[CameraSnapshot], queue: object) -> None:
    """A run that held a budget answers every frame: one that dropped some anyway (a camera's
    queue of `queue` frames overflowed: the run fell that far behind) says so."""
    if lost := sum(s.dropped for s in snapshots):
        log.warning(
            "%d frames were dropped although a budget answers every frame: a camera's queue "
            "(%s frames) overflowed, the run fell that far behind",
            *(lost, queue),
        )
