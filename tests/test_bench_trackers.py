"""scripts/bench_trackers.py (its pieces in scripts/_bench_trackers): the identity measures on
tiny hand-made sequences (and their switches against TrackEval's own CLEAR), the peers' ids
given back to their input boxes, a run scored end to end with our tracker alone, and the
command line. The peers themselves run only where `trackers` is importable (the benchmark's
venv, see the script's docstring); those tests skip elsewhere."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"

# the script's pieces live in scripts/_bench_trackers, found beside the script as when it runs
if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))

import bench_trackers  # noqa: E402  (scripts/: not a package)
from _bench_trackers import measures, report, runs  # noqa: E402
from _bench_trackers.inputs import Drive, Run  # noqa: E402
from _bench_trackers.measures import Frame  # noqa: E402

from drivepercept.eval import EvalThresholds  # noqa: E402
from drivepercept.eval.tracking import Step, evaluate_sequence, trackeval_data  # noqa: E402
from drivepercept.tracking.bytetrack import TrackParams  # noqa: E402

HAVE_TRACKERS = importlib.util.find_spec("trackers") is not None
needs_trackers = pytest.mark.skipif(
    not HAVE_TRACKERS,
    reason="Roboflow trackers is not importable here: the peers run in the benchmark's venv "
    "(python3 -m venv --system-site-packages /work/trackers-venv; pip install trackers "
    "'supervision<0.31')",
)


def box(x: float, y: float = 10.0, w: float = 30.0, h: float = 50.0) -> list[float]:
    return [x, y, x + w, y + h]


def frame(
    t_s: float,
    gts: Mapping[Any, list[float]],
    preds: Mapping[Any, list[float]],
    dets: Sequence[tuple[list[float], float]] = (),
) -> Frame:
    return Frame(
        t_s=t_s,
        gt_ids=tuple(gts),
        gt_boxes=np.array(list(gts.values()), float).reshape(-1, 4),
        pred_ids=tuple(preds),
        pred_boxes=np.array(list(preds.values()), float).reshape(-1, 4),
        det_boxes=np.array([b for b, _ in dets], float).reshape(-1, 4),
        det_scores=np.array([s for _, s in dets], float),
    )


# --------------------------------------------------------------------------- matching


def test_clear_pairs_keep_last_frames_pair_over_a_better_overlap() -> None:
    # given an object matched to id 1, then a frame where id 2 overlaps it more
    frames = [
        frame(0.0, {"A": box(0)}, {1: box(0), 2: box(200)}),
        frame(0.1, {"A": box(0)}, {1: box(8), 2: box(1)}),  # IoU 0.58 vs 0.94
    ]
    # when matched as CLEAR matches
    pairs = measures.clear_pairs(frames)
    # then the object keeps id 1 and nothing switched
    assert pairs == [[("A", 1)], [("A", 1)]]
    assert measures.switches(frames, pairs) == []


def test_clear_pairs_below_half_iou_do_not_match_and_a_frame_without_targets_keeps_pairs() -> None:
    frames = [
        frame(0.0, {"A": box(0)}, {1: box(0), 2: box(3)}),
        frame(0.1, {}, {1: box(0)}),  # no targets: CLEAR neither matches nor forgets
        frame(0.2, {"A": box(0)}, {1: box(3), 2: box(0)}),  # continuing 1 wins over IoU 1.0
        frame(0.3, {"A": box(0)}, {1: box(20)}),  # IoU 0.2: no match
    ]
    assert measures.clear_pairs(frames) == [[("A", 1)], [], [("A", 1)], []]


def random_sequence(seed: int, n_frames: int = 40) -> list[Frame]:
    """Four objects drifting, seen by jittered boxes whose ids swap, vanish and restart."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0, 300, size=(4, 2))
    next_id = 10
    current = {g: g for g in range(4)}
    out = []
    for k in range(n_frames):
        gts, preds = {}, {}
        for g in range(4):
            x, y = starts[g] + k * rng.uniform(0.5, 2.0)
            if rng.random() < 0.9:
                gts[g] = box(x, y)
            if rng.random() < 0.08:  # the tracker restarts the object
                current[g], next_id = next_id, next_id + 1
            if rng.random() < 0.05:  # or swaps it with another
                other = int(rng.integers(4))
                current[g], current[other] = current[other], current[g]
            if rng.random() < 0.85:
                preds[current[g]] = box(x + rng.normal(0, 4), y + rng.normal(0, 4))
        out.append(frame(k / 15.0, gts, preds))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_switches_are_trackevals_clear_switches(seed: int) -> None:
    # given a messy random sequence
    frames = random_sequence(seed)
    steps = [Step(f.gt_ids, f.gt_boxes, f.pred_ids, f.pred_boxes) for f in frames]
    # when TrackEval's CLEAR scores it and the measures split its switches
    clear = evaluate_sequence(trackeval_data(steps))["CLEAR"]
    m = measures.measure(frames)
    # then they count the same switches, and the split adds up to them
    assert int(clear["IDSW"]) > 0
    assert m.switches == int(clear["IDSW"])
    assert m.restarts + m.taken_over == m.switches
    assert m.objects_matched == 4


