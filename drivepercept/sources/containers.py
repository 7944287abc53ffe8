"""The containers of recorded drives, read: MCAP files (`mcapread`), ROS 2 bag folders (MCAP
storage by `mcapread`, SQLite storage by rosbags) and ROS 1 bags (`bagread`), every one under
the size limits of `untrusted`.

Only image and calibration messages are decoded (`rosimage.IMAGE_TYPES`,
`CAMERA_INFO_TYPES`), never by a schema that may build far more than the message's bytes:
CDR by the standard definitions of rosbags' type store (`untrusted.decoder_for`: a message
that does not fit is one undecodable frame); JSON (Foxglove) once its raw bytes hold at most
`MAX_JSON_ITEMS` brackets and commas, its stamp within int64; protobuf (Foxglove, by
`mcap-protobuf-support` where installed) only by a schema without repeated fields of
strings, bytes or messages (an image's: none at all), a calibration at most
`MAX_CALIBRATION_BYTES`.

`open_container(path)` gives one with `topics()`, `messages(topic, on_damage)` (log time,
type name and a call that decodes the message: decoding is left to the caller, so that one
bad message is one skipped frame; a chunk that cannot be read is reported to `on_damage`
and skipped), `metadata(name)`, `attachment(name)` and `close()`.

Only what is a recording is opened, and nothing of it blocks: a `.mcap` or `.bag` regular
file, or a folder with a regular `metadata.yaml` (and regular storage files); a FIFO, a
device, a folder named `x.mcap` or a video is refused in one line before any library opens
it. Every error a library raises while opening becomes one `SourceError` line.
"""

from __future__ import annotations

import functools
import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from drivepercept.errors import ConfigError, DrivePerceptError
from drivepercept.sources import rosimage
from drivepercept.sources.bagread import (
    Ros1Bag,
    Sqlite3Bag,
    inflated_message,
    ros2_metadata,
)
from drivepercept.sources.mcapread import McapFile
from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import (
    Buffer,
    Message,
    MiB,
    OnDamage,
    RefusedError,
    Topic,
    decoder_for,
    file_kind,
    merged_topics,
    refused,
)

__all__ = ["Container", "Message", "OnDamage", "Topic", "open_container"]

RECORDING = "a recording (an .mcap or .bag file, or a ROS 2 bag folder with a metadata.yaml)"
DECODED = rosimage.IMAGE_TYPES | rosimage.CAMERA_INFO_TYPES
# '[', '{' and ',' in a JSON message: a Foxglove image holds about 10, a calibration 50;
# json.loads builds an object of ~60 bytes for each 3-byte `{},` (a 257 MiB message: 6 GB)
MAX_JSON_ITEMS = 10_000
MAX_CALIBRATION_BYTES = MiB  # a protobuf calibration: about 500 bytes in a real one


class Container(Protocol):
    """An opened recording."""

    def topics(self) -> list[Topic]: ...

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]: ...

    def metadata(self, name: str) -> dict[str, str] | None: ...

    def attachment(self, name: str) -> bytes | None: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------ MCAP decoding


def _json(data: Buffer) -> Any:
    """A JSON message, its raw bytes checked first (see the module's docstring)."""
    raw = bytes(data)
    items = raw.count(b"[") + raw.count(b"{") + raw.count(b",")
    if items > MAX_JSON_ITEMS:
        raise RefusedError(
            f"a JSON message of {items} brackets and commas, more than the {MAX_JSON_ITEMS} "
            "an image or calibration holds"
        )
    msg = json.loads(raw)
    stamp = rosimage.stamp_ns(msg)
    if not -(2**63) <= stamp < 2**63:
        raise RefusedError(f"a JSON message stamped {stamp} ns, past what a clock holds")
    return msg


def _protobuf(schema: Any) -> Callable[[Buffer], Any] | None:
    """A decoder of Foxglove's protobuf images and calibrations whose schema cannot build far
    more than the message's bytes (see the module's docstring); None without the package."""
    try:
        from mcap_protobuf.decoder import DecoderFactory
    except ImportError:
        return None
    from google.protobuf.descriptor_pb2 import FileDescriptorSet  # type: ignore[import-untyped]

    found: dict[str, Any] = {}

    def add(prefix: str, types: Any) -> None:
        for t in types:
            found[f"{prefix}.{t.name}".lstrip(".")] = t
            add(f"{prefix}.{t.name}", t.nested_type)

    for file in FileDescriptorSet.FromString(schema.data).file:
        add(file.package, file.message_type)
    calibration = schema.name in rosimage.CAMERA_INFO_TYPES
    why = _repeated(found, schema.name, calibration, set())
    if why is not None:
        return functools.partial(refused, f"its schema {schema.name} holds {why}")
    decode = DecoderFactory().decoder_for("protobuf", schema)
    if decode is None:
        return None

    def checked(data: Buffer) -> Any:
        if calibration and len(data) > MAX_CALIBRATION_BYTES:
            raise RefusedError(f"a calibration of {len(data)} bytes")
        return decode(bytes(data))

    return checked


def _repeated(found: dict[str, Any], name: str, numbers_ok: bool, seen: set[str]) -> str | None:
    """A repeated field of protobuf message `name` (or of one it holds) that may build more
    than its bytes: any (`numbers_ok`: one of strings, bytes or messages); None if none."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    if name in seen:
        return None
    seen.add(name)
    if name not in found:
        return f"an unknown message {name[:80]}"
    objects = (F.TYPE_MESSAGE, F.TYPE_GROUP, F.TYPE_STRING, F.TYPE_BYTES)
    for f in found[name].field:
        if f.label == F.LABEL_REPEATED and (not numbers_ok or f.type in objects):
            return f"a repeated field {f.name}"
        if f.type == F.TYPE_MESSAGE:
            why = _repeated(found, f.type_name.lstrip("."), numbers_ok, seen)
            if why is not None:
                return why
    return None


def _own_store(schema: Any) -> Any:
    """rosbags' type store of a `ros2msg` schema's own definitions (an empty one for any
    other schema: its type is then unknown, and its decode fails)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.EMPTY)
    if schema is not None and schema.encoding == "ros2msg":
        store.register(get_types_from_msg(schema.data.decode(), schema.name))
    return store


