"""The job layer as a Python API (no argparse, no subprocess): options, mode policies, runs,
and what a slow or failing output does to a run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fakereaders import FakeReader

from drivepercept.config import PipelineConfig
from drivepercept.errors import ConfigError
from drivepercept.models.oracle import make_oracle
from drivepercept.pipeline import Pipeline, PipelineError
from drivepercept.run import DEFAULT_MODEL, Mode, ModelOptions, RunOptions, run
from drivepercept.rundir import RunDir, RunRecord
from drivepercept.sinks.fanout import OnFailure, SinkPolicy, SinkSet
from drivepercept.types import FrameResult

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RIG = ROOT / "sample_videos" / "rig.toml"


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith(("decode-", "sink-"))]
    assert not left


# ------------------------------------------------------------------ options and modes


def test_replay_mode_chooses_nothing_and_live_modes_choose_the_live_policies() -> None:
    assert Mode.REPLAY.policies({"device": "cpu"}) == {}
    for mode in (Mode.LIVE, Mode.REALTIME):
        assert mode.policies({"device": "cpu"}) == {
            "drop_policy": "drop_oldest",
            "queue_capacity": 1,
            "max_in_flight": 2,  # n+1 computes while n is post-processed
            "ring_slots": 3,  # and one for the next batch, made just in time
            "freeze_heap": True,  # no full garbage collection during the run
        }
    # the staging slots follow the in-flight batches the caller chose
    assert Mode.LIVE.policies({"device": "cpu", "max_in_flight": 3})["ring_slots"] == 4


def test_the_callers_settings_win_over_the_mode_and_the_defaults_fill_the_rest() -> None:
    options = RunOptions(sources=("a.mp4",), mode=Mode.LIVE, settings={"queue_capacity": 2})
    config = options.pipeline()
    assert options.mode is Mode.LIVE and options.run_command == "live"
    assert (config.queue_capacity, config.drop_policy) == (2, "drop_oldest")
    assert config.score_threshold == PipelineConfig().score_threshold
    replay = RunOptions(sources=("a.mp4",)).pipeline()
    assert (replay.drop_policy, replay.queue_capacity, replay.freeze_heap) == ("block", 4, False)
    assert RunOptions(sources=("a",), mode=Mode.REALTIME).run_command == "replay --realtime"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"sources": ()}, "at least one source"),
        ({"mode": "fast"}, "mode must be"),
        ({"settings": {"dorp_policy": "block"}}, "unknown pipeline settings ['dorp_policy']"),
        ({"duration_s": 0.0}, "duration must be > 0"),
        ({"metrics_port": 70000}, "metrics port"),
        ({"budget_ms": 0.0}, "budget"),
        ({"report_formats": ("pdf",)}, "report formats"),
        ({"input_size": 416}, "input size must look like WIDTHxHEIGHT"),
        ({"input_size": "416"}, "got '416'"),
        ({"input_size": [416, 0]}, "input size"),
        ({"input_size": [416, 256, 3]}, "input size"),
        ({"model": 5}, "model must be a model name"),
        ({"classes": "most"}, "classes must be driving or all"),
    ],
)
def test_bad_options_are_one_clear_error(kwargs: dict[str, object], words: str) -> None:
    base: dict[str, object] = {"sources": ("a.mp4",), **kwargs}
    with pytest.raises(ConfigError) as error:
        RunOptions(**base)  # type: ignore[arg-type]
    assert words in str(error.value) and "\n" not in str(error.value)


def test_the_model_a_source_runs_by_default(tmp_path: Path) -> None:
    # a synthetic rig names its model; an old one (before rigs named it) is known by its
    # [simulation] table; anything else runs the real-road default
    assert RunOptions(sources=(str(SAMPLE_RIG),)).model == "drivepercept-tiny"
    old = tmp_path / "rig.toml"
    old.write_text(SAMPLE_RIG.read_text().replace('model = "drivepercept-tiny"', ""))
    assert "model =" not in old.read_text()
    assert RunOptions(sources=(str(old),)).model == "drivepercept-tiny"
    plain = tmp_path / "plain.toml"
    plain.write_text('[[cameras]]\nname = "a"\nvideo = "a.mp4"\n')
    assert RunOptions(sources=(str(plain),)).model == DEFAULT_MODEL == "yolox-nano"
    assert RunOptions(sources=("a.mp4",)).model == DEFAULT_MODEL
    assert RunOptions(sources=(str(SAMPLE_RIG), "a.mp4")).model == DEFAULT_MODEL  # mixed
    assert RunOptions(sources=("a.mp4",), model="drivepercept-tiny").model == "drivepercept-tiny"
    assert RunOptions(sources=("a.mp4",), input_size=[640, 384]).input_size == (640, 384)  # type: ignore[arg-type]
    assert RunOptions(sources=("a.mp4",), input_size=" 640x384 ").input_size == (640, 384)  # type: ignore[arg-type]


def test_a_bad_setting_value_is_caught_when_the_pipeline_config_is_made() -> None:
    with pytest.raises(ConfigError, match="precision"):
        RunOptions(sources=("a.mp4",), settings={"precision": "fp8"}).pipeline()


# ------------------------------------------------------------------ a run through the API


def test_a_replay_through_the_python_api_matches_its_run_folder(tmp_path: Path) -> None:
    # given the sample rig, three frames a camera, on the CPU
    options = RunOptions(
        sources=(str(SAMPLE_RIG),),
        settings={"device": "cpu", "max_frames": 3},
        out_root=tmp_path,
        name="api",
        report_formats=("json",),
    )
    # when it runs through the API alone
    result = run(options)
    # then the result, the folder's record, its detections and its summary agree
    folder = RunDir(result.run_dir)
    assert result.run_dir == tmp_path / "api"
    assert result.stats.frames == 18 and result.failure() is None
    record = folder.read_record()
    assert record == result.record
    assert (record.command, record.mode, record.status) == ("replay", "replay", "complete")
    assert record.summary is not None and record.summary.frames == 18
    frames = list(result.detections())
    assert len(frames) == 18
    assert {f["camera"] for f in frames} == {c.name for c in result.cameras}
    summary = json.loads(folder.summary_json.read_text())
    assert summary["frames"] == 18 and summary["run"]["command"] == "replay"
    assert record.sinks is not None and record.sinks["detections"].frames_written == 18
    # and run.json's typed sections keep every key the file holds, and write it back whole
    raw = json.loads(folder.run_json.read_text())
    assert record.to_json() == raw
    assert record.telemetry is not None and record.telemetry.cpu_count >= 1
    assert record.sources[0].width > 0 and record.model.input_size == (448, 256)


def test_a_damaged_section_keeps_what_fits_and_names_what_does_not() -> None:
    # given a run.json whose summary has a counter written as text and a camera that is not
    # an object, and whose live camera's changes hold a stray number
    data = {
        "command": "live",
        "mode": "live",
        "summary": {"frames": "12", "batches": 3, "cameras": {"a": {"frames": 4}, "b": 7}},
        "live": {"a": {"state": "ended", "changes": [{"state": "streaming"}, 5]}},
    }
    record, problems = RunRecord.from_json(data)
    # then the rest is read, and what did not fit is named
    assert record.summary is not None and record.summary.batches == 3
    assert record.summary.frames == 0 and list(record.summary.cameras) == ["a"]
    assert record.live is not None and [c.state for c in record.live["a"].changes] == ["streaming"]
    assert problems == ["summary.frames: unexpected str; ignored"]


def test_run_json_of_version_1_still_reads() -> None:
    old = {"schema_version": 1, "command": "replay", "mode": "realtime", "status": "complete"}
    record, problems = RunRecord.from_json({**old, "sources": [{"camera": "a"}, 3]})
    assert problems == [] and record.mode == "realtime" and record.camera_names == ["a"]
    record, problems = RunRecord.from_json({**old, "summary": [1, 2]})
    assert record.summary is None and problems == ["summary should be a dict, got list; ignored"]


# ------------------------------------------------------------------ output policies


class SlowSink:
    """Sleeps `delay_s` on every batch's first frame: a video encoder that cannot keep up."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.written: list[FrameResult] = []
        self.closed = False

    def write(self, result: FrameResult) -> None:
        if not self.written or self.written[-1].batch_index != result.batch_index:
            time.sleep(self.delay_s)
        self.written.append(result)

    def close(self) -> None:
        self.closed = True