# --------------------------------------------------------------------------- switches


def restart_and_takeover() -> list[Frame]:
    """A: id 1, lost for one frame, then id 3 (new); B: id 2 until it leaves, then A takes
    id 2 over."""
    return [
        frame(0 / 15, {"A": box(0), "B": box(100)}, {1: box(0), 2: box(100)}),
        frame(1 / 15, {"A": box(2), "B": box(100)}, {1: box(2), 2: box(100)}),
        frame(2 / 15, {"A": box(4), "B": box(100)}, {2: box(100)}),
        frame(3 / 15, {"A": box(6), "B": box(100)}, {3: box(6), 2: box(100)}),
        frame(4 / 15, {"A": box(8)}, {3: box(8)}),
        frame(5 / 15, {"A": box(10)}, {2: box(10)}),
    ]


def test_a_switch_to_a_new_id_is_a_restart_with_its_gap_and_to_an_old_id_a_takeover() -> None:
    frames = restart_and_takeover()
    events = measures.switches(frames, measures.clear_pairs(frames))
    assert [(s.frame, s.gt_id, s.old_id, s.new_id, s.restart) for s in events] == [
        (3, "A", 1, 3, True),
        (5, "A", 3, 2, False),
    ]
    assert events[0].gap_s == pytest.approx(2 / 15)  # last matched at frame 1
    assert events[1].gap_s == pytest.approx(1 / 15)


def test_an_id_born_before_its_first_scored_box_is_a_takeover() -> None:
    # given id 3's first box in the tracker's output at frame 2 (scored from frame 3 only)
    frames = restart_and_takeover()
    pairs = measures.clear_pairs(frames)
    events = measures.switches(frames, pairs, born={3: 2})
    assert [s.restart for s in events] == [False, False]


def test_measure_counts_ids_per_object_and_short_restarts() -> None:
    m = measures.measure(restart_and_takeover(), short_gap_s=0.1)
    assert (m.objects, m.objects_matched, m.ids_matched) == (2, 2, 4)  # A: 1, 3, 2; B: 2
    assert m.ids_per_object == pytest.approx(2.0)
    assert (m.switches, m.restarts, m.taken_over) == (2, 1, 1)
    assert m.restarts_short == 0  # its gap, 2/15 s, is over 0.1 s
    assert measures.measure(restart_and_takeover(), short_gap_s=0.2).restarts_short == 1


def test_extra_ids_are_told_by_their_gap_and_those_shared_with_another_object() -> None:
    # given A: ids 1 (frames 0-1), 3 (3-4, 2/15 s later), 2 (5, taken from B)
    frames = restart_and_takeover()
    m = measures.measure(frames, short_gap_s=1.0)
    # then its two ids beyond the first came after short gaps, and id 2 is B's too
    assert m.extra == measures.ExtraIds(after_short_gap=2, shared=1)
    assert m.extra.total == m.ids_matched - m.objects_matched
    # with a shorter line, the 2/15 s gap is a middle one
    assert measures.measure(frames, short_gap_s=0.1).extra.after_mid_gap == 1


