"""The deadline scheduler against fixed settings, on a machine made short: interleaved runs of
the same command with `--budget-ms B` (the scheduler holds it) and with `--budget-ms B
--no-schedule` (every frame the engine takes goes to the model, the newest wins), while a
second process keeps one core busy (a Python loop), for the whole run or for a window of it.

Two workloads (issue 45's acceptance):

- `realtime` (default): `replay sample_videos/rig.toml --realtime`, 6 cameras at 15 fps for
  8 s (720 frames), the hog on for the whole run;
- `live`: six cameras served by `serve-cameras` (the sample rig's clips, looped), `live
  --duration 12`, the hog on from second 3 to second 6 of capture (`--hog 3:6`).

The hog's seconds count from the run's first emitted frame (its frames.csv growing), so that
model loading and the warm-up are not in them. Printed for every run: frames answered (lines
in detections.jsonl) and dropped, p50 / p99 end-to-end latency over the run and after its
first second, frames over the budget, the share of frames the model saw, and the p99 of each
second of capture (`summary.json`'s `per_second`). Then each side's medians.

    python3 scripts/bench_deadline.py --rounds 3 --json deadline.json
    python3 scripts/bench_deadline.py --workload live --hog 3:6 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from drivepercept.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
RIG = ROOT / "sample_videos" / "rig.toml"
CAMERAS = ("front", "front_left", "front_right", "back", "back_left", "back_right")


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _hog(run_dir: Path, window: tuple[float, float] | None, limit_s: float) -> None:
    """Keep one core busy: for the window (seconds from the run's first emitted frame), or
    from the start for `limit_s`. Runs in a child process."""
    if window is None:
        _spin(time.monotonic() + limit_s)
        return
    frames = RunDir(run_dir).frames_csv
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the first frame's line (the header comes first)
        if frames.exists() and frames.read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    start = time.monotonic()
    time.sleep(window[0])
    _spin(start + window[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(
    args: argparse.Namespace, out: Path, name: str, schedule: bool, port: int
) -> list[str]:
    cmd = [sys.executable, "-m", "drivepercept"]
    if args.workload == "realtime":
        cmd += ["replay", str(RIG), "--realtime"]
    else:
        cmd += ["live", "--duration", str(args.duration)]
        for cam in CAMERAS:
            cmd += ["--camera", f"{cam}=http://127.0.0.1:{port}/{cam}.mjpg"]
    cmd += ["--model", args.model, "--budget-ms", str(args.budget_ms)]
    cmd += ["--out", str(out), "--name", name, "--no-progress", "--report", "json"]
    return cmd + ([] if schedule else ["--no-schedule"])


def _figures(run_dir: Path, budget_ms: float) -> dict[str, Any]:
    folder = RunDir(run_dir)
    lines = [json.loads(x) for x in folder.detections_jsonl.read_text().splitlines()]
    record = json.loads(folder.run_json.read_text())
    summary = json.loads(folder.summary_json.read_text())
    e2e = np.array([x["timestamps"]["end_to_end_ms"] for x in lines], np.float64)
    capture = np.array([x["timestamps"]["capture_ns"] for x in lines], np.int64)
    later = e2e[capture >= capture.min() + 1_000_000_000] if e2e.size else e2e
    cams = record["summary"]["cameras"].values()
    predicted = sum(1 for x in lines if x.get("predicted"))

    def pct(values: np.ndarray, q: float) -> float:
        return round(float(np.percentile(values, q)), 1) if values.size else float("nan")

    return {
        "answered": len(lines),
        "dropped": sum(c["dropped"] for c in cams),
        "p50_ms": pct(e2e, 50),
        "p99_ms": pct(e2e, 99),
        "p99_after_1s_ms": pct(later, 99),
        "over_budget": int((e2e > budget_ms).sum()),
        "detected_share": round((len(lines) - predicted) / max(1, len(lines)), 3),
        "per_second_p99": [s["p99_ms"] for s in summary.get("per_second") or []],
        "per_second_over": [s["over_budget"] for s in summary.get("per_second") or []],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("realtime", "live"), default="realtime")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--budget-ms", type=float, default=100.0)
    p.add_argument("--model", default="drivepercept-tiny")
    p.add_argument("--duration", type=float, default=12.0, help="live: seconds of capture")
    p.add_argument("--hog", default="all", help="'all', 'none' or START:END seconds")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    args = p.parse_args()
    window = None if args.hog in ("all", "none") else tuple(float(v) for v in args.hog.split(":"))
    server = None
    port = _free_port()
    if args.workload == "live":
        server = subprocess.Popen(
            [sys.executable, "-m", "drivepercept", "serve-cameras", str(RIG), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="deadline-") as tmp:
            for r in range(args.rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                for schedule in order:
                    side = "schedule" if schedule else "no-schedule"
                    name = f"{side}-{r}"
                    cmd = _command(args, Path(tmp), name, schedule, port)
                    hog = None
                    if args.hog != "none":
                        hog = multiprocessing.Process(
                            target=_hog, args=(Path(tmp) / name, window, 60.0), daemon=True
                        )
                        hog.start()
                    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
                    if hog is not None:
                        hog.terminate()
                        hog.join()
                    if done.returncode != 0:
                        print(f"{name}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
                        continue
                    fig = {"side": side, "round": r, **_figures(Path(tmp) / name, args.budget_ms)}
                    results.append(fig)
                    print(json.dumps(fig), flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    for side in ("schedule", "no-schedule"):
        rows = [x for x in results if x["side"] == side]
        if rows:
            keys = ("answered", "dropped", "p99_ms", "p99_after_1s_ms", "over_budget")
            med = {k: statistics.median(x[k] for x in rows) for k in (*keys, "detected_share")}
            print(f"{side:12s} median of {len(rows)}: {json.dumps(med)}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
