"""The rig's objects: what tracking and fusion give a driving stack, one list per rig time
step (`drivepercept.tracking`), written to objects.jsonl."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sighting:
    """One camera's box of an object: the camera, its track there, the box (xyxy px)."""

    camera: str
    track_id: int
    xyxy: tuple[float, float, float, float]


@dataclass(frozen=True)
class RigObject:
    """One physical object around the vehicle at a rig time step.

    Attributes:
        id: its global id, the same in every camera and held over time.
        class_name: its class (the class of its boxes).
        x_m, y_m: where it stands on the ground, ego frame (x forward, y left), metres; the
            mean of its sightings' ground contact points (box bottom centres).
        range_m: its distance from the ego origin on the ground.
        speed_mps: its ground speed (None until it has been placed twice).
        sightings: the camera boxes behind it.
    """

    id: int
    class_name: str
    x_m: float
    y_m: float
    range_m: float
    speed_mps: float | None
    sightings: tuple[Sighting, ...]


@dataclass(frozen=True)
class RigStep:
    """The rig's objects after one batch: its newest frame's index and time, its objects."""

    frame_index: int
    pts_s: float
    stamp_ns: int
    objects: tuple[RigObject, ...]
