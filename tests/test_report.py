"""Reports: summary.json against frames.csv, latency.csv, report.html, trace.json, comparison,
and run folders in a bad state (killed, corrupt, missing)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from drivepercept.cli import main
from drivepercept.cli.commands import EXIT_PARTIAL
from drivepercept.report import load_run, write_comparison, write_report
from drivepercept.report.trace import build_trace
from drivepercept.sinks import FrameTimingCsvSink, LoadCsvSink
from drivepercept.telemetry import STAGE_SPANS
from drivepercept.types import (
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    GpuSample,
    Letterbox,
    LoadSample,
)

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MS = 1_000_000

pytestmark = pytest.mark.timeout(300)


# --- a run folder made by hand, with numbers known in advance -------------------------------


def _frame(
    cam: int, frame: int, batch: int, size: int, capture_ms: float, latency_ms: float
) -> FrameResult:
    c = int(capture_ms * MS)
    step = int(latency_ms * MS) // 10
    stamps = [c + k * step for k in range(10)] + [c + int(latency_ms * MS)]
    # STAMPS order: capture decoded preprocessed queued batched copy_start copy_done
    #               compute_start inference_done postprocessed emitted
    timing = FrameTiming(
        capture_ns=stamps[0],
        decoded_ns=stamps[1],
        preprocessed_ns=stamps[2],
        queued_ns=stamps[3],
        batched_ns=stamps[4],
        copy_done_ns=stamps[6],
        inference_done_ns=stamps[8],
        postprocessed_ns=stamps[9],
        emitted_ns=stamps[10],
        copy_start_ns=stamps[5],
        compute_start_ns=stamps[7],
    )
    names = ("left", "right")
    box = Letterbox((64, 48), (64, 48), 1.0, 1.0, 0.0, 0.0)
    meta = FrameMeta(names[cam], cam, frame, frame / 10, stamps[0], stamps[1], stamps[2], box)
    return FrameResult(
        meta=meta,
        batch_index=batch,
        batch_size=size,
        detections=Detections.empty(("car",)),
        timing=timing,
    )


# camera 0 "left": frames 0..3, latencies 10, 20, 30, 40 ms; camera 1 "right": frames 0, 2
# (frame 1 dropped), latencies 50 and 150 ms. Batches: 0 = {L0, R0}, 1 = {L1}, 2 = {L2, R2},
# 3 = {L3}. Captures every 100 ms; right's captures 4 ms after left's.
HAND_FRAMES = [
    _frame(0, 0, 0, 2, 0.0, 10.0),
    _frame(1, 0, 0, 2, 4.0, 50.0),
    _frame(0, 1, 1, 1, 100.0, 20.0),
    _frame(0, 2, 2, 2, 200.0, 30.0),
    _frame(1, 2, 2, 2, 204.0, 150.0),
    _frame(0, 3, 3, 1, 300.0, 40.0),
]


def _load_sample(t_ms: float, util: float) -> LoadSample:
    gpu = GpuSample(
        index=0,
        util_pct=util,
        mem_util_pct=10.0,
        mem_used_bytes=float(2 << 30),
        mem_total_bytes=float(80 << 30),
        power_w=200.0 + util,
        power_limit_w=700.0,
        temperature_c=55.0,
        sm_clock_mhz=1900.0,
        mem_clock_mhz=2600.0,
        pcie_tx_bytes_s=float(1 << 20),
        pcie_rx_bytes_s=float("nan"),
        throttle_reasons=0x4 if util > 50 else 0,
    )
    return LoadSample(
        t_ns=int(t_ms * MS),
        process_cpu_pct=120.0,
        system_cpu_pct=60.0,
        per_core_cpu_pct=(50.0, 70.0),
        process_rss_bytes=500 << 20,
        system_mem_used_bytes=4 << 30,
        system_mem_total_bytes=16 << 30,
        gpus=(gpu,),
    )


def _hand_run(path: Path, frames: list[FrameResult] = HAND_FRAMES, **run: Any) -> Path:
    path.mkdir(parents=True)
    with FrameTimingCsvSink(path / "frames.csv") as sink:
        for f in frames:
            sink.write(f)
    with LoadCsvSink(path / "load.csv") as load:
        for t, util in ((0.0, 20.0), (100.0, 80.0), (200.0, 90.0), (300.0, 30.0)):
            load.write(_load_sample(t, util))
    record = {
        "status": "complete",
        "command": "replay",
        "model": {"name": "hand-made"},
        "config": {"batch_timeout_ms": 20.0},
        "environment": {"device": "cuda:0", "gpu": "Test GPU"},
        "sources": [{"camera": "left"}, {"camera": "right"}],
        "telemetry": {"rate_hz": 10.0, "gpus": [{"index": 0, "name": "Test GPU"}]},
        "summary": {"cameras": {"left": {"dropped": 0}, "right": {"dropped": 1}}},
        **run,
    }
    (path / "run.json").write_text(json.dumps(record))
    return path


def test_summary_of_a_hand_made_run_matches_hand_computed_values(tmp_path: Path) -> None:
    run = _hand_run(tmp_path / "hand")
    result = write_report(run, budget_ms=45.0)
    s = result.summary
    assert result.problems == ()
    assert s["schema"] == "drivepercept.summary" and s["schema_version"] == 1
    assert s["frames"] == 6
    # first capture 0 ms, last emission 300 + 40 = 340 ms (right's 204 + 150 = 354 ms is later)
    assert s["span_s"] == pytest.approx(0.354)
    assert s["throughput_fps"] == pytest.approx(6 / 0.354, abs=1e-3)
    e2e = s["end_to_end_ms"]
    assert (e2e["count"], e2e["p50_ms"], e2e["max_ms"]) == (6, 35.0, 150.0)
    assert e2e["mean_ms"] == pytest.approx(50.0)
    # over 45 ms: 50 and 150
    assert s["deadline"] == {"budget_ms": 45.0, "frames": 6, "misses": 2, "miss_rate": 0.333333}
    left, right = s["cameras"]["left"], s["cameras"]["right"]
    assert left["end_to_end_ms"]["p50_ms"] == 25.0
    assert left["throughput_fps"] == pytest.approx(4 / 0.340, abs=1e-3)
    assert (left["dropped"], left["frame_index_gaps"]) == (0, 0)
    assert (right["dropped"], right["frame_index_gaps"]) == (1, 1)
    assert right["deadline"]["misses"] == 2
    # stages: each frame's spans are latency/10 apart, emit takes the rest
    assert s["stages"]["decode"]["p50_ms"] == pytest.approx(3.5)
    assert list(s["stages"]) == [span.name for span in STAGE_SPANS]
    b = s["batches"]
    assert (b["count"], b["mean_size"], b["full_share"]) == (4, 1.5, 0.5)
    assert b["size_counts"] == {"1": 2, "2": 2}
    # spreads: 4, 0, 4, 0 ms
    assert b["capture_spread_ms"]["max_ms"] == 4.0
    assert b["capture_spread_ms"]["p50_ms"] == 2.0
    # the frames' own times (pts frame / 10 s): each batch shows one instant
    assert (b["source_spread_ms"]["count"], b["source_spread_ms"]["max_ms"]) == (4, 0.0)
    load = s["load"]
    assert load["samples"] == 4 and load["gpu_unavailable"] is None
    (gpu,) = load["gpus"]
    assert gpu["name"] == "Test GPU"
    assert gpu["util_pct"] == {"mean": 55.0, "max": 90.0}
    assert gpu["power_w"]["max"] == 290.0
    assert gpu["throttle_reasons_seen"] == ["sw_power_cap"]
    assert load["process_rss_mb"] == {"mean": 500.0, "max": 500.0}
    # throughput windows of 1 s: one window of 0.354 s
    assert s["throughput"]["total_fps"] == [pytest.approx(6 / 0.354, abs=1e-3)]
    # and the files are there
    assert {p.name for p in result.files} == {
        "summary.json",
        "latency.csv",
        "report.html",
        "trace.json",
    }
    assert json.loads((run / "summary.json").read_text()) == s


def test_latency_csv_rows(tmp_path: Path) -> None:
    run = _hand_run(tmp_path / "hand")
    write_report(run, formats=["csv"])
    with (run / "latency.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * (1 + len(STAGE_SPANS))  # all, left, right
    first = rows[0]
    assert (first["scope"], first["stage"], first["count"], first["max_ms"]) == (
        "all",
        "end_to_end",
        "6",
        "150.0",
    )
    right = next(r for r in rows if r["scope"] == "right" and r["stage"] == "end_to_end")
    assert float(right["p50_ms"]) == 100.0


def test_one_frame_and_empty_runs_still_report(tmp_path: Path) -> None:
    one = write_report(_hand_run(tmp_path / "one", HAND_FRAMES[:1]))
    assert one.summary["frames"] == 1
    assert one.summary["end_to_end_ms"]["p99_ms"] == 10.0
    assert one.summary["throughput_fps"] == pytest.approx(100.0)  # 1 frame in 10 ms
    empty = write_report(_hand_run(tmp_path / "empty", []))
    assert empty.summary["frames"] == 0
    assert empty.summary["end_to_end_ms"]["p50_ms"] is None
    assert empty.summary["throughput_fps"] == 0.0
    assert "frames.csv holds no frames" in empty.problems
    assert (tmp_path / "empty" / "report.html").stat().st_size > 0
    json.loads((tmp_path / "empty" / "trace.json").read_text())


def test_trace_has_a_track_per_camera_and_stage(tmp_path: Path) -> None:
    run = _hand_run(tmp_path / "hand")
    write_report(run, formats=["trace"])
    trace = json.loads((run / "trace.json").read_text())
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(tracks.values()) == sorted(
        [
            "decode-left",
            "decode-right",
            "batcher",
            "engine copy stream",
            "engine compute stream",
            "engine-complete",
        ]
    )
    by_track: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            by_track.setdefault(tracks[e["tid"]], []).append(e)
    assert len([e for e in by_track["decode-left"] if e["name"] == "decode"]) == 4
    assert len([e for e in by_track["decode-right"] if e["name"] == "decode"]) == 2
    assert len(by_track["batcher"]) == 4
    inference = [e for e in by_track["engine compute stream"] if e["name"] == "inference"]
    assert len(inference) == 4
    # batch 2 = L2 (capture 200 ms, latency 30) and R2: its inference span is L2's stamps 7 -> 8
    assert inference[2]["ts"] == pytest.approx(200_000 + 7 * 3_000)
    assert inference[2]["dur"] == pytest.approx(3_000)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events if e["ph"] == "X")
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} >= {"CPU %", "GPU0 util %", "GPU0 power W"}


def test_trace_of_a_long_run_keeps_the_last_frames(tmp_path: Path) -> None:
    data = load_run(_hand_run(tmp_path / "hand"))
    trace = build_trace(data, max_frames=3)
    decode = [e for e in trace["traceEvents"] if e.get("name") == "decode"]
    assert len(decode) == 3 and trace["otherData"]["frames_left_out"] == 3
    # the three emitted last: L2 (230 ms), L3 (340 ms) and R2 (354 ms)
    assert sorted(e["args"]["frame"] for e in decode) == [2, 2, 3]


def test_compare_two_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _hand_run(tmp_path / "a")
    slower = [
        dataclasses.replace(
            f,
            timing=dataclasses.replace(f.timing, emitted_ns=f.timing.emitted_ns + 10 * MS),
        )
        for f in HAND_FRAMES
    ]
    b = _hand_run(tmp_path / "b", slower, config={"batch_timeout_ms": 5.0})
    result = write_comparison(a, b)
    assert result.html == a / "compare-b.html"
    line = next(x for x in result.text.splitlines() if x.startswith("end-to-end p50 ms"))
    assert line.split()[-3:] == ["35.0", "45.0", "1.29x"]
    page = result.html.read_text()
    assert "batch_timeout_ms" in page and "20.0 -&gt; 5.0" in page
    assert 'alt="p99 latency per second A vs B"' in page  # where each held a budget
    # the CLI prints the same table
    assert main(["report", str(a), "--compare", str(b)]) == 0
    assert "1.29x" in capsys.readouterr().out


def test_each_second_of_capture_and_the_schedule_are_in_the_summary_and_page(
    tmp_path: Path,
) -> None:
    # given frames over three seconds of capture, some over a 100 ms budget, and a run that
    # held it (run.json's schedule, as the scheduler writes it)
    latencies = {0: [10.0, 20.0, 150.0], 1: [30.0, 40.0], 2: [200.0]}
    frames = [
        _frame(k % 2, k, k, 1, 1000.0 * second + 10.0 * k, ms)
        for second, values in latencies.items()
        for k, ms in enumerate(values)
    ]
    schedule = {
        "budget_ms": 100.0,
        "max_gap_ms": 1000.0,
        "cameras": {
            name: {"priority": p, "detected": 3, "predicted": 1, "detected_share": 0.75,
                   "forced": 1, "longest_gap_ms": 400.0}
            for name, p in (("left", 2.0), ("right", 1.0))
        },
        "timeline": [{"t_s": 0.0, "detected": [2, 1], "predicted": [0, 1], "service_ms": 20.0,
                      "margin_ms": 5.0}],
    }  # fmt: skip
    run = _hand_run(tmp_path / "held", frames, schedule=schedule)
    write_report(run, formats=("json", "html"))
    summary = json.loads((run / "summary.json").read_text())
    # then each second has its frames, its p99 and how many were over
    seconds = summary["per_second"]
    assert [s["t_s"] for s in seconds] == [0, 1, 2]
    assert [s["frames"] for s in seconds] == [3, 2, 1]
    assert [s["over_budget"] for s in seconds] == [1, 0, 1]
    for s, values in zip(seconds, latencies.values(), strict=True):
        assert s["p99_ms"] == pytest.approx(np.percentile(values, 99), abs=1e-3)
    # and the schedule: per camera as run.json has it, per second each camera's share
    assert summary["schedule"]["cameras"]["left"]["priority"] == 2.0
    assert summary["schedule"]["per_second"] == [{"t_s": 0.0, "detected_share": [1.0, 0.5]}]
    page = (run / "report.html").read_text()
    assert "<h2>Deadline</h2>" in page and "held a 100 ms budget" in page
    assert "p99 latency and detected share per second" in page
    # a run without a schedule has the seconds, and says nothing was held
    plain = _hand_run(tmp_path / "plain", frames)
    write_report(plain, formats=("html",))
    assert "No budget was held" in (plain / "report.html").read_text()
    # a damaged schedule (lists of another length, a camera that is not a table) is left out
    for bad in (
        {**schedule, "timeline": [{"t_s": 0.0, "detected": [1], "predicted": [1, 2]}]},
        {**schedule, "cameras": {"left": 3}},
    ):
        damaged = _hand_run(
            tmp_path / f"damaged{len(list(tmp_path.iterdir()))}", frames, schedule=bad
        )
        write_report(damaged, formats=("json", "html"))
        assert json.loads((damaged / "summary.json").read_text())["schedule"] is None


# --- run folders in a bad state -------------------------------------------------------------


def test_report_cli_bad_folders_are_one_line(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    # in this process (test_bad_input.py's test_the_real_command_prints_one_line[report-partial]
    # runs the real command)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for args, message in [
        ((str(tmp_path / "missing"),), "does not exist"),
        ((str(tmp_path / "empty"),), "no frames.csv"),
        ((str(tmp_path / "file"),), "is not a folder"),
        ((str(tmp_path / "empty"), "--format", "pdf"), "report formats are"),
        ((str(tmp_path / "empty"), "--budget-ms", "-1"), "budget_ms must be > 0"),
    ]:
        code, err = in_process(["report", *args])
        assert code != 0, args
        assert err.count("\n") == 1 and message in err, err
        assert "Traceback" not in err


def test_corrupt_frames_csv_line_is_named_and_the_rest_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _hand_run(tmp_path / "hand")
    lines = (run / "frames.csv").read_text().splitlines(keepends=True)
    lines[2] = '"unterminated,quote\n'  # line 3: must not swallow the lines after it
    lines[3] = "left,0,zz,not,a,number\n"  # line 4 of the file
    lines[5] = lines[5].replace(",", ",x", 1)  # a stray field: wrong width
    (run / "frames.csv").write_text("".join(lines))
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    assert code == 3  # a report of what is there, with problems
    assert err.count("\n") == 1
    assert "frames.csv line 3" in err and "(and 2 more" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] == 3
    assert [p.split(":")[0] for p in summary["problems"]] == [
        "frames.csv line 3",
        "frames.csv line 4",
        "frames.csv line 6",
    ]
    assert "frames.csv line 4" in (run / "report.html").read_text()


def test_run_json_with_wrong_types_is_named_not_a_traceback(tmp_path: Path) -> None:
    run = _hand_run(tmp_path / "hand", summary=None, live=None, model="x", sources=5)
    record = json.loads((run / "run.json").read_text())
    record["summary"], record["live"] = [], "nope"
    (run / "run.json").write_text(json.dumps(record))
    result = write_report(run)
    assert result.summary["frames"] == 6
    assert any("model should be a dict" in p for p in result.problems)
    assert any("sources should be a list" in p for p in result.problems)
    assert any("live should be a dict" in p for p in result.problems)


# --- the real thing: a replay of the sample rig ---------------------------------------------


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    code = main(
        [
            "replay",
            str(SAMPLE_RIG),
            "--max-frames",
            "40",
            "--out",
            str(out),
            "--name",
            "sample",
            "--no-progress",
            "--budget-ms",
            "500",
        ]
    )
    assert code == 0
    return out / "sample"


def _frames_csv(run: Path) -> list[dict[str, str]]:
    with (run / "frames.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_sample_replay_writes_every_report_file(sample_run: Path) -> None:
    names = {p.name for p in sample_run.iterdir()}
    assert {
        "detections.jsonl",
        "frames.csv",
        "load.csv",
        "run.json",
        "summary.json",
        "latency.csv",
        "report.html",
        "trace.json",
    } <= names


def test_sample_summary_agrees_with_frames_csv(sample_run: Path) -> None:
    s = json.loads((sample_run / "summary.json").read_text())
    rows = _frames_csv(sample_run)
    run = json.loads((sample_run / "run.json").read_text())
    # recomputed here from the raw rows, independently of the report code
    assert s["frames"] == len(rows) == 240
    capture = np.array([int(r["capture_ns"]) for r in rows])
    emitted = np.array([int(r["emitted_ns"]) for r in rows])
    e2e = np.array([float(r["end_to_end_ms"]) for r in rows])
    span_s = (emitted.max() - capture.min()) / 1e9
    assert s["span_s"] == pytest.approx(span_s, abs=1e-6)
    assert s["throughput_fps"] == pytest.approx(len(rows) / span_s, abs=1e-3)
    for q, key in ((50, "p50_ms"), (95, "p95_ms"), (99, "p99_ms"), (100, "max_ms")):
        assert s["end_to_end_ms"][key] == pytest.approx(np.percentile(e2e, q), abs=2e-3)
    assert s["deadline"]["misses"] == int((e2e > 500.0).sum())
    assert s["budget_ms"] == 500.0
    for cam, rec in s["cameras"].items():
        mine = [r for r in rows if r["camera"] == cam]
        assert rec["frames"] == len(mine) == 40
        p95 = np.percentile([float(r["end_to_end_ms"]) for r in mine], 95)
        assert rec["end_to_end_ms"]["p95_ms"] == pytest.approx(p95, abs=2e-3)
        assert rec["dropped"] == run["summary"]["cameras"][cam]["dropped"] == 0
        assert rec["frame_index_gaps"] == 0
    batches = {int(r["batch_index"]): int(r["batch_size"]) for r in rows}
    assert s["batches"]["count"] == len(batches) == run["summary"]["batches"]
    assert s["batches"]["mean_size"] == pytest.approx(np.mean(list(batches.values())), abs=1e-3)
    # stage medians are consistent with the raw stamps
    inference = [int(r["inference_done_ns"]) - int(r["compute_start_ns"]) for r in rows]
    assert s["stages"]["inference"]["p50_ms"] == pytest.approx(np.median(inference) / 1e6, abs=2e-3)
    # on this CPU-only run the report says why there are no GPU figures, and still has CPU ones
    assert s["load"]["gpu_unavailable"] == "the run did not use a GPU"
    assert s["load"]["samples"] > 0 and s["load"]["process_cpu_pct"]["max"] > 0


def test_sample_load_samples_share_the_frames_clock(sample_run: Path) -> None:
    with (sample_run / "load.csv").open() as fh:
        t = [int(r["t_ns"]) for r in csv.DictReader(fh)]
    rows = _frames_csv(sample_run)
    first = min(int(r["capture_ns"]) for r in rows)
    last = max(int(r["emitted_ns"]) for r in rows)
    inside = [x for x in t if first <= x <= last]
    # 10 Hz over the run: most samples fall between the first capture and the last result
    assert len(inside) >= 0.8 * (last - first) / 1e8 - 2
    assert t == sorted(t)


def test_sample_trace_is_valid_with_one_track_per_camera(sample_run: Path) -> None:
    trace = json.loads((sample_run / "trace.json").read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in {"M", "X", "C"} and isinstance(e["pid"], int)
        if e["ph"] in {"X", "C"}:
            assert isinstance(e["ts"], (int, float))
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["dur"] >= 0
    tracks = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    cameras = [c["camera"] for c in json.loads((sample_run / "run.json").read_text())["sources"]]
    assert [t for t in tracks if t.startswith("decode-")] == [f"decode-{c}" for c in cameras]
    decode_spans = [e for e in events if e["ph"] == "X" and e["name"] == "decode"]
    assert len(decode_spans) == 240


def test_sample_html_is_self_contained_with_plots_and_config(sample_run: Path) -> None:
    page = (sample_run / "report.html").read_text()
    run = json.loads((sample_run / "run.json").read_text())
    assert page.count('src="data:image/png;base64,') >= 6
    for alt in ("latency CDF", "latency over time", "stage breakdown", "throughput over time"):
        assert alt in page
    assert "GPU metrics unavailable: the run did not use a GPU" in page
    for key in run["config"]:
        assert f'<td class="l">{key}</td>' in page, key
    assert run["environment"]["torch"] in page
    assert "drivepercept-tiny" in page
    # nothing for a browser to fetch
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "<link" not in page and "@import" not in page


def _page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked the network for (Chromium's own background requests have
    another network isolation key than the file:// page)."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        e["params"]["url"]
        for e in log["events"]
        if e["type"] == start
        and "file://" in e.get("params", {}).get("network_isolation_key", "")
        and not e["params"]["url"].startswith("file:")
    ]


@pytest.mark.desktop
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_report_renders_in_headless_chromium_without_requests(
    sample_run: Path, tmp_path: Path
) -> None:
    assert CHROMIUM is not None

    def shoot(page: Path, name: str) -> tuple[Path, list[str]]:
        shot, netlog = tmp_path / f"{name}.png", tmp_path / f"{name}.netlog.json"
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / ('profile-' + name)}",
                f"--log-net-log={netlog}",
                "--window-size=1200,3000",
                f"--screenshot={shot}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
        return shot, _page_requests(netlog)

    # the check can see a request: a page with one external image makes one
    bait = tmp_path / "bait.html"
    bait.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    assert shoot(bait, "bait")[1] == ["http://example.invalid/x.png"]
    # the report makes none, and renders (a page of plots, not a blank one)
    shot, requests = shoot(sample_run / "report.html", "report")
    assert requests == []
    import cv2

    image = cv2.imread(str(shot))
    assert image is not None and image.shape[:2] == (3000, 1200)
    assert float(image.std()) > 20
    keep = os.environ.get("DRIVEPERCEPT_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_report_of_a_replay_killed_mid_way(tmp_path: Path) -> None:
    # given a replay killed with SIGKILL (no chance to clean up) once frames are on disk
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drivepercept",
            "replay",
            str(SAMPLE_RIG),
            "--out",
            str(tmp_path),
            "--name",
            "k",
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = tmp_path / "k"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            frames = run / "frames.csv"
            if frames.exists() and frames.read_text().count("\n") > 60:
                break
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    rows = len(_frames_csv(run))
    assert rows > 0
    # every file holds whole lines that parse: nothing written before the kill is corrupt
    data = (run / "detections.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n")
    assert all(json.loads(line) for line in data.decode().splitlines())
    with (run / "load.csv").open(newline="") as fh:
        assert len({len(row) for row in csv.reader(fh)}) <= 1
    assert not list(run.glob("*.tmp"))
    # when the report is asked for
    out = subprocess.run(
        [sys.executable, "-m", "drivepercept", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # then it reports the frames that are there and names the problem, in one line
    assert out.returncode == 3  # a report of what is there, with problems
    assert out.stderr.count("\n") == 1 and "did not finish" in out.stderr, out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] == rows
    assert summary["run"]["status"] == "running"
    assert (run / "report.html").stat().st_size > 10_000
    json.loads((run / "trace.json").read_text())
    assert load_run(run).problems


# --------------------------------------------------------------------------- crafted folders

# markup that would run if it reached the page as HTML: it sets the title
_BAIT = "<img src=x onerror=\"document.title='PWNED'\"><script>document.title='PWNED'</script>"


def _crafted(sample_run: Path, tmp_path: Path) -> Path:
    """A copy of the sample run whose run.json carries markup in every kind of field a
    sender controls: a source's size, names, the model, config and environment values (a
    size is a number in run.json's typed sources: markup there is dropped and named)."""
    folder = tmp_path / "crafted"
    shutil.copytree(sample_run, folder)
    (folder / "report.html").unlink()
    record = json.loads((folder / "run.json").read_text())
    for source in record["sources"]:
        source["width"], source["height"] = _BAIT, _BAIT
        source["source"] = _BAIT
    record["model"]["name"] = _BAIT
    record["model"]["runtime_choice"] = {"reason": _BAIT}
    record["config"]["precision"] = _BAIT
    record["environment"]["drivepercept"] = _BAIT
    record["environment"]["device"] = _BAIT
    record["status"] = _BAIT
    (folder / "run.json").write_text(json.dumps(record))
    return folder


