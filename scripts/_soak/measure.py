"""The soak's measurements, pure: RSS growth, frame accounting, thread checks, and the
pass/fail criteria over them and the latency windows (scripts/_soak/latency.py; see
scripts/soak.py's docstring)."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _soak.latency import MODEL_DRIFT, LatencyWindows, latency_value, model_value

# ---------------------------------------------------------------------- pure pieces


@dataclass(frozen=True)
class Criterion:
    """One pass/fail check: what was measured against what was allowed."""

    name: str
    value: str
    limit: str
    passed: bool


@dataclass(frozen=True)
class RssGrowth:
    """RSS when warm-up ended and at the last sample of the run, in MB."""

    warmup_s: float
    after_warmup_mb: float
    end_mb: float
    max_mb: float

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.after_warmup_mb


def warmup_s_for(duration_s: float, warmup_s: float | None = None) -> float:
    """The memory warm-up: as given, else the first minute, or the first 10 % of a run
    shorter than 10 minutes."""
    if warmup_s is not None:
        return warmup_s
    return 60.0 if duration_s >= 600.0 else 0.1 * duration_s


def rss_growth(samples: Sequence[tuple[float, float]], *, warmup_s: float) -> RssGrowth:
    """(t_s, rss_mb) samples in time order -> the RSS at the first sample at or after
    `warmup_s` and at the last one.

    Raises:
        ValueError: no sample at or after the warm-up.
    """
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if not after:
        last = samples[-1][0] if samples else None
        raise ValueError(f"expected a sample at or after {warmup_s:g} s, the last is at {last}")
    return RssGrowth(
        warmup_s=warmup_s,
        after_warmup_mb=after[0][1],
        end_mb=after[-1][1],
        max_mb=max(rss for _, rss in samples),
    )


@dataclass(frozen=True)
class Accounting:
    """Where one camera's served frames went (see scripts/soak.py's docstring)."""

    camera: str
    served: int  # written by the server to our client's socket(s)
    read: int  # taken from FFmpeg by the decoder thread
    processed: int
    dropped: int
    discarded: int
    connects: int
    tolerance: int  # frames one connection may leave unread in its buffers

    @property
    def unread(self) -> int:
        """Served, never read: in socket / FFmpeg buffers at the stop or at a broken link."""
        return self.served - self.read

    @property
    def pipeline_balanced(self) -> bool:
        """read = processed + dropped + discarded: the pipeline lost no frame it read."""
        return self.read == self.processed + self.dropped + self.discarded

    @property
    def allowed_unread(self) -> int:
        return self.tolerance * max(1, self.connects)

    @property
    def passed(self) -> bool:
        return self.pipeline_balanced and 0 <= self.unread <= self.allowed_unread


@dataclass(frozen=True)
class ThreadCheck:
    """Thread counts around the run: Python threads by name, and the OS's threads by id.

    A native leak is a thread the run started that is still alive after it (`new_os`), not a
    lower count: the served cameras' FFmpeg decoder threads, in the baseline, end for good
    once their clip's first pass is kept (18 of them with 6 cameras on 2 cores), so the
    count after a clean run is below the one before."""

    before_names: tuple[str, ...]
    after_names: tuple[str, ...]
    before_os: int
    after_os: int
    during_max_py: int
    during_max_os: int
    new_os: int = 0  # OS threads alive after the run (in every reading) that were not before

    @property
    def leaked(self) -> list[str]:
        """Python threads alive after the run that were not before it."""
        extra = collections.Counter(self.after_names) - collections.Counter(self.before_names)
        return sorted(extra.elements())

    @property
    def gone(self) -> list[str]:
        """Python threads alive before the run that are not after it."""
        missing = collections.Counter(self.before_names) - collections.Counter(self.after_names)
        return sorted(missing.elements())

    @property
    def passed(self) -> bool:
        return not self.leaked and not self.gone and self.new_os == 0


def criteria(
    *,
    threads: ThreadCheck,
    rss: RssGrowth,
    latency: LatencyWindows,
    accounting: Sequence[Accounting],
    rss_limit_mb: float,
    latency_ratio: float,
    run_status: str,
    model_ratio: float = MODEL_DRIFT,
    threads_not_stopped: Sequence[str],
) -> list[Criterion]:
    """Every pass/fail check of a soak, in the order they are printed."""
    out = [
        Criterion("run completed", run_status, "complete", run_status == "complete"),
        Criterion(
            "pipeline threads stopped",
            ", ".join(threads_not_stopped) or "all",
            "all",
            not threads_not_stopped,
        ),
        Criterion(
            "no thread leak (python)",
            f"before {len(threads.before_names)}, after {len(threads.after_names)}"
            + (f", new {threads.leaked}" if threads.leaked else "")
            + (f", gone {threads.gone}" if threads.gone else ""),
            "after == before",
            not threads.leaked and not threads.gone,
        ),
        Criterion(
            "no thread leak (os)",
            f"before {threads.before_os}, after {threads.after_os}, new {threads.new_os}",
            "new == 0",
            threads.new_os == 0,
        ),
        Criterion(
            "rss growth after warm-up",
            f"{rss.growth_mb:+.1f} MB ({rss.after_warmup_mb:.1f} -> {rss.end_mb:.1f})",
            f"< {rss_limit_mb:g} MB",
            rss.growth_mb < rss_limit_mb,
        ),
        Criterion(
            "p99 latency less the engine's time, last / first third, over the host's slowdown",
            latency_value(latency),
            f"<= {latency_ratio:g}",
            latency.steady_ratio <= latency_ratio,  # NaN fails
        ),
        Criterion(
            "model time per batch, mean, last / first third",
            model_value(latency),
            f"<= {model_ratio:g}",
            latency.model_ratio <= model_ratio,  # NaN fails
        ),
    ]
    for a in accounting:
        out.append(
            Criterion(
                f"frames accounted for: {a.camera}",
                f"served {a.served} = processed {a.processed} + dropped {a.dropped} "
                f"+ discarded {a.discarded} + unread {a.unread}",
                f"read balanced, 0 <= unread <= {a.allowed_unread}",
                a.passed,
            )
        )
    return out


def camera_pairs(videos: Sequence[tuple[str, Path]], count: int) -> list[tuple[str, Path]]:
    """`count` (name, video) cameras from the given clips, reusing them in turn when there are
    fewer (a reused clip's camera is named <name>-2, <name>-3, ...)."""
    if not videos or count < 1:
        raise ValueError(f"expected >= 1 clip and >= 1 camera, got {len(videos)} and {count}")
    out = []
    for k, (name, path) in zip(range(count), itertools.cycle(videos)):
        lap = k // len(videos)
        out.append((name if lap == 0 else f"{name}-{lap + 1}", path))
    return out
