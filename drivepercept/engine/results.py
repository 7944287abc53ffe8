"""A finished batch's frames as `FrameResult`s: each detected frame's packed boxes mapped
back through its letterbox, each predicted one (a detection interval) with empty
`Detections` flagged for the tracking stage, and every frame's stage times."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from drivepercept.types import Batch, Detections, FrameResult, FrameTiming


def batch_results(
    batch: Batch,
    packed: np.ndarray,
    counts: list[int],
    class_names: tuple[str, ...],
    *,
    submit_ns: int,
    copy_done_ns: int,
    times_ns: Mapping[str, int],
    emitted_ns: int,
) -> list[FrameResult]:
    """The results of `batch`, whose first `len(counts)` frames the model saw: row k of
    `packed` (k, max detections, 6: xyxy, score, label) holds `counts[k]` boxes of frame k
    in model-input pixels."""
    results = []
    for row, meta in enumerate(batch.frames):
        if row >= len(counts):  # not detected: the tracking stage answers it
            detections = Detections.empty(class_names, predicted=True)
        else:
            rows = packed[row, : counts[row]]
            detections = Detections(
                xyxy=meta.letterbox.to_original(rows[:, :4]),
                scores=rows[:, 4].astype(np.float32),
                labels=rows[:, 5].astype(np.int64),
                class_names=class_names,
            )
        timing = FrameTiming(  # in STAMPS order
            *(meta.capture_ns, meta.decoded_ns, meta.preprocessed_ns, meta.queued_ns),
            *(batch.batched_ns, submit_ns, copy_done_ns, times_ns["compute_start"]),
            *(times_ns["inference_done"], times_ns["postprocessed"], emitted_ns),
        )
        results.append(FrameResult(meta, batch.batch_index, batch.size, detections, timing))
    return results
