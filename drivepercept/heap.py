"""The process's heap frozen for a run (`PipelineConfig.freeze_heap`).

Python's cyclic garbage collector walks every tracked object in a full collection: in a
process with a model loaded (about 350-420 thousand objects) that took 150-220 ms on the
2-core development machine, holding the GIL, more than a latency budget. Collected once
after the warm-up and frozen (`gc.freeze`), those objects are skipped by every later
collection (a forced full one: 0.2-0.3 ms). Thawed when the run ends, so that what it froze
can be collected again.
"""

from __future__ import annotations

import gc


class FrozenHeap:
    """Freezes the heap once (`freeze`) and thaws it (`thaw`); both idempotent. A heap that
    something else froze (the caller, before a fork; another pipeline still running) is left
    as it is: `gc.unfreeze` would thaw all of it, not only what this froze."""

    def __init__(self) -> None:
        self.frozen = False

    def freeze(self) -> None:
        if not self.frozen and gc.get_freeze_count() == 0:
            gc.collect()
            gc.freeze()
            self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
