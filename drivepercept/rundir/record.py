"""run.json as a `RunRecord`: its top level, and its sections as typed records
(`rundir/sections.py`). Written (`to_json`) and read (`from_json`) only here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from drivepercept.rundir.sections import (
    JsonObject,
    LiveCameraRecord,
    ModelRecord,
    SinkRecord,
    SourceRecord,
    SummaryRecord,
    TelemetryRecord,
    TrackingRecord,
    dump,
    load_value,
)
from drivepercept.rundir.sections import (
    hints as _hints,
)

# 2: command says what ran (replay --realtime, eval); sinks section (the typed sections read
# and write the same keys)
RUN_SCHEMA_VERSION = 2

# the top-level keys and their JSON types; a value of another type is dropped with a problem
_SECTIONS: dict[str, type | tuple[type, ...]] = {
    "model": dict,
    "config": dict,
    "sources": list,
    "environment": dict,
    "telemetry": dict,
    "summary": dict,
    "live": dict,
    "reconnect": dict,
    "sinks": dict,
    "tracking": dict,
    "schedule": dict,
    "status": str,
    "command": str,
    "mode": str,
    "started": str,
    "error": str,
    "duration_s": (int, float),
    "schema_version": int,
}
# older readers expect these keys only when they apply
_ONLY_WHEN_SET = ("live", "reconnect", "duration_s", "sinks", "error", "tracking", "schedule")


@dataclass(frozen=True)
class RunRecord:
    """What run.json holds (schema `RUN_SCHEMA_VERSION`; version 1 files read too).

    The typed sections' fields are documented where they are made (`drivepercept.run.record`);
    `config` (the `PipelineConfig`), `environment` (versions) and `reconnect` (the
    `ReconnectPolicy`) are other components' own keys and stay JSON objects.
    """

    command: str  # what ran: replay, replay --realtime, live, eval
    mode: str  # replay, realtime, live
    status: str = "running"  # running, complete, interrupted, failed
    started: str = ""
    model: ModelRecord = field(default_factory=ModelRecord)
    config: JsonObject = field(default_factory=dict)
    sources: tuple[SourceRecord, ...] = ()
    environment: JsonObject = field(default_factory=dict)
    telemetry: TelemetryRecord | None = None
    summary: SummaryRecord | None = None
    error: str | None = None
    live: dict[str, LiveCameraRecord] | None = None
    reconnect: JsonObject | None = None
    duration_s: float | None = None
    sinks: dict[str, SinkRecord] | None = None
    tracking: TrackingRecord | None = None
    # a run with a deadline: the scheduler's settings, per camera the frames detected and
    # predicted and the longest gap between detections, and a timeline per second
    schedule: JsonObject | None = None
    schema_version: int = RUN_SCHEMA_VERSION

    def to_json(self) -> JsonObject:
        data: JsonObject = {}
        for key in _SECTIONS:
            value = getattr(self, key)
            if value is None and key in _ONLY_WHEN_SET:
                continue
            data[key] = dump(value)
        return data

    def but(self, **changes: Any) -> RunRecord:
        """A copy with `changes`."""
        return replace(self, **changes)

    @classmethod
    def from_json(cls, data: object) -> tuple[RunRecord, list[str]]:
        """A record from run.json's object, however damaged, and what was wrong with it.

        Keys of the wrong JSON type are dropped and named; unknown keys are ignored (a newer
        writer); missing ones take their defaults.
        """
        problems: list[str] = []
        if not isinstance(data, dict):
            return cls(command="unknown", mode="unknown", status="unknown"), [
                "run.json is not a JSON object"
            ]
        values: dict[str, Any] = {}
        for key, kind in _SECTIONS.items():
            value = data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                problems.append(
                    f"{key} should be a {getattr(kind, '__name__', 'number')}, got "
                    f"{type(value).__name__}; ignored"
                )
                continue
            values[key] = value
        hints = _hints(RunRecord)
        for key in ("model", "telemetry", "summary", "sources", "live", "sinks", "tracking"):
            if key in values:  # of the right JSON type: what does not fit inside is dropped
                values[key] = load_value(hints[key], values[key], problems)[1]
        if "duration_s" in values:
            values["duration_s"] = float(values["duration_s"])
        values.setdefault("command", "unknown")
        values.setdefault("mode", values["command"] if values["command"] != "unknown" else "replay")
        values.setdefault("status", "unknown")
        return cls(**values), problems

    @property
    def camera_names(self) -> list[str]:
        return [s.camera for s in self.sources]
