"""Streaming AP ("Towards Streaming Perception", Li, Wang and Ramanan, ECCV 2020): each
labelled frame scored against the newest output that existed when it was captured.

A detector is scored offline on each frame's own output, however long that took. On the road
the world moves on meanwhile: at the moment frame k is captured (c_k) the newest thing the
system can act on is the output of an earlier frame j, emitted at or before c_k. Streaming AP
scores those boxes as frame k's detections, so latency costs accuracy: a slow model is one
or more frames behind, and every frame the live policy dropped is answered by an older
output. With `forecast`, each of those boxes is moved on by its tracked velocity (px/s, the
box's xyxy motion) over the time between frame j's capture and c_k, as a tracker that
predicts ahead would do.

Times are the pipeline's own (monotonic ns): each emitted frame's `capture_ns` and
`emitted_ns`. A frame the live policy dropped has no line; its capture time is the nearest
emitted frame's, moved by the difference of their labelled timestamps (`timestamp_s`; where
the labels have none, by the camera's frame period from the emitted frames). Scoring is the
COCO scorer's (`score_detections`), on the same frames for every variant.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from drivepercept.errors import ConfigError
from drivepercept.eval.report import EvalThresholds, StreamingScores
from drivepercept.eval.scoring import score_detections
from drivepercept.types.detections import moved_boxes

Record = Mapping[str, Any]


def capture_times_ns(
    frames: Sequence[tuple[int, float | None]], emitted: Mapping[int, int]
) -> dict[int, int]:
    """Each frame's capture time: its own where it was emitted, else the nearest emitted
    frame's moved by their timestamp difference (or, without timestamps, by the frame
    period the emitted frames show).

    Args:
        frames: (frame_index, timestamp_s or None) of every labelled frame of one camera.
        emitted: frame_index -> capture_ns of the frames that were emitted.
    """
    if not emitted:
        return {}
    stamps = dict(frames)
    known = sorted(emitted)
    period_ns = _period_ns(known, emitted)
    out = {}
    for k, t in frames:
        if k in emitted:
            out[k] = int(emitted[k])
            continue
        i = bisect.bisect_left(known, k)
        j = min(known[max(i - 1, 0) : i + 1], key=lambda j: abs(j - k))
        tj = stamps.get(j)
        if t is not None and tj is not None:
            out[k] = int(emitted[j] + round((t - tj) * 1e9))
        else:
            out[k] = int(emitted[j] + round((k - j) * period_ns))
    return out


def _period_ns(known: Sequence[int], emitted: Mapping[int, int]) -> float:
    """The camera's frame period from its emitted frames (median of capture-time steps per
    frame); 0 with fewer than two."""
    if len(known) < 2:
        return 0.0
    steps = [(emitted[b] - emitted[a]) / (b - a) for a, b in itertools.pairwise(known)]
    return float(np.median(steps))


def newest_outputs(
    capture_ns: Mapping[int, int], outputs: Sequence[Record]
) -> dict[int, Record | None]:
    """For each frame (frame_index -> capture time), the output emitted last at or before its
    capture (None: nothing yet). `outputs`: one camera's detections.jsonl lines."""
    ordered = sorted(
        outputs, key=lambda r: (int(r["timestamps"]["emitted_ns"]), int(r["frame_index"]))
    )
    emitted = [int(r["timestamps"]["emitted_ns"]) for r in ordered]
    found: dict[int, Record | None] = {}
    for k, c in capture_ns.items():
        i = bisect.bisect_right(emitted, c)
        found[k] = ordered[i - 1] if i else None
    return found


def forecast_boxes(
    boxes: Sequence[Sequence[float]],
    velocities: Sequence[Sequence[float | None] | None] | None,
    dt_s: float,
    size: tuple[float, float] | None,
) -> tuple[list[list[float]], list[int]]:
    """Boxes moved on by their velocities (px/s of x1, y1, x2, y2) over `dt_s`, clipped to
    the image (`size`: width, height); a box without a velocity stays. Returns the boxes and
    the indices of those kept (a box moved wholly out of the image is dropped). The lines'
    form of `Detections.moved_on` (`moved_boxes`)."""
    n = len(boxes)
    v = np.full((n, 4), np.nan)
    for i, row in enumerate((velocities or [])[:n]):
        if row is not None and all(x is not None for x in row):
            v[i] = row
    moved, kept = moved_boxes(boxes, v, dt_s, size)
    index = np.flatnonzero(kept)
    return moved[index].tolist(), index.tolist()


