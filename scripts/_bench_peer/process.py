"""bench_peer's process-wide settings: the torch and OpenCV threads each tool gets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------- process-wide settings


@dataclass
class Globals:
    """The process-wide settings each tool gets: torch intra-op threads and OpenCV threads.

    `torch_threads` and `cv2_threads` are what drivepercept found before Ultralytics was
    imported (for the record); `threads` is what both tools' networks run on.
    """

    torch_threads: int
    cv2_threads: int
    threads: int = 1

    def for_ours(self) -> None:
        import cv2
        import torch

        # the run's torch_threads setting says the same (the engine splits it over its CPU
        # lanes, and gives it to ONNX Runtime); set here too so nothing runs on the peer's
        torch.set_num_threads(self.threads)
        cv2.setNumThreads(self.cv2_threads)

    def for_peer(self) -> None:
        import cv2

        cv2.setNumThreads(0)  # what `import ultralytics` does
        # the predictor's set-up sets its own thread count (select_device: cpu_count - 1);
        # the matched rounds set `threads` in the on_predict_start callback


def _set_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def _get_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def host_cpu_ticks() -> tuple[int, int] | None:
    """(stolen, all) CPU ticks of the whole host since boot (Linux's /proc/stat: steal is
    time a vCPU was ready to run while the hypervisor ran another tenant); None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """The share of the host's CPU time stolen between two `host_cpu_ticks` (NaN unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return math.nan
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])