def _missing(exc: ImportError) -> ConfigError:
    from drivepercept.recording import missing_ros_extra

    return missing_ros_extra("reading ROS bags and MCAP", exc)


class _Mcap:
    """An MCAP file: its topics, and one topic's messages decoded one at a time (messages
    compressed one by one, as a ROS 2 bag of `compression_mode: message` holds them, are
    inflated under the message limit first)."""

    def __init__(self, path: Path, *, message_compression: str = "") -> None:
        try:  # (the extra is there before anything opens)
            import mcap  # noqa: F401
            import rosbags  # noqa: F401
        except ImportError as exc:
            raise _missing(exc) from None
        self.path = path
        self._file = McapFile(path)
        self._compression = message_compression

    def topics(self) -> list[Topic]:
        return self._file.topics()

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        decoders: dict[int, Callable[[Buffer], Any]] = {}
        for schema, channel, log_time, data in self._file.messages(topic, on_damage):
            decode = decoders.get(channel.id)
            if decode is None:
                decode = decoders[channel.id] = self._decoder(topic, schema, channel)
            name = schema.name if schema else ""
            if self._compression:
                yield log_time, name, functools.partial(self._inflated, decode, data)
            else:
                yield log_time, name, functools.partial(decode, data)
            data = b""  # not held while the next message is read (a frame may be 256 MiB)

    def _inflated(self, decode: Callable[[Buffer], Any], data: bytes) -> Any:
        return decode(inflated_message(data, self._compression))

    def _decoder(self, topic: str, schema: Any, channel: Any) -> Callable[[Buffer], Any]:
        """The decode of a channel's messages (see the module's docstring).

        Raises:
            SourceError: its schema cannot be read, or no decoder reads its encoding.
        """
        enc, name = channel.message_encoding, schema.name if schema else ""
        if name not in DECODED:
            return functools.partial(refused, f"{name or 'no type'} is not an image type")
        try:
            if enc == "cdr":
                return decoder_for(name, ros1=False, own=functools.partial(_own_store, schema))
            if enc == "json":
                return _json
            decode = _protobuf(schema) if enc == "protobuf" else None
        except Exception as exc:  # a schema that cannot be parsed
            raise SourceError(
                f"{self.path}: topic {topic}: its schema {name} cannot be read ({exc})"[:400]
            ) from None
        if decode is None:
            raise SourceError(
                f"{self.path}: topic {topic} is {enc}-encoded {name}, which no installed "
                "decoder reads"
                + (" (pip install mcap-protobuf-support)" if enc == "protobuf" else "")
            )
        return decode

    def metadata(self, name: str) -> dict[str, str] | None:
        return self._file.metadata(name)

    def attachment(self, name: str) -> bytes | None:
        return self._file.attachment(name)

    def close(self) -> None:
        self._file.close()


class _Ros2Mcap:
    """A ROS 2 bag folder of MCAP storage files: one `_Mcap` each, read one after another
    (a bag is split into files by time)."""

    def __init__(self, files: tuple[Path, ...], message_compression: str) -> None:
        self._files: list[_Mcap] = []
        try:
            for file in files:
                self._files.append(_Mcap(file, message_compression=message_compression))
        except BaseException:
            self.close()
            raise

    def topics(self) -> list[Topic]:
        # (each file's counts checked against its own bytes)
        return merged_topics([t for file in self._files for t in file.topics()])

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        for file in self._files:
            if any(t.name == topic for t in file.topics()):
                yield from file.messages(topic, on_damage)

    def metadata(self, name: str) -> dict[str, str] | None:
        return None

    def attachment(self, name: str) -> bytes | None:
        return None

    def close(self) -> None:
        for file in self._files:
            file.close()


# ------------------------------------------------------------------ opening


def open_container(path: Path) -> Container:
    """The recording at `path`, opened: checked for what it is before any library opens it
    (see the module's docstring).

    Raises:
        SourceError: `path` is missing, is not a recording, or cannot be read (one line).
        ConfigError: the `[ros]` extra is not installed.
    """
    try:
        st = path.stat()
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        raise SourceError(
            f"recording not found: {path}" if missing else f"cannot open {path}: {exc.strerror}"
        ) from None
    mode, suffix = st.st_mode, path.suffix.lower()
    if stat.S_ISDIR(mode) and not (path / "metadata.yaml").exists():
        raise SourceError(f"{path} is a folder without a metadata.yaml, not {RECORDING}")
    if not stat.S_ISDIR(mode) and (not stat.S_ISREG(mode) or suffix not in (".mcap", ".bag")):
        raise SourceError(f"{path} is {file_kind(mode)}, not {RECORDING}")
    try:
        if stat.S_ISDIR(mode):
            meta = ros2_metadata(path)
            if meta.storage == "mcap":
                return _Ros2Mcap(meta.files, meta.message_compression)
            return Sqlite3Bag(meta)
        return _Mcap(path) if suffix == ".mcap" else Ros1Bag(path)
    except DrivePerceptError:
        raise
    except Exception as exc:  # any library's error at open: one line
        raise SourceError(f"cannot read {path}: {type(exc).__name__}: {exc}"[:400]) from None
