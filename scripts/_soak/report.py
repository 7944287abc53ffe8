"""The soak's outcome: everything measured, as soak.json and as the printed table."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from _soak.latency import LatencyWindows
from _soak.measure import Accounting, Criterion, RssGrowth, ThreadCheck
from _soak.sampling import Sample


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity turned into None (soak.json is strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass
class Outcome:
    """Everything measured, ready for soak.json."""

    settings: dict[str, Any]
    threads: ThreadCheck
    rss: RssGrowth
    rss_after_run_mb: float
    latency: LatencyWindows
    accounting: list[Accounting]
    extra: dict[str, Any]
    samples: list[Sample]
    criteria: list[Criterion]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)

    def to_json(self) -> dict[str, Any]:
        samples = [
            {**asdict(s), "cameras": [{**asdict(c), "in_transit": c.in_transit} for c in s.cameras]}
            for s in self.samples
        ]
        data = {
            "passed": self.passed,
            "settings": self.settings,
            "criteria": [asdict(c) for c in self.criteria],
            "threads": {
                **asdict(self.threads),
                "leaked": self.threads.leaked,
                "gone": self.threads.gone,
            },
            "rss": {
                **asdict(self.rss),
                "growth_mb": round(self.rss.growth_mb, 2),
                "after_run_mb": self.rss_after_run_mb,
            },
            "latency": {
                **asdict(self.latency),
                "ratio": round(self.latency.ratio, 4),
                "thirds_ratio": round(self.latency.thirds_ratio, 4),
                "own_ratio": round(self.latency.own_ratio, 4),
                "model_ratio": round(self.latency.model_ratio, 4),
                "steady_ratio": round(self.latency.steady_ratio, 4),
            },
            "accounting": [
                {
                    **asdict(a),
                    "unread": a.unread,
                    "allowed_unread": a.allowed_unread,
                    "pipeline_balanced": a.pipeline_balanced,
                    "passed": a.passed,
                }
                for a in self.accounting
            ],
            **self.extra,
            "samples": samples,
        }
        out: dict[str, Any] = _finite(data)
        return out


def table(outcome: Outcome) -> Iterator[str]:
    """The figures and the verdicts, as printed."""
    s = outcome.settings
    t = outcome.threads
    yield (
        f"soak: {len(s['cameras'])} cameras at {s['fps']:g} fps for {s['duration_s']:g} s, "
        f"model {s['model']} ({s['weights_note']}), device {s['device']}, "
        f"load average {s['loadavg_before'][0]:.2f} -> {s['loadavg_after'][0]:.2f} "
        f"on {s['cpu_count']} CPUs"
    )
    summary = outcome.extra["run_summary"]
    yield (
        f"run      {summary['frames']} frames in {summary['elapsed_s']} s "
        f"({summary['throughput_fps']} fps, mean batch {summary['mean_batch_size']}), "
        f"{outcome.extra['run_dir']}"
    )
    yield (
        f"threads  python: before {len(t.before_names)}, during max {t.during_max_py}, "
        f"after {len(t.after_names)}   os: before {t.before_os}, during max "
        f"{t.during_max_os}, after {t.after_os}"
    )
    r = outcome.rss
    yield (
        f"rss      after {r.warmup_s:g} s warm-up {r.after_warmup_mb:.1f} MB, end "
        f"{r.end_mb:.1f} MB, growth {r.growth_mb:+.1f} MB, max {r.max_mb:.1f} MB, "
        f"after the run {outcome.rss_after_run_mb:.1f} MB"
    )
    lat = outcome.latency
    parts = (("first", lat.window_s, lat.first), ("last", lat.window_s, lat.last))
    yield "latency  part                  frames  end to end p99  own p99  model mean  model p99"
    for name, w, p in (*parts, ("first third", None, lat.early), ("last third", None, lat.late)):
        label = name if w is None else f"{name} {w:.0f} s"
        yield (
            f"         {label:<20}{p.frames:>8}{p.p99_ms:>13.1f} ms{p.own_p99_ms:>6.1f} ms"
            f"{p.model_mean_ms:>9.1f} ms{p.model_p99_ms:>8.1f} ms"
        )
    yield (
        f"         own = end to end less the engine's time (the model's call, the wait for the "
        f"batch before); end to end last / first third {lat.thirds_ratio:.3f}, last / first "
        f"{lat.window_s:.0f} s {lat.ratio:.3f}"
    )
    load = outcome.extra.get("host_cpu_cores")
    if load is not None:
        yield (
            f"host     CPU cores in use: this process {load['process_mean']:.2f} (mean), other "
            f"processes {load['others_mean']:.2f} (max {load['others_max']:.2f} over a "
            f"sample), stolen by the hypervisor {load['steal_mean']:.2f} (max "
            f"{load['steal_max']:.2f})"
        )
    transit = outcome.extra["in_transit_during_run"]
    outages = outcome.extra["outages"]
    skipped = outcome.extra["server"]["skipped_slow_client"]
    yield (
        "frames   served = read + unread; read = processed + dropped + discarded "
        "(unread: written to the socket after the decoder's last read, at the stop or at a "
        "broken connection; allowed: tolerance x connects)"
    )
    yield (
        f"{'camera':<14}{'served':>8}{'read':>8}{'processed':>10}{'dropped':>9}"
        f"{'discarded':>10}{'unread':>8}{'allowed':>8}{'connects':>9}{'transit max':>12}"
        f"{'outage est':>11}{'srv skipped':>12}"
    )
    for a in outcome.accounting:
        yield (
            f"{a.camera:<14}{a.served:>8}{a.read:>8}{a.processed:>10}{a.dropped:>9}"
            f"{a.discarded:>10}{a.unread:>8}{a.allowed_unread:>8}{a.connects:>9}"
            f"{transit.get(a.camera, {}).get('max', 0):>12}"
            f"{outages[a.camera]['frames_lost_estimate']:>11}{skipped[a.camera]:>12}"
        )
    for c in outcome.criteria:
        yield f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.value} (limit {c.limit})"
