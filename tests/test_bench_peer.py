"""scripts/bench_peer.py (its pieces in scripts/_bench_peer): the parts that do not need
Ultralytics (argument parsing, the statistics, the report) and its one-line exit where
Ultralytics is not installed. The benchmark itself runs only in the peer venv (see the
script's docstring)."""

from __future__ import annotations

import ast
import importlib.util
import json
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

from _bench_peer import exported, options, rounds, stats  # noqa: E402  (scripts/: not a package)
from _bench_peer.stamps import ArrivalStamps  # noqa: E402


def _round(
    tool: str,
    mode: str,
    n: int,
    fps: float,
    p50: float = math.nan,
    *,
    runtime: str = "torch",
    threads: int = 2,
) -> stats.RoundResult:
    return stats.RoundResult(
        tool=tool,
        mode=mode,
        round=n,
        frames=100,
        fps=fps,
        p50_ms=p50,
        p99_ms=p50 * 2,
        runtime=runtime,
        threads=threads,
    )


# ---------------------------------------------------------------------- arguments


def test_defaults_are_six_streams_two_rounds_of_both_modes_at_320() -> None:
    settings = options.parse_args([])
    assert (settings.streams, settings.rounds, settings.imgsz) == (6, 2, 320)
    assert settings.modes == ("replay", "live")
    assert (settings.conf, settings.iou, settings.max_det) == (0.25, 0.7, 100)
    assert settings.json_path is None


def test_by_default_both_tools_get_the_machines_cores_on_both_runtimes() -> None:
    settings = options.parse_args([])
    assert settings.threads == (os.cpu_count() or 1)
    assert settings.runtimes == ("torch", "onnxruntime")
    assert settings.peer_default_threads is False  # the peer's own default: asked for


def test_runtime_threads_and_the_peer_default_line_are_chosen_by_flags() -> None:
    settings = options.parse_args(
        ["--runtime", "onnxruntime", "--threads", "3", "--peer-default-threads"]
    )
    assert settings.runtimes == ("onnxruntime",)
    assert settings.threads == 3
    assert settings.peer_default_threads is True
    assert options.parse_args(["--runtime", "both"]).runtimes == ("torch", "onnxruntime")
    assert options.parse_args(["--threads", "cores"]).threads == options.machine_cores()


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
        (["--threads", "many"], "--threads must be cores or a count"),
        (["--threads", "auto"], "--threads must be cores or a count"),
        (["--threads", "0"], "--threads must be cores or a count >= 1"),
        (["--runtime", "tensorrt"], "--runtime: torch, onnxruntime or both"),
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
    # given frames out of order: batch 3 (2 frames) out at 1 s, batch 4 at 2 s, batch 5 at 3 s
    rows = [(5, 3, 50.0), (3, 1, 900.0), (4, 2, 40.0), (3, 1, 800.0), (4, 2, 45.0), (5, 3, 55.0)]
    batch = [b for b, _, _ in rows]
    emitted = [s * 1_000_000_000 for _, s, _ in rows]
    # when they are turned into figures
    figures = stats.run_figures(batch, emitted, [e for _, _, e in rows])
    # then 4 frames over 2 s, and only the later batches' latencies, in emission order
    assert figures.frames == 6
    assert figures.fps == pytest.approx(2.0)
    assert sorted(figures.later_ms) == [40.0, 45.0, 50.0, 55.0]
    assert stats.run_figures([], [], []).frames == 0


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


def test_summary_gives_best_median_and_ratios_per_mode_and_runtime() -> None:
    # given two interleaved rounds of each tool in each mode, on torch
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
    # then replay has throughput only, live has latency too, each with the threads used
    replay, live = summary["replay"]["torch"], summary["live"]["torch"]
    assert set(replay) == {"threads", "fps"}
    assert set(live) == {"threads", "fps", "p50_ms", "p99_ms"}
    assert replay["threads"] == {"peer": "2", "ours": "2"}
    fps = replay["fps"]
    assert (fps["peer_best"], fps["ours_best"]) == (12.0, 18.0)
    assert (fps["peer_median"], fps["ours_median"]) == (11.0, 16.0)
    assert fps["ratio_best"] == pytest.approx(1.5)
    assert fps["ratio_median"] == pytest.approx(16.0 / 11.0)
    assert "own_ratio_best" not in fps  # no round of the peer at its own default
    p50 = live["p50_ms"]
    assert (p50["peer_best"], p50["ours_best"]) == (100.0, 60.0)
    assert p50["ratio_best"] == pytest.approx(0.6)
    # and the table shows every round and every summary line, naming runtime and threads
    lines = stats.table(rounds, summary)
    assert sum(1 for line in lines if line.startswith(("replay", "live"))) == 8 + 4
    summary_lines = [line for line in lines if line.endswith("same threads")]
    assert len(summary_lines) == 4
    assert all(" torch " in line and " 2/2 " in line for line in summary_lines)


