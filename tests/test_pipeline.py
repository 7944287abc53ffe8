"""The pipeline end to end on in-memory cameras: geometry, batching, shutdown, errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fakereaders import FakeReader
from fakesinks import Collect

from drivepercept.config import PipelineConfig
from drivepercept.models.base import Detector, InputSpec
from drivepercept.models.oracle import make_oracle
from drivepercept.pipeline import JOIN_TIMEOUT_S, Pipeline, PipelineError
from drivepercept.types import CameraState, FrameResult, RunProgress

pytestmark = pytest.mark.timeout(60)

STAGE_THREADS = ("decode-", "batcher", "engine", "gpu-monitor")


def _stage_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(STAGE_THREADS)]


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """Every test must end with every pipeline thread stopped and joined."""
    assert _stage_threads() == []
    yield
    assert _stage_threads() == []


def _cpu(**kw: object) -> PipelineConfig:
    return PipelineConfig(device="cpu", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frame_size", "input_size"),
    [
        ((640, 360), (320, 320)),
        ((300, 500), (320, 192)),
        ((1280, 720), (256, 384)),
        ((97, 61), (128, 128)),
    ],
)
def test_boxes_come_back_in_original_pixels(
    frame_size: tuple[int, int], input_size: tuple[int, int]
) -> None:
    # given a box known in original-frame pixels, and the letterbox computed by hand
    fw, fh = frame_size
    iw, ih = input_size
    original = np.array([0.1 * fw, 0.2 * fh, 0.6 * fw, 0.9 * fh])
    scale = min(iw / fw, ih / fh)
    nw, nh = round(fw * scale), round(fh * scale)
    pad_x, pad_y = (iw - nw) // 2, (ih - nh) // 2
    sx, sy = nw / fw, nh / fh
    in_input = original * np.array([sx, sy, sx, sy]) + np.array([pad_x, pad_y, pad_x, pad_y])
    # when an oracle model "detects" exactly that box in its input
    detector = make_oracle(size=input_size, boxes=[in_input.tolist()])
    sink = Collect()
    with Pipeline(
        cameras=[
            ("a", FakeReader(size=frame_size, frames=3)),
            ("b", FakeReader(size=(fh, fw), frames=3)),
        ],
        detector=detector,
        config=_cpu(),
        sinks=[sink],
    ) as p:
        p.run()
    # then the box comes back in the first camera's original pixels within 1 px
    a = [r for r in sink.results if r.camera == "a"]
    assert len(a) == 3
    for r in a:
        assert r.detections.xyxy.shape == (1, 4)
        np.testing.assert_allclose(r.detections.xyxy[0], original, atol=1.0)
        assert r.detections.names == ["person"]
    # and the second camera (the frame turned on its side) maps the same input box through
    # its own letterbox, computed by hand the same way
    scale_b = min(iw / fh, ih / fw)
    nw_b, nh_b = round(fh * scale_b), round(fw * scale_b)
    off_b = np.array([(iw - nw_b) // 2, (ih - nh_b) // 2] * 2)
    expected_b = (in_input - off_b) / np.array([nw_b / fh, nh_b / fw] * 2)
    expected_b = np.clip(expected_b, 0, [fh, fw, fh, fw])
    b = [r for r in sink.results if r.camera == "b"]
    assert len(b) == 3
    for r in b:
        np.testing.assert_allclose(r.detections.xyxy[0], expected_b, atol=1.0)


def test_every_frame_of_every_camera_once_in_order() -> None:
    sink = Collect()
    cams = [(f"c{i}", FakeReader(frames=n)) for i, n in enumerate((25, 7, 18))]
    with Pipeline(
        cameras=cams, detector=make_oracle(size=(64, 64)), config=_cpu(), sinks=[sink]
    ) as p:
        stats = p.run()
    for name, n in (("c0", 25), ("c1", 7), ("c2", 18)):
        idx = [r.frame_index for r in sink.results if r.camera == name]
        assert idx == list(range(n)), name
    assert stats.frames == 50 and not stats.interrupted and stats.threads_not_stopped == ()
    assert sink.closed
    # stage timestamps are in pipeline order for every frame
    for r in sink.results:
        t = r.timing
        order = [
            t.capture_ns,
            t.decoded_ns,
            t.preprocessed_ns,
            t.queued_ns,
            t.batched_ns,
            t.copy_done_ns,
            t.inference_done_ns,
            t.postprocessed_ns,
            t.emitted_ns,
        ]
        assert order == sorted(order)


def test_slow_camera_does_not_hold_back_the_others_live() -> None:
    # given three live cameras delivering at 50 fps and one at 5 fps
    fast = [(f"fast{i}", FakeReader(frames=60, pace_s=0.02)) for i in range(3)]
    slow = ("slow", FakeReader(frames=6, pace_s=0.2))
    sink = Collect()
    with Pipeline(
        cameras=[*fast, slow],
        detector=make_oracle(size=(64, 64)),
        config=_cpu(batch_timeout_ms=30.0, drop_policy="drop_oldest", queue_capacity=4),
        sinks=[sink],
    ) as p:
        stats = p.run()
    # then partial batches went out on timeout and the fast cameras kept (nearly) their rate
    assert stats.partial_batches > 0
    by_cam = {c.name: c for c in stats.cameras}
    assert by_cam["slow"].frames == 6
    for i in range(3):
        cam = by_cam[f"fast{i}"]
        assert cam.frames + cam.dropped == 60
    fast_times = sorted(r.timing.emitted_ns for r in sink.results if r.camera == "fast0")
    fast_rate = (len(fast_times) - 1) / ((fast_times[-1] - fast_times[0]) / 1e9)
    assert fast_rate > 15.0  # 50 fps offered (some dropped); held to the slow one: 5
    sizes = {r.batch_size for r in sink.results}
    assert 3 in sizes


def test_replay_pairs_a_slow_decoders_frames_with_the_others_by_time() -> None:
    """Replay: a camera whose decoder is slower does not make the others run ahead of it
    (which would put frames of different instants into one batch, one rig step); each
    batch holds one instant, and the replay takes about the slow camera's own time."""
    fast = [(f"fast{i}", FakeReader(frames=12, pace_s=0.005)) for i in range(2)]
    slow = ("slow", FakeReader(frames=12, pace_s=0.05))
    sink = Collect()
    with Pipeline(
        cameras=[*fast, slow],
        detector=make_oracle(size=(64, 64)),
        config=_cpu(batch_timeout_ms=5.0),
        sinks=[sink],
    ) as p:
        stats = p.run()
    assert [c.frames for c in stats.cameras] == [12, 12, 12]
    by_batch: dict[int, set[int]] = {}
    for r in sink.results:
        by_batch.setdefault(r.batch_index, set()).add(r.frame_index)
    assert all(len(indices) == 1 for indices in by_batch.values()), by_batch
    assert stats.source_spread_ms is not None and stats.source_spread_ms["max"] == 0.0


