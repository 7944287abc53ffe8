"""The containers of recorded drives, read: MCAP files (`mcapread`; ROS 2 messages decoded by
`mcap-ros2-support`, Foxglove's protobuf ones by `mcap-protobuf-support` where installed,
JSON ones as JSON), ROS 2 bag folders (MCAP storage by `mcapread`, SQLite storage by
rosbags) and ROS 1 bags (`bagread`), every one under the size limits of `untrusted`.

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
from drivepercept.sources.bagread import (
    Ros1Bag,
    Sqlite3Bag,
    inflated_message,
    ros2_metadata,
)
from drivepercept.sources.mcapread import McapFile
from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import Topic, file_kind

__all__ = ["Container", "Topic", "open_container"]

RECORDING = "a recording (an .mcap or .bag file, or a ROS 2 bag folder with a metadata.yaml)"
OnDamage = Callable[[str, "int | None"], None]
Message = tuple[int, str, Callable[[], Any]]  # (log time ns, type name, decode)


class Container(Protocol):
    """An opened recording."""

    def topics(self) -> list[Topic]: ...

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]: ...

    def metadata(self, name: str) -> dict[str, str] | None: ...

    def attachment(self, name: str) -> bytes | None: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------ MCAP decoding


class _JsonDecoders:
    """mcap decoder factory for JSON-encoded channels (Foxglove's JSON schemas)."""

    def decoder_for(self, message_encoding: str, schema: Any) -> Callable[[bytes], Any] | None:
        return json.loads if message_encoding == "json" else None


class _StandardCdrDecoders:
    """CDR messages of the standard types (images, calibration) whose schema
    `mcap-ros2-support` does not read (an IDL schema), by rosbags' type store."""

    def decoder_for(self, message_encoding: str, schema: Any) -> Callable[[bytes], Any] | None:
        from drivepercept.recording.messages import typestore

        store = typestore()
        if message_encoding != "cdr" or schema is None or schema.name not in store.fielddefs:
            return None
        return functools.partial(store.deserialize_cdr, typename=schema.name)


def _mcap_factories() -> list[Any]:
    try:
        from mcap_ros2.decoder import DecoderFactory as Ros2Decoders
    except ImportError as exc:
        raise _missing(exc) from None
    factories: list[Any] = [Ros2Decoders(), _JsonDecoders(), _StandardCdrDecoders()]
    try:  # Foxglove's protobuf schemas: optional
        from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders

        factories.insert(2, ProtobufDecoders())
    except ImportError:
        pass
    return factories


def _missing(exc: ImportError) -> ConfigError:
    from drivepercept.recording import missing_ros_extra

    return missing_ros_extra("reading ROS bags and MCAP", exc)


class _Mcap:
    """An MCAP file: its topics, and one topic's messages decoded one at a time (messages
    compressed one by one, as a ROS 2 bag of `compression_mode: message` holds them, are
    inflated under the message limit first)."""

    def __init__(self, path: Path, *, message_compression: str = "") -> None:
        try:
            import mcap  # noqa: F401  (the extra is there before anything opens)
        except ImportError as exc:
            raise _missing(exc) from None
        self.path = path
        self.factories = _mcap_factories()
        self._file = McapFile(path)
        self._compression = message_compression

    def topics(self) -> list[Topic]:
        return self._file.topics()

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        decoders: dict[int, Callable[[bytes], Any]] = {}
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

    def _inflated(self, decode: Callable[[bytes], Any], data: bytes) -> Any:
        return decode(inflated_message(data, self._compression))

    def _decoder(self, topic: str, schema: Any, channel: Any) -> Callable[[bytes], Any]:
        enc, name = channel.message_encoding, schema.name if schema else ""
        try:
            found = (f.decoder_for(enc, schema) for f in self.factories)
            decode = next((d for d in found if d is not None), None)
        except Exception as exc:  # a schema its factory cannot parse
            raise SourceError(
                f"{self.path}: topic {topic}: its schema {name} cannot be read ({exc})"
            ) from None
        if decode is None:
            raise SourceError(
                f"{self.path}: topic {topic} is {enc}-encoded {name}, which no installed "
                "decoder reads"
                + (" (pip install mcap-protobuf-support)" if enc == "protobuf" else "")
            )
        return decode  # type: ignore[no-any-return]

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
        out: dict[str, Topic] = {}
        for file in self._files:
            for t in file.topics():
                if (seen := out.get(t.name)) is not None:
                    count = -1 if t.count < 0 or seen.count < 0 else t.count + seen.count
                    t = Topic(t.name, seen.msgtype, count)
                out[t.name] = t
        return list(out.values())

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
