"""`evaluate`: a clip with ground truth through the replay pipeline, scored (eval.json).

The pipeline is the one every replay runs (same model set-up, precision, batching), with two
settings that scoring needs: every frame (`block`), and a low score threshold by default
(AP integrates over the whole precision-recall curve). Scoring itself is `drivepercept.eval`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError
from drivepercept.eval import EvalReport, EvalThresholds, clip_paths, load_ground_truth
from drivepercept.eval import evaluate as score
from drivepercept.pipeline import Pipeline
from drivepercept.rig import resolve_cameras
from drivepercept.run.job import RunResult, run
from drivepercept.run.options import DEFAULT_MODEL, RunOptions
from drivepercept.rundir import RunDir, write_json


@dataclass(frozen=True)
class EvaluateResult:
    report: EvalReport
    run: RunResult

    @property
    def eval_json(self) -> Path:
        return RunDir(self.run.run_dir).eval_json


def evaluate(
    clip: str | Path,
    *,
    ground_truth: str | Path | None = None,
    model: str = DEFAULT_MODEL,
    weights: str | None = "DEFAULT",
    settings: Mapping[str, Any] | None = None,
    thresholds: EvalThresholds | None = None,
    out_root: Path = Path("runs"),
    name: str | None = None,
    progress: Callable[[Pipeline], None] | None = None,
) -> EvaluateResult | None:
    """Replay a clip (its folder or rig.toml) and score it against its ground truth.

    Returns None when the run was interrupted (nothing is scored).

    Raises:
        ConfigError: no rig, ground truth of another clip or malformed, bad settings.
    """
    chosen = {"score_threshold": 0.05, **(settings or {})}
    if chosen.setdefault("drop_policy", "block") != "block":
        raise ConfigError("eval scores every frame: drop_policy must be 'block'")
    rig, gt_path = clip_paths(clip, ground_truth)
    cams = resolve_cameras([str(rig)])
    truth = load_ground_truth(gt_path, cameras=[c.name for c in cams])
    options = RunOptions(
        sources=(str(rig),),
        model=model,
        weights=weights,
        settings=chosen,
        out_root=out_root,
        name=name or time.strftime("eval-%Y%m%d-%H%M%S"),
        command="eval",
    )
    result = run(options, progress=progress)
    if result.stats.interrupted:
        return None
    # Every ground-truth frame of the replayed cameras (up to max_frames) is scored: a
    # frame the pipeline did not emit (a truncated video, say) counts as all misses.
    limit = int(chosen.get("max_frames", 0))
    names = {c.name for c in cams}
    wanted = [
        (str(im["camera"]), int(im["frame_index"]))
        for im in truth["images"]
        if im["camera"] in names and (not limit or int(im["frame_index"]) < limit)
    ]
    report = score(
        truth, list(result.detections()), thresholds=thresholds or EvalThresholds(), images=wanted
    )
    record = result.record
    write_json(
        RunDir(result.run_dir).eval_json,
        {
            **report.to_json(),
            "model": model,
            "weights": weights,
            "clip": str(rig),
            "ground_truth": str(gt_path),
            "run_dir": str(result.run_dir),
            "device": result.stats.device,
            "pipeline": dict(record.config) or dataclasses.asdict(options.pipeline()),
        },
    )
    return EvaluateResult(report=report, run=result)