def test_camera_that_ends_early_leaves_the_rest_running() -> None:
    sink = Collect()
    cams = [("long", FakeReader(frames=40, pace_s=0.005)), ("short", FakeReader(frames=3))]
    with Pipeline(
        cameras=cams,
        detector=make_oracle(size=(64, 64)),
        config=_cpu(batch_timeout_ms=1000.0),
        sinks=[sink],
    ) as p:
        t0 = time.monotonic()
        stats = p.run()
        elapsed = time.monotonic() - t0
    assert [c.frames for c in stats.cameras] == [40, 3]
    # an ended camera is not waited for: 40 frames at 5 ms, far below 37 x the 1 s timeout
    assert elapsed < 10.0


def test_a_camera_whose_decoder_raises_fails_alone_and_the_others_go_on() -> None:
    # given a camera whose reader raises at its 6th frame, beside a healthy one
    sink = Collect()
    cams = [
        ("ok", FakeReader(frames=300, pace_s=0.001)),
        ("bad", FakeReader(frames=50, fail_at=5)),
    ]
    with Pipeline(
        cameras=cams, detector=make_oracle(size=(64, 64)), config=_cpu(), sinks=[sink]
    ) as p:
        stats = p.run()
        snaps = {s.name: s for s in p.cameras()}
    # then the run goes on to the healthy camera's end; the failed one keeps its 5 frames
    assert [c.frames for c in stats.cameras] == [300, 5]
    assert snaps["bad"].state is CameraState.FAILED and snaps["ok"].state is CameraState.ENDED
    assert snaps["bad"].reader.last_error == "RuntimeError: camera broke at frame 5"
    assert len(sink.results) == 305 and sink.closed


