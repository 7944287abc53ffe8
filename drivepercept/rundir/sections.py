"""run.json's sections as frozen, typed records: written with `to_json`, read with
`from_json` (however old or damaged the file: a key of the wrong JSON type is dropped and
named, a missing one takes its default, an unknown one, from a newer writer, is ignored).

What the fields mean is said where they are made (`drivepercept.run.record`); the report
reads them by attribute. Sections whose keys are another component's own (the pipeline
settings, the versions, a runtime's self-description) stay JSON objects: `config`,
`environment`, `reconnect`, and `runtime_choice` / `runtime` inside `model`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

JsonObject = dict[str, Any]
S = TypeVar("S", bound="Section")


class Section:
    """A run.json object as a frozen dataclass (subclasses are `@dataclass(frozen=True)`)."""

    def to_json(self) -> JsonObject:
        return {f.name: dump(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[S], data: object, problems: list[str] | None = None) -> S:
        """The section from a JSON object; what did not fit goes into `problems`."""
        found: list[str] = problems if problems is not None else []
        if not isinstance(data, dict):
            found.append(f"{_name(cls)} should be an object, got {type(data).__name__}")
            return cls()
        kinds = hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            ok, value = load_value(kinds[f.name], data[f.name], found)
            if ok:
                values[f.name] = value
            else:
                found.append(
                    f"{_name(cls)}.{f.name}: unexpected {type(data[f.name]).__name__}; ignored"
                )
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (annotations are strings here), once a type."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _name(cls: type) -> str:
    return cls.__name__.removesuffix("Record").lower() or cls.__name__


def dump(value: Any) -> Any:
    """A section, or tuples and dicts of them, as JSON values."""
    if isinstance(value, Section):
        return value.to_json()
    if isinstance(value, tuple):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


def load_value(kind: Any, value: object, problems: list[str]) -> tuple[bool, Any]:
    """(fits, the value as `kind`) for the JSON `value`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True, value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return True, None
        for option in (a for a in args if a is not type(None)):
            ok, loaded = load_value(option, value, problems)
            if ok:
                return True, loaded
        return False, None
    if isinstance(kind, type) and issubclass(kind, Section):
        return (True, kind.from_json(value, problems)) if isinstance(value, dict) else (False, None)
    if origin is tuple and isinstance(value, list):
        item = args[0]
        if len(args) == 2 and args[1] is Ellipsis:
            loaded = [load_value(item, v, problems) for v in value]
            return True, tuple(v for ok, v in loaded if ok)  # an odd item is dropped
        parts = [load_value(a, v, problems) for a, v in zip(args, value, strict=False)]
        fits = len(value) == len(args) and all(ok for ok, _ in parts)
        return fits, tuple(v for _, v in parts) if fits else None
    if origin is dict and isinstance(value, dict):
        loaded_items = {k: load_value(args[1], v, problems) for k, v in value.items()}
        return True, {k: v for k, (ok, v) in loaded_items.items() if ok and isinstance(k, str)}
    if kind is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number, float(value) if number else None  # type: ignore[arg-type]
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if kind in (str, bool):
        return isinstance(value, kind), value
    return False, None


@dataclass(frozen=True)
class ModelRecord(Section):
    name: str = ""
    weights: str | None = None
    input_size: tuple[int, int] | None = None
    classes_kept: tuple[str, ...] | None = None
    runtime_choice: JsonObject | None = None
    runtime: JsonObject | None = None  # at the end: what ran the network beyond torch

    def to_json(self) -> JsonObject:
        data = super().to_json()
        if self.runtime is None:
            del data["runtime"]  # only where the detector says what ran it
        return data


@dataclass(frozen=True)
class SourceRecord(Section):
    camera: str = ""
    source: str = ""
    width: int = 0
    height: int = 0
    fps: float = 0.0
    frame_count: int = -1
    topic: str | None = None  # the image topic read, for a recorded drive (bag, MCAP)


@dataclass(frozen=True)
class TelemetryRecord(Section):
    rate_hz: float = 0.0
    cpu_count: int = 0
    gpus: tuple[JsonObject, ...] = ()
    driver_version: str | None = None
    nvml_version: str | None = None
    gpu_unavailable: str | None = None
    unsupported: tuple[str, ...] = ()
    samples: int = 0


@dataclass(frozen=True)
class WarmupRecord(Section):
    batch_size: int = 0
    ms: float = 0.0


@dataclass(frozen=True)
class CameraSummaryRecord(Section):
    frames: int = 0
    dropped: int = 0
    fps: float = 0.0
    frames_missing_from_source: int = 0
    frames_undecodable: int = 0
    discarded_at_stop: int = 0
    frames_read: int = 0
    frames_decoded: int = 0
    frames_prepared: int = 0
    end_to_end_ms: dict[str, float | None] = field(default_factory=dict)
    frames_predicted: int = 0  # answered by the tracker, not the model (--detect-every)


@dataclass(frozen=True)
class SummaryRecord(Section):
    frames: int = 0
    elapsed_s: float = 0.0
    throughput_fps: float = 0.0
    batches: int = 0
    partial_batches: int = 0
    mean_batch_size: float = 0.0
    interrupted: bool = False
    threads_not_stopped: tuple[str, ...] = ()
    warmup: tuple[WarmupRecord, ...] = ()
    in_flight_high_water: int = 0
    failed_batches: int = 0
    failed_frames: int = 0
    batch_error: str | None = None
    cameras: dict[str, CameraSummaryRecord] = field(default_factory=dict)
    # p50 / p99 / max ms of the batches' spreads of their frames' own times (stamp or pts)
    source_spread_ms: dict[str, float] | None = None


@dataclass(frozen=True)
class StateChangeRecord(Section):
    t_ns: int = 0
    state: str = ""
    detail: str = ""


@dataclass(frozen=True)
class LiveCameraRecord(Section):
    source: str = ""
    state: str = ""
    connects: int = 0
    failed_attempts: int = 0
    last_error: str = ""
    downtime_s: float = 0.0
    outage_s: float = 0.0
    frames_received: int = 0
    arrival_fps: float = 0.0
    frames_lost_estimate: int = 0
    changes: tuple[StateChangeRecord, ...] = ()


@dataclass(frozen=True)
class SinkRecord(Section):
    slow: bool = False
    on_failure: str = ""
    frames_written: int = 0
    frames_dropped: int = 0
    queue_high_water: int = 0
    failed: str | None = None


@dataclass(frozen=True)
class CameraTracksRecord(Section):
    tracks: int = 0  # tracks confirmed in this camera over the run
    lifetime_median_s: float = 0.0
    lifetime_max_s: float = 0.0
    unconfirmed_died: int = 0  # tracks that ended before their id (no second box)


@dataclass(frozen=True)
class TrackingRecord(Section):
    """`--track`: per camera its tracks and their lifetimes; the rig's objects (global ids
    made), and whether the rig's geometry placed them (else per camera only)."""

    cameras: dict[str, CameraTracksRecord] = field(default_factory=dict)
    rig_objects: int = 0
    placed: bool = False
    ms_per_frame: float | None = None  # the tracking stage's own time per camera frame
    cpu_ms_per_frame: float | None = None  # the CPU its thread spent in it, per camera frame
