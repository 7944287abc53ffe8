"""scripts/bench_peer.py (its pieces in scripts/_bench_peer): the parts that do not need
Ultralytics (argument parsing, the statistics, the report) and its one-line exit where
Ultralytics is not installed. The benchmark itself runs only in the peer venv (see the
script's docstring)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SCRIPT = SCRIPTS / "bench_peer.py"

# the script's pieces live in scripts/_bench_peer, found beside the script as when it runs
if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))

from _bench_peer import options, stats  # noqa: E402  (scripts/ is a folder, not a package)
from _bench_peer.stamps import ArrivalStamps  # noqa: E402


def _round(tool: str, mode: str, n: int, fps: float, p50: float = math.nan) -> stats.RoundResult:
    return stats.RoundResult(
        tool=tool, mode=mode, round=n, frames=100, fps=fps, p50_ms=p50, p99_ms=p50 * 2
    )


# ---------------------------------------------------------------------- arguments


def test_defaults_are_six_streams_two_rounds_of_both_modes_at_320() -> None:
    settings = options.parse_args([])
    assert (settings.streams, settings.rounds, settings.imgsz) == (6, 2, 320)
    assert settings.modes == ("replay", "live")
    assert (settings.conf, settings.iou, settings.max_det) == (0.25, 0.7, 100)
    assert settings.threads == 0  # each tool's own choice
    assert settings.json_path is None


def test_flags_are_parsed_into_settings(tmp_path: Path) -> None:
    flags = "--modes live --rounds 3 --duration 20 --imgsz 416 --streams 4 --threads 1"
    settings = options.parse_args([*flags.split(), "--json", str(tmp_path / "x.json")])
    assert settings.modes == ("live",)
    assert (settings.rounds, settings.duration_s, settings.imgsz) == (3, 20.0, 416)
    assert (settings.streams, settings.threads) == (4, 1)
    assert settings.json_path == tmp_path / "x.json"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--imgsz", "300"], "--imgsz must be a multiple of 32"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--modes", "replay,offline"], "--modes"),
        (["--threads", "many"], "--threads must be auto or a count"),
        (["--duration", "1"], "--duration must be > 2 s"),
        (["--conf", "1.5"], "--conf must be in (0, 1)"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        options.parse_args(flags)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------- statistics


def test_throughput_counts_frames_after_the_first_batch_over_their_span() -> None:
    # given a first batch of 2 out at t=1 s, then 4 more frames out by t=3 s
    emitted_ns = [1_000_000_000] * 2 + [2_000_000_000] * 2 + [3_000_000_000] * 2
    # then 4 frames over 2 s
    assert stats.throughput_fps(emitted_ns, 2) == pytest.approx(2.0)


def test_throughput_is_nan_without_frames_after_the_first_batch() -> None:
    assert math.isnan(stats.throughput_fps([5, 5], 2))
    assert math.isnan(stats.throughput_fps([], 1))
    assert math.isnan(stats.throughput_fps([5, 5, 5], 0))


def test_run_figures_leave_the_first_batch_out_of_latency_and_start_the_clock_with_it() -> None:
    # given frames.csv rows out of order: batch 3 (2 frames) out at 1 s, batch 4 at 2 s,
    # batch 5 at 3 s
    def row(batch: int, out_s: int, e2e_ms: float) -> dict[str, str]:
        return {
            "batch_index": str(batch),
            "emitted_ns": str(out_s * 1_000_000_000),
            "end_to_end_ms": str(e2e_ms),
        }

    rows = [row(5, 3, 50.0), row(3, 1, 900.0), row(4, 2, 40.0), row(3, 1, 800.0)]
    rows += [row(4, 2, 45.0), row(5, 3, 55.0)]
    # when they are turned into figures
    figures = stats.run_figures(rows)
    # then 4 frames over 2 s, and only the later batches' latencies, in emission order
    assert figures.frames == 6
    assert figures.fps == pytest.approx(2.0)
    assert sorted(figures.later_ms) == [40.0, 45.0, 50.0, 55.0]
    assert stats.run_figures([]).frames == 0


def test_percentiles_interpolate_and_are_nan_when_empty() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile_ms(values, 50) == pytest.approx(50.5)
    assert stats.percentile_ms(values, 99) == pytest.approx(99.01)
    assert math.isnan(stats.percentile_ms([], 50))


def test_best_is_the_max_for_rates_and_the_min_for_latencies() -> None:
    assert stats.best_and_median([3.0, 1.0, 2.0, math.nan], higher_is_better=True) == (3.0, 2.0)
    assert stats.best_and_median([3.0, 1.0, 2.0], higher_is_better=False) == (1.0, 2.0)
    best, median = stats.best_and_median([math.nan], higher_is_better=True)
    assert math.isnan(best) and math.isnan(median)


def test_ratio_is_ours_over_peer_and_nan_when_undefined() -> None:
    assert stats.ratio(30.0, 20.0) == pytest.approx(1.5)
    assert math.isnan(stats.ratio(30.0, 0.0))
    assert math.isnan(stats.ratio(math.nan, 20.0))


def test_summary_gives_best_median_and_ratios_per_mode() -> None:
    # given two interleaved rounds of each tool in each mode
    rounds = [
        _round("peer", "replay", 1, 10.0),
        _round("ours", "replay", 1, 14.0),
        _round("peer", "replay", 2, 12.0),
        _round("ours", "replay", 2, 18.0),
        _round("peer", "live", 1, 8.0, p50=100.0),
        _round("ours", "live", 1, 9.0, p50=80.0),
        _round("peer", "live", 2, 6.0, p50=120.0),
        _round("ours", "live", 2, 12.0, p50=60.0),
    ]
    # when summarised
    summary = stats.summarise(rounds)
    # then replay has throughput only, live has latency too
    assert set(summary["replay"]) == {"fps"}
    assert set(summary["live"]) == {"fps", "p50_ms", "p99_ms"}
    fps = summary["replay"]["fps"]
    assert (fps["peer_best"], fps["ours_best"]) == (12.0, 18.0)
    assert (fps["peer_median"], fps["ours_median"]) == (11.0, 16.0)
    assert fps["ratio_best"] == pytest.approx(1.5)
    assert fps["ratio_median"] == pytest.approx(16.0 / 11.0)
    p50 = summary["live"]["p50_ms"]
    assert (p50["peer_best"], p50["ours_best"]) == (100.0, 60.0)
    assert p50["ratio_best"] == pytest.approx(0.6)
    # and the table shows every round and every summary line
    lines = stats.table(rounds, summary)
    assert sum(1 for line in lines if line.startswith(("replay", "live"))) == 8 + 4


def test_count_agreement_compares_frames_both_tools_processed() -> None:
    peer = {(0, 0): 3, (0, 1): 5, (1, 0): 2}
    ours = {(0, 0): 3, (0, 1): 6, (1, 0): 2, (1, 1): 9}
    text = stats.count_agreement(peer, ours)
    assert "equal in 67 %" in text
    assert "within 1 in 100 % of 3 frames" in text


def test_arrival_stamps_are_taken_once_by_object() -> None:
    stamps = ArrivalStamps()
    frame, other = object(), object()
    stamps.put(frame, 123)
    assert stamps.take(other) is None
    assert stamps.take(frame) == 123
    assert stamps.take(frame) is None


# ---------------------------------------------------------------------- without ultralytics


@pytest.mark.integration
@pytest.mark.timeout(30)
def test_without_ultralytics_the_script_exits_2_with_one_line() -> None:
    # given the system python, where ultralytics is not installed (the peer venv has it)
    if importlib.util.find_spec("ultralytics") is not None:
        pytest.skip("ultralytics is importable here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # when the script runs
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    # then it says what to do in one line, and exits 2 without a traceback
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "ultralytics is not importable" in lines[0]
    assert "/work/peer-venv" in lines[0]
    assert done.stdout == ""