def test_a_model_that_raises_on_one_batch_loses_that_batch_only() -> None:
    # given a model that raises on its 3rd call (the warm-up is off: calls are batches)
    class Flaky(torch.nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            Flaky.calls += 1
            if Flaky.calls == 3:
                raise RuntimeError("CUDA out of memory (injected)")
            return _Sleepy(0.0).forward(x)

    detector = Detector("flaky", Flaky(), InputSpec((64, 64)), ("a",))
    sink = Collect()
    with Pipeline(
        cameras=[("c", FakeReader(frames=10))],
        detector=detector,
        config=_cpu(warmup=False, sample_hz=0),
        sinks=[sink],
    ) as p:
        stats = p.run()
    # then that batch's frame has no result, every other frame has, and the run says so
    assert stats.failed_batches == 1 and stats.failed_frames == 1
    assert stats.batch_error == "RuntimeError: CUDA out of memory (injected)"
    assert stats.frames == 9 and stats.cameras[0].discarded == 1
    assert sorted(r.frame_index for r in sink.results) == [0, 1, *range(3, 10)]


def test_a_tracking_stage_s_time_is_in_every_frame_s_end_to_end() -> None:
    # what a consumer waits for is the stage's output: a frame is emitted when the stage
    # hands it on, so a stage that takes 20 ms per batch shows in every frame's emit span
    def slow_stage(results: list[FrameResult]) -> list[FrameResult]:
        time.sleep(0.02)
        return results

    sink = Collect()
    cams = [(f"c{i}", FakeReader(frames=6)) for i in range(2)]
    with Pipeline(
        cameras=cams,
        detector=make_oracle(size=(64, 64)),
        config=_cpu(warmup=False, sample_hz=0),
        sinks=[sink],
        stage=slow_stage,
    ) as p:
        p.run()
    assert len(sink.results) == 12
    for r in sink.results:
        t = r.timing
        assert t.emitted_ns - t.postprocessed_ns >= 20_000_000, r.meta
    # one batch's frames are handed on together
    by_batch: dict[int, set[int]] = {}
    for r in sink.results:
        by_batch.setdefault(r.batch_index, set()).add(r.timing.emitted_ns)
    assert all(len(stamps) == 1 for stamps in by_batch.values())


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_heap_freezes_the_warm_process_for_the_run_and_unfreezes_at_close(
    freeze: bool,
) -> None:
    # a full collection walks every object of the loaded process (150-190 ms here): frozen,
    # the run's collections skip them; the pipeline hands them back when it closes
    import gc

    class FrozenDuringRun(Collect):
        def __init__(self) -> None:
            super().__init__()
            self.frozen: list[int] = []

        def write(self, result: FrameResult) -> None:
            self.frozen.append(gc.get_freeze_count())
            super().write(result)

    assert gc.get_freeze_count() == 0
    sink = FrozenDuringRun()
    with Pipeline(
        cameras=[("c", FakeReader(frames=4))],
        detector=make_oracle(size=(64, 64)),
        config=_cpu(warmup=False, sample_hz=0, freeze_heap=freeze),
        sinks=[sink],
    ) as p:
        p.run()
    assert len(sink.frozen) == 4
    if freeze:  # the engine, the detector and the libraries among them
        assert min(sink.frozen) > 10_000
    else:
        assert max(sink.frozen) == 0
    assert gc.get_freeze_count() == 0


def test_a_heap_the_caller_froze_stays_frozen_after_the_run() -> None:
    # gc.unfreeze thaws everything: a pipeline thaws only a heap it froze itself
    import gc

    gc.freeze()
    before = gc.get_freeze_count()
    try:
        with Pipeline(
            cameras=[("c", FakeReader(frames=2))],
            detector=make_oracle(size=(64, 64)),
            config=_cpu(warmup=False, sample_hz=0, freeze_heap=True),
            sinks=[Collect()],
        ) as p:
            p.run()
        # thawed, the count would be 0; frozen objects may still be freed by reference
        # counting meanwhile (an earlier test's leftovers let go: one random-order run saw
        # 571879 -> 571873), so a few fewer is not a thaw
        assert gc.get_freeze_count() > 0.99 * before > 0
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("detect_every", [1, 2])
def test_a_model_that_keeps_raising_stops_the_run(detect_every: int) -> None:
    # (with a detection interval of 2 on one camera, every other batch has no frame for the
    # model: such a batch is no success of the model's and does not reset the count)
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("shape mismatch (injected)")

    detector = Detector("broken", Broken(), InputSpec((64, 64)), ("a",))
    sink = Collect()
    with (
        Pipeline(
            # paced, so that each batch is done with before the next comes
            cameras=[("c", FakeReader(frames=50, pace_s=0.02))],
            detector=detector,
            config=_cpu(warmup=False, sample_hz=0, detect_every=detect_every),
            sinks=[sink],
            stage=lambda results: results,
        ) as p,
        pytest.raises(PipelineError, match="3 batches in a row failed") as info,
    ):
        p.run()
    cause = info.value.__cause__
    assert cause is not None and isinstance(cause.__cause__, ValueError)
    assert sink.closed and all(r.detections.predicted for r in sink.results)


def test_keyboard_interrupt_stops_within_the_join_budget() -> None:
    sink = Collect()
    cams = [(f"c{i}", FakeReader(frames=100_000, pace_s=0.002)) for i in range(3)]
    calls = {"n": 0}

    def interrupt(_: RunProgress) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    with Pipeline(
        cameras=cams, detector=make_oracle(size=(64, 64)), config=_cpu(), sinks=[sink]
    ) as p:
        t0 = time.monotonic()
        stats = p.run(progress=interrupt, progress_interval_s=0.1)
        stop_s = time.monotonic() - t0
    assert stats.interrupted and stats.threads_not_stopped == ()
    assert stats.frames == len(sink.results) > 0
    assert stop_s < 0.1 * 3 + JOIN_TIMEOUT_S + 1.0
    assert sink.closed


def test_drop_oldest_keeps_queues_bounded_and_counts_drops() -> None:
    # given a fast camera feeding a deliberately slow consumer under the live policy
    class SlowSink(Collect):
        def write(self, result: FrameResult) -> None:
            time.sleep(0.01)
            super().write(result)

    sink = SlowSink()
    reader = FakeReader(frames=300)
    with Pipeline(
        cameras=[("live", reader)],
        detector=make_oracle(size=(64, 64)),
        config=_cpu(drop_policy="drop_oldest", queue_capacity=2),
        sinks=[sink],
    ) as p:
        stats = p.run()
    cam = stats.cameras[0]
    assert cam.dropped > 0
    assert cam.frames + cam.dropped == 300
    assert max(stats.queue_high_water) <= 2
    # the newest frame wins: processed frame indices only increase
    idx = [r.frame_index for r in sink.results]
    assert idx == sorted(idx) and idx[-1] == 299


def test_a_lone_batch_is_not_held_back_waiting_for_the_next() -> None:
    # given one camera paced at 10 fps: each batch is alone in the engine's inbox
    sink = Collect()
    with Pipeline(
        cameras=[("paced", FakeReader(frames=12, pace_s=0.1))],
        detector=make_oracle(size=(64, 64)),
        config=_cpu(),
        sinks=[sink],
    ) as p:
        p.run()
    waits_ms = sorted((r.timing.emitted_ns - r.timing.batched_ns) / 1e6 for r in sink.results)
    # then it is computed at once, not a frame period (100 ms) later when the next one comes
    assert waits_ms[len(waits_ms) // 2] < 50.0, waits_ms


class _Sleepy(torch.nn.Module):
    """A model that takes `seconds` a batch and finds nothing."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        time.sleep(self.seconds)
        empty = {"boxes": torch.zeros((0, 4)), "scores": torch.zeros(0)}
        return [{**empty, "labels": torch.zeros(0, dtype=torch.long)} for _ in range(len(x))]


@pytest.mark.parametrize("bound_s", [10.0, 0.3])
def test_the_drain_waits_for_the_frames_in_flight_up_to_its_bound(bound_s: float) -> None:
    # given a model that takes 0.4 s a batch, and frames queued behind it when capture stops
    detector = Detector("sleepy", _Sleepy(0.4), InputSpec((64, 64)), ("a",))
    sink = Collect()
    p = Pipeline(
        cameras=[("c", FakeReader(frames=1000))],
        detector=detector,
        config=_cpu(drain_timeout_s=bound_s, queue_capacity=3, warmup=False, sample_hz=0),
        sinks=[sink],
    )
    started = time.monotonic()
    stats = p.run(duration_s=0.5)
    took = time.monotonic() - started
    read = p.decoders[0].frames_read
    if bound_s > 5:
        # then every frame read came out, and the drain ended when they did, not at its bound
        assert read >= 3 and stats.frames == read == len(sink.results)
        assert took < 0.5 + 0.4 * (read + 1) + 1.5, (took, read)
    else:
        # then a short bound cuts the drain: the frames still inside are counted as discarded
        assert stats.frames < read and took < 0.5 + bound_s + 0.4 + JOIN_TIMEOUT_S
        assert stats.cameras[0].discarded == read - stats.frames
    assert stats.threads_not_stopped == ()


DRAIN_S = 0.5


def test_results_after_the_join_budget_are_dropped_not_written_to_closed_sinks() -> None:
    # given a model so slow that the engine overruns the shutdown budget
    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            time.sleep(DRAIN_S + JOIN_TIMEOUT_S + 1.0)
            return [
                {
                    "boxes": torch.zeros((0, 4)),
                    "scores": torch.zeros(0),
                    "labels": torch.zeros(0, dtype=torch.long),
                }
                for _ in range(len(x))
            ]

    detector = Detector("slow", Slow(), InputSpec((64, 64)), ("a",))
    sink = Collect()
    calls = {"n": 0}

    def interrupt(_: RunProgress) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt

    p = Pipeline(
        cameras=[("c", FakeReader(frames=5))],
        detector=detector,
        config=_cpu(drain_timeout_s=DRAIN_S),
        sinks=[sink],
    )
    stats = p.run(progress=interrupt, progress_interval_s=0.1)
    # then the run reports the thread that did not stop, and what it emitted late is neither
    # written nor counted
    assert stats.interrupted and "engine" in stats.threads_not_stopped
    for t in p.threads:
        t.join(timeout=10)
    assert sink.closed
    assert len(sink.results) == sum(p.frames_done())


def test_camera_snapshots_and_load_samples_while_running() -> None:
    # given two cameras paced at about 50 fps and a 20 Hz load sampler
    class Loads:
        def __init__(self) -> None:
            self.samples: list[object] = []
            self.closed = False

        def write(self, sample: object) -> None:
            self.samples.append(sample)

        def close(self) -> None:
            self.closed = True

    loads = Loads()
    views = []

    def progress(p: RunProgress) -> None:
        views.append((p.cameras, p.load))

    with Pipeline(
        cameras=[
            ("a", FakeReader(frames=40, pace_s=0.02)),
            ("b", FakeReader(frames=40, pace_s=0.02)),
        ],
        detector=make_oracle(size=(64, 64), boxes=[[1, 1, 9, 9]]),
        config=_cpu(sample_hz=20.0),
        load_sinks=[loads],
    ) as pipeline:
        assert pipeline.sampler is not None
        assert pipeline.sampler.thread.name == "gpu-monitor"
        stats = pipeline.run(progress=progress, progress_interval_s=0.2)
    # then the camera snapshots saw both cameras at a plausible rate with a latency figure
    assert stats.frames == 80
    fps = [[c.fps for c in cams] for cams, _ in views]
    busy = [(cams, f) for (cams, _), f in zip(views, fps, strict=True) if min(f) > 0]
    assert busy, fps
    # (the first views cover the start-up, later ones a full window of ~50 fps per camera)
    assert any(all(30 <= x <= 70 for x in f) for _, f in busy), fps
    assert all(x <= 70 for _, f in busy for x in f)
    assert all(c.p95_ms > 0 for cams, _ in busy for c in cams)
    assert any(load is not None for _, load in views)
    # and the load sink got samples on the sampler thread and was closed with the run
    assert len(loads.samples) >= 5 and loads.closed


def test_no_sampler_thread_when_sampling_is_off() -> None:
    with Pipeline(
        cameras=[("a", FakeReader(frames=3))],
        detector=make_oracle(size=(64, 64), boxes=[]),
        config=_cpu(sample_hz=0.0),
    ) as pipeline:
        assert pipeline.sampler is None
        pipeline.run()
        assert pipeline.latest_load() is None


def test_duration_stops_capture_and_drains_what_was_read() -> None:
    # given two endless-ish paced cameras
    with Pipeline(
        cameras=[
            ("a", FakeReader(frames=10_000, pace_s=0.01)),
            ("b", FakeReader(frames=10_000, pace_s=0.01)),
        ],
        detector=make_oracle(size=(64, 64), boxes=[]),
        config=_cpu(),
    ) as pipeline:
        # when the run has a duration
        t0 = time.monotonic()
        stats = pipeline.run(duration_s=0.5)
        elapsed = time.monotonic() - t0
    # then it stopped soon after, not interrupted, and every frame read came out
    assert 0.5 <= elapsed < 0.5 + 1.5
    assert not stats.interrupted and stats.threads_not_stopped == ()
    assert 10 < stats.frames == sum(d.frames_read for d in pipeline.decoders)


@pytest.mark.timeout(30)
def test_progress_gets_readings_and_may_stop_capture() -> None:
    # given three cameras of 40 frames each, read slowly, and a callback that has seen enough
    # once 12 results are out
    seen: list[RunProgress] = []

    def enough(p: RunProgress) -> bool:
        seen.append(p)
        return p.frames_done >= 12

    cams = [(f"c{i}", FakeReader(frames=40, pace_s=0.01)) for i in range(3)]
    with Pipeline(cameras=cams, detector=make_oracle(size=(64, 64)), config=_cpu()) as p:
        stats = p.run(progress=enough, progress_interval_s=0.05)
        described = p.describe()
    # then it was handed readings, not the pipeline, and its True stopped capture early,
    # with what was read drained out as a duration's end does
    assert all(isinstance(r, RunProgress) for r in seen) and seen[0].expected_frames == 120
    assert [c.name for c in seen[-1].cameras] == ["c0", "c1", "c2"]
    assert 12 <= stats.frames < 120 and not stats.interrupted
    assert seen[-1].frames_done == stats.frames  # the last reading is taken after the stop
    # and the description says what ran, as a job records it
    assert described.device == "cpu" and described.runtime is None
    assert described.threads >= 1 and described.lanes >= 1
    assert described.config["batch_timeout_ms"] == p.config.batch_timeout_ms


def _stalled_run(
    device: str, slow_call: int, frames: int = 40
) -> tuple[list[FrameResult], dict[str, int], dict[str, object], int]:
    """Two cameras at 20 fps paced live, `frames` each, a 150 ms budget, tracking, and a
    model that takes 10 ms a batch except call `slow_call` (the warm-up makes 4), 500 ms:
    the results, the stall's start and end (monotonic ns), the schedule's figures and the
    frames counted."""
    from drivepercept.rig import CameraConfig
    from drivepercept.tracking.stage import RigTracker

    stall: dict[str, int] = {}

    class StallsOnce(torch.nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            StallsOnce.calls += 1
            if StallsOnce.calls == slow_call:
                stall["start"] = time.monotonic_ns()
                time.sleep(0.5)
                stall["end"] = time.monotonic_ns()
            return [{k: v.to(x.device) for k, v in d.items()} for d in _Sleepy(0.01).forward(x)]

    detector = Detector("stalls", StallsOnce(), InputSpec((64, 64)), ("a",))
    names = ("c0", "c1")
    sink = Collect()
    config = PipelineConfig(
        device=device, deadline_ms=150, drop_policy="drop_oldest", queue_capacity=8,
        max_in_flight=2, ring_slots=3, cpu_lanes=1, sample_hz=0,
    )  # fmt: skip
    with Pipeline(
        cameras=[(n, FakeReader(frames=frames, pace_s=0.05)) for n in names],
        detector=detector,
        config=config,
        sinks=[sink],
        stage=RigTracker([CameraConfig(name=n) for n in names]),
    ) as p:
        stats = p.run()
        figures = p.scheduler.figures() if p.scheduler is not None else {}
    assert stall, "the model never reached its slow batch"
    return sink.results, stall, figures, stats.frames


_DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


@pytest.mark.parametrize("device", _DEVICES)
def test_frames_the_model_is_late_with_are_answered_by_their_deadline(device: str) -> None:
    # given a live run with a 150 ms budget and tracking, and a model that takes 10 ms a
    # batch, except its 8th real batch, 500 ms (another process took the cores mid-batch)
    results, stall, figures, frames = _stalled_run(device, slow_call=12)
    # then that batch's frames were answered while the model was still on them, from their
    # cameras' tracks, within the budget
    answered = [r for r in results if stall["start"] < r.timing.compute_start_ns < stall["end"]]
    assert answered and all(r.detections.predicted for r in answered)
    # (at their deadline less a guard of 3 ms or more; 20 ms more for a busy test machine's
    # wake-up, against a stall that lasts 500 ms)
    assert all(r.timing.end_to_end_ms <= 170 for r in answered), [
        r.timing.end_to_end_ms for r in answered
    ]
    # and so were the frames captured while it stalled, waiting for the engine in their
    # cameras' queues (the batcher sends them on, `_aging_round`), none dropped
    during = [r for r in results if stall["start"] < r.timing.capture_ns < stall["end"]]
    assert len(during) >= 16, len(during)  # 2 cameras x 20 fps x 0.5 s, less a frame each
    assert all(r.timing.end_to_end_ms <= 170 for r in during), [
        r.timing.end_to_end_ms for r in during
    ]
    # and once each: the model's boxes for them, when they came, were not handed on again
    keys = [(r.camera, r.frame_index) for r in results]
    assert len(keys) == len(set(keys)) == frames == 80
    # and run.json's schedule counts those the model had (`overdue`; frames that were to be
    # predicted anyway, answered early from the engine's inbox, stay `predicted`)
    cameras = figures["cameras"]
    assert isinstance(cameras, dict)
    assert sum(c["overdue"] for c in cameras.values()) >= 1


def test_after_a_stall_the_model_sees_the_frames_again() -> None:
    # given the same run, 4 s long, its 8th real batch stalled 500 ms
    results, stall, _, frames = _stalled_run("cpu", slow_call=12, frames=80)
    # then from 2 s after the stall the model saw most frames again: the stall was not
    # taken for the machine's pace (in the mean of the service times it held every
    # estimate up for 24 batches, and the model saw only the starvation bound's frames,
    # 10 of 162 over 4 s)
    later = [r for r in results if r.timing.capture_ns > stall["end"] + 2_000_000_000]
    detected = [r for r in later if not r.detections.predicted]
    assert len(later) >= 20 and len(detected) >= len(later) / 3, (len(detected), len(later))
    assert frames == 160


def test_a_camera_s_first_frame_waits_for_the_model_however_late() -> None:
    # (a guard: the code before the watch passes it too)
    # given the same run, the model's first real batch (the cameras' first frames) stalled
    results, stall, _, frames = _stalled_run("cpu", slow_call=5)
    # then nothing was answered while it stalled: there were no tracks to predict from, and
    # a camera's first frame must be detected
    assert not [r for r in results if stall["start"] < r.timing.emitted_ns < stall["end"]]
    firsts = [r for r in results if r.frame_index == 0]
    assert len(firsts) == 2 and not any(r.detections.predicted for r in firsts)
    assert all(r.timing.end_to_end_ms > 150 for r in firsts)  # late, and detected
    # and every frame was answered once
    keys = [(r.camera, r.frame_index) for r in results]
    assert len(keys) == len(set(keys)) == frames


class _LooksStage:
    """A stage that reads the frames' pixels (as tracking's looks do) and records them."""

    wants_images = True

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...] | None] = []

    def __call__(self, results: list[FrameResult]) -> list[FrameResult]:
        self.shapes += [None if r.original_bgr is None else r.original_bgr.shape for r in results]
        return results


@pytest.mark.parametrize("policy", ["block", "drop_oldest"])
@pytest.mark.parametrize("keep_original", [False, True])
def test_a_stage_that_reads_the_pixels_gets_them_and_the_sinks_only_when_asked(
    policy: str, keep_original: bool
) -> None:
    """Issue 44: the tracking stage reads each detected frame's original pixels (its boxes'
    looks); they are dropped as the stage hands the frames on unless a sink wants them (an
    annotated video), so no sink's queue holds a frame's pixels it never asked for."""
    stage, sink = _LooksStage(), Collect()
    cams = [(f"c{i}", FakeReader(size=(96, 64), frames=5)) for i in range(2)]
    with Pipeline(
        cameras=cams,
        detector=make_oracle(size=(64, 64)),
        config=_cpu(warmup=False, sample_hz=0, drop_policy=policy),
        sinks=[sink],
        stage=stage,
        keep_original=keep_original,
    ) as p:
        p.run()
    assert sink.results and len(stage.shapes) == len(sink.results)
    assert all(s == (64, 96, 3) for s in stage.shapes)  # (H, W, 3) of the camera's frames
    kept = [r.original_bgr is not None for r in sink.results]
    assert kept == [keep_original] * len(kept)
