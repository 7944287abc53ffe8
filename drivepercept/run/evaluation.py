"""`evaluate_clip`: labelled data through the replay pipeline, scored (eval.json).

The labelled data is a synthetic clip, a MOTChallenge sequence or a COCO json with its images
(`drivepercept.run.groundtruth` reads each). The pipeline is the one every replay runs (same
readers, model set-up, precision, batching), with two settings that scoring needs: every frame
(`block`), and a low score threshold by default (AP integrates over the whole precision-recall
curve). Scoring itself is `drivepercept.eval.score_detections`.

With `track`, the run tracks (`RunOptions(track=True)`) and its tracks are scored too
(`drivepercept.eval.tracking`: HOTA, MOTA, IDF1 per camera and for the rig, the same-id
share across cameras, the ego-position error). With `streaming`, the clip is replayed in real
time (`Mode.REALTIME`: paced at its frame rate, the live drop policy) and each labelled frame
is also scored against the newest output at its capture (`drivepercept.eval.streaming`);
`forecast` moves those boxes on by their tracked velocities (it tracks, and implies
streaming).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.eval import EvalReport, EvalThresholds, score_detections
from drivepercept.eval.report import StreamingScores, TrackingScores
from drivepercept.eval.streaming import score_streaming
from drivepercept.eval.tracking import score_tracking
from drivepercept.run.groundtruth import GroundTruth, read_ground_truth
from drivepercept.run.job import RunResult, run
from drivepercept.run.options import PIPELINE_KEYS, Mode, ModelOptions, RunOptions
from drivepercept.rundir import RunDir, write_json
from drivepercept.types import RunProgress


@dataclass(frozen=True)
class EvaluateResult:
    report: EvalReport  # streaming: the offline AP of the frames the run emitted
    run: RunResult
    tracking: TrackingScores | None = None
    streaming: StreamingScores | None = None

    @property
    def eval_json(self) -> Path:
        return RunDir(self.run.run_dir).eval_json

    def table(self) -> str:
        """The printed tables: COCO, then tracking and streaming where they were scored."""
        tables = [self.report.table()]
        tables += [self.tracking.table()] if self.tracking is not None else []
        tables += [self.streaming.table()] if self.streaming is not None else []
        return "\n\n".join(tables)


def evaluate_clip(
    clip: str | Path,
    *,
    ground_truth: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    thresholds: EvalThresholds | None = None,
    progress: Callable[[RunProgress], bool | None] | None = None,
    track: bool = False,
    streaming: bool = False,
    forecast: bool = False,
    budget_ms: float | None = None,
) -> EvaluateResult | None:
    """Replay labelled data and score the detections against its labels.

    Args:
        clip: a synthetic clip (its folder or rig.toml), a MOTChallenge sequence folder, a COCO
            json (images below its folder) or an image folder (with `ground_truth`).
        ground_truth: another ground-truth file than the format's own; an image folder's COCO
            json.
        settings: the keys of a settings file (`drivepercept.run.read_settings_file`) that
            eval uses: model (default: a clip's rig names it, else `DEFAULT_MODEL`), weights,
            classes, input_size, weights_dir, weights_mirror, onnx_layout, onnx_batch,
            trt_cache, runtime, onnx_cache, out (runs/), name (eval-<date>-<time>) and the
            pipeline settings.
        thresholds: which labelled objects are too hidden or small to be targets.
        track: track, and score the tracks (labels with track ids: a simulated clip's).
        streaming: replay in real time (the live drop policy unless `settings` choose one)
            and score streaming AP next to offline AP.
        forecast: streaming, with each output forecast to the frame's capture time by its
            tracked velocities (the run tracks; scored beside plain streaming).
        budget_ms: streaming: the p99 latency budget the deadline scheduler holds (every frame
            answered, by the model or by the tracker's prediction for its capture time;
            `drivepercept.schedule`); None: `settings`' budget_ms, else every frame the
            engine takes goes to the model.

    Returns None when the run was interrupted (nothing is scored).

    Raises:
        ConfigError: not labelled data, labels malformed or of other images, bad settings, an
            image the pipeline could not read (frames would not match their labels), `track`
            with labels that have no track ids (said before the run).
    """
    streaming = streaming or forecast
    given = dict(settings or {})
    chosen = {"score_threshold": 0.05, **{k: v for k, v in given.items() if k in PIPELINE_KEYS}}
    # streaming runs as the road does (the mode's live policy); offline scores every frame
    if not streaming and (policy := chosen.setdefault("drop_policy", "block")) != "block":
        raise ConfigError(f"eval scores every frame: drop_policy must be 'block', got {policy!r}")
    truth = read_ground_truth(clip, annotations=ground_truth)
    if track and not all("track_id" in a for a in truth.coco["annotations"]):
        raise ConfigError(f"eval --track needs labels with track ids ({truth.format} has none)")
    options = RunOptions(
        sources=truth.sources,  # a clip's rig file (its model the default), or image folders
        **ModelOptions.from_settings(given).run_fields(),
        settings=chosen,
        out_root=Path(given.get("out", "runs")),
        name=given.get("name") or time.strftime("eval-%Y%m%d-%H%M%S"),
        command="eval",
        mode=Mode.REALTIME if streaming else Mode.REPLAY,
        track=track or forecast,
        budget_ms=(budget_ms or given.get("budget_ms")) if streaming else None,
    )
    result = run(options, progress=progress)
    if result.stats.interrupted:
        return None
    limit = int(chosen.get("max_frames", 0))
    th = thresholds or EvalThresholds()
    stream = None
    if streaming:
        _check_folders_read(truth, result, limit)
        images = _scored_images(truth, limit)
        stream = score_streaming(
            truth.coco, result.detections(), forecast=forecast, thresholds=th, images=images
        )
        report = stream.offline
    else:
        report = score_run(truth, result, thresholds=th, limit=limit)
    tracks = score_tracks(truth, result, thresholds=th, limit=limit) if track else None
    record = result.record
    write_json(
        RunDir(result.run_dir).eval_json,
        {
            **report.to_json(),
            "model": options.model,
            "weights": options.weights,
            "clip": str(clip),
            "format": truth.format,
            "ground_truth": str(truth.path),
            "images_missing": truth.missing_images,
            "run_dir": str(result.run_dir),
            "device": result.stats.device,
            "pipeline": dict(record.config) or dataclasses.asdict(options.pipeline()),
            "mode": options.mode.value,
            **({"tracking": tracks.to_json()} if tracks is not None else {}),
            **({"streaming": stream.to_json()} if stream is not None else {}),
        },
    )
    return EvaluateResult(report=report, run=result, tracking=tracks, streaming=stream)


def score_tracks(
    truth: GroundTruth,
    result: RunResult,
    *,
    thresholds: EvalThresholds | None = None,
    limit: int = 0,
) -> TrackingScores:
    """A tracked run's tracks and placed objects scored against labels with track ids (each
    camera's mount from the rig, for the objects' range from it).

    Raises:
        ConfigError: labels without track ids, or a run that did not track.
    """
    mounts = {
        c.name: (c.extrinsics.position_m[0], c.extrinsics.position_m[1])
        for c in result.cameras
        if c.extrinsics is not None
    }
    return score_tracking(
        truth.coco,
        result.detections(),
        result.objects(),
        mounts=mounts,
        thresholds=thresholds,
        images=_scored_images(truth, limit),
    )


def _scored_images(truth: GroundTruth, limit: int) -> list[tuple[str, int]]:
    """(camera, frame_index) of every labelled frame of the replayed cameras (up to `limit`
    a camera, 0: all)."""
    return [
        (str(im["camera"]), int(im["frame_index"]))
        for im in truth.coco["images"]
        if im["camera"] in truth.cameras and (not limit or int(im["frame_index"]) < limit)
    ]


def score_run(
    truth: GroundTruth,
    result: RunResult,
    *,
    thresholds: EvalThresholds | None = None,
    limit: int = 0,
    by_camera: bool = True,
) -> EvalReport:
    """A finished run's detections scored against the labels it was run on (`by_camera`:
    each camera scored alone too, one more COCO evaluation a camera).

    Every ground-truth frame of the replayed cameras (up to `limit` a camera, 0: all) is
    scored: a frame the pipeline did not emit (a truncated video, say) counts as all misses.

    Raises:
        ConfigError: an image folder's reader skipped an image (frames would not match labels).
    """
    _check_folders_read(truth, result, limit)
    return score_detections(
        truth.coco,
        list(result.detections()),
        thresholds=thresholds or EvalThresholds(),
        images=_scored_images(truth, limit),
        by_camera=by_camera,
    )


def _check_folders_read(truth: GroundTruth, result: RunResult, limit: int) -> None:
    """Frames of an image folder are matched to labels by their place in it: a folder reader
    that skipped an image (undecodable) would shift every later frame, so that is an error."""
    read = {c.name: c.frames for c in result.stats.cameras}
    for camera, images in truth.folder_frames.items():
        expected = min(images, limit) if limit else images
        if read.get(camera, 0) != expected:
            raise ConfigError(
                f"camera {camera} read {read.get(camera, 0)} of its {expected} images (an "
                f"undecodable image?): frames cannot be matched to labels; see {result.run_dir}"
            )
