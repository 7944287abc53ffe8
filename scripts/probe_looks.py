"""How far better looks would take the tracker: a run's boxes re-tracked with looks that know
the ground truth. A probe (issue 44), not a tracker: it says where the ids per object left
over come from, and what a better appearance (a learned one) would have to do.

    python3 scripts/probe_looks.py DRIVE RUNS/N [DRIVE RUNS/M ...] [--json OUT.json]

Each DRIVE is a `drivepercept simulate` folder (videos, rig.toml, ground_truth.json with
world track ids) and each run one of it made with `drivepercept eval DRIVE --track`. The
run's boxes go through the whole tracking stage again (`drivepercept.run.retrack`, as
`scripts/bench_trackers.py --retrack` does), each time with another `LooksReader`:

* colours: the stage's own (`ColourLooks`, read from the drive's videos): the run's ids;
* motion only: no looks;
* one look per object: each box that overlaps a labelled object (IoU >= 0.5, the best)
  looks like that object and nothing else (a random unit vector of its own); the other
  boxes keep their colours. What perfect looks would give;
* K looks: the same with the objects in K groups that look alike (object id modulo K):
  looks that tell only K kinds of objects apart;
* each object's mean colours: each box that overlaps an object gets the mean of that
  object's colours over the drive (`box_features` at its labelled boxes, every camera,
  visibility >= 0.5): colours without the noise of one frame's box (occlusion, size, view).

The last three also with tight gates (`appearance_gate` 0.05, `recognise_distance` 0.02:
looks without noise need no slack). The fusion keeps its own settings. Every result is
scored as `scripts/bench_trackers.py` scores (`eval --track`'s scorer, cameras pooled):
HOTA, IDF1, ID switches, ids per object, and the ids beyond each object's first by what came
before each; then every variant over all the drives given, pooled. Nothing is timed.

Exit status: 0 done, 1 an input could not be read, 2 bad arguments (among them a --json
that would write over a file of an input folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _bench_trackers.inputs import Drive, Run, read_drive, read_run
from _bench_trackers.measures import IdMeasures, pooled
from _bench_trackers.report import Row, row_json, score
from _bench_trackers.runs import run_retrack

from drivepercept.errors import DrivePerceptError
from drivepercept.finite import finite
from drivepercept.rig import load_rig
from drivepercept.run.recorded_frames import RecordedFrames
from drivepercept.tracking.appearance import (
    DIM,
    ColourLooks,
    Features,
    LooksRequest,
    box_features,
)
from drivepercept.tracking.association import box_iou
from drivepercept.tracking.bytetrack import TrackParams

MATCH_IOU = 0.5  # a box is a labelled object's where it overlaps it this much (the best)
MIN_VISIBILITY = 0.5  # an object's mean colours are read from boxes at least this visible
TIGHT = TrackParams(appearance_gate=0.05, recognise_distance=0.02)  # looks without noise
Look = Callable[[int], "Features | None"]


@dataclass(frozen=True)
class Truth:
    """A drive's labelled boxes per (camera, frame_index): `(M, 4)` xyxy, world ids,
    visibilities."""

    boxes: dict[tuple[str, int], tuple[npt.NDArray[np.float64], list[int], list[float]]]

    @classmethod
    def of(cls, drive: Drive) -> Truth:
        """The drive's labels (COCO `bbox`: x, y, width, height) by frame."""
        images = {
            int(im["id"]): (str(im["camera"]), int(im["frame_index"]))
            for im in drive.coco["images"]
        }
        rows: dict[tuple[str, int], list[tuple[list[float], int, float]]] = {}
        for a in drive.coco["annotations"]:
            if a.get("iscrowd"):
                continue  # (a crowd region is no one object)
            x, y, w, h = (float(v) for v in a["bbox"])
            row = ([x, y, x + w, y + h], int(a["track_id"]), float(a.get("visibility", 1.0)))
            rows.setdefault(images[int(a["image_id"])], []).append(row)
        return cls(
            {
                key: (
                    np.array([r[0] for r in rs], np.float64),
                    [r[1] for r in rs],
                    [r[2] for r in rs],
                )
                for key, rs in rows.items()
            }
        )

    def objects_of(self, camera: str, frame_index: int, xyxy: npt.ArrayLike) -> list[int]:
        """Each box's labelled object (the one it overlaps most, IoU >= MATCH_IOU), or -1."""
        boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
        labelled = self.boxes.get((camera, frame_index))
        if labelled is None or not len(boxes):
            return [-1] * len(boxes)
        iou = box_iou(boxes, labelled[0])
        best = iou.argmax(axis=1)
        return [
            labelled[1][j] if iou[k, j] >= MATCH_IOU else -1 for k, j in enumerate(best.tolist())
        ]


class TruthLooks:
    """A `LooksReader` that knows the ground truth: each box of a labelled object gets
    `look(object)` (None: its colours), the others their colours."""

    def __init__(self, truth: Truth, look: Look) -> None:
        self._truth = truth
        self._look = look
        self._colours = ColourLooks()

    @property
    def needs_pixels(self) -> bool:
        return True

    def __call__(self, frames: Sequence[LooksRequest]) -> list[Features]:
        out = self._colours(frames)
        for frame, looks in zip(frames, out, strict=True):
            for k, obj in enumerate(
                self._truth.objects_of(frame.camera, frame.frame_index, frame.xyxy)
            ):
                look = self._look(obj) if obj >= 0 else None
                if look is not None:
                    looks[k] = look
        return out


def unit_look(key: int) -> Features:
    """A random unit vector of its own for `key` (the same on every call)."""
    v = np.random.default_rng(key).standard_normal(DIM).astype(np.float32)
    out: Features = v / np.linalg.norm(v)
    return out