class BrokenSink:
    def __init__(self, after: int = 5) -> None:
        self.after = after
        self.seen = 0
        self.closed = False

    def write(self, result: FrameResult) -> None:
        self.seen += 1
        if self.seen > self.after:
            raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.closed = True


def _paced_run(sinks: SinkSet) -> float:
    cams = [(f"c{i}", FakeReader(size=(64, 64), frames=60, pace_s=0.01)) for i in range(4)]
    config = PipelineConfig(device="cpu", sample_hz=0.0)
    with Pipeline(
        cameras=cams, detector=make_oracle(size=(64, 64), boxes=[]), config=config, sinks=sinks
    ) as pipeline:
        stats = pipeline.run()
    assert stats.frames == 240
    return stats.batches / stats.elapsed_s


def test_a_slow_output_does_not_slow_the_batches_and_its_backlog_is_counted() -> None:
    # given the same paced rig, once without and once with an output that takes 200 ms a batch
    alone = _paced_run(SinkSet())
    slow = SlowSink(0.2)
    sinks = SinkSet()
    sinks.add(slow, SinkPolicy(slow=True, queue_batches=2), name="video")
    with_slow = _paced_run(sinks)
    # then batch throughput is the same within noise (inline, it would fall to 5 batches/s)
    assert with_slow >= 0.7 * alone, (with_slow, alone)
    # and every frame is either written or counted as dropped from the full queue
    report = sinks.report()["video"]
    assert report.frames_dropped > 0 and report.queue_high_water == 2
    assert (
        report.frames_written + report.frames_dropped
        == 240
        == len(slow.written) + report.frames_dropped
    )
    assert slow.closed and report.failed is None