def test_extra_ids_after_a_long_gap_and_while_an_earlier_id_is_still_on_the_object() -> None:
    # given A tracked by id 1 at 0-1 s, by id 2 for one frame in between (a second track on
    # it), then by id 3 after 4 s unseen, and by id 4 after 2 s more
    frames = [
        frame(0.0, {"A": box(0)}, {1: box(0)}),
        frame(0.5, {"A": box(0)}, {2: box(0)}),
        frame(1.0, {"A": box(0)}, {1: box(0)}),
        frame(5.0, {"A": box(0)}, {3: box(0)}),
        frame(7.0, {"A": box(0)}, {4: box(0)}),
    ]
    pairs = measures.clear_pairs(frames)
    extra = measures.extra_ids(frames, pairs, short_gap_s=1.0)
    # then one overlapping, one after a long gap (4 s), one after a middle one (2 s)
    assert extra == measures.ExtraIds(after_mid_gap=1, after_long_gap=1, overlapping=1)
    assert extra.to_json()["total"] == 3
    with pytest.raises(ValueError, match="one list of pairs per frame"):
        measures.extra_ids(frames, pairs[:-1])


def test_never_given_id_counts_objects_a_box_matched_but_no_track() -> None:
    # given C seen by a 0.3 box, D by a 0.9 box, E by nothing, all never tracked, and A tracked
    frames = [
        frame(
            0.0,
            {"A": box(0), "C": box(100), "D": box(200), "E": box(300)},
            {1: box(0)},
            [(box(0), 0.9), (box(100), 0.3), (box(201), 0.9), (box(330), 0.9)],
        ),
        frame(0.1, {"C": box(100)}, {}, [(box(101), 0.3)]),
    ]
    pairs = measures.clear_pairs(frames)
    assert measures.never_given_id(frames, pairs) == {"C", "D"}
    assert measures.never_given_id(frames, pairs, min_score=0.5) == {"D"}
    m = measures.measure(frames, high_score=0.5)
    assert (m.never_id, m.never_id_high) == (2, 1)


def test_pooled_sums_cameras_and_recomputes_ids_per_object() -> None:
    a = measures.IdMeasures(3, 2, 3, 1, 1, 1, 0, 0, (0.2,), extra=measures.ExtraIds(1, shared=1))
    b = measures.IdMeasures(5, 4, 4, 2, 0, 0, 1, 1, (), extra=measures.ExtraIds(overlapping=1))
    p = measures.pooled([a, b])
    assert (p.objects, p.objects_matched, p.ids_matched, p.switches) == (8, 6, 7, 3)
    assert p.extra == measures.ExtraIds(after_short_gap=1, overlapping=1, shared=1)
    assert p.ids_per_object == pytest.approx(7 / 6)
    assert p.restart_gaps_s == (0.2,)
    with pytest.raises(ValueError, match="no cameras"):
        measures.pooled([])


def test_frame_refuses_boxes_and_ids_that_do_not_pair_up() -> None:
    with pytest.raises(ValueError, match="expected 2 boxes"):
        Frame(0.0, ("A", "B"), np.zeros((1, 4)), (), np.zeros((0, 4)))
    with pytest.raises(ValueError, match="unique"):
        Frame(0.0, (), np.zeros((0, 4)), (1, 1), np.zeros((2, 4)))


# --------------------------------------------------------------------------- peers' ids


def test_ids_for_inputs_by_index_and_by_iou() -> None:
    ids = runs.ids_for_inputs(4, [7, -1, 9], out_index=[2, 0, 3])
    assert ids.tolist() == [-1, -1, 7, 9]
    inputs = np.array([box(0), box(100), box(200)], float)
    out = np.array([box(200), box(100.1)], float)  # reordered, one a hair off (IoU 0.993)
    assert runs.ids_for_inputs(3, [5, 6], in_boxes=inputs, out_boxes=out).tolist() == [-1, 6, 5]
    moved = np.array([box(103)], float)  # IoU 0.82: a tracker's smoothed box, not an input
    assert runs.ids_for_inputs(3, [6], in_boxes=inputs, out_boxes=moved).tolist() == [-1] * 3
    with pytest.raises(ValueError, match="distinct"):
        runs.ids_for_inputs(2, [1, 2], out_index=[1, 1])


def test_relabelled_lines_carry_the_new_ids_only() -> None:
    line = {"camera": "front", "boxes": [box(0)], "track_ids": [4], "global_ids": [2]}
    line["velocities"] = [[0.0] * 4]
    out = runs.relabelled(line, [11])
    assert out["track_ids"] == [11]
    assert "global_ids" not in out and "velocities" not in out
    assert line["track_ids"] == [4]  # the run's line untouched


# --------------------------------------------------------------------------- a run


FPS = 15.0