def mean_colours(drive: Drive, truth: Truth) -> dict[int, Features]:
    """Each labelled object's colours averaged over its boxes at least MIN_VISIBILITY
    visible, every camera (`box_features`, read from the drive's videos), made unit."""
    cameras = load_rig(drive.rig_toml).cameras
    stamps = {
        (str(im["camera"]), int(im["frame_index"])): float(im["timestamp_s"])
        for im in drive.coco["images"]
    }
    sums: dict[int, npt.NDArray[np.float64]] = {}
    with RecordedFrames(cameras) as frames:
        for camera, index in sorted(truth.boxes, key=lambda k: (k[0], stamps.get(k, 0.0))):
            boxes, ids, seen = truth.boxes[(camera, index)]
            keep = [k for k, v in enumerate(seen) if v >= MIN_VISIBILITY]
            image = (
                frames(camera, stamps[(camera, index)])
                if keep and (camera, index) in stamps
                else None
            )
            if image is None:
                continue
            for k, look in zip(keep, box_features(image, boxes[keep]), strict=True):
                if look.any():
                    sums[ids[k]] = sums.get(ids[k], np.zeros(DIM)) + look
    return {obj: (s / np.linalg.norm(s)).astype(np.float32) for obj, s in sums.items()}


@dataclass(frozen=True)
class Variant:
    name: str
    gates: str  # "default" or "tight"
    looks: TruthLooks | None
    pixels: bool = True


def variants(drive: Drive, groups: int) -> list[Variant]:
    """The readers the module docstring lists, for one drive."""
    truth = Truth.of(drive)
    means = mean_colours(drive, truth)
    out = [
        Variant("colours", "default", None),
        Variant("motion only", "default", None, pixels=False),
    ]
    for name, look in (
        ("one look per object", unit_look),
        (f"{groups} looks", lambda obj: unit_look(obj % groups)),
        ("each object's mean colours", means.get),
    ):
        out += [Variant(name, gates, TruthLooks(truth, look)) for gates in ("default", "tight")]
    return out


def probe(drive: Drive, run: Run, groups: int) -> list[tuple[Variant, Row]]:
    """Every variant's re-tracking of `run`, scored."""
    out = []
    for v in variants(drive, groups):
        params = TIGHT if v.gates == "tight" else TrackParams()
        tracked = run_retrack(
            drive, run.lines, params=params, looks=v.looks, pixels=v.pixels, name=v.name
        )
        out.append((v, score(tracked, drive, run, short_gap_s=1.0, high_score=0.5)))
    return out


def table(results: Sequence[tuple[Variant, Row]]) -> list[str]:
    lines = [
        "| looks | gates | HOTA | IDF1 | ID sw. | ids per object | ids beyond one: after <= 1 s"
        " / <= 3 s / longer / overlapping |",
        "|---|---|---|---|---|---|---|",
    ]
    for v, r in results:
        p, c, e = r.pooled, r.scores.cameras, r.pooled.extra
        lines.append(
            f"| {v.name} | {v.gates} | {c.hota:.3f} | {c.idf1:.3f} | {c.id_switches} | "
            f"{p.ids_per_object:.3f} ({p.ids_matched}/{p.objects_matched}) | "
            f"{e.after_short_gap} / {e.after_mid_gap} / {e.after_long_gap} / {e.overlapping} |"
        )
    return lines


def pooled_lines(results: Sequence[tuple[Variant, Row]]) -> list[str]:
    """Every variant's ids per object over all drives given (cameras and drives pooled)."""
    by_variant: dict[tuple[str, str], list[IdMeasures]] = {}
    for v, r in results:
        by_variant.setdefault((v.name, v.gates), []).append(r.pooled)
    lines = []
    for (name, gates), parts in by_variant.items():
        m = pooled(parts)
        e = m.extra
        lines.append(
            f"- {name}, {gates} gates: {m.ids_per_object:.3f} ({m.ids_matched}/"
            f"{m.objects_matched}); ids beyond one {e.total} ({e.after_short_gap} / "
            f"{e.after_mid_gap} / {e.after_long_gap} / {e.overlapping}); ID switches {m.switches}"
        )
    return lines


def overwrites_an_input(out: Path, folders: Sequence[str]) -> bool:
    """Whether `out` is a file that is already there in one of the input folders."""
    return out.exists() and any(out.resolve().parent == Path(f).resolve() for f in folders)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="DRIVE RUN", help="a simulated drive, then its run")
    ap.add_argument("--groups", type=int, default=11, help="K of 'K looks' (default 11)")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2 or args.groups < 1:
        ap.error("give DRIVE RUN pairs, and --groups of at least 1")
    if args.json is not None and overwrites_an_input(args.json, args.pairs):
        ap.error(f"--json {args.json} is a file of an input folder: give another path")
    report: dict[str, Any] = {}
    every: list[tuple[Variant, Row]] = []
    try:
        for drive_path, run_path in zip(args.pairs[::2], args.pairs[1::2], strict=True):
            drive, run = read_drive(drive_path), read_run(run_path)
            results = probe(drive, run, args.groups)
            print(f"\n## {drive.path.name} ({run.name})\n", *table(results), sep="\n", flush=True)
            report[str(drive.path)] = [
                {"looks": v.name, "gates": v.gates, **row_json(r)} for v, r in results
            ]
            every += results
    except (DrivePerceptError, OSError, KeyError, ValueError) as exc:
        print(f"probe_looks: {exc}", file=sys.stderr)
        return 1
    print("\n## every drive, pooled\n", *pooled_lines(every), sep="\n")
    if args.json is not None:
        text = json.dumps(finite(report), indent=1, allow_nan=False)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
