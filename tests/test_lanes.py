"""CPU lanes: a batch run as sub-batches at once (engine/lanes.py), in the step and the run."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from fakereaders import FakeReader

from drivepercept.config import PipelineConfig
from drivepercept.engine.lanes import Lanes, plan_lanes, threads_per_lane
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, InputSpec
from drivepercept.pipeline import Pipeline

pytestmark = pytest.mark.timeout(60)

CPU = torch.device("cpu")
Outputs = list[dict[str, torch.Tensor]]


def lane_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("engine-lane")]


def per_image(x: torch.Tensor) -> Outputs:
    """One output per image: its first pixel, so the order can be checked."""
    return [{"value": row.flatten()[:1].clone()} for row in x]


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_lanes_are_planned_for_the_cpu_and_bounded_by_the_batch() -> None:
    # one lane per torch thread, at most one per frame
    assert plan_lanes(0, device=CPU, threads=2, max_batch=6) == 2
    assert plan_lanes(0, device=CPU, threads=16, max_batch=6) == 6
    assert plan_lanes(4, device=CPU, threads=2, max_batch=6) == 4  # asked for
    assert plan_lanes(0, device=CPU, threads=2, max_batch=1) == 1  # one camera
    # off on a GPU and where another runtime or compile runs the model
    assert plan_lanes(0, device=torch.device("cuda"), threads=8, max_batch=6) == 1
    assert plan_lanes(0, device=CPU, threads=2, max_batch=6, eligible=False) == 1
    # the threads are shared out, at least one each
    assert (
        threads_per_lane(16, 6) == 2 and threads_per_lane(2, 2) == 1 and threads_per_lane(1, 4) == 1
    )
    with pytest.raises(ConfigError, match="cpu_lanes must be 0"):
        PipelineConfig(cpu_lanes=-1)


def test_map_runs_the_parts_at_once_on_named_threads_and_keeps_batch_order() -> None:
    # given two lanes and a call that only returns once both lanes are inside it
    meeting = threading.Barrier(2, timeout=10)
    seen: list[tuple[str, int, bool]] = []

    def call(x: torch.Tensor) -> Outputs:
        seen.append(
            (threading.current_thread().name, x.shape[0], torch.is_inference_mode_enabled())
        )
        meeting.wait()  # BrokenBarrierError if the parts ran one after the other
        return per_image(x)

    lanes = Lanes(2)
    x = torch.arange(5, dtype=torch.float32).view(5, 1)
    # when a batch of 5 is mapped under inference mode
    with torch.inference_mode():
        out = lanes.map(call, x)
    lanes.close()
    # then the parts (3 + 2) ran at once, one in the caller and one in a lane thread, each in
    # inference mode, and the outputs come back in batch order
    assert sorted(n for _, n, _ in seen) == [2, 3]
    names = {name for name, _, _ in seen}
    assert threading.current_thread().name in names
    assert any(name.startswith("engine-lane") for name in names)
    assert all(inference for _, _, inference in seen)
    assert [float(o["value"]) for o in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert lane_threads() == []  # closed: joined


def test_a_failing_lane_raises_in_the_caller_after_every_lane_finished() -> None:
    finished = threading.Event()

    def call(x: torch.Tensor) -> Outputs:
        if threading.current_thread().name.startswith("engine-lane"):
            raise RuntimeError("lane broke")
        finished.wait(0.2)
        finished.set()
        return per_image(x)

    lanes = Lanes(2)
    with pytest.raises(RuntimeError, match="lane broke"):
        lanes.map(call, torch.zeros(4, 1))
    assert finished.is_set()
    # and a single frame, or a closed lane set, runs in the caller alone
    assert len(lanes.map(call, torch.zeros(1, 1))) == 1
    lanes.close()
    assert len(lanes.map(call, torch.zeros(4, 1))) == 4


class Recording(torch.nn.Module):
    """Records, per call, the rows, the autocast state and torch's thread count it saw; one
    box per image."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, bool, int]] = []

    def forward(self, x: torch.Tensor) -> Outputs:
        seen = (x.shape[0], torch.is_autocast_enabled("cpu"), torch.get_num_threads())
        self.calls.append(seen)
        score = x.float().mean(dim=(1, 2, 3))
        box = torch.tensor([[1.0, 1.0, 9.0, 9.0]])
        return [
            {"boxes": box, "scores": s.reshape(1), "labels": torch.ones(1, dtype=torch.long)}
            for s in score
        ]


