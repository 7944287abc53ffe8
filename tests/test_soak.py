"""scripts/soak.py: its pure measurements (scripts/_soak) on made-up figures (fast), and the
soak itself: 6 served cameras live at 15 fps for 10 minutes with the default model (slow; the
duration is DRIVEPERCEPT_SOAK_S seconds when set)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SCRIPT = SCRIPTS / "soak.py"
SOAK_S = float(os.environ.get("DRIVEPERCEPT_SOAK_S", "600"))

# the script's pieces live in scripts/_soak, found beside the script as when it runs
if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))

from _soak import latency, measure, report, sampling  # noqa: E402  (scripts/ is a folder, not a package)


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


soak = _load_script()


# ---------------------------------------------------------------------- pure pieces (fast)


def test_latency_windows_take_p99_of_the_first_and_last_minute() -> None:
    # given 10 minutes of frames at 10 fps whose latency is 100 ms, but 200 ms in minute 10
    t_s = np.arange(0, 600, 0.1)
    e2e = np.where(t_s >= 540, 200.0, 100.0)
    capture_ns = (5_000_000_000 + t_s * 1e9).astype(np.int64)
    # when the windows are measured
    got = latency.latency_windows(capture_ns.tolist(), e2e.tolist(), window_s=60.0)
    # then the first minute is 100 ms, the last 200 ms (its frames only), ratio 2
    assert got.window_s == 60.0
    assert got.first.p99_ms == pytest.approx(100.0)
    assert got.last.p99_ms == pytest.approx(200.0)
    assert got.first.frames == got.last.frames == 600
    assert got.ratio == pytest.approx(2.0)
    # and the thirds have 2000 frames each; without the model's times the own part is all of
    # it and the model's figures are unknown (a failing NaN)
    assert got.early.frames == got.late.frames == 2000
    assert got.late.own_p99_ms == got.late.p99_ms == pytest.approx(200.0)
    assert math.isnan(got.model_ratio)


def test_latency_windows_of_a_short_run_are_a_third_of_it_and_do_not_overlap() -> None:
    # given 90 s of frames whose latency grows by 1 ms per second, in shuffled order
    t_s = np.arange(0.0, 90.0, 0.5)
    order = np.random.default_rng(1).permutation(t_s.size)
    capture_ns = (t_s[order] * 1e9).astype(np.int64).tolist()
    e2e = (100.0 + t_s[order]).tolist()
    got = latency.latency_windows(capture_ns, e2e, window_s=60.0)
    # then each window is 29.8 s (a third of the 89.5 s span) and p99 comes from its frames
    assert got.window_s == pytest.approx(89.5 / 3)
    assert got.first.frames == got.last.frames == 60
    assert got.first.p99_ms == pytest.approx(np.percentile(100.0 + t_s[:60], 99))
    assert got.last.p99_ms == pytest.approx(np.percentile(100.0 + t_s[-60:], 99))


def test_engine_wait_is_the_time_queued_while_earlier_batches_ran() -> None:
    # given batch 0 computing 10-100 ms, batch 1 50-130 ms (a lane of its own: it does not
    # wait), batch 2 whose frames were queued at 90 and 120 ms and computed from 135 ms, and
    # batch 3 computed at once (its frame came after every earlier batch was done); listed
    # out of order
    rows = [  # batch, queued, compute start, inference done (ms)
        (2, 90, 135, 170),
        (0, 5, 10, 100),
        (1, 40, 40, 130),
        (2, 120, 135, 170),
        (3, 200, 205, 240),
    ]
    b, q, s, d = (np.array(c) for c in zip(*rows, strict=True))
    got = latency.behind_ms(b, q * 1_000_000, s * 1_000_000, d * 1_000_000)
    # then batch 2's frames waited until 130 ms (the latest end before them): 40 and 10 ms;
    # batch 1's frame waited for batch 0 only until its own compute began (0 ms); the others
    # did not wait
    assert got.tolist() == pytest.approx([40.0, 0.0, 0.0, 10.0, 0.0])
    assert latency.behind_ms([], [], [], []).size == 0
    with pytest.raises(ValueError, match="one stamp of each per frame"):
        latency.behind_ms([0, 1], [0], [0, 1], [0, 1])


def _run_of(
    e2e_ms: np.ndarray, model_ms: np.ndarray, wait_ms: np.ndarray, step_s: float = 0.1
) -> Any:
    t_s = np.arange(e2e_ms.size) * step_s
    capture_ns = (t_s * 1e9).astype(np.int64).tolist()
    return latency.latency_windows(
        capture_ns,
        e2e_ms.tolist(),
        window_s=60.0,
        model_ms=model_ms.tolist(),
        wait_ms=wait_ms.tolist(),
    )


def _queueing_run(own_ms: np.ndarray, usual_ms: np.ndarray, slow: np.ndarray) -> Any:
    """10 minutes at 10 fps: each batch takes `usual_ms`, or 78 ms where `slow`; a frame after
    a slow batch waits 60 ms for it (queued behind it at capacity)."""
    model = np.where(slow, 78.0, usual_ms)
    wait = np.where(np.roll(slow, 1), 60.0, 0.0)
    return _run_of(own_ms + model + wait, model, wait)


_I = np.arange(6000)  # 10 minutes at 10 fps


def test_a_host_that_slows_late_moves_end_to_end_but_fails_neither_criterion() -> None:
    # given a CI soak's shape: for the last 2.5 minutes the host's cores run slower (the usual
    # batch 40 -> 45 ms, slow batches 1 % -> 10 % of them, some in a row), frames queue
    # behind slow batches, and the pipeline's own part (12 ms, p99 20) slows with the cores
    late = _I >= 4500
    own = np.where(late, 1.125, 1.0) * (12.0 + 8.0 * (_I % 50 == 7))
    slow = np.where(late, _I % 20 < 2, _I % 100 == 0)
    got = _queueing_run(own, np.where(late, 45.0, 40.0), slow)
    # when judged, end to end has grown (printed: last minute 151.5 ms, first 90), the own part
    # by 12.5 % and the model's mean by 14.7 %, and neither criterion fails
    assert got.last.p99_ms == pytest.approx(60.0 + 78.0 + 12.0 * 1.125)
    assert got.ratio > 1.6 and got.thirds_ratio > 1.2
    assert got.own_ratio == pytest.approx(1.125)
    assert got.model_ratio == pytest.approx(46.32 / 40.38, rel=1e-3)
    assert got.model_ratio <= latency.MODEL_DRIFT
    assert got.steady_ratio == pytest.approx(got.own_ratio / got.model_ratio)
    assert got.steady_ratio <= 1.0


def test_growth_of_the_pipelines_own_part_fails_at_one_model_speed() -> None:
    # given the own part growing 12 -> 30 ms over the run (a queue, state or per-frame work
    # that grows) at one model speed
    own = np.linspace(12.0, 30.0, 6000)
    got = _queueing_run(own, np.full(6000, 40.0), _I % 100 == 0)
    # then the own part's criterion fails, nothing to excuse it, and the model's does not
    assert got.model_ratio == pytest.approx(1.0)
    assert (
        got.steady_ratio
        == got.own_ratio
        == pytest.approx(np.percentile(own[4001:], 99) / np.percentile(own[:2000], 99), rel=1e-3)
    )
    assert got.steady_ratio > 1.2


def test_the_hosts_slowdown_excuses_at_most_its_drift_and_never_a_speed_up() -> None:
    # given the own part 20 -> 30 ms (1.5x) with the model's mean 40 -> 44, -> 80 or -> 30 ms
    def judged(model_late: float) -> Any:
        early = latency.Part(2000, 100.0, 20.0, 40.0, 78.0)
        late = latency.Part(2000, 150.0, 30.0, model_late, 80.0)
        return latency.LatencyWindows(60.0, early, late, early, late)

    # then a 10 % slower host takes 10 % off, a 2x slower one only the drift (1.3x), and a
    # faster one nothing
    assert judged(44.0).steady_ratio == pytest.approx(1.5 / 1.1)
    assert judged(80.0).steady_ratio == pytest.approx(1.5 / latency.MODEL_DRIFT)
    assert judged(80.0).model_ratio > latency.MODEL_DRIFT
    assert judged(30.0).steady_ratio == pytest.approx(1.5)


def test_an_engine_slowing_beyond_the_hosts_drift_fails_the_model_criterion() -> None:
    # given the usual batch 40 -> 60 ms from minute 4 (1.5x: more than the host's drift), the
    # pipeline's own part steady
    got = _queueing_run(np.full(6000, 12.0), np.where(_I >= 2400, 60.0, 40.0), _I % 100 == 0)
    # then the model's criterion fails, the own part's does not
    assert got.model_ratio == pytest.approx(1.49, abs=0.01)
    assert got.model_ratio > latency.MODEL_DRIFT
    assert got.own_ratio == pytest.approx(1.0)
    assert got.steady_ratio <= 1.0


def test_the_printed_criteria_name_the_figures_they_were_judged_on() -> None:
    first = latency.Part(600, 100.0, 20.0, 41.0, 78.0)
    last = latency.Part(600, 150.0, 21.0, 44.0, 80.0)
    early = latency.Part(2000, 110.0, 20.0, 40.0, 77.0)
    late = latency.Part(2000, 121.0, 22.0, 46.0, 79.0)
    got = latency.LatencyWindows(60.0, first, last, early, late)
    assert latency.latency_value(got) == (
        "0.957 (22.0 / 20.0 ms = 1.100, over the host's slowdown x1.150; end to end, not "
        "judged: thirds 1.100, 121.0 / 110.0 ms, last / first 60 s 1.500, 150.0 / 100.0 ms)"
    )
    assert latency.model_value(got) == "1.150 (mean 46.0 / 40.0 ms, p99 79.0 / 77.0 ms)"


def test_latency_windows_reject_mismatched_or_empty_tables() -> None:
    with pytest.raises(ValueError, match="expected as many latencies"):
        latency.latency_windows([1, 2], [1.0], window_s=60.0)
    with pytest.raises(ValueError, match="expected as many latencies"):
        latency.latency_windows([], [], window_s=60.0)
    with pytest.raises(ValueError, match="expected as many model times"):
        latency.latency_windows([1, 2], [1.0, 2.0], window_s=60.0, model_ms=[1.0])
    with pytest.raises(ValueError, match="expected as many engine waits"):
        latency.latency_windows([1, 2], [1.0, 2.0], window_s=60.0, wait_ms=[1.0])


def _windows(own_early: float, own_late: float, model_early: float = 40.0) -> Any:
    part = latency.Part(900, 400.0, 20.0, 40.0, 80.0)
    return latency.LatencyWindows(
        60.0,
        part,
        part,
        latency.Part(900, 400.0, own_early, model_early, 80.0),
        latency.Part(900, 440.0, own_late, 40.0, 80.0),
    )


def test_a_zero_first_third_makes_failing_nan_ratios() -> None:
    windows = _windows(0.0, 5.0, model_early=0.0)
    assert math.isnan(windows.steady_ratio) and math.isnan(windows.model_ratio)


def test_rss_growth_runs_from_the_end_of_warm_up_to_the_last_sample() -> None:
    samples = [(0.0, 500.0), (30.0, 800.0), (60.0, 900.0), (300.0, 910.0), (600.0, 930.0)]
    got = measure.rss_growth(samples, warmup_s=60.0)
    assert (got.after_warmup_mb, got.end_mb, got.max_mb) == (900.0, 930.0, 930.0)
    assert got.growth_mb == pytest.approx(30.0)
    with pytest.raises(ValueError, match="expected a sample at or after 700 s"):
        measure.rss_growth(samples, warmup_s=700.0)


def test_warm_up_is_a_minute_or_a_tenth_of_a_short_run() -> None:
    assert measure.warmup_s_for(600.0) == 60.0
    assert measure.warmup_s_for(3600.0) == 60.0
    assert measure.warmup_s_for(90.0) == pytest.approx(9.0)
    assert measure.warmup_s_for(90.0, 20.0) == 20.0


def _account(**kw: int) -> Any:
    figures = {
        "served": 9000,
        "read": 8999,
        "processed": 2700,
        "dropped": 6299,
        "discarded": 0,
        "connects": 1,
        "tolerance": 3,
    }
    return measure.Accounting(camera="front", **{**figures, **kw})


def test_accounting_balances_served_against_processed_dropped_and_unread() -> None:
    # given a camera whose server wrote 9000 frames, 1 of them still on the wire at the stop
    a = _account()
    # then every frame is accounted for
    assert (a.unread, a.allowed_unread, a.pipeline_balanced, a.passed) == (1, 3, True, True)
    # and a frame the pipeline read but did not count fails it
    assert not _account(dropped=6298).passed
    # and more unread than the buffers hold fails it, or fewer than none (over-counting)
    assert not _account(read=8990, dropped=6290).passed
    assert not _account(read=9001, dropped=6301).passed
    # and each reconnect may strand its own buffers' worth
    assert _account(read=8993, dropped=6293, connects=3).passed


def test_thread_check_names_new_and_vanished_threads() -> None:
    before = ("MainThread", "serve-front", "serve-http")
    same = measure.ThreadCheck(before, before, 20, 20, 30, 50)
    assert same.passed and not same.leaked
    leak = measure.ThreadCheck(before, (*before, "decode-front"), 20, 21, 30, 50)
    assert leak.leaked == ["decode-front"] and not leak.passed
    gone = measure.ThreadCheck(before, before[:2], 20, 19, 30, 50)
    assert gone.gone == ["serve-http"] and not gone.passed
    native = measure.ThreadCheck(before, before, 20, 23, 30, 50, new_os=3)
    assert not native.passed
    # and native threads that ended (the served clips' decoders, once a pass is kept) are no
    # leak, but one the run left behind is, even when others ended
    assert measure.ThreadCheck(before, before, 31, 13, 30, 50).passed
    assert not measure.ThreadCheck(before, before, 31, 14, 30, 50, new_os=1).passed


def test_criteria_fail_on_each_measurement_alone() -> None:
    ok_threads = measure.ThreadCheck(("MainThread",), ("MainThread",), 9, 9, 20, 40)
    ok_rss = measure.RssGrowth(60.0, 900.0, 920.0, 925.0)
    ok_latency = _windows(20.0, 22.0)
    base: dict[str, Any] = {
        "threads": ok_threads,
        "rss": ok_rss,
        "latency": ok_latency,
        "accounting": [_account()],
        "rss_limit_mb": 50.0,
        "latency_ratio": 1.2,
        "run_status": "complete",
        "threads_not_stopped": [],
    }
    assert all(c.passed for c in measure.criteria(**base))
    bad: dict[str, Any] = {
        "run_status": "interrupted",
        "threads_not_stopped": ["batcher"],
        "threads": measure.ThreadCheck(("MainThread",), ("MainThread", "x"), 9, 10, 20, 40, 1),
        "rss": measure.RssGrowth(60.0, 900.0, 950.0, 950.0),
        "latency": _windows(20.0, 24.1),
        "model_latency": _windows(20.0, 22.0, model_early=30.7),
        "accounting": [_account(read=8000, dropped=5300)],
    }
    for key, value in bad.items():
        arg = "latency" if key == "model_latency" else key
        failed = [c.name for c in measure.criteria(**{**base, arg: value}) if not c.passed]
        assert len(failed) == (2 if key == "threads" else 1), (key, failed)


def test_the_table_and_soak_json_carry_every_figure_and_verdict() -> None:
    # given a made-up outcome: the own part's p99 20 -> 26 ms (failing), the model steady, one
    # camera, a model figure unknown (NaN)
    parts = latency.Part(900, 120.0, 20.0, 41.0, 78.0), latency.Part(900, 150.0, 26.0, 41.0, 80.0)
    lat = latency.LatencyWindows(60.0, *parts, *parts)
    rss = measure.RssGrowth(60.0, 900.0, 905.0, 910.0)
    threads = measure.ThreadCheck(("MainThread",), ("MainThread",), 8, 8, 30, 50)
    checks = measure.criteria(
        threads=threads,
        rss=rss,
        latency=lat,
        accounting=[_account()],
        rss_limit_mb=50.0,
        latency_ratio=1.2,
        run_status="complete",
        threads_not_stopped=[],
    )
    settings = {
        "cameras": ["front"],
        "fps": 15.0,
        "duration_s": 600.0,
        "model": "yolox-nano",
        "weights_note": "made up",
        "device": "cpu",
        "loadavg_before": [0.5],
        "loadavg_after": [1.5],
        "cpu_count": 2,
        "nan_figure": math.nan,
    }
    extra = {
        "run_dir": "/tmp/x",
        "run_summary": {
            "frames": 9000,
            "elapsed_s": 600.0,
            "throughput_fps": 15.0,
            "batches": 9000,
            "mean_batch_size": 1.0,
        },
        "host_cpu_cores": None,
        "in_transit_during_run": {},
        "outages": {"front": {"frames_lost_estimate": 0}},
        "server": {"skipped_slow_client": {"front": 0}},
    }
    outcome = report.Outcome(settings, threads, rss, 920.0, lat, [_account()], extra, [], checks)
    # when it is printed and written
    lines = list(report.table(outcome))
    data = outcome.to_json()
    # then the latency rows give each part's figures, and the verdicts name the failing one
    assert any(line.split()[:3] == ["last", "60", "s"] and "26.0 ms" in line for line in lines)
    verdicts = [line for line in lines if line.startswith(("PASS", "FAIL"))]
    assert len(verdicts) == len(checks) == 8
    failed = [line for line in verdicts if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL  p99 latency less the engine's time")
    assert "1.300 (26.0 / 20.0 ms" in failed[0]
    assert not outcome.passed and data["passed"] is False
    # and soak.json holds the ratios and strict JSON (NaN written as null)
    assert data["latency"]["steady_ratio"] == pytest.approx(1.3)
    assert data["latency"]["model_ratio"] == pytest.approx(1.0)
    assert data["settings"]["nan_figure"] is None
    json.dumps(data, allow_nan=False)


def test_cameras_reuse_clips_under_new_names() -> None:
    clips = [("front", Path("f.mp4")), ("back", Path("b.mp4"))]
    got = measure.camera_pairs(clips, 5)
    assert [n for n, _ in got] == ["front", "back", "front-2", "back-2", "front-3"]
    assert [p.name for _, p in got] == ["f.mp4", "b.mp4", "f.mp4", "b.mp4", "f.mp4"]
    assert measure.camera_pairs(clips, 1) == clips[:1]


def test_backlog_in_transit_is_summed_up_per_camera() -> None:
    samples = [
        sampling.Sample(
            5.0 * k,
            900.0,
            20,
            40,
            (sampling.CameraSample("front", 75 * k + d, 75 * k, 0, 0, "streaming"),),
        )
        for k, d in enumerate((0, 2, 0, 1))
    ]
    assert sampling.in_transit(samples) == {"front": {"max": 2, "median": 0, "samples": 4}}


def test_host_load_splits_the_cpu_between_this_process_others_and_steal() -> None:
    # given three samples 5 s apart: the process used 7.5 then 5 CPU s, the host 10 then 9,
    # the hypervisor stole 0 then 1
    samples = [
        sampling.Sample(t, 900.0, 20, 40, (), cpu, busy, steal)
        for t, cpu, busy, steal in (
            (0.0, 100.0, 500.0, 3.0),
            (5.0, 107.5, 510.0, 3.0),
            (10.0, 112.5, 519.0, 4.0),
        )
    ]
    got = sampling.host_load(samples)
    # then this process used 1.5 and 1 cores, the others 0.5 and 0.8, steal 0 and 0.2
    assert got is not None
    assert got.process_mean == pytest.approx(1.25)
    assert (got.others_mean, got.others_max) == pytest.approx((0.65, 0.8))
    assert (got.steal_mean, got.steal_max) == pytest.approx((0.1, 0.2))
    assert sampling.host_load(samples[:1]) is None


def test_bad_durations_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        soak.main(["--duration", "10", "--out", "unused"])
    assert exit_info.value.code == 2
    assert "--duration >= 3 x --sample-s" in capsys.readouterr().err


# ---------------------------------------------------------------------- the soak (slow)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(SOAK_S + 300)
def test_soak_six_live_cameras_hold_steady(tmp_path: Path) -> None:
    # given the soak script in a process of its own (its thread and memory figures are its
    # own), 6 served cameras at 15 fps, the default model
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    # when it runs for SOAK_S seconds
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--duration", f"{SOAK_S:g}", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=SOAK_S + 240,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    # then no thread leaked, Python or native
    threads = report["threads"]
    assert threads["leaked"] == [] and threads["gone"] == [], threads
    assert threads["new_os"] == 0, threads
    # and RSS grew less than 50 MB after warm-up
    assert report["rss"]["growth_mb"] < 50.0, report["rss"]
    # and the model's mean time per batch in the last third of the run is within 1.3x of the
    # first third's, and p99 of the pipeline's own part of the latency (end to end less the
    # model's call and the wait for the batches before) within 1.2x, over that slowdown
    steady = report["latency"]
    assert steady["steady_ratio"] is not None and steady["steady_ratio"] <= 1.2, steady
    assert steady["model_ratio"] is not None and steady["model_ratio"] <= 1.3, steady
    # and every frame served is processed, dropped, or was left on the wire at the stop
    for cam in report["accounting"]:
        assert cam["pipeline_balanced"], cam
        assert 0 <= cam["unread"] <= cam["allowed_unread"], cam
    assert len(report["accounting"]) == 6
    assert all(c["passed"] for c in report["criteria"]), report["criteria"]
    assert proc.returncode == 0
