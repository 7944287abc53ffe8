"""The benchmark suite (`bench --mode ...`): the capacity search on a fake measurement, the
pass rule, tables and JSON, bad input, and (slow) real live and capacity runs against the
project's camera server."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from drivepercept.bench import BenchRequest, write_bench_json
from drivepercept.bench.capacity import (
    CapacityResult,
    CapacityStep,
    Verdict,
    capacity,
    search_capacity,
)
from drivepercept.bench.ceiling import CeilingLine, CeilingResult
from drivepercept.bench.common import SpeedOptions
from drivepercept.bench.compare import BenchLine, BenchResult, round_ratios
from drivepercept.bench.live import LiveResult, live_bench
from drivepercept.bench.served import LiveStep, measure_live
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, InputSpec
from drivepercept.run import RunOptions
from drivepercept.telemetry.loadwatch import LoadFigures

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RIG = ROOT / "sample_videos" / "rig.toml"
ORACLE = "drivepercept.models.oracle:make_oracle"

pytestmark = pytest.mark.timeout(300)


def _step(cameras: int, *, p99_ms: float = 50.0, dropped: int = 0, fps: float = 15.0) -> LiveStep:
    frames = int(cameras * fps * 10)  # a 10 s window at full rate
    return LiveStep(cameras, fps, 10.0, frames, dropped, p99_ms / 2, p99_ms)


def _fake(capacity_n: int, *, flaky: dict[int, int] | None = None) -> Callable[[int], LiveStep]:
    """A machine that serves `capacity_n` cameras: more push p99 over 100 ms. `flaky`: camera
    counts whose first N measurements fail anyway (a noisy neighbour)."""
    flaky = dict(flaky or {})

    def measure(n: int) -> LiveStep:
        if flaky.get(n, 0) > 0:
            flaky[n] -= 1
            return _step(n, p99_ms=400.0)
        return _step(n, p99_ms=60.0 if n <= capacity_n else 150.0)

    return measure


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize("answer", [0, 1, 2, 3, 5, 7, 11, 12])
def test_search_finds_the_largest_passing_count(answer: int) -> None:
    found, steps = search_capacity(_fake(answer), Verdict(100.0), max_cameras=12)
    assert found == answer
    # doubling then bisection: a handful of counts, each failing one measured twice
    counts = [s.step.cameras for s in steps]
    assert len(set(counts)) <= 2 * math.ceil(math.log2(13)) + 1
    for s in steps:
        assert s.passed == (s.step.cameras <= answer)
        if not s.passed:
            assert s.attempt in (1, 2)
    failed_first = [s for s in steps if not s.passed and s.attempt == 1]
    assert all(sum(1 for t in steps if t.step.cameras == s.step.cameras) == 2 for s in failed_first)


def test_search_order_is_doubling_then_bisection() -> None:
    found, steps = search_capacity(_fake(5), Verdict(100.0), max_cameras=12)
    assert found == 5
    assert [(s.step.cameras, s.passed) for s in steps] == [
        (1, True),
        (2, True),
        (4, True),
        (8, False),
        (8, False),
        (6, False),
        (6, False),
        (5, True),
    ]


def test_one_unlucky_window_does_not_end_the_search() -> None:
    # given a noisy neighbour that spoils the first measurement of 2 cameras
    found, steps = search_capacity(_fake(4, flaky={2: 1}), Verdict(100.0), max_cameras=8)
    # then 2 is measured again, passes, and the search goes on to the true answer
    assert found == 4
    assert [(s.step.cameras, s.attempt, s.passed) for s in steps][:3] == [
        (1, 1, True),
        (2, 1, False),
        (2, 2, True),
    ]


def test_each_step_is_reported_as_it_is_measured() -> None:
    seen: list[CapacityStep] = []
    _, steps = search_capacity(_fake(2), Verdict(100.0), max_cameras=4, on_step=seen.append)
    assert tuple(seen) == steps


def test_search_refuses_no_cameras() -> None:
    with pytest.raises(ConfigError, match="max cameras must be >= 1, got 0"):
        search_capacity(_fake(1), Verdict(100.0), max_cameras=0)


def test_the_pass_rule_names_what_a_step_missed() -> None:
    rule = Verdict(100.0)
    assert rule.why_not(_step(2)) == ""
    assert rule.why_not(_step(2, p99_ms=120.0)) == "p99 120 >= 100 ms"
    # 1 % of the offered frames may be dropped, not more
    assert rule.why_not(_step(2, dropped=3)) == ""  # 3 of 303
    assert "dropped 1.6% > 1%" in rule.why_not(_step(2, dropped=5))
    slow = LiveStep(2, 15.0, 10.0, 250, 0, 40.0, 60.0)  # 25 of 30 frames/s
    assert rule.why_not(slow) == "25.0 of 30 frames/s"
    assert rule.why_not(LiveStep(2, 15.0, 0.0, 0, 0, math.nan, math.nan)) == "no results"
    with pytest.raises(ConfigError, match="budget must be > 0 ms, got 0"):
        Verdict(0.0)


# --------------------------------------------------------------------------- tables and JSON


def _capacity_result() -> CapacityResult:
    _, steps = search_capacity(_fake(2), Verdict(100.0), max_cameras=4)
    return CapacityResult(
        cameras=2,
        steps=steps,
        fps=15.0,
        budget_ms=100.0,
        size=(640, 360),
        model="yolox-nano",
        input_size=(416, 256),
        device="cpu",
        step_s=10.0,
        elapsed_s=123.4,
    )


def test_capacity_table_has_a_line_per_step_and_the_answer() -> None:
    table = _capacity_result().table()
    lines = table.splitlines()
    assert lines[0].startswith("capacity: 640x360 cameras at 15 fps, p99 < 100 ms")
    assert lines[1] == "model yolox-nano, input 416x256, device cpu"
    assert lines[2].split()[:3] == ["cameras", "frames/s", "target"]
    # (no load figures in these made-up steps: n/a, never a made-up zero)
    assert lines[3].split() == ["1", "15.0", "15.0", "30.0", "60.0", "0.0%", "n/a", "n/a", "pass"]
    assert lines[5].split()[:2] == ["4", "60.0"] and "FAIL: p99 150 >= 100 ms" in lines[5]
    assert lines[6].split()[:2] == ["4", "again"] and "FAIL: p99 150 >= 100 ms" in lines[6]
    assert lines[-1].startswith("capacity: 2 camera(s)")


def test_json_holds_the_machine_and_the_figures(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    request = BenchRequest(mode="capacity", fps=15.0)
    write_bench_json(path, request, _capacity_result())
    record = json.loads(path.read_text())
    assert record["mode"] == "capacity" and record["schema"] == 1
    assert record["machine"]["cores"] >= 1 and "torch" in record["machine"]
    results = record["results"]
    assert results["cameras"] == 2 and results["budget_ms"] == 100.0
    assert [s["cameras"] for s in results["steps"]][:2] == [1, 2]
    assert results["steps"][0]["drop_share"] == 0.0 and results["steps"][0]["passed"]


def test_live_step_figures_and_json_without_nan() -> None:
    step = LiveStep(3, 15.0, 10.0, 441, 9, 80.0, 190.0)
    assert step.target_fps == 45.0 and step.achieved_fps == pytest.approx(44.1)
    assert step.drop_share == pytest.approx(9 / 450)
    empty = LiveStep(3, 15.0, 0.0, 0, 0, math.nan, math.nan).as_dict()
    assert empty["p99_ms"] is None and empty["drop_share"] == 1.0
    json.dumps(empty, allow_nan=False)


def test_ceiling_table_has_a_line_per_batch_size() -> None:
    result = CeilingResult(
        tuple(CeilingLine(b, 10, 20.0 * b, 40.0 * b, 50.0 * b) for b in (1, 2, 3)),
        model="m",
        input_size=(416, 256),
        device="cpu",
        precision="fp32",
        rounds=3,
    )
    rows = result.table().splitlines()
    assert rows[1].split() == ["batch", "batches", "frames/s", "p50", "ms", "p99", "ms"]
    assert [r.split()[0] for r in rows[2:5]] == ["1", "2", "3"]
    assert rows[2].split()[2:] == ["20.0", "40.0", "50.0"]
    assert "best: batch 3, 60.0 frames/s" in result.table()
    assert [x["batch"] for x in result.as_dict()["lines"]] == [1, 2, 3]


def test_a_single_mode_table_has_no_ratios() -> None:
    result = BenchResult((BenchLine("pipeline", 60, 2.0),), batch=6, device="cpu")
    assert "pipeline / " not in result.table()
    assert result.as_dict()["lines"] == [
        {
            "mode": "pipeline",
            "frames": 60,
            "seconds": 2.0,
            "fps": 30.0,
            "round_fps": [],
            "load": None,
        }
    ]


def test_the_ratios_are_of_the_bests_and_round_by_round() -> None:
    # given three interleaved rounds where the host's speed drifted: round 2 of the pipeline
    # ran slow, round 3 of the model alone did
    model_only = BenchLine("model-only", 90, 1.0, round_fps=(80.0, 90.0, 60.0))
    pipeline = BenchLine("pipeline", 90, 1.2, round_fps=(72.0, 45.0, 75.0))
    result = BenchResult((model_only, pipeline), batch=6, device="cpu", rounds=3)
    assert round_ratios(pipeline, model_only) == pytest.approx((0.9, 0.5, 1.25))
    row = next(r for r in result.table().splitlines() if r.startswith("pipeline / model-only"))
    # the bests' ratio (75 / 90), then each round's, then their median
    assert row.split(":")[1].split()[0] == "0.83x"
    assert "round by round 0.90, 0.50, 1.25; median 0.90" in row
    assert result.as_dict()["lines"][1]["round_fps"] == [72.0, 45.0, 75.0]
    # and a line without its rounds (built by hand) gives no round-by-round ratios
    assert round_ratios(pipeline, BenchLine("model-only", 90, 1.0)) == ()


SPEED = SpeedOptions("fp16", True, True, False, 0, 16, ("compile: no compiler here",))
LOAD = LoadFigures(42, 10.0, 45.0, 80.0, 2100.0, 110.0, 130.0)


def test_every_table_says_its_speed_options_and_load() -> None:
    # given each benchmark's result with the speed options and load it was measured with
    step = LiveStep(6, 15.0, 6.0, 540, 0, 20.0, 35.0, LOAD)
    _, steps = search_capacity(lambda n: dataclasses.replace(step, cameras=n), Verdict(100.0))
    results: list[Any] = [
        BenchResult((BenchLine("pipeline", 60, 2.0, LOAD),), batch=6, device="cuda:0", speed=SPEED),
        CeilingResult(
            (CeilingLine(1, 10, 500.0, 2.0, 3.0),),
            model="m",
            input_size=(448, 256),
            device="cuda:0",
            precision="fp16",
            rounds=2,
            speed=SPEED,
            load=LOAD,
        ),
        LiveResult(step=step, model="m", input_size=(448, 256), device="cuda:0", speed=SPEED),
        dataclasses.replace(_capacity_result(), steps=steps, speed=SPEED),
    ]
    speed_line = (
        "speed: fp16, channels_last on, compile on, cuda graphs off, torch threads 16 "
        "(torch's default); ran eagerly: compile: no compiler here"
    )
    for result in results:
        # then the table's header says them, before any figure
        rows = result.table().splitlines()
        assert speed_line in rows[:3], rows
        figures = result.as_dict()
        assert figures["speed"] == {
            "precision": "fp16",
            "channels_last": True,
            "compile": True,
            "cuda_graphs": False,
            "torch_threads": 0,
            "torch_threads_used": 16,
            "cpu_lanes": None,
            "fallbacks": ["compile: no compiler here"],
            "runtime": "torch",
        }
        # and the load: GPU utilization mean/max, memory, CPU, in the table and the JSON
        text = result.table()
        assert "45/80" in text or "GPU util 45.0 % mean, 80.0 % max" in text, text
        json.dumps(figures, allow_nan=False)
    bench, ceiling, live, cap = (r.as_dict() for r in results)
    assert bench["lines"][0]["load"]["gpu_util_max_pct"] == 80.0
    assert ceiling["load"]["gpu_mem_max_mb"] == 2100.0
    assert live["load"]["process_cpu_mean_pct"] == 110.0
    assert cap["steps"][0]["load"]["gpu_util_mean_pct"] == 45.0
    assert results[0].table().splitlines()[2].split()[4:] == ["GPU", "%", "GPU", "MB", "CPU", "%"]
    assert results[0].table().splitlines()[3].split()[4:] == ["45/80", "2100", "110"]


# --------------------------------------------------------------------------- bad input

FAST = ["--model", ORACLE, "--weights", "none", "--no-progress"]


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["--mode", "capacity", "--budget-ms", "0"], "budget must be > 0 ms, got 0"),
        (["--mode", "capacity", "--fps", "0"], "fps must be > 0 and <= 240, got 0"),
        (["--mode", "live", str(SAMPLE_RIG), "--duration", "-1"], "duration must be > 0 s"),
        (["--mode", "capacity", "--size", "640by360"], "size must look like WIDTHxHEIGHT"),
        (["--mode", "live"], "give at least one SOURCE"),
        (["--mode", "warp", str(SAMPLE_RIG)], "invalid choice: 'warp'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    in_process: Callable[[list[str]], tuple[int, str]], argv: list[str], phrase: str
) -> None:
    started = time.monotonic()
    code, err = in_process(["bench", *argv, *FAST])
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drivepercept bench: error: "), err
    assert phrase in lines[0]
    assert time.monotonic() - started < 5  # said before any model, render or camera


def test_a_request_checks_its_mode() -> None:
    with pytest.raises(ConfigError, match="bench mode must be one of default, ceiling"):
        BenchRequest(mode="warp")


def test_the_suites_front_door_loads_neither_torch_nor_opencv() -> None:
    # so that a request (the sweep's grid too) is checked before any model, render or camera
    check = (
        "import sys; from drivepercept.bench import BenchRequest; "
        "BenchRequest(mode='sweep', precisions='fp32'); "
        "sys.exit(sorted({'torch', 'cv2'} & set(sys.modules)) != [])"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


# --------------------------------------------------------------------------- real runs


def test_ceiling_and_pipeline_modes_on_the_cli(
    in_process: Callable[[list[str]], tuple[int, str]], tmp_path: Path
) -> None:
    code, err = in_process(
        [
            "bench",
            str(SAMPLE_RIG),
            "--mode",
            "ceiling",
            "--rounds",
            "1",
            *FAST,
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    assert code == 0, err
    results = json.loads((tmp_path / "c.json").read_text())["results"]
    lines = results["lines"]
    assert [x["batch"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert all(x["fps"] > 0 and 0 < x["p50_ms"] <= x["p99_ms"] for x in lines)
    # the speed options it ran with, and the load: no GPU here, so null and why
    assert results["speed"]["precision"] == "fp32" and results["speed"]["torch_threads_used"] >= 1
    load = results["load"]
    if load["samples"]:  # the oracle may finish inside one sampler interval
        assert load["gpu_util_mean_pct"] is None and load["process_cpu_mean_pct"] is not None
    assert load["gpu_unavailable"] == "the run did not use a GPU"
    code, err = in_process(
        ["bench", str(SAMPLE_RIG), "--mode", "pipeline", "--frames", "2", "--rounds", "1", *FAST]
    )
    assert code == 0, err


class Quick(torch.nn.Module):
    """A detector that finds nothing, at once."""

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        empty = {
            "boxes": torch.zeros((0, 4)),
            "scores": torch.zeros(0),
            "labels": torch.zeros(0, dtype=torch.long),
        }
        return [dict(empty) for _ in range(len(x))]


def _quick() -> Detector:
    return Detector("quick", Quick(), InputSpec((160, 96)), ("car",))


def test_a_live_measurement_of_served_cameras() -> None:
    # given two sample videos served live at 15 fps and a model far faster than that
    videos = [(n, ROOT / "sample_videos" / f"{n}.mp4") for n in ("front", "back")]
    options = RunOptions(
        sources=("unused",), model="quick", weights=None, settings={"device": "cpu"}
    )
    # when a 2 s window is measured after 0.5 s of settling
    step = measure_live(
        options,
        videos,
        fps=15.0,
        duration_s=2.0,
        warmup_s=0.5,
        detector=_quick(),
    )
    print(step)
    # then the window's figures are those of a machine that keeps up (loosely: it is shared)
    assert step.cameras == 2 and step.target_fps == 30.0
    assert 1.9 <= step.window_s <= 3.0
    assert step.frames > 20 and 10 < step.achieved_fps < 40
    assert 0 < step.p50_ms <= step.p99_ms < 2000
    assert 0 <= step.drop_share < 0.5
    # and the load sampler watched the window (the run's own sampler was off: one sampler)
    assert step.load is not None and step.load.samples >= 10
    assert step.load.process_cpu_mean_pct is not None and step.load.gpu_util_mean_pct is None


@pytest.mark.slow
def test_live_mode_on_the_sample_rig(
    in_process: Callable[[list[str]], tuple[int, str]], tmp_path: Path
) -> None:
    out = tmp_path / "live.json"
    code, err = in_process(
        [
            "bench",
            str(SAMPLE_RIG),
            "--mode",
            "live",
            "--fps",
            "15",
            "--duration",
            "6",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert code == 0, err
    results = json.loads(out.read_text())["results"]
    assert results["cameras"] == 6 and results["target_fps"] == 90.0
    assert results["frames"] > 0 and results["p50_ms"] <= results["p99_ms"]
    assert 0 <= results["drop_share"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_capacity_of_the_default_model_in_under_5_minutes(yolox_nano_onnx: Path) -> None:
    options = RunOptions(
        sources=("simulated",),
        weights=str(yolox_nano_onnx),
        settings={"device": "cpu"},
        budget_ms=300,
        schedule=False,  # every frame to the model, as before the deadline scheduler
    )
    assert options.model_name == "yolox-nano"
    seen: list[CapacityStep] = []
    result = capacity(options, fps=15.0, on_step=seen.append)
    print(result.table())
    assert result.elapsed_s < 300
    assert tuple(seen) == result.steps
    passed = [s.step.cameras for s in result.steps if s.passed]
    assert result.cameras == max(passed, default=0)


def test_live_bench_refuses_a_rig_without_videos() -> None:
    options = RunOptions(sources=("cam=http://127.0.0.1:9/x.mjpg",), model=ORACLE, weights=None)
    with pytest.raises(ConfigError, match="serves video files as cameras"):
        live_bench(options)
