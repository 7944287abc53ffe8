"""bench_peer's process-wide settings: the torch and OpenCV threads each tool gets."""

from __future__ import annotations

from dataclasses import dataclass

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