def streaming_frames(
    ground_truth: Mapping[str, Any],
    detections: Iterable[Record],
    *,
    forecast: bool,
    images: Iterable[tuple[str, int]] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[int, float]]]:
    """Each labelled frame with the detections streaming scores it on (the newest output at
    its capture, forecast or not), and per frame with an output its lag (frames, ms)."""
    wanted = None if images is None else {(str(c), int(k)) for c, k in images}
    labelled: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for im in ground_truth["images"]:
        if wanted is None or (str(im["camera"]), int(im["frame_index"])) in wanted:
            labelled[str(im["camera"])].append(im)
    by_camera: dict[str, list[Record]] = defaultdict(list)
    for d in detections:
        by_camera[str(d["camera"])].append(d)
    frames: list[dict[str, Any]] = []
    lags: list[tuple[int, float]] = []
    for cam, ims in labelled.items():
        outputs = by_camera.get(cam, [])
        captured = {int(r["frame_index"]): int(r["timestamps"]["capture_ns"]) for r in outputs}
        stamps = [(int(im["frame_index"]), im.get("timestamp_s")) for im in ims]
        capture = capture_times_ns(stamps, captured)
        used = newest_outputs(capture, outputs)
        for im in ims:
            k = int(im["frame_index"])
            frame: dict[str, Any] = {"camera": cam, "frame_index": k, "boxes": []}
            frame |= {"scores": [], "class_names": []}
            out = used.get(k)
            if out is not None:
                j_capture = int(out["timestamps"]["capture_ns"])
                lags.append((k - int(out["frame_index"]), (capture[k] - j_capture) / 1e6))
                frame |= _answer(out, (capture[k] - j_capture) / 1e9, im, forecast=forecast)
            frames.append(frame)
    return frames, lags


def _answer(out: Record, dt_s: float, image: Mapping[str, Any], *, forecast: bool) -> Record:
    """An output's boxes, scores and class names as another frame's (moved on by dt_s)."""
    boxes, scores, names = out["boxes"], out["scores"], out["class_names"]
    if not forecast:
        return {"boxes": boxes, "scores": scores, "class_names": names}
    size = (float(image["width"]), float(image["height"])) if "width" in image else None
    moved, kept = forecast_boxes(boxes, out.get("velocities"), dt_s, size)
    return {
        "boxes": moved,
        "scores": [scores[i] for i in kept],
        "class_names": [names[i] for i in kept],
    }


def score_streaming(
    ground_truth: Mapping[str, Any],
    detections: Iterable[Record],
    *,
    forecast: bool = False,
    thresholds: EvalThresholds | None = None,
    images: Iterable[tuple[str, int]] | None = None,
) -> StreamingScores:
    """Streaming AP next to offline AP of a real-time run (see the module docstring).

    Args:
        ground_truth: a COCO dict as `load_ground_truth` returns.
        detections: the run's detections.jsonl lines (with `timestamps`; with `velocities`
            for `forecast`).
        forecast: also score the outputs moved on to each frame's capture time.
        thresholds: which labelled objects are ignore regions.
        images: the (camera, frame_index) pairs scored (default: every labelled image).

    Raises:
        ConfigError: no labelled frame to score, or the detections lack timestamps.
    """
    records = list(detections)
    if any("timestamps" not in r for r in records):
        raise ConfigError("streaming AP needs the detections' timestamps (capture, emitted)")
    pairs = None if images is None else [(str(c), int(k)) for c, k in images]
    frames, lags = streaming_frames(ground_truth, records, forecast=False, images=pairs)
    scored = [(f["camera"], f["frame_index"]) for f in frames]
    if not scored:
        raise ConfigError("none of the evaluated frames (camera, frame_index) is labelled")
    wanted = set(scored)
    own = [r for r in records if (str(r["camera"]), int(r["frame_index"])) in wanted]
    th = thresholds or EvalThresholds()
    done = sorted({(str(r["camera"]), int(r["frame_index"])) for r in own})
    # offline: the emitted frames, each on its own output (none emitted: every frame missed)
    offline = score_detections(ground_truth, own, thresholds=th, images=done or scored)
    streaming = score_detections(
        ground_truth, frames, thresholds=th, images=scored, by_camera=False
    )
    moved = None
    if forecast:
        ahead, _ = streaming_frames(ground_truth, records, forecast=True, images=pairs)
        moved = score_detections(ground_truth, ahead, thresholds=th, images=scored, by_camera=False)
    lag = np.array(lags, float).reshape(-1, 2)
    return StreamingScores(
        offline=offline,
        streaming=streaming,
        forecast=moved,
        frames=len(scored),
        processed=len(done),
        without_output=len(scored) - len(lags),
        lag_frames=float(lag[:, 0].mean()) if len(lag) else -1.0,
        lag_ms=float(lag[:, 1].mean()) if len(lag) else -1.0,
    )
