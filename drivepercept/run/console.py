"""A run in words, for a terminal: the progress bar and status line, the summary table, the
report's key figures. The CLI prints these; a Python caller may too. And the terminal kept
for them: native libraries' own stderr lines go to the log (`quiet_native`)."""

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
from typing import TYPE_CHECKING, TextIO

from drivepercept.report import ReportResult
from drivepercept.types import CameraSnapshot, LoadSample, RunProgress

if TYPE_CHECKING:  # torch: `drivepercept report` prints report lines without loading it
    from drivepercept.run.job import RunResult

log = logging.getLogger("drivepercept")
native_log = logging.getLogger("drivepercept.native")

_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colours (Rerun's WARN lines)
MAX_NATIVE_LINE = 4096  # bytes of a native stderr line logged at most


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
    straight to file descriptor 2 (libjpeg's "Corrupt JPEG data: 1 extraneous bytes before
    marker 0xdb", after our error line) goes to the log at INFO (`native_stderr_logged`).
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
    `native-stderr` into the log (`drivepercept.native`, INFO, one record a line, colours
    taken out), while `sys.stderr` (and the log handlers on it) write to a duplicate of the
    real stderr. Put back as it was at the end; a child process that still holds the pipe
    leaves the (daemon) thread to it. Does nothing where there is no file descriptor 2.
    A crash (a fatal signal in native code) would end the process before the thread logs
    what it said: for the block, Python's faulthandler writes the crash's traceback to the
    real stderr (unless it was already on)."""
    try:
        real = os.dup(2)
    except OSError:
        yield
        return
    previous = sys.stderr
    try:
        ours = previous is not None and previous.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a captured or replaced sys.stderr
        ours = False
    swapped: TextIO | None = None
    if ours:
        previous.flush()
        swapped = open(  # noqa: SIM115 (closed at the end of the block)
            real, "w", buffering=1, encoding=previous.encoding, errors="backslashreplace",
            closefd=False,
        )  # fmt: skip
        sys.stderr = swapped
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    crash_report = not faulthandler.is_enabled()
    if crash_report:
        faulthandler.enable(file=real, all_threads=True)
    drain = threading.Thread(target=_drain, args=(read_end,), name="native-stderr", daemon=True)
    drain.start()
    try:
        yield
    finally:
        if swapped is not None:
            swapped.flush()
        if crash_report:
            faulthandler.disable()
        os.dup2(real, 2)  # the pipe's last writer in this process: the drain reads its end
        drain.join(timeout=1.0)
        if not drain.is_alive():
            os.close(read_end)
        if swapped is not None:
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is swapped:
                    handler.setStream(previous)
            sys.stderr = previous
            swapped.close()
        os.close(real)


def _drain(fd: int) -> None:
    """Log each line read from `fd` until its end (the `native-stderr` thread)."""
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
            _say(line)
    _say(pending)


def _say(line: bytes) -> None:
    text = _ESCAPES.sub(b"", line[:MAX_NATIVE_LINE]).decode("utf-8", "replace").strip()
    if text:
        native_log.info("native stderr: %s", text)


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
