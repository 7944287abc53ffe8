"""What a run is asked to do: `RunOptions`, and the `Mode` whose policies fill in what the
user did not set."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivepercept.choices import DEFAULT_MODEL as DEFAULT_MODEL
from drivepercept.config import SETTING_KINDS, PipelineConfig, ReconnectPolicy
from drivepercept.errors import ConfigError
from drivepercept.geometry import check_priority, parse_input_size
from drivepercept.report import ALL_FORMATS, DEFAULT_BUDGET_MS, FORMATS
from drivepercept.rig import CameraConfig, read_toml, rig_model
from drivepercept.sources.pacing import DEFAULT_MAX_GAP_S as DEFAULT_MAX_GAP_S
from drivepercept.sources.pacing import MAX_GAP_LIMIT_S
from drivepercept.types import CLASS_CHOICES, RUNTIMES, Pacing

if TYPE_CHECKING:  # the sink loads OpenCV: options (and `drivepercept --help`) do not need it
    from drivepercept.sinks.rerun import RerunTarget

_PIPELINE_FIELDS = dataclasses.fields(PipelineConfig)
PIPELINE_KEYS = frozenset(f.name for f in _PIPELINE_FIELDS)
# the other keys of a settings file (and of the CLI flags that mean the same)
# an ONNX model's output layout, batch policy and TensorRT engine cache (flags and TOML alike)
ONNX_KEYS = ("onnx_layout", "onnx_batch", "trt_cache")
RUN_KEYS = frozenset(
    {"model", "weights", "classes", "input_size", "out", "name", "save_video", "mosaic"}
    | {"budget_ms", "weights_dir", "weights_mirror", *ONNX_KEYS, "runtime", "onnx_cache"}
    | {"topics", "mcap", "mcap_images", "track", "max_gap_s", "priority"}
)
DEADLINE_QUEUE = 8  # frames waiting per camera in a run with a deadline (`Mode.policies`)
MAX_LINGER_S = 3600.0  # --metrics-linger-s at most: an hour
# settings a front end takes from the environment (`environment_settings`)
ENVIRONMENT = {
    "weights_dir": "DRIVEPERCEPT_WEIGHTS_DIR",
    "weights_mirror": "DRIVEPERCEPT_WEIGHTS_MIRROR",
    "onnx_cache": "DRIVEPERCEPT_ONNX_CACHE",
}


def environment_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings `environ` gives (the CLI passes `os.environ`; components read none):
    the variables of `ENVIRONMENT`, and the ONNX export cache under `$XDG_CACHE_HOME` where
    that is set and `$DRIVEPERCEPT_ONNX_CACHE` is not (else the default, ~/.cache's)."""
    found = {k: environ[v].strip() for k, v in ENVIRONMENT.items() if environ.get(v, "").strip()}
    if environ.get("XDG_CACHE_HOME", "").strip():
        found.setdefault("onnx_cache", str(default_onnx_cache(environ)))
    return found


def default_onnx_cache(environ: Mapping[str, str]) -> Path:
    """The export cache of `runtime = "auto"`: `$XDG_CACHE_HOME/drivepercept/onnx`, else
    `~/.cache/drivepercept/onnx` (`environ`: what the front end passes; {} for the latter)."""
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return root / "drivepercept" / "onnx"


FILE_KEYS = PIPELINE_KEYS | RUN_KEYS | {"report", "sources"}
# What each settings key takes. Flags are typed by argparse; a TOML file or a Python caller
# can give anything, and a wrong type must fail here, by name, not deep in a stage.
_Kind = tuple[str, "type | tuple[type, ...]"]
_TYPES: dict[str, _Kind] = dict(SETTING_KINDS)
_KINDS: dict[str, _Kind] = {
    **{f.name: _TYPES[getattr(f.type, "__name__", str(f.type))] for f in _PIPELINE_FIELDS},
    **dict.fromkeys(RUN_KEYS, _TYPES["str"]),
    **dict.fromkeys(("save_video", "mosaic", "mcap_images", "track"), _TYPES["bool"]),
    "budget_ms": _TYPES["float"],
    "max_gap_s": _TYPES["float"],
    "priority": ("NAME=P,... or a table of camera priorities", (str, dict)),
    "input_size": ("WIDTHxHEIGHT or [width, height]", (str, list)),
    "report": ("a string or a list of strings", (str, list)),
    "sources": ("a list of strings", list),
    "topics": ("a list of strings", list),
}


