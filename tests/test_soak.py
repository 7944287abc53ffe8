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

from _soak import latency, measure, sampling  # noqa: E402  (scripts/ is a folder, not a package)


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
    assert got.first_p99_ms == pytest.approx(100.0)
    assert got.last_p99_ms == pytest.approx(200.0)
    assert got.first_frames == got.last_frames == 600
    assert got.ratio == pytest.approx(2.0)


def test_latency_windows_of_a_short_run_are_a_third_of_it_and_do_not_overlap() -> None:
    # given 90 s of frames whose latency grows by 1 ms per second, in shuffled order
    t_s = np.arange(0.0, 90.0, 0.5)
    order = np.random.default_rng(1).permutation(t_s.size)
    capture_ns = (t_s[order] * 1e9).astype(np.int64).tolist()
    e2e = (100.0 + t_s[order]).tolist()
    got = latency.latency_windows(capture_ns, e2e, window_s=60.0)
    # then each window is 29.8 s (a third of the 89.5 s span) and p99 comes from its frames
    assert got.window_s == pytest.approx(89.5 / 3)
    assert got.first_frames == got.last_frames == 60
    assert got.first_p99_ms == pytest.approx(np.percentile(100.0 + t_s[:60], 99))
    assert got.last_p99_ms == pytest.approx(np.percentile(100.0 + t_s[-60:], 99))


def test_latency_ratio_takes_out_the_hosts_slowdown_but_not_a_speed_up() -> None:
    # given 10 minutes at 10 fps: in the last minute latency grows 100 -> 150 ms while the
    # model's own time grows 60 -> 75 ms (the host 1.25x slower)
    t_s = np.arange(0, 600, 0.1)
    late = t_s >= 540
    e2e = np.where(late, 150.0, 100.0)
    model = np.where(late, 75.0, 60.0)
    capture_ns = (t_s * 1e9).astype(np.int64).tolist()
    # when the windows are measured with the model's times
    got = latency.latency_windows(capture_ns, e2e.tolist(), window_s=60.0, model_ms=model.tolist())
    # then the raw ratio is 1.5, the host's 1.25, and what is left for the pipeline 1.2
    assert got.first_model_ms == pytest.approx(60.0) and got.last_model_ms == pytest.approx(75.0)
    assert got.ratio == pytest.approx(1.5)
    assert got.host_ratio == pytest.approx(1.25)
    assert got.adjusted_ratio == pytest.approx(1.2)
    # and a host that got faster does not excuse growth: the raw ratio stands
    faster = latency.latency_windows(
        capture_ns, e2e.tolist(), window_s=60.0, model_ms=np.where(late, 50.0, 60.0).tolist()
    )
    assert faster.adjusted_ratio == pytest.approx(1.5)
    # and without the model's times the raw ratio is the criterion
    plain = latency.latency_windows(capture_ns, e2e.tolist(), window_s=60.0)
    assert math.isnan(plain.host_ratio) and plain.adjusted_ratio == pytest.approx(1.5)
    # and the criterion fails on growth the host does not explain
    grown = latency.LatencyWindows(60.0, 100.0, 150.0, 600, 600, 60.0, 63.0)
    assert grown.adjusted_ratio > 1.2
    # and a model twice as slow excuses no more than the host's usual drift (1.3x)
    slow = latency.LatencyWindows(60.0, 100.0, 200.0, 600, 600, 60.0, 120.0)
    assert slow.host_ratio == pytest.approx(2.0)
    assert slow.adjusted_ratio == pytest.approx(2.0 / latency.MAX_HOST_EXCUSE)


def _run_of(model_ms: np.ndarray, e2e_ms: np.ndarray, step_s: float = 0.1) -> Any:
    t_s = np.arange(model_ms.size) * step_s
    capture_ns = (t_s * 1e9).astype(np.int64).tolist()
    return latency.latency_windows(
        capture_ns, e2e_ms.tolist(), window_s=60.0, model_ms=model_ms.tolist()
    )


def test_a_host_that_slows_for_the_last_90_s_is_judged_on_bins_of_the_usual_speed() -> None:
    # given a CI soak's shape: 10 minutes at 10 fps, the model at 40 ms (p99 46) and latency
    # 48 ms (p99 56.5) for 8.5 minutes, then the model at 45 ms (p99 78) and latency 136 ms at
    # p99: queueing near capacity grows latency far more than the model's time
    t_s = np.arange(0, 600, 0.1)
    slow = t_s >= 510
    tail = (np.arange(t_s.size) % 50) == 0  # 2 % of frames are the tail
    model = np.where(slow, np.where(tail, 78.0, 45.0), np.where(tail, 46.0, 40.0))
    e2e = np.where(slow, np.where(tail, 136.0, 55.0), np.where(tail, 56.5, 48.0))
    # when the windows are measured
    got = _run_of(model, e2e)
    # then first and last minute differ by 2.4x, more than any division by the host takes out
    assert got.ratio > 2.0 and got.adjusted_ratio > 1.2
    # and the thirds leave out the 9 slow bins of the last third, keep its 11 others and all
    # 20 of the first, and find no growth
    assert got.thirds is not None and got.thirds.enough
    assert (got.thirds.early_frames, got.thirds.early_of) == (2000, 2000)
    assert (got.thirds.late_frames, got.thirds.late_of) == (1100, 2000)
    assert got.thirds.usual_model_ms == pytest.approx(40.12)
    assert got.steady_ratio == pytest.approx(1.0, abs=0.01)


