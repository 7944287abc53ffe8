"""Run folder -> latency report: summary.json, latency.csv, report.html, trace.json; and the
comparison of two runs.

`write_report(run_dir)` reads what the run left (run.json, frames.csv, load.csv), however the
run ended, and writes the chosen formats next to them. Files are written whole (to a temporary
name, then renamed), so a report is never half a file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.report.rundata import ReportError, RunData, load_run
from drivepercept.report.summary import (
    DEFAULT_BUDGET_MS,
    DEFAULT_WINDOW_S,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_VERSION,
    build_summary,
    latency_csv,
)
from drivepercept.rundir import RunDir, write_text

log = logging.getLogger(__name__)

FORMATS: dict[str, str] = {
    "json": RunDir.SUMMARY_JSON,
    "csv": RunDir.LATENCY_CSV,
    "html": RunDir.REPORT_HTML,
    "trace": RunDir.TRACE_JSON,
}
ALL_FORMATS: tuple[str, ...] = ("html", "json", "csv", "trace")


@dataclass(frozen=True)
class ReportResult:
    run_dir: Path
    files: tuple[Path, ...]
    summary: dict[str, Any]
    problems: tuple[str, ...]


def parse_formats(text: str | Iterable[str]) -> tuple[str, ...]:
    """'html,json' -> ('html', 'json'); unknown names are a ConfigError."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        raise ConfigError(
            f"report formats are {', '.join(ALL_FORMATS)} (comma-separated), got {text!r}"
        )
    return names


def write_report(
    run_dir: Path | str,
    *,
    formats: Iterable[str] = ALL_FORMATS,
    budget_ms: float = DEFAULT_BUDGET_MS,
    window_s: float = DEFAULT_WINDOW_S,
    data: RunData | None = None,
) -> ReportResult:
    """Write the report files of a run folder into it.

    Raises:
        ReportError: there is nothing to report on (no folder, no frames.csv).
        ConfigError: a bad format name or budget.
        OutputError: a file cannot be written.
    """
    from drivepercept.report.html import render_html  # matplotlib: only when writing
    from drivepercept.report.trace import build_trace

    chosen = parse_formats(list(formats))
    if not budget_ms > 0:
        raise ConfigError(f"budget_ms must be > 0, got {budget_ms:g}")
    data = data or load_run(run_dir)
    summary = build_summary(data, budget_ms=budget_ms, window_s=window_s)
    files = []
    for fmt in chosen:
        path = data.run_dir / FORMATS[fmt]
        if fmt == "json":
            write_text(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
        elif fmt == "csv":
            write_text(path, latency_csv(summary))
        elif fmt == "html":
            write_text(path, render_html(data, summary))
        else:
            write_text(path, json.dumps(build_trace(data), separators=(",", ":")) + "\n")
        files.append(path)
    return ReportResult(
        run_dir=data.run_dir, files=tuple(files), summary=summary, problems=data.problems
    )


@dataclass(frozen=True)
class ComparisonResult:
    html: Path
    text: str
    problems: tuple[str, ...]


def write_comparison(
    run_a: Path | str,
    run_b: Path | str,
    *,
    budget_ms: float = DEFAULT_BUDGET_MS,
    out: Path | None = None,
) -> ComparisonResult:
    """Compare two runs: a table of key figures (B / A) and `compare-<B>.html` in run A's
    folder (or `out`).

    Raises:
        ReportError, ConfigError, OutputError: as `write_report`.
    """
    from drivepercept.report.compare import comparison_text, render_comparison

    if not budget_ms > 0:
        raise ConfigError(f"budget_ms must be > 0, got {budget_ms:g}")
    a, b = load_run(run_a), load_run(run_b)
    sa = build_summary(a, budget_ms=budget_ms)
    sb = build_summary(b, budget_ms=budget_ms)
    path = out or RunDir(a.run_dir).comparison_html(b.name)
    write_text(path, render_comparison(a, sa, b, sb))
    problems = tuple(f"{a.name}: {p}" for p in a.problems) + tuple(
        f"{b.name}: {p}" for p in b.problems
    )
    return ComparisonResult(html=path, text=comparison_text(sa, sb), problems=problems)


__all__ = [
    "ALL_FORMATS",
    "DEFAULT_BUDGET_MS",
    "FORMATS",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_VERSION",
    "ComparisonResult",
    "ReportError",
    "ReportResult",
    "RunData",
    "build_summary",
    "load_run",
    "parse_formats",
    "write_comparison",
    "write_report",
]