def check_types(settings: Mapping[str, Any], *, where: str) -> None:
    """ConfigError naming the first key of `settings` whose value has the wrong type."""
    for key, value in settings.items():
        what, kind = _KINDS.get(key, ("", object))
        items = value if isinstance(value, list) and key in ("report", "sources", "topics") else []
        bad_bool = isinstance(value, bool) and kind is not bool
        if not isinstance(value, kind) or bad_bool or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{where}{key} must be {what}, got {value!r}")


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A run's settings file: a TOML table (the whole file, or its `[replay]` table) of
    pipeline settings, `sources` and the run keys (model, weights, out, name, ...).

    Raises:
        ConfigError: the file is missing or not TOML, has keys no run knows, or a value of
            the wrong type.
    """
    data = read_toml(Path(path), what="config file")
    table = data.get("replay", data)
    if not isinstance(table, Mapping):
        raise ConfigError(f"config file {path}: [replay] must be a table, got {table!r}")
    raw = dict(table)
    unknown = sorted(set(raw) - FILE_KEYS)
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}")
    check_types(raw, where=f"config file {path}: ")
    return raw


class Mode(enum.Enum):
    """How sources are read.

    REPLAY: files, every frame, as fast as the pipeline goes (`block`: no frame is lost).
    REALTIME: files paced at their frame rate, as if they were cameras (live policies).
    LIVE: devices and streams, which reconnect (live policies).
    """

    REPLAY = "replay"
    REALTIME = "realtime"
    LIVE = "live"

    @property
    def command(self) -> str:
        """The command that runs this mode (what run.json says ran)."""
        return {"replay": "replay", "realtime": "replay --realtime", "live": "live"}[self.value]

    @property
    def pacing(self) -> Pacing:
        """How this mode reads its cameras."""
        return {"replay": Pacing.AS_FAST_AS_POSSIBLE, "realtime": Pacing.PACED}.get(
            self.value, Pacing.LIVE
        )

    def policies(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The pipeline settings this mode chooses where `settings` has none.

        Live and real-time runs take each camera's newest frame (a queue of one,
        drop_oldest, every drop counted), and batches are made just in time (the batcher
        prepares the next one as the engine is about to be free, `batching`), two batches in
        flight and one staging slot more, for the next batch. Two in flight on a CPU too: the
        completion thread's NMS and sinks for batch n then overlap batch n+1's compute
        instead of delaying its start (measured, six cameras, YOLOv8n-size network on 2
        cores: the median gap between computes fell from 6-12 ms to 0.2 ms).
        """
        if self is Mode.REPLAY:
            return {}
        in_flight = int(settings.get("max_in_flight", 2))
        return {
            "drop_policy": "drop_oldest",
            # with a deadline every frame is answered: a camera's frames wait their turn
            # (8: 267 ms at 30 frames/s, more than a budget's worth)
            "queue_capacity": DEADLINE_QUEUE if settings.get("deadline_ms") else 1,
            "max_in_flight": in_flight,
            "ring_slots": in_flight + 1,
            "freeze_heap": True,  # no full garbage collection inside a latency budget
        }