def test_a_failing_output_is_set_aside_and_the_run_goes_on() -> None:
    broken = BrokenSink(after=5)
    sinks = SinkSet()
    sinks.add(broken, SinkPolicy(on_failure=OnFailure.ISOLATE), name="extra")
    _paced_run(sinks)  # every frame still processed
    report = sinks.report()["extra"]
    assert report.frames_written == 5 and broken.seen == 6  # never called after it failed
    assert report.failed == "OSError: [Errno 28] No space left on device"
    assert broken.closed


def test_a_failing_essential_output_stops_the_run_cleanly(tmp_path: Path) -> None:
    from drivepercept.sinks import DetectionsJsonlSink

    broken = BrokenSink(after=5)
    kept = DetectionsJsonlSink(tmp_path / "d.jsonl")
    sinks = SinkSet()
    sinks.add(kept, name="detections")
    sinks.add(broken, SinkPolicy(on_failure=OnFailure.STOP), name="frames")
    with pytest.raises(PipelineError, match="No space left on device"):
        _paced_run(sinks)
    # and what was written before stays a valid file
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["camera"] for line in lines)


def test_an_output_failure_is_in_run_json_and_the_summary_line(tmp_path: Path) -> None:
    from drivepercept.run.console import summary_table

    options = RunOptions(
        sources=(str(SAMPLE_RIG),),
        settings={"device": "cpu", "max_frames": 2},
        out_root=tmp_path,
        name="broken",
        report_formats=("json",),
    )
    result = run(options, sinks=[(BrokenSink(after=3), SinkPolicy())])
    assert result.record.status == "complete" and result.stats.frames == 12
    assert result.record.sinks is not None
    assert "No space left" in (result.record.sinks["BrokenSink"].failed or "")
    assert "output BrokenSink failed (set aside)" in summary_table(result)
    why = result.failure()  # a partial run: exit 3
    assert why is not None and why.startswith("output(s) failed and were set aside")
    assert "BrokenSink: OSError: [Errno 28] No space left on device" in why
    # and in the report
    summary = json.loads(RunDir(result.run_dir).summary_json.read_text())
    assert "No space left" in summary["outputs_failed"]["BrokenSink"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_replay_through_the_api_on_cuda(tmp_path: Path) -> None:
    options = RunOptions(
        sources=(str(SAMPLE_RIG),), settings={"device": "cuda", "max_frames": 3}, out_root=tmp_path
    )
    result = run(options)
    assert result.stats.frames == 18 and result.stats.device == "cuda:0"


def test_every_api_name_is_the_thing_it_names_not_a_module() -> None:
    # (the package exports lazily; a submodule named like its function would shadow it)
    import importlib
    import types

    api = importlib.import_module("drivepercept.run")
    importlib.import_module("drivepercept.run.evaluation")  # imported first, elsewhere
    for name in api.__all__:
        assert not isinstance(getattr(api, name), types.ModuleType), name


def test_model_options_are_one_hashable_value_read_from_settings_once() -> None:
    # given a settings table as the CLI and eval merge it (a file's keys, flags over them)
    settings = {"model": "yolox-nano", "weights": "none", "input_size": "512x288"}
    settings |= {"runtime": "torch", "classes": "all", "out": "elsewhere"}
    model = ModelOptions.from_settings(settings)
    # when a run is made from them
    options = RunOptions(sources=("sample_videos/rig.toml",), **model.run_fields())
    # then the run's model options are those, checked (the size parsed), and hashable: a
    # fleet worker keys its loaded detectors by them
    resolved = options.model_options
    assert resolved.model == "yolox-nano" and resolved.input_size == (512, 288)
    assert resolved.runtime == "torch" and resolved.classes == "all"
    assert resolved.weights == "none" and resolved.onnx_batch is None  # the default
    assert {resolved: 1}[RunOptions(sources=("x.mp4",), **resolved.run_fields()).model_options]
    assert ModelOptions.from_settings({}) == ModelOptions()  # nothing given: the defaults
    # the modes say how they read their cameras
    assert [m.pacing.value for m in Mode] == ["as_fast_as_possible", "paced", "live"]
    assert not Mode.REPLAY.pacing.paced and Mode.REALTIME.pacing.paced
