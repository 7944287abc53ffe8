"""How torch's intra-op threads wait: the one process-wide CPU setting made at import.

torch's CPU kernels run on GNU OpenMP threads (one per core by default). Left alone, a thread
that reaches the end of a parallel region spins for a while before it sleeps, on the bet that
it owns its core. In this pipeline it does not: decoder threads, the batcher and the sinks run
on the same cores, and a spinning thread takes the core from the one it waits for. Measured on
a 2-core machine (YOLOv8n-size network at 320x320, batch of 6): with one other busy process
a batch took 2048 ms with the default wait and 146-258 ms with `PASSIVE`; with nothing else
running the two are alike (replay pipeline 37.2 and 37.8 frames/s, model alone 46.4 and 45.1;
docs/BENCHMARKS.md, "CPU layout", and scripts/bench_cpu_layout.py).

libgomp reads `OMP_WAIT_POLICY` once, when torch loads it, so this can only take effect when
drivepercept is imported before torch; a value the user set is kept either way.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def prefer_passive_waits() -> None:
    """Ask OpenMP for passive waits unless torch is loaded already or the user chose."""
    if "torch" not in sys.modules:
        os.environ.setdefault(WAIT_POLICY_ENV, PASSIVE)


def wait_policy() -> str:
    """The wait policy this process's OpenMP threads use, as far as the environment tells:
    the variable's value, or "default (spin, then sleep)" when it is unset."""
    return os.environ.get(WAIT_POLICY_ENV) or "default (spin, then sleep)"