@dataclass(frozen=True)
class ModelOptions:
    """The detector a run loads and what runs it. Frozen and hashable: a fleet worker loads
    each once. `RunOptions` extends these (checks them, and resolves the model a rig names).

    `from_settings` reads them from a settings table (a file's keys, flags merged over
    them); `run_fields` gives them back as `RunOptions` keywords.

    Attributes:
        model, weights: the detector (`drivepercept.models.load_detector`); model None is
            the model the rig file names (every source a rig naming the same one), else
            `DEFAULT_MODEL`.
        classes: "driving" (the driving classes, COCO's mapped onto them) or "all".
        input_size: (width, height) of the model input, for models that take any
            (YOLOX); None for the model's default ("WxH" and [w, h] are taken too).
        weights_dir, weights_mirror: where "DEFAULT" weights are found without a download,
            and where they are downloaded from (`drivepercept.models.WeightsStore`).
        onnx_layout, onnx_batch, trt_cache: for a `.onnx` model only: its output layout
            (yolox, yolov8, end2end) and batch-1 policy (loop, refuse) over its sidecar's,
            and TensorRT's engine cache folder (`drivepercept.models.onnx`).
        runtime: what runs the network: "auto" (the fastest for the device: ONNX Runtime
            for an exportable model on a CPU), "torch" or "onnxruntime"
            (`drivepercept.models.runtime`).
        onnx_cache: the folder of cached exports for runtime auto / onnxruntime; None for
            `default_onnx_cache({})` (the CLI passes `$XDG_CACHE_HOME`'s).
    """

    model: str | None = None
    weights: str | None = "DEFAULT"
    classes: str = "driving"
    input_size: tuple[int, int] | None = None
    weights_dir: Path | None = None
    weights_mirror: str | None = None
    onnx_layout: str | None = None
    onnx_batch: str | None = None
    trt_cache: Path | None = None
    runtime: str = "auto"
    onnx_cache: Path | None = None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ModelOptions:
        return cls(**{f.name: settings[f.name] for f in _MODEL_FIELDS if f.name in settings})

    def run_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in _MODEL_FIELDS}


_MODEL_FIELDS = dataclasses.fields(ModelOptions)


