"""bench_peer's process-wide settings: the torch and OpenCV threads each tool gets."""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------- process-wide settings


@dataclass
class Globals:
    """The process-wide settings each tool gets: torch intra-op threads and OpenCV threads."""

    torch_threads: int
    cv2_threads: int
    forced_threads: int = 0

    def for_ours(self) -> None:
        import cv2
        import torch

        torch.set_num_threads(self.forced_threads or self.torch_threads)
        cv2.setNumThreads(self.cv2_threads)

    def for_peer(self) -> None:
        import cv2

        cv2.setNumThreads(0)  # what `import ultralytics` does
        # the predictor's set-up sets its own thread count (select_device); --threads
        # overrides it in the on_predict_start callback


def _set_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def _get_threads() -> int:
    import torch

    return int(torch.get_num_threads())
