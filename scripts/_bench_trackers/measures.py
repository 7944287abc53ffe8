"""The identity measures TrackEval's figures do not give, as small pure functions on one
camera's frames (a `Frame` a labelled frame, in time order).

Every measure rests on one matching, the one TrackEval's CLEAR makes for MOTA and its ID
switches (`clear_pairs`): per frame, target boxes and tracked boxes one-to-one at IoU >= 0.5
(Hungarian, `drivepercept.eval.tracking.match` on `box_iou`), preferring to keep the pairs of
the previous frame. The switches counted here are therefore CLEAR's own (the scorer's "IDsw"),
and what they are split into adds up to them:

* ids per object: distinct tracked ids each world object was matched to, over the objects
  matched at all (1.0: every object kept one id).
* restart: a switch to an id that was born in that frame (the tracker lost the object and
  started a new track on it), with the gap since the object's previous matched frame; a
  restart after a gap of at most `short_gap_s` is one a tracker keeping lost tracks that
  long could have avoided.
* taken over: a switch to an id that existed before (another object's track, or one that
  wandered).
* extra ids: the ids beyond each object's first (what ids per object is over 1), each told by
  what came before it on its object: the gap since an earlier id was last matched to it (at
  most `short_gap_s`, at most `LONG_GAP_S`, longer), or none (it came while an earlier id
  was still matched to the object in later frames: two tracks on one object, or a track
  taking its box for a while); and how many of them were matched to another object too.
* never given an id: world objects some box of the detector matched (one-to-one, IoU >= 0.5,
  every box of the frame, tracked or not, scoring at least `min_score`) in some frame, but no
  tracked box ever did.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drivepercept.eval.tracking import MATCH_IOU, box_iou, match

Boxes = npt.NDArray[np.float64]
Floats = npt.NDArray[np.float64]
Pair = tuple[Hashable, Hashable]  # (world id, tracked id)
CONTINUE_BONUS = 1000.0  # CLEAR's weight for keeping last frame's pair
LONG_GAP_S = 3.0  # an extra id after a longer gap: its object was hidden or away that long
_EPS = float(np.finfo("float").eps)


def _boxes(value: object) -> Boxes:
    return np.asarray(value, np.float64).reshape(-1, 4)


@dataclass(frozen=True)
class Frame:
    """One labelled frame of one camera.

    Attributes:
        t_s: its time in seconds.
        gt_ids: the world id of each target box (ignore regions left out).
        gt_boxes: `(G, 4)` the target boxes, xyxy.
        pred_ids: the tracked id of each scored tracked box (unique within the frame).
        pred_boxes: `(P, 4)` those boxes.
        det_boxes: `(D, 4)` every box the detector gave in the frame, tracked or not.
        det_scores: `(D,)` their scores.
    """

    t_s: float
    gt_ids: tuple[Hashable, ...]
    gt_boxes: Boxes
    pred_ids: tuple[Hashable, ...]
    pred_boxes: Boxes
    det_boxes: Boxes = field(default_factory=lambda: np.zeros((0, 4)))
    det_scores: Floats = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        for name, ids, n in (
            ("gt_boxes", self.gt_ids, len(_boxes(self.gt_boxes))),
            ("pred_boxes", self.pred_ids, len(_boxes(self.pred_boxes))),
        ):
            if len(ids) != n:
                raise ValueError(f"{name}: expected {len(ids)} boxes (one per id), got {n}")
        if len(_boxes(self.det_boxes)) != len(np.asarray(self.det_scores).reshape(-1)):
            raise ValueError(
                f"det_scores: expected {len(_boxes(self.det_boxes))} scores (one per box), "
                f"got {len(np.asarray(self.det_scores).reshape(-1))}"
            )
        if len(set(self.pred_ids)) != len(self.pred_ids):
            raise ValueError(f"pred_ids must be unique within a frame, got {self.pred_ids}")


def clear_pairs(frames: Sequence[Frame], threshold: float = MATCH_IOU) -> list[list[Pair]]:
    """Each frame's (world id, tracked id) pairs as TrackEval's CLEAR matches them: IoU >=
    `threshold`, one-to-one, a pair that continues the previous matched frame's first.

    As in CLEAR, a frame without targets or without tracked boxes matches nothing and does
    not end the continuation: the pairs kept are those of the last frame that had both.
    """
    out: list[list[Pair]] = []
    previous: dict[Hashable, Hashable] = {}
    for f in frames:
        if not f.gt_ids or not f.pred_ids:
            out.append([])
            continue
        iou = box_iou(_boxes(f.gt_boxes), _boxes(f.pred_boxes))
        keeps = np.array(
            [[g in previous and previous[g] == p for p in f.pred_ids] for g in f.gt_ids], bool
        )
        score = np.where(iou >= threshold - _EPS, CONTINUE_BONUS * keeps + iou, 0.0)
        pairs = [(f.gt_ids[r], f.pred_ids[c]) for r, c in match(score, threshold)]
        previous = dict(pairs)
        out.append(pairs)
    return out


def first_frames(frames: Sequence[Frame]) -> dict[Hashable, int]:
    """Where each tracked id first appears (index into `frames`)."""
    born: dict[Hashable, int] = {}
    for k, f in enumerate(frames):
        for p in f.pred_ids:
            born.setdefault(p, k)
    return born


@dataclass(frozen=True)
class Switch:
    """One ID switch: the world object `gt_id`, matched to `old_id` last, is matched to
    `new_id` in frame `frame` (index into the frames)."""

    frame: int
    gt_id: Hashable
    old_id: Hashable
    new_id: Hashable
    restart: bool  # new_id was born in this frame
    gap_s: float  # since the object's previous matched frame


def switches(
    frames: Sequence[Frame],
    pairs: Sequence[Sequence[Pair]],
    born: Mapping[Hashable, int] | None = None,
) -> list[Switch]:
    """The ID switches of `pairs` (CLEAR's rule: a matched object whose id differs from the
    one it was last matched to, however long ago), each told restart or take-over.

    Args:
        frames: the camera's frames, in time order.
        pairs: `clear_pairs(frames)`.
        born: where each id first appeared in the tracker's output (index into `frames`);
            ids missing from it: their first scored appearance (`first_frames`).
    """
    if len(pairs) != len(frames):
        raise ValueError(f"expected one list of pairs per frame ({len(frames)}), got {len(pairs)}")
    first = first_frames(frames)
    if born is not None:
        first.update(born)
    last: dict[Hashable, tuple[Hashable, float]] = {}
    out: list[Switch] = []
    for k, (f, matched) in enumerate(zip(frames, pairs, strict=True)):
        for g, p in matched:
            if g in last and last[g][0] != p:
                old, seen_s = last[g]
                out.append(Switch(k, g, old, p, restart=first[p] == k, gap_s=f.t_s - seen_s))
            last[g] = (p, f.t_s)
    return out


@dataclass(frozen=True)
class ExtraIds:
    """The ids beyond each object's first, by what came before each (see the module
    docstring); `shared` counts those of them also matched to another object."""

    after_short_gap: int = 0
    after_mid_gap: int = 0
    after_long_gap: int = 0
    overlapping: int = 0
    shared: int = 0

    @property
    def total(self) -> int:
        return self.after_short_gap + self.after_mid_gap + self.after_long_gap + self.overlapping

    def __add__(self, other: ExtraIds) -> ExtraIds:
        return ExtraIds(
            self.after_short_gap + other.after_short_gap,
            self.after_mid_gap + other.after_mid_gap,
            self.after_long_gap + other.after_long_gap,
            self.overlapping + other.overlapping,
            self.shared + other.shared,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "total": self.total,
            "after_short_gap": self.after_short_gap,
            "after_mid_gap": self.after_mid_gap,
            "after_long_gap": self.after_long_gap,
            "overlapping": self.overlapping,
            "shared": self.shared,
        }


def extra_ids(
    frames: Sequence[Frame],
    pairs: Sequence[Sequence[Pair]],
    *,
    short_gap_s: float = 1.0,
    long_gap_s: float = LONG_GAP_S,
) -> ExtraIds:
    """Each object's ids beyond its first (in the order of their first match to it), told
    by the gap since an earlier id of it was last matched, or overlapping (see the module
    docstring)."""
    if len(pairs) != len(frames):
        raise ValueError(f"expected one list of pairs per frame ({len(frames)}), got {len(pairs)}")
    spans: dict[Pair, list[int]] = {}  # (object, id) -> [first frame, last frame]
    objects_of: dict[Hashable, set[Hashable]] = defaultdict(set)
    for k, matched in enumerate(pairs):
        for g, p in matched:
            spans.setdefault((g, p), [k, k])[1] = k
            objects_of[p].add(g)
    by_object: dict[Hashable, list[tuple[int, int, Hashable]]] = defaultdict(list)
    for (g, p), (first, last) in spans.items():
        by_object[g].append((first, last, p))
    counts = dict.fromkeys(("short", "mid", "long", "overlapping", "shared"), 0)
    for spans_of in by_object.values():
        spans_of.sort(key=lambda span: span[0])
        seen_until = spans_of[0][1]  # the latest frame an earlier id was matched to it
        for first, last, p in spans_of[1:]:
            if first <= seen_until:
                counts["overlapping"] += 1
            else:
                gap = frames[first].t_s - frames[seen_until].t_s
                bucket = "short" if gap <= short_gap_s + 1e-9 else "mid"
                counts["long" if gap > long_gap_s + 1e-9 else bucket] += 1
            counts["shared"] += len(objects_of[p]) > 1
            seen_until = max(seen_until, last)
    return ExtraIds(
        counts["short"], counts["mid"], counts["long"], counts["overlapping"], counts["shared"]
    )


def ids_by_object(pairs: Iterable[Iterable[Pair]]) -> dict[Hashable, set[Hashable]]:
    """The distinct tracked ids each world object was matched to."""
    ids: dict[Hashable, set[Hashable]] = defaultdict(set)
    for matched in pairs:
        for g, p in matched:
            ids[g].add(p)
    return dict(ids)


def detected_objects(frames: Iterable[Frame], min_score: float = 0.0) -> set[Hashable]:
    """World objects matched (IoU >= 0.5, one-to-one per frame) by some detector box scoring
    at least `min_score`, tracked or not, in some frame."""
    seen: set[Hashable] = set()
    for f in frames:
        keep = np.asarray(f.det_scores, np.float64).reshape(-1) >= min_score
        det = _boxes(f.det_boxes)[keep]
        for r, _ in match(box_iou(_boxes(f.gt_boxes), det)):
            seen.add(f.gt_ids[r])
    return seen


def never_given_id(
    frames: Sequence[Frame], pairs: Iterable[Iterable[Pair]], min_score: float = 0.0
) -> set[Hashable]:
    """World objects a detector box matched (`detected_objects`) that no tracked box ever
    matched (`pairs`)."""
    return detected_objects(frames, min_score) - set(ids_by_object(pairs))


@dataclass(frozen=True)
class IdMeasures:
    """The identity measures of one camera, or of several pooled (sums; objects are per
    camera, so pooled counts are of (camera, world object) pairs).

    Attributes:
        objects: world objects among the targets.
        objects_matched: those matched to a tracked box at least once.
        ids_matched: distinct tracked ids matched, summed over those objects.
        switches: CLEAR's ID switches.
        restarts: switches to an id born in that frame.
        restarts_short: restarts after a gap of at most `short_gap_s`.
        never_id: objects a detector box (any score) matched, no tracked box.
        never_id_high: the same, counting only boxes scoring at least `high_score`.
        restart_gaps_s: each restart's gap.
        short_gap_s: the gap a restart counts as short up to.
        high_score: the score `never_id_high` counts boxes from.
        extra: the ids beyond each object's first, by what came before each.
    """

    objects: int
    objects_matched: int
    ids_matched: int
    switches: int
    restarts: int
    restarts_short: int
    never_id: int
    never_id_high: int
    restart_gaps_s: tuple[float, ...] = ()
    short_gap_s: float = 1.0
    high_score: float = 0.5
    extra: ExtraIds = ExtraIds()

    @property
    def taken_over(self) -> int:
        return self.switches - self.restarts

    @property
    def ids_per_object(self) -> float:
        """Distinct ids per matched object; NaN where no object was matched."""
        return self.ids_matched / self.objects_matched if self.objects_matched else float("nan")

    def to_json(self) -> dict[str, object]:
        return {
            "objects": self.objects,
            "objects_matched": self.objects_matched,
            "ids_matched": self.ids_matched,
            "ids_per_object": None if not self.objects_matched else self.ids_per_object,
            "id_switches": self.switches,
            "restarts": self.restarts,
            "restarts_short": self.restarts_short,
            "taken_over": self.taken_over,
            "never_id": self.never_id,
            "never_id_high": self.never_id_high,
            "restart_gaps_s": [round(g, 4) for g in self.restart_gaps_s],
            "short_gap_s": self.short_gap_s,
            "high_score": self.high_score,
            "extra_ids": self.extra.to_json(),
        }


def measure(
    frames: Sequence[Frame],
    *,
    born: Mapping[Hashable, int] | None = None,
    short_gap_s: float = 1.0,
    high_score: float = 0.5,
) -> IdMeasures:
    """Every measure of one camera's frames (see the module docstring)."""
    pairs = clear_pairs(frames)
    by_object = ids_by_object(pairs)
    events = switches(frames, pairs, born)
    gaps = tuple(s.gap_s for s in events if s.restart)
    return IdMeasures(
        objects=len({g for f in frames for g in f.gt_ids}),
        objects_matched=len(by_object),
        ids_matched=sum(len(ids) for ids in by_object.values()),
        switches=len(events),
        restarts=len(gaps),
        restarts_short=sum(g <= short_gap_s + 1e-9 for g in gaps),
        never_id=len(never_given_id(frames, pairs)),
        never_id_high=len(never_given_id(frames, pairs, high_score)),
        restart_gaps_s=gaps,
        short_gap_s=short_gap_s,
        high_score=high_score,
        extra=extra_ids(frames, pairs, short_gap_s=short_gap_s),
    )


def pooled(parts: Iterable[IdMeasures]) -> IdMeasures:
    """Cameras' measures pooled: counts summed (their objects are distinct per camera)."""
    parts = list(parts)
    if not parts:
        raise ValueError("no cameras to pool")
    return IdMeasures(
        objects=sum(p.objects for p in parts),
        objects_matched=sum(p.objects_matched for p in parts),
        ids_matched=sum(p.ids_matched for p in parts),
        switches=sum(p.switches for p in parts),
        restarts=sum(p.restarts for p in parts),
        restarts_short=sum(p.restarts_short for p in parts),
        never_id=sum(p.never_id for p in parts),
        never_id_high=sum(p.never_id_high for p in parts),
        restart_gaps_s=tuple(g for p in parts for g in p.restart_gaps_s),
        short_gap_s=parts[0].short_gap_s,
        high_score=parts[0].high_score,
        extra=sum((p.extra for p in parts), ExtraIds()),
    )
