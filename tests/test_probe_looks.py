"""scripts/probe_looks.py: looks that know the ground truth, given to the tracking stage
through its `LooksReader` seam; the boxes matched to labelled objects, and, on a simulated
drive (slow), the probe end to end."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from labelboxes import detections_from_labels

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
if str(SCRIPTS) not in sys.path:  # (the script's pieces are found beside it, as when it runs)
    sys.path.append(str(SCRIPTS))

import probe_looks  # noqa: E402  (scripts/: not a package)
from _bench_trackers.inputs import Drive  # noqa: E402

from drivepercept.run.retrack import retrack  # noqa: E402
from drivepercept.tracking.appearance import DIM, LooksRequest, box_features  # noqa: E402

Cli = Callable[[list[str]], tuple[int, str]]


def _drive(annotations: list[dict[str, Any]]) -> Drive:
    images = [
        {"id": 1, "camera": "front", "frame_index": 4},
        {"id": 2, "camera": "back", "frame_index": 4},
    ]
    coco = {"images": images, "annotations": annotations, "categories": []}
    return Drive(Path("d"), Path("d/rig.toml"), coco, ("front", "back"), {}, {}, {})


def _label(image: int, track: int, bbox: list[float], **more: Any) -> dict[str, Any]:
    return {"image_id": image, "track_id": track, "bbox": bbox, "iscrowd": 0, **more}


def test_boxes_are_matched_to_the_labelled_object_they_overlap_most() -> None:
    truth = probe_looks.Truth.of(
        _drive(
            [
                _label(1, 7, [0, 0, 10, 20], visibility=0.4),
                _label(1, 8, [6, 0, 10, 20]),
                _label(1, 9, [100, 100, 50, 50], iscrowd=1),  # a crowd: no one object
                _label(2, 3, [0, 0, 10, 20]),
            ]
        )
    )
    assert truth.boxes[("front", 4)][1:] == ([7, 8], [0.4, 1.0])
    boxes = [[0, 0, 10, 20], [3, 0, 13, 40], [7, 0, 17, 20], [100, 100, 150, 150], [0, 0, 3, 3]]
    # the second overlaps 7 and 8 alike (IoU 0.3 each): below half, no one's
    assert truth.objects_of("front", 4, boxes) == [7, -1, 8, -1, -1]
    assert truth.objects_of("back", 4, boxes[:1]) == [3]
    assert truth.objects_of("front", 5, boxes[:2]) == [-1, -1]  # a frame with no labels
    assert truth.objects_of("front", 4, np.zeros((0, 4))) == []


def test_truth_looks_give_each_labelled_box_its_objects_look_and_the_rest_their_colours() -> None:
    truth = probe_looks.Truth.of(
        _drive([_label(1, 7, [0, 0, 10, 20]), _label(1, 8, [40, 0, 10, 20])])
    )
    image = np.zeros((60, 80, 3), np.uint8)
    image[:, 40:] = (30, 30, 200)
    boxes = np.array([[0.0, 0, 10, 20], [40, 0, 50, 20], [60, 30, 75, 55]])
    reader = probe_looks.TruthLooks(
        truth, lambda obj: probe_looks.unit_look(obj) if obj == 7 else None
    )
    assert reader.needs_pixels
    (looks,) = reader([LooksRequest("front", 4, image, boxes)])
    colours = box_features(image, boxes)
    assert np.allclose(looks[0], probe_looks.unit_look(7))
    assert np.allclose(looks[1:], colours[1:])  # 8's look is not known: its colours
    assert np.allclose(np.linalg.norm(probe_looks.unit_look(12), axis=0), 1.0)
    assert probe_looks.unit_look(12).shape == (DIM,)
    assert abs(float(probe_looks.unit_look(12) @ probe_looks.unit_look(13))) < 0.8
    assert np.array_equal(probe_looks.unit_look(12), probe_looks.unit_look(12))


def test_the_command_line_wants_pairs_and_says_what_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        probe_looks.main([str(tmp_path)])
    assert "DRIVE RUN pairs" in capsys.readouterr().err
    assert probe_looks.main([str(tmp_path), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("probe_looks: ") and "expected a simulated drive" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_probe_on_a_simulated_drive(
    in_process: Cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end on a 4 s crossing drive (its run: boxes made from its labels, tracked by
    motion): looks that know each object give no more ids per object than the colours and
    fewer ID switches than motion alone, and every variant is in the table and the JSON."""
    drive = tmp_path / "drive"
    code, err = in_process(
        ["simulate", "--out", str(drive), "--preset", "crossing", "--seed", "12", "--seconds", "4"]
    )
    assert code == 0, err
    gt = json.loads((drive / "ground_truth.json").read_text())
    run = tmp_path / "run"
    run.mkdir()
    tracked = retrack(drive / "rig.toml", detections_from_labels(gt, seed=3))  # motion alone
    (run / "detections.jsonl").write_text("".join(json.dumps(x) + "\n" for x in tracked.detections))
    out = tmp_path / "probe.json"
    capsys.readouterr()
    assert probe_looks.main([str(drive), str(run), "--groups", "5", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())[str(drive)]
    figures = {(r["looks"], r["gates"]): r["measures"]["cameras"] for r in rows}
    assert {r["tracker"] for r in rows} == {r["looks"] for r in rows}  # (bench_trackers' rows)
    assert set(figures) == {
        ("colours", "default"),
        ("motion only", "default"),
        *(
            (name, gates)
            for name in ("one look per object", "5 looks", "each object's mean colours")
            for gates in ("default", "tight")
        ),
    }
    for looks, gates in figures:
        assert f"| {looks} | {gates} |" in printed
    ipo = {k: r["ids_matched"] / r["objects_matched"] for k, r in figures.items()}
    perfect = ("one look per object", "default")
    assert ipo[perfect] <= ipo[("colours", "default")]
    assert figures[perfect]["id_switches"] < figures[("motion only", "default")]["id_switches"]
    assert figures[("motion only", "default")]["objects_matched"] > 20
    for looks, gates in figures:  # one drive: its pooled line is its table's row
        m = figures[(looks, gates)]
        line = f"- {looks}, {gates} gates: {m['ids_per_object']:.3f}"
        assert f"{line} ({m['ids_matched']}/{m['objects_matched']}); ids beyond one" in printed
    # the JSON is not written over an input
    target = run / "detections.jsonl"
    before = target.read_bytes()
    with pytest.raises(SystemExit):
        probe_looks.main([str(drive), str(run), "--json", str(target)])
    assert "is a file of an input folder" in capsys.readouterr().err
    assert target.read_bytes() == before
