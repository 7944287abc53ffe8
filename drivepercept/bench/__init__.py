"""The benchmark suite (`drivepercept bench`), over the jobs in `drivepercept.run`.

    from drivepercept.bench import BenchRequest, run_bench
    from drivepercept.run import RunOptions

    report = run_bench(RunOptions(sources=("sample_videos/rig.toml",)), BenchRequest("ceiling"))
    print(report.table())

`run_bench` runs any of the modes (`BENCH_MODES`: ceiling, pipeline, naive, live, capacity,
sweep, and the default three-way comparison); each mode's own entry point, result type and
knobs are in its module (`compare`, `ceiling`, `live`, `capacity`, `sweep`), their shared
parts in `common`. Importing this package loads neither torch nor OpenCV: a benchmark does,
when it runs.
"""

from __future__ import annotations

from drivepercept.bench.grid import SweepGrid
from drivepercept.bench.suite import (
    BENCH_MODES,
    SIMULATED,
    BenchReport,
    BenchRequest,
    run_bench,
    write_bench_json,
    write_bench_plot,
)

__all__ = [
    "BENCH_MODES",
    "SIMULATED",
    "BenchReport",
    "BenchRequest",
    "SweepGrid",
    "run_bench",
    "write_bench_json",
    "write_bench_plot",
]