def tiny_drive_and_run() -> tuple[Drive, Run]:
    """One camera, eight frames: A moving right (its box missing at frame 3; the run's ids 1
    then 3), B standing (id 2), C seen only by 0.3 boxes (never tracked)."""
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    lines: list[dict[str, Any]] = []
    for k in range(8):
        gts = {1: box(10 + 4 * k), 2: box(200), 3: box(400)}
        images.append({"id": k + 1, "camera": "front", "frame_index": k, "file_name": f"{k}"})
        for w, b in gts.items():
            x1, y1, x2, y2 = b
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": k + 1,
                    "category_id": 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "track_id": w,
                    "iscrowd": 0,
                    "visibility": 1.0,
                }
            )
        boxes = [gts[2], gts[3], box(600, 300, 10, 15)]
        scores = [0.9, 0.3, 0.05]
        ids = [2, -1, -1]
        if k != 3:
            boxes.insert(0, gts[1])
            scores.insert(0, 0.9)
            ids.insert(0, 1 if k < 3 else 3)
        lines.append(
            {
                "camera": "front",
                "frame_index": k,
                "pts_s": k / FPS,
                "boxes": boxes,
                "scores": scores,
                "labels": [0] * len(boxes),
                "track_ids": ids,
            }
        )
    coco = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "car"}]}
    drive = Drive(
        path=Path("tiny"),
        rig_toml=Path("tiny/rig.toml"),
        coco=coco,
        cameras=("front",),
        fps={"front": FPS},
        videos={},
        mounts={},
    )
    return drive, Run(Path("runs/tiny"), "tiny", lines, [], EvalThresholds())


def bench_args(*argv: str) -> argparse.Namespace:
    return bench_trackers.parse_args(["tiny", "runs/tiny", *argv])


def test_the_re_run_gives_boxes_their_kinds_from_the_lines_class_names() -> None:
    # given lines of one walker, boxed as a pedestrian for four frames, then (a sure box
    # over a weak one of its own label) as a cyclist
    drive, _ = tiny_drive_and_run()
    lines: list[dict[str, Any]] = []
    for k in range(8):
        walker = box(10 + 4 * k)
        boxes, names = [walker], ["pedestrian"]
        if k >= 4:
            boxes, names = [walker, walker], ["cyclist", "pedestrian"]
        lines.append(
            {
                "camera": "front",
                "frame_index": k,
                "pts_s": k / FPS,
                "boxes": boxes,
                "scores": [0.9] if k < 4 else [0.8, 0.2],
                "labels": [{"pedestrian": 3, "cyclist": 4}[n] for n in names],
                "class_names": names,
                "track_ids": [1] * len(boxes),
            }
        )
    # when our tracker runs again on them
    rerun = runs.run_ours(drive, lines, TrackParams())
    # then the sure cyclist box goes on with the walker's id (pedestrian and cyclist are
    # one kind), as the tracking stage would have it
    assert [line["track_ids"][0] for line in rerun.lines] == [1] * 8


def test_a_run_scored_with_ours_and_ours_re_run() -> None:
    # given the tiny run, where our run's ids restart A after a one-frame gap
    drive, run = tiny_drive_and_run()
    # when benchmarked without peers
    rows, lines = bench_trackers.bench_run(run, drive, bench_args("--peers", "none"), TrackParams())
    # then ours scores one switch, a restart after 2/15 s, and C is never given an id
    assert [r.tracked.name for r in rows] == ["ours", "ours, CameraTracker re-run"]
    ours, rerun = rows
    assert ours.scores.cameras.id_switches == 1 and ours.consistent
    assert (ours.pooled.restarts, ours.pooled.restarts_short, ours.pooled.taken_over) == (1, 1, 0)
    assert ours.pooled.restart_gaps_s == pytest.approx((2 / FPS,))
    assert ours.pooled.ids_per_object == pytest.approx(1.5)
    assert (ours.pooled.never_id, ours.pooled.never_id_high) == (1, 0)
    # and our tracker run again bridges the one-frame gap: one id per object, timed
    assert rerun.scores.cameras.id_switches == 0 and rerun.pooled.ids_per_object == 1.0
    assert rerun.tracked.frame_ms is not None and len(rerun.tracked.frame_ns) == 8
    # and the tables say so
    table = "\n".join(lines)
    ours_row = next(ln for ln in lines if ln.startswith("| ours | "))
    assert ours_row.endswith("| 1 | 1 | 1 | 0 | 1.50 (3/2) | 1 / 0 | not timed here |")
    assert "front HOTA / IDF1 / IDsw" in table
    assert report.row_json(ours)["measures"]["cameras"]["restarts"] == 1
    # and the extra ids: ours one, A's second id after a short gap; the re-run none
    assert report.row_json(ours)["measures"]["cameras"]["extra_ids"]["after_short_gap"] == 1
    assert "- ours: 1 ids beyond one per object: 1 after a gap <= 1 s, 0 after up to 3 s" in table
    assert "- ours, CameraTracker re-run: 0 ids beyond one per object" in table