def test_the_peer_at_its_own_default_threads_is_a_second_labelled_line() -> None:
    # given matched rounds on two runtimes, and the peer at its own default threads
    rounds = [
        _round("peer", "replay", 1, 10.0),
        _round("ours", "replay", 1, 9.0),
        _round(options.PEER_OWN, "replay", 1, 6.0, threads=1),
        _round("peer", "replay", 1, 20.0, runtime="onnxruntime"),
        _round("ours", "replay", 1, 25.0, runtime="onnxruntime"),
        _round(options.PEER_OWN, "replay", 1, 18.0, runtime="onnxruntime", threads=0),
    ]
    # when summarised
    summary = stats.summarise(rounds)
    # then the headline ratio is against the peer on the same threads, the other is kept apart
    torch_fps = summary["replay"]["torch"]["fps"]
    assert torch_fps["ratio_best"] == pytest.approx(0.9)
    assert torch_fps["own_ratio_best"] == pytest.approx(1.5)
    assert summary["replay"]["torch"]["threads"] == {"peer": "2", "ours": "2", "peer-own": "1"}
    ort = summary["replay"]["onnxruntime"]
    assert ort["fps"]["ratio_median"] == pytest.approx(1.25)
    assert ort["threads"]["peer-own"] == "ort"  # ONNX Runtime's own default
    # and the table labels the second line as not like for like, after the headline
    lines = [line for line in stats.table(rounds, summary) if line.endswith(")")]
    labelled = [line for line in lines if line.endswith(stats.PEER_OWN_LABEL)]
    assert len(labelled) == 2
    assert any(" torch " in line and " 1/2 " in line for line in labelled)
    assert any(" onnxruntime " in line and " ort/2 " in line for line in labelled)
    every_round = [line for line in stats.table(rounds, summary) if " peer-own " in line]
    assert len(every_round) == 2


def test_threads_used_names_one_count_or_each_and_ort_for_its_default() -> None:
    rounds = [_round("peer", "live", 1, 1.0, threads=2), _round("peer", "live", 2, 1.0, threads=1)]
    assert stats.threads_used(rounds, "peer") == "1,2"
    assert stats.threads_used([_round("ours", "live", 1, 1.0, threads=0)], "ours") == "ort"
    assert stats.threads_used(rounds, "ours") == "-"


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


# ---------------------------------------------------------------------- the ONNX export


def test_onnx_metadata_reads_back_as_ultralytics_autobackend_reads_it() -> None:
    # given the metadata written into the export, each value as str(value) (as Ultralytics'
    # exporter writes metadata_props)
    names = ["person", "bicycle", "car"]
    metadata = exported.ultralytics_metadata(version="8.4.0", stride=32, imgsz=320, names=names)
    props = {key: str(value) for key, value in metadata.items()}
    # when read back as AutoBackend's apply_metadata does (int(), ast.literal_eval)
    stride, batch = int(props["stride"]), int(props["batch"])
    imgsz, args = ast.literal_eval(props["imgsz"]), ast.literal_eval(props["args"])
    # then a dynamic, fp32, NMS-free detection export at the bench's input size
    assert (stride, batch, imgsz) == (32, 1, [320, 320])
    assert ast.literal_eval(props["names"]) == {0: "person", 1: "bicycle", 2: "car"}
    assert props["task"] == "detect"
    assert args["dynamic"] is True and args["nms"] is False and args["half"] is False
    assert ast.literal_eval(props["end2end"]) is False


def test_ours_ort_threads_come_from_the_runs_record(tmp_path: Path) -> None:
    # run.json's model section, as the report's loader reads it
    from drivepercept.rundir import RunDir

    def threads(model: dict[str, object]) -> int:
        (tmp_path / "run.json").write_text(json.dumps({"command": "replay", "model": model}))
        return rounds._run_ort_threads(RunDir(tmp_path).read_record().model)

    assert threads({"runtime": {"backend": "onnxruntime", "threads": 2}}) == 2
    # two lanes of one thread: two in all, as the peer's one session of two
    assert threads({"runtime": {"backend": "onnxruntime", "threads": 1, "lanes": 2}}) == 2
    assert threads({"runtime": {"backend": "onnxruntime"}}) == 0  # ORT's default
    assert threads({"runtime": None}) == -1


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


def test_a_run_folder_gives_the_same_figures_as_its_frames(tmp_path: Path) -> None:
    # given a run folder as drivepercept writes it: two cameras, batch 0 at 1 s, batch 1 at 2 s
    header = (
        "camera,camera_index,frame_index,pts_s,batch_index,batch_size,capture_ns,decoded_ns,"
        "preprocessed_ns,queued_ns,batched_ns,copy_start_ns,copy_done_ns,compute_start_ns,"
        "inference_done_ns,postprocessed_ns,emitted_ns,end_to_end_ms,detections"
    )
    lines = [header]
    for batch, (capture_s, out_s) in enumerate([(0.9, 1.0), (1.8, 2.0)]):
        for cam in (0, 1):
            cap, out = int(capture_s * 1e9) + cam, int(out_s * 1e9)
            stamps = ",".join(str(cap + k) for k in range(9))
            e2e = (out - cap) / 1e6
            lines.append(f"c{cam},{cam},{batch},0.0,{batch},2,{cap},{stamps},{out},{e2e},{cam}")
    (tmp_path / "frames.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "run.json").write_text(
        json.dumps(
            {
                "command": "replay",
                "mode": "replay",
                "status": "complete",
                "sources": [{"camera": "c0"}, {"camera": "c1"}],
            }
        )
    )
    from drivepercept.report import load_run

    # when bench_peer reads it through the report's loader
    figures = stats.timeline_figures(load_run(tmp_path).timeline)
    # then 2 frames after the first batch over 1 s, and batch 1's latencies (200 ms)
    assert figures.frames == 4 and figures.fps == pytest.approx(2.0)
    assert figures.later_ms == pytest.approx((200.0, 200.0), abs=1e-3)


def test_steal_is_the_stolen_share_of_the_host_ticks_between_two_readings() -> None:
    from _bench_peer.process import host_cpu_ticks, steal_pct

    assert steal_pct((10, 1000), (60, 1200)) == pytest.approx(25.0)
    assert math.isnan(steal_pct(None, (1, 2))) and math.isnan(steal_pct((5, 100), (5, 100)))
    ticks = host_cpu_ticks()
    if ticks is not None:  # Linux
        stolen, total = ticks
        assert 0 <= stolen <= total
