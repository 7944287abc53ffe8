"""Labels on annotated frames: id first, and placed so that none hides another
(drivepercept.sinks.video_labels, drawn by drivepercept.sinks.annotate)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from drivepercept.sinks import draw_detections
from drivepercept.sinks.annotate import label_rects
from drivepercept.sinks.video_labels import Rect, label_texts, overlap_area, place_labels
from drivepercept.types import DRIVING_CLASSES, Detections

CAR, PERSON = DRIVING_CLASSES.index("car"), DRIVING_CLASSES.index("pedestrian")
BIG: Rect = (100, 100, 500, 400)  # a near car
SMALL: Rect = (110, 90, 150, 140)  # a pedestrian across the car's top edge, near its left


def _tracked(boxes: list[Rect], labels: list[int], global_ids: list[int]) -> Detections:
    n = len(boxes)
    return Detections(
        np.array(boxes, np.float32).reshape(n, 4),
        np.full(n, 0.87, np.float32),
        np.array(labels, np.int64),
        DRIVING_CLASSES,
        track_ids=np.arange(n, dtype=np.int64) + 20,
        global_ids=np.array(global_ids, np.int64),
    )


def _assert_apart(rects: list[Rect]) -> None:
    for (i, a), (j, b) in itertools.combinations(enumerate(rects), 2):
        assert overlap_area(a, b) == 0, f"labels {i} {a} and {j} {b} overlap"


def _assert_inside(rects: list[Rect], width: int, height: int) -> None:
    for rect in rects:
        x1, y1, x2, y2 = rect
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, rect


# --- the text ---------------------------------------------------------------------------------


def test_the_label_starts_with_the_object_id_else_the_track_id() -> None:
    # given a box placed across the rig, one tracked in its camera only, one untracked
    det = Detections(
        np.array([[0, 0, 10, 10]] * 3, np.float32),
        np.array([0.87, 0.5, 0.333], np.float32),
        np.array([CAR, PERSON, CAR], np.int64),
        DRIVING_CLASSES,
        track_ids=np.array([4, 5, -1]),
        global_ids=np.array([3, -1, -1]),
    )
    # then the id leads, before the class and the score
    assert label_texts(det) == ["#3 car 0.87", "c5 pedestrian 0.50", "car 0.33"]
    # and without tracking at all, the class leads
    plain = Detections(det.xyxy, det.scores, det.labels, DRIVING_CLASSES)
    assert label_texts(plain) == ["car 0.87", "pedestrian 0.50", "car 0.33"]


# --- the placement ----------------------------------------------------------------------------


def test_a_small_box_over_a_large_boxs_top_edge_gets_a_label_of_its_own() -> None:
    # given two labels that would overlap, both above their boxes
    sizes = [(120, 20), (120, 20)]
    assert overlap_area((100, 80, 220, 100), (110, 70, 230, 90)) > 0
    # when they are placed
    big, small = place_labels([BIG, SMALL], sizes, (640, 480))
    # then they do not overlap, the small box keeps the place above it, the large box's
    # label moves inside its top
    _assert_apart([big, small])
    assert small == (110, 70, 230, 90)
    assert big == (100, 100, 220, 120)


def test_labels_avoid_the_reserved_header() -> None:
    # given a box at the top-left corner, under the header
    header: Rect = (0, 0, 200, 24)
    (label,) = place_labels([(0, 0, 100, 100)], [(80, 16)], (640, 480), reserved=[header])
    # then its label is not on the header
    assert overlap_area(label, header) == 0
    _assert_inside([label], 640, 480)


def test_labels_stay_inside_the_image_for_boxes_at_its_edges() -> None:
    # given boxes touching each edge and corner of a 320x240 image, and one filling it
    width, height = 320, 240
    boxes: list[Rect] = [
        (0, 0, 40, 30),  # top-left corner
        (290, 0, 320, 30),  # top-right corner: the label is wider than the box
        (0, 210, 40, 240),  # bottom-left corner
        (280, 220, 320, 240),  # bottom-right corner
        (150, 0, 170, 240),  # top to bottom
        (0, 0, 320, 240),  # the whole image
        (260, 230, 360, 290),  # past the bottom-right corner
    ]
    sizes = [(90, 14)] * len(boxes)
    # when their labels are placed
    rects = place_labels(boxes, sizes, (width, height))
    # then each lies inside the image, none over another
    _assert_inside(rects, width, height)
    _assert_apart(rects)


def test_a_crowded_column_stays_bounded_and_inside_the_image() -> None:
    # given more boxes in one column than there are places to try
    boxes: list[Rect] = [(10, 2 + 2 * k, 60, 32 + 2 * k) for k in range(30)]
    rects = place_labels(boxes, [(50, 12)] * len(boxes), (200, 100))
    # then every box still gets a label inside the image (some may overlap: there is no room)
    assert len(rects) == len(boxes)
    _assert_inside(rects, 200, 100)


def test_place_labels_wants_a_size_per_box() -> None:
    with pytest.raises(ValueError, match="2 boxes and 1 sizes"):
        place_labels([BIG, SMALL], [(10, 10)], (640, 480))


# --- the drawing ------------------------------------------------------------------------------


def test_the_drawn_labels_of_a_small_box_over_a_large_one_do_not_cover_each_other() -> None:
    # given a car and a pedestrian across its top edge, both objects across the rig
    image = np.full((480, 640, 3), 90, np.uint8)
    both = _tracked([BIG, SMALL], [CAR, PERSON], [3, 7])
    # when the frame is drawn
    out = draw_detections(image, both, header="front  #12  41.2 ms")
    rects = label_rects(both, (640, 480), header="front  #12  41.2 ms")
    big, small = rects
    assert big is not None and small is not None
    # then the two label strips do not overlap
    assert overlap_area(big, small) == 0
    # and the car's strip is exactly what the car's label alone draws (the same text on the
    # same strip, wherever it is placed): nothing of the pedestrian's label is on it
    alone = _tracked([BIG], [CAR], [3])
    (alone_rect,) = label_rects(alone, (640, 480))
    assert alone_rect is not None
    alone_out = draw_detections(image, alone)

    def strip(img: np.ndarray, r: Rect) -> np.ndarray:
        return img[r[1] : r[3], r[0] : r[2]]

    assert np.array_equal(strip(out, big), strip(alone_out, alone_rect))
    # and the same holds for the pedestrian's strip
    person = _tracked([SMALL], [PERSON], [7])
    (person_rect,) = label_rects(person, (640, 480))
    assert person_rect is not None
    assert np.array_equal(strip(out, small), strip(draw_detections(image, person), person_rect))


def test_drawn_labels_stay_inside_the_image_for_boxes_at_its_edges() -> None:
    # given tracked boxes at the corners of a small frame, and one off its right edge
    boxes: list[Rect] = [(0, 0, 30, 20), (300, 0, 320, 20), (0, 220, 30, 240), (290, 200, 400, 260)]
    det = _tracked(boxes, [CAR, PERSON, CAR, PERSON], [1, 22, -1, 333])
    rects = label_rects(det, (320, 240), header="rear  #1  9.9 ms")
    assert all(r is not None for r in rects)
    placed = [r for r in rects if r is not None]
    _assert_inside(placed, 320, 240)
    _assert_apart(placed)
    # and drawing them on a frame of that size works
    out = draw_detections(np.zeros((240, 320, 3), np.uint8), det, header="rear  #1  9.9 ms")
    assert out.shape == (240, 320, 3)


def test_a_box_with_non_finite_corners_gets_no_label() -> None:
    det = _tracked([BIG, SMALL], [CAR, PERSON], [3, 7])
    det.xyxy[1, 0] = np.nan
    rects = label_rects(det, (640, 480))
    assert rects[0] is not None and rects[1] is None


def test_large_boxes_are_drawn_first_so_a_small_box_across_ones_edge_stays_whole() -> None:
    # given a pedestrian across the car's left edge, listed before the car
    image = np.zeros((480, 640, 3), np.uint8)
    person: Rect = (90, 200, 130, 240)
    det = _tracked([person, BIG], [PERSON, CAR], [-1, -1])
    # when the frame is drawn
    out = draw_detections(image, det)
    # then the pedestrian's top edge is whole where it crosses the car's left edge
    alone = draw_detections(image, _tracked([person], [PERSON], [-1]))
    assert np.array_equal(out[200, 90:130], alone[200, 90:130])
    # and the car's edge shows below the pedestrian (above it is the pedestrian's label)
    car_alone = draw_detections(image, _tracked([BIG], [CAR], [-1]))
    assert np.array_equal(out[245:395, 100], car_alone[245:395, 100])


def test_a_predicted_frames_boxes_are_drawn_as_corners_only() -> None:
    # given one box, detected in one frame and predicted by the tracker in another
    xyxy = np.array([[100.0, 100.0, 300.0, 260.0]], np.float32)
    args = (xyxy, np.array([0.9], np.float32), np.array([0]), DRIVING_CLASSES)
    image = np.zeros((360, 640, 3), np.uint8)
    detected = draw_detections(image, Detections(*args))
    predicted = draw_detections(image, Detections(*args, predicted=True))
    # then both mark the box's corners, but only the detected one the middle of its sides
    # (rows, columns: the top edge is row 100, the left column 100, the bottom row 259)
    for drawn in (detected, predicted):
        assert drawn[100, 110].any() and drawn[110, 100].any() and drawn[259, 290].any()
    assert detected[180, 100].any() and detected[259, 200].any()
    assert not predicted[180, 100].any() and not predicted[259, 200].any()