def test_retrack_runs_the_whole_tracking_stage_on_the_runs_boxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a stand-in retrack that gives A one id throughout
    import drivepercept.run.retrack as retrack_module
    from drivepercept.run.retrack import Retracked

    drive, run = tiny_drive_and_run()
    seen: dict[str, Any] = {}

    def retrack(
        rig: Path, lines: list[dict[str, Any]], *, spread_frames: int, **stage: Any
    ) -> Retracked:
        seen.update(rig=rig, spread=spread_frames, **stage)
        fixed = [runs.relabelled(ln, [1 if t == 3 else t for t in ln["track_ids"]]) for ln in lines]
        return Retracked(fixed, [], 0, stage_ns=4000 * len(lines))

    monkeypatch.setattr(retrack_module, "retrack", retrack)
    tracked = runs.run_retrack(drive, run.lines)
    row = report.score(tracked, drive, run, short_gap_s=1.0, high_score=0.5)
    # (the stage's defaults: no settings or looks of the bench's own)
    assert seen == {"rig": drive.rig_toml, "spread": 0, "params": None, "looks": None}
    assert tracked.name == "ours re-tracked" and row.scores.cameras.id_switches == 0
    assert set(tracked.frame_ns) == {4000}  # the stage's own time per frame, nothing else


def test_command_line_refuses_unknown_peers_and_bad_gaps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_args("--peers", "sort,deepsort")
    assert exit_.value.code == 2 and "unknown deepsort" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_args("--short-gap-s", "-1")
    assert bench_args("--peers", "all").peer_keys == list(runs.PEER_KEYS)


def test_main_says_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a folder that is no drive: one line, exit 1
    assert bench_trackers.main([str(tmp_path), str(tmp_path), "--peers", "none"]) == 1
    assert "expected a simulated drive" in capsys.readouterr().err
    if not HAVE_TRACKERS:  # peers asked for without the venv: how to get it, exit 2
        assert bench_trackers.main([str(tmp_path), str(tmp_path), "--peers", "sort"]) == 2
        assert "/work/trackers-venv" in capsys.readouterr().err


# --------------------------------------------------------------------------- the peers


@needs_trackers
@pytest.mark.parametrize("key", runs.PEER_KEYS)
@pytest.mark.parametrize("settings", ["matched", "defaults"])
def test_each_peer_tracks_the_tiny_run(key: str, settings: str) -> None:
    # given the tiny run's boxes
    drive, run = tiny_drive_and_run()
    (spec,) = runs.iter_specs([key])
    if runs.peer_available(spec) is not None:
        pytest.skip(str(runs.peer_available(spec)))
    # when the peer tracks them
    tracked = runs.run_peer(spec, drive, run.lines, settings=settings, params=TrackParams())
    # then every line has an id per box, B (0.9 every frame) keeps one id once confirmed,
    # the 0.05 box is never tracked, and each frame was timed
    assert [len(ln["track_ids"]) for ln in tracked.lines] == [len(ln["boxes"]) for ln in run.lines]
    b_ids = {ln["track_ids"][ln["boxes"].index(box(200))] for ln in tracked.lines[3:]}
    assert len(b_ids) == 1 and min(b_ids) >= 0
    assert all(ln["track_ids"][-1] == -1 for ln in tracked.lines)
    assert len(tracked.frame_ns) == 8 and "global_ids" not in tracked.lines[0]
    assert tracked.settings["frame_rate"] == FPS
    if settings == "matched":
        assert tracked.settings.get("minimum_consecutive_frames") == TrackParams().min_hits
    row = report.score(tracked, drive, run, short_gap_s=1.0, high_score=0.5)
    assert row.consistent and row.scores.rig is None