@dataclass(frozen=True, kw_only=True)
class RunOptions(ModelOptions):
    """Everything a replay, real-time replay or live run needs.

    Attributes:
        sources: rig files, videos, image folders, NAME=SOURCE items, devices or URLs
            (resolved by `drivepercept.rig.resolve_cameras`).
        mode: see `Mode` (a string is taken too).
        model, weights, classes, input_size, weights_dir, weights_mirror, onnx_layout,
            onnx_batch, trt_cache, runtime, onnx_cache: the detector, `ModelOptions`' fields
            (a run's options are its model's, and more).
        settings: `PipelineConfig` fields the caller chose; the mode fills in the rest.
        out_root, name: the run folder is out_root/name (name defaults to <mode>-<date>-<time>).
        save_video, mosaic: annotated videos, per camera or tiled.
        report_formats: the latency report's files (() for none).
        budget_ms: the p99 capture-to-result latency to hold: live and real-time runs hold
            it with the deadline scheduler (`drivepercept.schedule`: every frame answered,
            detected or predicted by the tracker, so tracking is on) unless `schedule` is
            False; the report marks the frames over it. None: nothing held, and the report's
            deadline is `DEFAULT_BUDGET_MS` (`report_budget_ms`).
        duration_s: stop capture after this long (None: when the sources end).
        reconnect: live cameras' backoff and timeouts.
        metrics_port: serve Prometheus metrics on 127.0.0.1:port; metrics_linger_s keeps
            them up after the run.
        show: a live window (only where there is a display).
        command: what run.json says ran (default: the mode's command).
        topics: the image topics of a recorded drive (bag, MCAP) to read, in camera order
            (empty: every image topic).
        mcap: also write the results as an MCAP file for Foxglove (mcap_images: with the
            camera images).
        rerun: stream to a Rerun viewer (`RerunTarget`: spawned, connected to, or saved).
        track: track objects per camera and, where the rig has geometry, across cameras
            (`drivepercept.tracking`): ids in detections.jsonl, objects in objects.jsonl.
        max_gap_s: real-time replay: the longest a file's camera waits for its next frame (a
            longer gap in its stamps is skipped over, said and counted), and how far apart
            the first stamps of a recording's cameras may be and still play in step
            (`drivepercept.sources.pacing`).
        schedule: False: a budget only marks the report's deadline misses (`--no-schedule`,
            for comparisons); a replay as fast as it goes never holds one.
        priorities: camera name -> priority for the scheduler, over the rig file's.
    """

    sources: tuple[str, ...]
    mode: Mode = Mode.REPLAY
    settings: Mapping[str, Any] = field(default_factory=dict)
    out_root: Path = Path("runs")
    name: str | None = None
    save_video: bool = False
    mosaic: bool = False
    report_formats: tuple[str, ...] = ALL_FORMATS
    budget_ms: float | None = None
    duration_s: float | None = None
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    metrics_port: int | None = None
    metrics_linger_s: float = 0.0
    show: bool = False
    command: str | None = None
    topics: tuple[str, ...] = ()
    mcap: Path | None = None
    mcap_images: bool = False
    rerun: RerunTarget | None = None
    track: bool = False
    max_gap_s: float = DEFAULT_MAX_GAP_S
    schedule: bool = True
    priorities: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise ConfigError(f"mode must be replay, realtime or live, got {self.mode!r}") from None
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        object.__setattr__(self, "out_root", Path(self.out_root))
        if not self.sources:
            raise ConfigError("give at least one source: a rig.toml, a video, a folder or a URL")
        if self.model is None:
            from drivepercept.sources.recordings import simulated_model  # reads the file

            model = rig_model(self.sources) or simulated_model(self.sources) or DEFAULT_MODEL
            object.__setattr__(self, "model", model)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"model must be a model name, got {self.model!r}")
        if self.classes not in CLASS_CHOICES:
            raise ConfigError(f"classes must be driving or all, got {self.classes!r}")
        object.__setattr__(self, "input_size", parse_input_size(self.input_size))
        for key in ONNX_KEYS:
            value = getattr(self, key)
            if value is not None and not self.model.strip().lower().endswith(".onnx"):
                flag = "--" + key.replace("_", "-")
                raise ConfigError(f"{flag} ({key}) is for .onnx models only; model is {self.model}")
        if self.trt_cache is not None:
            object.__setattr__(self, "trt_cache", Path(self.trt_cache))
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.onnx_cache is not None:
            object.__setattr__(self, "onnx_cache", Path(self.onnx_cache))
        if self.weights_dir is not None:
            object.__setattr__(self, "weights_dir", Path(self.weights_dir))
        unknown = sorted(set(self.settings) - PIPELINE_KEYS)
        if unknown:
            raise ConfigError(f"unknown pipeline settings {unknown}")
        check_types(self.settings, where="setting ")
        if self.weights is not None and not isinstance(self.weights, str):
            raise ConfigError(f"weights must be 'none', 'DEFAULT' or a path, got {self.weights!r}")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise ConfigError(f"duration must be > 0 s, got {self.duration_s:g}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be 0..65535, got {self.metrics_port}")
        object.__setattr__(self, "topics", tuple(str(t) for t in self.topics))
        if self.mcap is not None:
            object.__setattr__(self, "mcap", Path(self.mcap))
        elif self.mcap_images:
            raise ConfigError("--mcap-images adds the images to an MCAP file: give --mcap FILE")
        if not (
            math.isfinite(self.metrics_linger_s) and 0 <= self.metrics_linger_s <= MAX_LINGER_S
        ):
            raise ConfigError(
                f"metrics linger must be 0..{MAX_LINGER_S:g} s, got {self.metrics_linger_s:g}"
            )
        if not (math.isfinite(self.max_gap_s) and 0 < self.max_gap_s <= MAX_GAP_LIMIT_S):
            raise ConfigError(
                f"max gap must be > 0 and <= {MAX_GAP_LIMIT_S:g} s, got {self.max_gap_s:g}"
            )
        if (budget := self.budget_ms) is not None:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)):
                raise ConfigError(f"budget must be a number of ms, got {budget!r}")
            if not (math.isfinite(budget) and budget > 0):
                raise ConfigError(f"budget must be > 0 ms, got {budget:g}")
        object.__setattr__(self, "priorities", priorities_setting(self.priorities))
        bad = [f for f in self.report_formats if f not in FORMATS]
        if bad:
            raise ConfigError(f"report formats are {', '.join(ALL_FORMATS)}, got {bad}")

    @property
    def model_name(self) -> str:
        """The model that runs (resolved in __post_init__)."""
        assert self.model is not None
        return self.model

    @property
    def model_options(self) -> ModelOptions:
        """The model fields, checked and resolved (the model a rig names, the input size
        parsed), as one hashable value."""
        return ModelOptions(**{f.name: getattr(self, f.name) for f in _MODEL_FIELDS})

    @property
    def holds_budget(self) -> bool:
        """Whether the run holds its budget (a live or real-time run given one)."""
        return self.budget_ms is not None and self.schedule and self.mode is not Mode.REPLAY

    @property
    def report_budget_ms(self) -> float:
        """The report's deadline: the budget, else `DEFAULT_BUDGET_MS`."""
        return float(self.budget_ms) if self.budget_ms is not None else DEFAULT_BUDGET_MS

    def camera_priorities(self, cams: Sequence[CameraConfig]) -> list[float]:
        """Each camera's priority for the deadline scheduler: `priorities`' (`--priority`),
        else its rig file's (default 1). ConfigError for a name that is no camera here."""
        names = [c.name for c in cams]
        if unknown := sorted(set(self.priorities) - set(names)):
            known = ", ".join(names)
            raise ConfigError(f"--priority: no camera {', '.join(unknown)}; cameras are: {known}")
        return [self.priorities.get(c.name, c.priority) for c in cams]

    @property
    def run_command(self) -> str:
        return self.command or self.mode.command

    def pipeline(self) -> PipelineConfig:
        """The pipeline settings: the caller's, over the mode's policies, over the defaults.

        Raises:
            ConfigError: a setting is invalid (or names a device that is not there).
        """
        settings = dict(self.settings)
        if self.holds_budget:
            settings.setdefault("deadline_ms", self.budget_ms)
        chosen = {**self.mode.policies(settings), **settings}
        try:
            return PipelineConfig(**chosen)
        except TypeError as exc:
            raise ConfigError(f"bad pipeline setting: {exc}") from None


