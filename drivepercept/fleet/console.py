"""The fleet on a terminal: a progress line over drives and frames, and the closing table."""

from __future__ import annotations

import sys
from typing import TextIO

from drivepercept.fleet.job import FleetResult
from drivepercept.fleet.scheduler import FleetProgress


class FleetBar:
    """One line on stderr, redrawn in place: drives done, failures, frames, frames/s."""

    def __init__(self, *, enabled: bool, out: TextIO | None = None) -> None:
        self.enabled = enabled
        self.out = out or sys.stderr  # when made, not at import: the CLI may have swapped it
        self.drawn = False

    def __call__(self, p: FleetProgress) -> None:
        if not self.enabled:
            return
        bar = "#" * int(20 * p.done / max(p.drives, 1))
        rate = p.frames / p.elapsed_s if p.elapsed_s > 0 else 0.0
        running = ", ".join(p.running[:3]) + (" ..." if len(p.running) > 3 else "")
        self.out.write(
            f"\r\x1b[K[{bar:<20}] {p.done}/{p.drives} drives ({p.failed} not complete)  "
            f"{p.frames} frames  {rate:.1f} frames/s  running: {running or '-'}"
        )
        self.out.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.drawn:
            self.out.write("\n")


def fleet_table(result: FleetResult) -> str:
    """Drive by drive, then the totals (latency over every frame of the fleet)."""
    rows = [
        f"{'drive':<24} {'status':<9} {'frames':>7} {'frames/s':>9} {'p50 ms':>8} {'retries':>7}"
    ]
    for d in result.record["drives"]:
        p50 = (d.get("latency_ms") or {}).get("p50")
        rows.append(
            f"{d['drive']:<24} {d['status'] + ('*' if d.get('resumed') else ''):<9} "
            f"{d['frames']:>7} {d['throughput_fps']:>9.1f} "
            f"{p50 if p50 is not None else float('nan'):>8.1f} {d['retries']:>7}"
        )
    t = result.record["totals"]
    lat = t["latency_ms"]
    acc = t.get("accuracy")
    rows.append(
        f"fleet: {t['complete']}/{t['drives']} drives complete, {t['frames']} frames, "
        f"{t['throughput_fps']:.1f} frames/s over {result.record['wall_s']:.1f} s, "
        f"{t['retries']} retries; latency p50 {lat['p50']} ms, p99 {lat['p99']} ms"
        + (f"; pooled mAP@.5 {acc['map_50']}" if acc else "")
        + (" (* resumed: not run again)" if t["resumed"] else "")
    )
    return "\n".join(rows)