def _recording() -> Detector:
    return Detector(
        name="rec", module=Recording(), input=InputSpec(size=(32, 32)), class_names=("bg", "a")
    )


def test_a_step_with_lanes_gives_the_boxes_of_one_lane_and_autocasts_in_each() -> None:
    # given one batch of 4 different frames, and steps with 2 lanes and with 1
    batch = torch.stack([torch.full((32, 32, 3), 40 * i, dtype=torch.uint8) for i in range(4)])
    config = PipelineConfig(device="cpu", score_threshold=0.0, torch_threads=2, precision="bf16")
    two = DetectorStep(_recording(), config, CPU, max_batch=4)
    one = DetectorStep(_recording(), dataclasses.replace(config, cpu_lanes=1), CPU, max_batch=4)
    module = two.detector.module
    assert isinstance(module, Recording)
    torch.set_num_threads(2)
    try:
        # when both run it (the calling thread computes the first lane itself)
        packed2, counts2 = two(batch)
        threads_after_batch = torch.get_num_threads()
        packed1, counts1 = one(batch)
        halves = list(module.calls)
        # and a one-frame batch from a thread that is on one torch thread
        module.calls.clear()
        torch.set_num_threads(1)
        two(batch[:1])
        threads_after_one = torch.get_num_threads()
    finally:
        two.close()
        one.close()
    # then the lanes saw halves, each under bf16 autocast on one of the two threads, the
    # results are the same, and the calling thread has its own count back
    assert sorted(halves) == [(2, True, 1), (2, True, 1)]
    assert threads_after_batch == 2
    assert two.lanes.count == 2 and one.lanes.count == 1
    assert torch.equal(counts1, counts2) and torch.allclose(packed1, packed2)
    # and the lone frame ran in the calling thread on both threads, then gave them back
    assert module.calls == [(1, True, 2)] and threads_after_one == 1
    assert lane_threads() == []


def test_a_run_shares_the_threads_among_its_lanes_and_leaves_no_lane_thread() -> None:
    # given four cameras on the CPU, torch on 2 threads
    config = PipelineConfig(device="cpu", torch_threads=2, sample_hz=0.0, score_threshold=0.0)
    detector = _recording()
    cams = [(f"c{i}", FakeReader(size=(32, 32), frames=4)) for i in range(4)]
    # when it replays them
    with Pipeline(cameras=cams, detector=detector, config=config) as pipeline:
        stats = pipeline.run()
        lanes = pipeline.engine.step.lanes.count
        flight = pipeline.engine.flight_limit
    # then the batches of 4 with others waiting behind ran whole in one of the 2 lanes, the
    # others cut in two (as the warm-up's batch was), all on 1 of the 2 threads, with a
    # batch for each lane and one more in flight (the warm-up's lone frame ran on both
    # threads), and no lane thread is left
    assert stats.frames == 16 and lanes == 2 and flight == 3
    module = detector.module
    assert isinstance(module, Recording)
    rows = [r for r, _, _ in module.calls]
    assert sum(rows) == 16 + 4 + 1 and max(rows) == 4  # the run's frames and the warm-up's
    assert {threads for rows, _, threads in module.calls if rows >= 2} == {1}
    assert (1, 2) in {(rows, threads) for rows, _, threads in module.calls}  # a lone frame
    assert lane_threads() == []
    # and a later run without lanes has every thread in its one lane (the threads the engine
    # starts take torch's default from the last setting: it was given back)
    one = PipelineConfig(device="cpu", cpu_lanes=1, sample_hz=0.0)
    again = _recording()
    cams = [(f"c{i}", FakeReader(size=(32, 32), frames=2)) for i in range(2)]
    with Pipeline(cameras=cams, detector=again, config=one) as pipeline:
        pipeline.run()
    assert isinstance(again.module, Recording)
    assert {threads for _, _, threads in again.module.calls} == {torch.get_num_threads()}


