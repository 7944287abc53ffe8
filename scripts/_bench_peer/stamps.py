"""bench_peer's arrival stamps: when each frame reached Ultralytics' reader threads."""

from __future__ import annotations

import contextlib
import threading
import time
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _bench_peer.network import _Ultralytics


# ---------------------------------------------------------------------- peer arrival stamps


class ArrivalStamps:
    """When each frame Ultralytics' reader threads took from OpenCV came in, by array id.

    Thread-safety: reader threads write, the main thread reads; one lock. A frame the
    loader replaced by a newer one is never looked up; entries older than `keep_s` go.
    """

    def __init__(self, keep_s: float = 5.0) -> None:
        self._lock = threading.Lock()
        self._stamps: dict[int, int] = {}
        self._keep_ns = int(keep_s * 1e9)

    def put(self, image: object, arrived_ns: int) -> None:
        with self._lock:
            self._stamps[id(image)] = arrived_ns
            if len(self._stamps) > 4096:
                oldest = arrived_ns - self._keep_ns
                self._stamps = {k: v for k, v in self._stamps.items() if v >= oldest}

    def take(self, image: object) -> int | None:
        with self._lock:
            return self._stamps.pop(id(image), None)


@contextlib.contextmanager
def stamped_loader(peer: _Ultralytics, stamps: ArrivalStamps) -> Iterator[None]:
    """Give Ultralytics' loader module (only it) a `cv2` whose VideoCapture stamps each frame
    when `grab()`/`read()` returns it (OpenCV has then read and decoded it)."""
    import cv2

    class StampedCapture:
        """A `cv2.VideoCapture` by composition (a Python subclass of OpenCV's class crashed
        the process after a few live rounds): the calls LoadStreams makes, stamped."""

        def __init__(self, *args: Any) -> None:
            self._capture = cv2.VideoCapture(*args)
            self._grabbed_ns = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._capture, name)

        def grab(self) -> bool:
            ok = bool(self._capture.grab())
            self._grabbed_ns = time.monotonic_ns()
            return ok

        def retrieve(self, *args: Any) -> tuple[bool, Any]:
            ok, image = self._capture.retrieve(*args)
            if ok and image is not None:
                stamps.put(image, self._grabbed_ns)
            return ok, image

        def read(self, *args: Any) -> tuple[bool, Any]:
            ok, image = self._capture.read(*args)
            if ok and image is not None:
                stamps.put(image, time.monotonic_ns())
            return ok, image

    proxy = types.ModuleType("cv2_stamped")
    proxy.__dict__.update(cv2.__dict__)
    proxy.VideoCapture = StampedCapture  # type: ignore[attr-defined]
    original = peer.loaders.cv2
    peer.loaders.cv2 = proxy
    try:
        yield
    finally:
        peer.loaders.cv2 = original