def test_growth_at_the_usual_speed_fails_and_a_model_slowing_all_along_falls_back() -> None:
    # given latency that grows 100 -> 150 ms over the run while the model runs at one speed
    t_s = np.arange(0, 600, 0.1)
    got = _run_of(np.full(t_s.size, 40.0), 100.0 + 50.0 * t_s / 600.0)
    # then every bin is usual, and the last third's p99 over the first's fails the criterion
    assert got.thirds is not None and got.thirds.enough
    assert got.thirds.early_frames == got.thirds.early_of == 2000
    assert got.steady_ratio == pytest.approx(149.83 / 116.45, rel=1e-3) and got.steady_ratio > 1.2
    # and a model that slows all along (the pipeline's own work growing: 40 -> 80 ms) leaves
    # too few usual bins in the thirds: the first and last minute are judged, with at most
    # the host's usual drift excused
    growing = _run_of(40.0 + 40.0 * t_s / 600.0, 100.0 + 100.0 * t_s / 600.0)
    assert growing.thirds is not None and not growing.thirds.enough
    assert growing.steady_ratio == pytest.approx(growing.adjusted_ratio)
    assert growing.steady_ratio > 1.3


def test_thirds_need_half_of_each_thirds_bins_at_the_usual_speed() -> None:
    enough = latency.Thirds(40.0, 100.0, 110.0, 1800, 900, 1800, 1800)
    assert enough.enough and enough.ratio == pytest.approx(1.1)
    assert not latency.Thirds(40.0, 100.0, 110.0, 1800, 899, 1800, 1800).enough
    assert not latency.Thirds(40.0, 100.0, 110.0, 0, 0, 0, 0).enough
    assert math.isnan(latency.Thirds(40.0, 0.0, 110.0, 10, 10, 10, 10).ratio)


def test_a_sliver_of_a_usual_bin_does_not_stand_for_a_third() -> None:
    # given a 30 s run at 100 fps whose first 10 s ran slow (start-up: model 90 ms, latency
    # 150 ms) and the rest at the usual 43 ms / 60 ms; its first third ends 17 ms into the
    # second bin, so two of its frames are in a usual bin
    t_s = np.arange(0, 30.05, 0.01)
    start = t_s < 10.0
    got = _run_of(np.where(start, 90.0, 43.0), np.where(start, 150.0, 60.0), step_s=0.01)
    # then those two frames are too few to judge the first third by: the fallback decides
    assert got.thirds is not None and got.thirds.early_frames == 2
    assert not got.thirds.enough
    assert got.steady_ratio == pytest.approx(got.adjusted_ratio)


def test_the_printed_criterion_names_the_figures_it_was_judged_on() -> None:
    thirds = latency.Thirds(40.0, 100.0, 110.0, 1800, 900, 1800, 1800)
    used = latency.LatencyWindows(60.0, 90.0, 150.0, 600, 600, 70.0, 80.0, thirds)
    text = latency.latency_value(used)
    assert text.startswith("1.100 (last / first third 110.0 / 100.0 ms over 900/1800 and 1800/1800")
    assert "first / last 60 s 1.667" in text
    few = latency.Thirds(40.0, 100.0, 110.0, 1800, 810, 1800, 1800)
    fallback = latency.LatencyWindows(60.0, 90.0, 150.0, 600, 600, 70.0, 80.0, few)
    assert latency.latency_value(fallback).startswith(
        f"{150.0 / 90.0 / (80.0 / 70.0):.3f} (too few frames at the usual speed "
        "1800/1800 and 810/1800"
    )


def test_latency_windows_reject_mismatched_or_empty_tables() -> None:
    with pytest.raises(ValueError, match="expected as many latencies"):
        latency.latency_windows([1, 2], [1.0], window_s=60.0)
    with pytest.raises(ValueError, match="expected as many latencies"):
        latency.latency_windows([], [], window_s=60.0)
    with pytest.raises(ValueError, match="expected as many model times"):
        latency.latency_windows([1, 2], [1.0, 2.0], window_s=60.0, model_ms=[1.0])


def test_a_zero_first_window_makes_a_failing_nan_ratio() -> None:
    windows = latency.LatencyWindows(60.0, 0.0, 5.0, 10, 10)
    assert math.isnan(windows.ratio)


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
    ok_latency = latency.LatencyWindows(60.0, 400.0, 440.0, 900, 900)
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
        "latency": latency.LatencyWindows(60.0, 400.0, 481.0, 900, 900),
        "accounting": [_account(read=8000, dropped=5300)],
    }
    for key, value in bad.items():
        failed = [c.name for c in measure.criteria(**{**base, key: value}) if not c.passed]
        assert len(failed) == (2 if key == "threads" else 1), (key, failed)


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
    # and p99 latency of the last third of the run is within 1.2x of the first third's, both
    # over the 10 s bins in which the model ran at its usual speed (or, with too few such
    # bins, of the last minute over the first with the host's slowdown taken out)
    steady = report["latency"]
    assert steady["steady_ratio"] is not None and steady["steady_ratio"] <= 1.2, steady
    # and every frame served is processed, dropped, or was left on the wire at the stop
    for cam in report["accounting"]:
        assert cam["pipeline_balanced"], cam
        assert 0 <= cam["unread"] <= cam["allowed_unread"], cam
    assert len(report["accounting"]) == 6
    assert all(c["passed"] for c in report["criteria"]), report["criteria"]
    assert proc.returncode == 0
