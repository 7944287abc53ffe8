"""The `encode` thread of `drivepercept simulate`: the renderer's frames, written to disk.

The main thread renders; one named `encode` thread runs a writer's `write` on each rendered
instant (OpenCV releases the GIL while it encodes, so on two cores rendering and encoding
overlap). They are joined by a bounded queue: a slow disk slows the renderer down instead of
filling memory. The thread's error is recorded and re-raised on the main thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from drivepercept.errors import OutputError

log = logging.getLogger(__name__)

QUEUE_DEPTH = 4
JOIN_TIMEOUT_S = 30.0
_STOP = object()

Item = TypeVar("Item")


class EncodeThread(Generic[Item]):
    """Runs `write(item)` for each submitted item, in order, on a thread named `encode`.

    Args:
        write: what the thread does with one item (encode one instant of every camera).
        what: names the output in errors ("video encoding failed: ...").
    """

    def __init__(self, write: Callable[[Item], None], *, what: str) -> None:
        self._write = write
        self._what = what
        self._queue: queue.Queue[object] = queue.Queue(maxsize=QUEUE_DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="encode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                self._write(item)  # type: ignore[arg-type]
        except BaseException as exc:  # recorded and re-raised on the main thread
            self._error = exc

    def submit(self, item: Item) -> None:
        """Queue one item; blocks while the queue is full, fails if the thread died."""
        while True:
            self.raise_if_failed()
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    self.raise_if_failed()
                    raise OutputError(f"{self._what} thread stopped unexpectedly") from None

    def raise_if_failed(self) -> None:
        """Re-raise the thread's error, as an OutputError naming the output."""
        if self._error is not None:
            raise OutputError(f"{self._what} failed: {self._error}") from self._error

    def stop(self) -> None:
        """Write what is queued, then stop and join the thread (its error is kept for
        `raise_if_failed`); a thread that does not stop in time is logged."""
        if self._thread.is_alive():
            while True:
                try:
                    self._queue.put(_STOP, timeout=0.5)
                    break
                except queue.Full:
                    if not self._thread.is_alive():
                        break
            self._thread.join(timeout=JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("encode thread did not stop within %.0f s", JOIN_TIMEOUT_S)
