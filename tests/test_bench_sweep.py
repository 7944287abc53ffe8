"""`bench --sweep`: the grid's parsing and checks, the table, JSON and plot of a sweep measured
by a fake, bad input on the command line, and one small real sweep of served cameras."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from drivepercept.bench import BenchRequest, SweepGrid, write_bench_json, write_bench_plot
from drivepercept.bench.common import SpeedOptions
from drivepercept.bench.compare import BenchResult
from drivepercept.bench.served import LiveStep
from drivepercept.bench.sweep import HEADER, SweepCell, SweepResult, measure_grid
from drivepercept.errors import ConfigError, OutputError
from drivepercept.telemetry.loadwatch import LoadFigures

ORACLE = "drivepercept.models.oracle:make_oracle"
FAST = ["--model", ORACLE, "--weights", "none", "--device", "cpu", "--no-progress"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- the grid


def test_the_default_grid_depends_on_the_device() -> None:
    grid = SweepGrid.parse()
    assert grid.precisions is None  # resolved once the device is known
    assert grid.timeouts_ms == (5.0, 20.0, 50.0) and grid.cameras == (1, 2, 4)
    assert grid.resolve("cpu").precisions == ("fp32", "bf16")
    assert grid.resolve("cuda").precisions == ("fp32", "fp16", "bf16")


def test_lists_are_parsed_deduplicated_and_ordered() -> None:
    grid = SweepGrid.parse(precisions=" BF16, fp32,bf16", timeouts_ms="50, 0,5.5,50", cameras="4,1")
    assert grid.precisions == ("bf16", "fp32")  # the order given: the plot's line order
    assert grid.timeouts_ms == (0.0, 5.5, 50.0)
    assert grid.cameras == (1, 4)


def test_cells_are_measured_camera_count_by_camera_count() -> None:
    grid = SweepGrid.parse(precisions="fp32,bf16", timeouts_ms="5,50", cameras="1,2").resolve("cpu")
    assert grid.cells() == [
        ("fp32", 5.0, 1),
        ("fp32", 50.0, 1),
        ("bf16", 5.0, 1),
        ("bf16", 50.0, 1),
        ("fp32", 5.0, 2),
        ("fp32", 50.0, 2),
        ("bf16", 5.0, 2),
        ("bf16", 50.0, 2),
    ]


@pytest.mark.parametrize(
    ("kw", "phrase"),
    [
        ({"precisions": ""}, "sweep precisions must be a comma-separated list (e.g. fp32,bf16)"),
        ({"precisions": "fp32,,bf16"}, "got 'fp32,,bf16'"),
        ({"precisions": "fp8"}, "sweep precision must be one of fp32, fp16, bf16, got 'fp8'"),
        ({"timeouts_ms": " "}, "sweep batch timeouts must be a comma-separated list"),
        ({"timeouts_ms": "5,x"}, "sweep batch timeouts must be numbers, comma-separated"),
        ({"timeouts_ms": "-5"}, "sweep batch timeout must be between 0 and 60000 ms, got -5"),
        ({"timeouts_ms": "nan"}, "sweep batch timeout must be between 0 and 60000 ms, got nan"),
        ({"cameras": "0,2"}, "sweep cameras must be between 1 and 12, got 0"),
        ({"cameras": "13"}, "sweep cameras must be between 1 and 12, got 13"),
        ({"cameras": "1.5"}, "sweep cameras must be whole numbers, comma-separated (e.g. 1,2,4)"),
    ],
)
def test_bad_lists_are_a_config_error(kw: dict[str, str], phrase: str) -> None:
    with pytest.raises(ConfigError) as info:
        SweepGrid.parse(**kw)
    assert phrase in str(info.value)


def test_fp16_is_refused_on_a_cpu() -> None:
    grid = SweepGrid.parse(precisions="fp32,fp16")
    assert grid.resolve("cuda").precisions == ("fp32", "fp16")
    with pytest.raises(ConfigError, match="sweep precision fp16 needs a CUDA device, got device"):
        grid.resolve("cpu")


@pytest.mark.parametrize("axis", ["precisions", "timeouts_ms", "cameras"])
def test_empty_axes_are_refused_from_python_too(axis: str) -> None:
    with pytest.raises(ConfigError, match="give at least one of each"):
        SweepGrid(**{axis: ()})


def test_a_request_checks_the_sweep_and_keeps_its_knobs_to_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="got 'fp8'"):
        BenchRequest(mode="sweep", precisions="fp8")
    with pytest.raises(
        ConfigError, match=r"are the sweep's \(bench --sweep\), not bench --mode live"
    ):
        BenchRequest(mode="live", timeouts_ms="5")
    # the plot goes where --plot says, else beside the JSON, else nowhere
    request = BenchRequest(mode="sweep")
    assert request.plot_path(tmp_path / "s.json") == tmp_path / "s.png"
    assert request.plot_path(None) is None
    chosen = BenchRequest(mode="sweep", plot=tmp_path / "p.png")
    assert chosen.plot_path(tmp_path / "s.json") == tmp_path / "p.png"
    assert BenchRequest(mode="ceiling").plot_path(tmp_path / "c.json") is None


# --------------------------------------------------------------------------- table, JSON, plot


def _fake(precision: str, timeout_ms: float, cameras: int) -> LiveStep:
    """A machine where bf16 is faster and a longer timeout costs latency; 4 cameras is too
    many for fp32 (no results in the window at all). The CPU load is known for bf16."""
    if cameras == 4 and precision == "fp32":
        return LiveStep(cameras, 15.0, 0.0, 0, 0, math.nan, math.nan)
    rate = min(cameras * 15.0, 20.0 if precision == "fp32" else 25.0)
    frames = int(rate * 5)
    dropped = int(cameras * 15.0 * 5) - frames
    p50_ms, p99_ms = 40.0 + timeout_ms, 90.0 + 2 * timeout_ms
    load = LoadFigures(samples=50, rate_hz=10.0, process_cpu_mean_pct=180.0)
    return LiveStep(
        cameras, 15.0, 5.0, frames, dropped, p50_ms, p99_ms, load if precision == "bf16" else None
    )


def _result(cells: tuple[SweepCell, ...], grid: SweepGrid) -> SweepResult:
    return SweepResult(
        cells=cells,
        grid=grid,
        fps=15.0,
        size=(640, 360),
        model="yolox-nano",
        input_size=(416, 256),
        device="cpu",
        speed=SpeedOptions(
            precision="fp32/bf16 (per cell)",
            channels_last=True,
            compile=False,
            cuda_graphs=False,
            torch_threads=0,
            threads_used=2,
        ),
        cell_s=5.0,
        warmup_s=2.0,
        elapsed_s=96.4,
    )


def _sweep() -> tuple[SweepResult, list[SweepCell], list[tuple[str, float, int]]]:
    grid = SweepGrid.parse(timeouts_ms="5,50", cameras="1,2,4").resolve("cpu")
    asked: list[tuple[str, float, int]] = []
    seen: list[SweepCell] = []

    def measure(precision: str, timeout_ms: float, cameras: int) -> LiveStep:
        asked.append((precision, timeout_ms, cameras))
        return _fake(precision, timeout_ms, cameras)

    cells = measure_grid(measure, grid, on_cell=seen.append)
    return _result(cells, grid), seen, asked


def test_every_cell_is_measured_once_and_shown_as_it_is() -> None:
    result, seen, asked = _sweep()
    assert asked == result.grid.cells() and len(asked) == 12
    assert tuple(seen) == result.cells
    assert [(c.precision, c.batch_timeout_ms, c.step.cameras) for c in result.cells] == asked


def test_the_table_says_what_ran_and_has_a_row_per_cell() -> None:
    result, _, _ = _sweep()
    lines = result.table().splitlines()
    assert lines[0] == "sweep: 640x360 cameras at 15 fps, 5 s per cell after 2 s of settling"
    assert lines[1] == "model yolox-nano, input 416x256, device cpu"
    assert lines[2] == result.speed_lines()[0]  # every precision swept, then the other options
    assert lines[2].startswith("speed: fp32/bf16 (per cell), channels_last on, compile off")
    assert lines[3] == HEADER
    assert lines[3].split() == [
        "precision",
        "timeout",
        "ms",
        "cameras",
        "frames/s",
        "target",
        "p50",
        "ms",
        "p99",
        "ms",
        "dropped",
        "GPU",
        "%",
        "CPU",
        "%",
    ]
    rows = lines[4:16]
    assert rows[0].split() == [
        "fp32",
        "5",
        "1",
        "15.0",
        "15.0",
        "45.0",
        "100.0",
        "0.0%",
        "n/a",
        "n/a",
    ]
    assert rows[2].split()[-2:] == ["n/a", "180"]  # a CPU: no GPU figures
    assert rows[8].split() == [
        "fp32",
        "5",
        "4",
        "0.0",
        "60.0",
        "nan",
        "nan",
        "100.0%",
        "n/a",
        "n/a",
    ]
    # the best cell per camera count: most frames/s, then the lower p99
    assert lines[16] == "most frames/s at 1 camera(s): fp32, 5 ms (15.0 frames/s, p99 100 ms)"
    assert lines[18] == "most frames/s at 4 camera(s): bf16, 5 ms (25.0 frames/s, p99 100 ms)"
    assert lines[-2] == "sweep: 12 cells measured, 96 s in all"
    assert lines[-1].startswith("(GPU %: NVML utilization mean/max, CPU %")


def test_the_json_holds_every_cell_and_the_machine(tmp_path: Path) -> None:
    result, _, _ = _sweep()
    path = tmp_path / "sweep.json"
    write_bench_json(path, BenchRequest(mode="sweep"), result)
    record = json.loads(path.read_text())  # strict JSON: a cell without results has nulls
    assert record["mode"] == "sweep" and record["machine"]["cores"] >= 1
    results = record["results"]
    assert results["grid"] == {
        "precisions": ["fp32", "bf16"],
        "batch_timeouts_ms": [5.0, 50.0],
        "cameras": [1, 2, 4],
    }
    assert results["speed"]["torch_threads_used"] == 2 and results["speed"]["compile"] is False
    assert results["size"] == "640x360" and results["cell_s"] == 5.0
    cells = results["cells"]
    assert len(cells) == 12
    expected = {
        "precision": "fp32",
        "batch_timeout_ms": 5.0,
        "cameras": 1,
        "fps_per_camera": 15.0,
        "target_fps": 15.0,
        "achieved_fps": 15.0,
        "window_s": 5.0,
        "frames": 75,
        "dropped": 0,
        "drop_share": 0.0,
        "p50_ms": 45.0,
        "p99_ms": 100.0,
    }
    assert {k: cells[0][k] for k in expected} == expected  # and the step's own fields
    assert cells[2]["load"]["process_cpu_mean_pct"] == 180.0
    assert cells[8]["p99_ms"] is None and cells[8]["drop_share"] == 1.0


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    result, _, _ = _sweep()
    path = tmp_path / "sweep.png"
    write_bench_plot(path, result)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 400)


def test_only_a_sweep_draws_a_plot_where_it_can(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only bench --sweep draws a plot"):
        write_bench_plot(tmp_path / "x.png", BenchResult((), batch=1, device="cpu"))
    with pytest.raises(OutputError, match=r"cannot write .*/missing/x\.png"):
        write_bench_plot(tmp_path / "missing" / "x.png", _sweep()[0])


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["--precisions", "fp8"], "sweep precision must be one of fp32, fp16, bf16, got 'fp8'"),
        (["--precisions", ""], "sweep precisions must be a comma-separated list"),
        (["--timeouts-ms", "-5"], "sweep batch timeout must be between 0 and 60000 ms, got -5"),
        (["--sweep-cameras", "0"], "sweep cameras must be between 1 and 12, got 0"),
        (["--sweep-cameras", "1,20"], "sweep cameras must be between 1 and 12, got 20"),
        (["--precisions", "fp32,fp16"], "sweep precision fp16 needs a CUDA device, got device cpu"),
        (["--duration", "0"], "duration must be > 0 s, got 0"),
        (["--mode", "live"], "not allowed with argument"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    in_process: Callable[[list[str]], tuple[int, str]], argv: list[str], phrase: str
) -> None:
    started = time.monotonic()
    code, err = in_process(["bench", "--sweep", *argv, *FAST])
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drivepercept bench: error: "), err
    assert phrase in lines[0]
    assert time.monotonic() - started < 5  # said before any model, render or camera


def test_sweep_knobs_belong_to_the_sweep(
    in_process: Callable[[list[str]], tuple[int, str]],
) -> None:
    code, err = in_process(["bench", "--mode", "capacity", "--sweep-cameras", "1,2", *FAST])
    assert code == 2 and "not bench --mode capacity's" in err, err


@pytest.mark.integration
@pytest.mark.slow  # 14 s; the sweep's parts have unit tests above
def test_a_small_real_sweep_on_the_command_line(
    in_process: Callable[[list[str]], tuple[int, str]], tmp_path: Path
) -> None:
    # given served synthetic cameras and a model far faster than their frame rate
    out = tmp_path / "sweep.json"
    started = time.monotonic()
    # when 1 precision x 2 timeouts x 1, 2 cameras are measured for 1 s each
    code, err = in_process(
        [
            "bench",
            "--sweep",
            "--precisions",
            "fp32",
            "--timeouts-ms",
            "5,50",
            "--sweep-cameras",
            "1,2",
            "--duration",
            "1",
            "--fps",
            "10",
            "--size",
            "320x180",
            *FAST,
            "--json",
            str(out),
        ]
    )
    print(err, f"{time.monotonic() - started:.1f} s")
    assert code == 0, err
    # then each cell was shown as it was measured, and the JSON and the plot hold them all
    assert len([x for x in err.splitlines() if x.startswith("step: ")]) == 4
    results = json.loads(out.read_text())["results"]
    cells = results["cells"]
    assert [(c["batch_timeout_ms"], c["cameras"]) for c in cells] == [
        (5.0, 1),
        (50.0, 1),
        (5.0, 2),
        (50.0, 2),
    ]
    assert results["model"] == "oracle" and results["speed"]["channels_last"] is True
    for c in cells:  # loosely: the machine is shared
        assert c["precision"] == "fp32" and c["frames"] > 0 and 0.5 <= c["window_s"] < 3
        assert 0 < c["p50_ms"] <= c["p99_ms"] < 2000 and 0 <= c["drop_share"] < 0.5
    assert out.with_suffix(".png").read_bytes().startswith(PNG_SIGNATURE)