def priorities_setting(value: str | Mapping[str, Any] | None) -> dict[str, float]:
    """`--priority front=3,rear_left=0.5` (or a settings file's table) as camera -> priority;
    ConfigError for an item that is not NAME=NUMBER, or a priority out of range."""
    if not isinstance(value, str):
        return {str(k): check_priority(v, f"camera {k!r}") for k, v in (value or {}).items()}
    items = {}
    for item in filter(None, (i.strip() for i in value.split(","))):
        name, _, number = (part.strip() for part in item.partition("="))
        try:
            items[name] = float(number) if name else math.nan
        except ValueError:
            items[name] = math.nan
        if not name or math.isnan(items[name]):
            raise ConfigError(f"--priority takes NAME=NUMBER items, comma-separated; got {item!r}")
    return {k: check_priority(v, f"camera {k!r}") for k, v in items.items()}


def topics_setting(value: str | list[str] | None) -> tuple[str, ...]:
    """`--topics a,b` (or a settings file's list) as topic names, in order."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(t.strip() for t in items if t.strip())


def rerun_target(
    spawn: bool | None, connect: str | None, save: Path | None, serve: bool | None = None
) -> RerunTarget | None:
    """Where `--rerun` (spawn a viewer), `--rerun-connect URL`, `--rerun-save FILE` or
    `--rerun-serve` (a web viewer) send the recording; at most one (ConfigError otherwise)."""
    flags = (("--rerun", spawn), ("--rerun-connect", connect), ("--rerun-save", save))
    given = [flag for flag, value in (*flags, ("--rerun-serve", serve)) if value]
    if len(given) > 1:
        raise ConfigError(f"give one of the --rerun flags, got {' and '.join(given)}")
    if not given:
        return None
    from drivepercept.sinks.rerun import RerunTarget  # OpenCV: loaded only when asked for

    if serve:
        return RerunTarget(kind="serve")
    if connect:
        return RerunTarget(kind="connect", address=connect, path=None)
    if save is not None:
        return RerunTarget(kind="save", address=None, path=Path(save))
    return RerunTarget(kind="spawn", address=None, path=None) if spawn else None