def test_live_splits_each_batch_over_the_lanes_with_its_own_flight_limit() -> None:
    # given four cameras on the CPU, torch on 2 threads, run as live runs (newest frame)
    config = PipelineConfig(
        device="cpu",
        torch_threads=2,
        sample_hz=0.0,
        score_threshold=0.0,
        drop_policy="drop_oldest",
        queue_capacity=1,
        warmup=False,
    )
    detector = _recording()
    cams = [(f"c{i}", FakeReader(size=(32, 32), frames=4)) for i in range(4)]
    with Pipeline(cameras=cams, detector=detector, config=config) as pipeline:
        pipeline.run()
        flight = pipeline.engine.flight_limit
    # then a batch is cut into the lanes (just-in-time batches keep their latency), and as
    # many batches are in flight as configured
    module = detector.module
    assert isinstance(module, Recording)
    assert flight == config.max_in_flight
    assert {rows for rows, _, _ in module.calls} <= {1, 2}
    assert {threads for rows, _, threads in module.calls if rows == 2} == {1}


def test_run_json_records_the_lanes(tmp_path: Path) -> None:
    from drivepercept.run import RunOptions, run

    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(3):
        cv2.imwrite(str(frames / f"{i:03d}.png"), np.full((48, 64, 3), 50 * i, np.uint8))
    options = RunOptions(
        sources=(f"a={frames}", f"b={frames}"),
        model="rec",
        settings={"device": "cpu", "torch_threads": 2, "sample_hz": 0.0},
        out_root=tmp_path / "runs",
        name="lanes",
        report_formats=(),
    )
    result = run(options, detector=_recording())
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["environment"]["cpu_lanes"] == 2
    assert record["environment"]["cpu_threads"] == 2
    assert record["config"]["cpu_lanes"] == 0


def test_bench_figures_name_the_lanes_and_each_lanes_threads() -> None:
    from drivepercept.bench.common import SpeedOptions

    config = PipelineConfig(device="cpu", torch_threads=2)
    step = DetectorStep(_recording(), config, CPU, max_batch=6)
    one = DetectorStep(_recording(), dataclasses.replace(config, cpu_lanes=1), CPU, max_batch=6)
    step.close()
    speed, plain = SpeedOptions.of(config, step), SpeedOptions.of(config, one)
    assert (speed.cpu_lanes, speed.threads_used) == (2, 1)
    assert speed.line().endswith("torch threads 1 in each of 2 CPU lanes")
    assert plain.cpu_lanes == 1 and "lanes" not in plain.line()
    assert speed.as_dict()["cpu_lanes"] == 2


def test_launch_hands_each_batch_whole_to_a_free_lane_and_returns_at_once() -> None:
    # given two lanes and a model call that waits for a gate on the first batch
    gate = threading.Event()
    seen: list[list[float]] = []

    def call(x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        seen.append(x[:, 0].tolist())
        if float(x[0, 0]) == 0.0:
            assert gate.wait(5.0)
        return [{"v": row} for row in x[:, 0].clone()]

    lanes = Lanes(2, threads=1, total=2)
    try:
        one = lanes.launch(call, torch.arange(4.0).view(4, 1))
        two = lanes.launch(call, torch.arange(4.0, 8.0).view(4, 1))
        # while the first batch is held, the other lane runs the whole second batch
        assert [float(o["v"]) for o in two.wait()] == [4.0, 5.0, 6.0, 7.0]
        assert not gate.is_set() and sorted(seen) == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
        gate.set()
        assert [float(o["v"]) for o in one.wait()] == [0.0, 1.0, 2.0, 3.0]
        assert one.done_ns >= two.done_ns > 0
        # and a batch launched cut goes to the lanes as one part each, back in batch order
        seen.clear()
        cut = lanes.launch(call, torch.arange(8.0, 12.0).view(4, 1), whole=False)
        assert [float(o["v"]) for o in cut.wait()] == [8.0, 9.0, 10.0, 11.0]
        assert sorted(seen) == [[8.0, 9.0], [10.0, 11.0]]
    finally:
        gate.set()
        lanes.close()


def test_a_failing_launched_batch_raises_when_waited_for() -> None:
    def call(x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        if int(x[0, 0]) == 4:
            raise RuntimeError("lane broke")
        return [{"v": row} for row in x[:, 0]]

    lanes = Lanes(2, threads=1, total=2)
    try:
        fine = lanes.launch(call, torch.arange(4.0).view(4, 1))
        broken = lanes.launch(call, torch.arange(4.0, 8.0).view(4, 1))
        with pytest.raises(RuntimeError, match="lane broke"):
            broken.wait()
        assert len(fine.wait()) == 4  # the other batch is not lost
    finally:
        lanes.close()