def test_markup_in_a_crafted_run_json_reaches_the_report_as_text(
    sample_run: Path, tmp_path: Path
) -> None:
    folder = _crafted(sample_run, tmp_path)
    assert main(["report", str(folder)]) == EXIT_PARTIAL  # the sizes that are not numbers
    page = (folder / "report.html").read_text()
    assert "source.width: unexpected str; ignored" in page
    # then no tag of the bait survives, and its text is there, escaped
    assert "<script" not in page and "<img src=x" not in page and 'onerror="' not in page
    assert page.count("&lt;script&gt;") >= 5


@pytest.mark.desktop
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_a_crafted_run_json_runs_no_script_in_headless_chromium(
    sample_run: Path, tmp_path: Path
) -> None:
    assert CHROMIUM is not None

    def title(page: Path) -> str:
        dom = subprocess.run(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--user-data-dir={tmp_path / ('profile-' + page.stem)}",
                "--virtual-time-budget=2000", "--dump-dom", page.resolve().as_uri(),
            ],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        found = re.search(r"<title>(.*?)</title>", dom, re.S)
        return found.group(1) if found else ""

    # the check can see a script run: a page holding the bait raw gets the bait's title
    bait = tmp_path / "bait.html"
    bait.write_text(f"<html><head><title>clean</title></head><body>{_BAIT}</body></html>")
    assert title(bait) == "PWNED"
    # the report of the crafted folder keeps its own title
    folder = _crafted(sample_run, tmp_path)
    assert main(["report", str(folder)]) == EXIT_PARTIAL
    assert title(folder / "report.html").startswith("drivepercept report")
