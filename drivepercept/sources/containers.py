"""The containers of recorded drives, read: MCAP files (the `mcap` package; ROS 2 messages
decoded by `mcap-ros2-support`, Foxglove's protobuf ones by `mcap-protobuf-support` where
installed, JSON ones as JSON) and ROS 2 bag folders and ROS 1 bags (`rosbags`' AnyReader).

`open_container(path)` gives one with `topics()`, `messages(topic)` (log time, type name and
a call that decodes the message: decoding is left to the caller, so that one bad message is
one skipped frame), `span_ns()`, `attachment(name)` and `close()`. An MCAP without a summary
(cut short) is read front to back, in file order, so the messages before a cut come first.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from drivepercept.errors import ConfigError
from drivepercept.sources.readers import SourceError

log = logging.getLogger(__name__)

_SCAN_LIMIT = 20_000  # messages scanned for channels when an MCAP has no summary (cut short)


@dataclass(frozen=True)
class Topic:
    """A topic of a recording: its name, message type and message count (-1: unknown)."""

    name: str
    msgtype: str
    count: int


# ------------------------------------------------------------------ the two backends


class _JsonDecoders:
    """mcap decoder factory for JSON-encoded channels (Foxglove's JSON schemas)."""

    def decoder_for(self, message_encoding: str, schema: Any) -> Callable[[bytes], Any] | None:
        return json.loads if message_encoding == "json" else None


def _mcap_factories() -> list[Any]:
    try:
        from mcap_ros2.decoder import DecoderFactory as Ros2Decoders
    except ImportError as exc:
        raise _missing(exc) from None
    factories: list[Any] = [Ros2Decoders(), _JsonDecoders()]
    try:  # Foxglove's protobuf schemas: optional
        from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders

        factories.append(ProtobufDecoders())
    except ImportError:
        pass
    return factories


def _missing(exc: ImportError) -> ConfigError:
    from drivepercept.recording import missing_ros_extra

    return missing_ros_extra("reading ROS bags and MCAP", exc)


class _Mcap:
    """An MCAP file: its topics, and one topic's messages decoded one at a time."""

    def __init__(self, path: Path) -> None:
        try:
            from mcap.exceptions import InvalidMagic
            from mcap.reader import make_reader
        except ImportError as exc:
            raise _missing(exc) from None
        self.path = path
        self.factories = _mcap_factories()  # before the open: a missing extra leaks nothing
        try:
            self._file: IO[bytes] = path.open("rb")
        except OSError as exc:
            raise SourceError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            self._reader = make_reader(self._file)
            self._summary = self._reader.get_summary()
        except InvalidMagic as exc:
            self.close()
            raise SourceError(f"{path} is not an MCAP file ({exc})") from None
        except Exception:  # no summary to seek by (cut short): read front to back
            self._summary = None
        self.indexed = self._summary is not None

    def _query(self) -> Any:
        """The reader for one query: an indexed file's seeking reader; for a file cut short
        (no summary), a new front-to-back reader from its start (one query each)."""
        if self.indexed:
            return self._reader
        from mcap.reader import NonSeekingReader

        self._file.seek(0)
        return NonSeekingReader(self._file)

    def topics(self) -> list[Topic]:
        if self._summary is not None:
            stats = self._summary.statistics
            counts = stats.channel_message_counts if stats is not None else {}
            schemas = self._summary.schemas
            return [
                Topic(
                    ch.topic,
                    schemas[ch.schema_id].name if ch.schema_id in schemas else "",
                    counts.get(ch.id, -1),
                )
                for ch in self._summary.channels.values()
            ]
        seen: dict[str, Topic] = {}
        try:
            found = self._query().iter_messages(log_time_order=False)
            for schema, channel, _ in itertools.islice(found, _SCAN_LIMIT):
                seen.setdefault(
                    channel.topic, Topic(channel.topic, schema.name if schema else "", -1)
                )
        except Exception as exc:  # cut short: what was read says which topics there are
            log.info("%s: read up to a damaged or missing end (%s)", self.path, exc)
        return list(seen.values())

    def span_ns(self) -> tuple[int, int] | None:
        stats = self._summary.statistics if self._summary is not None else None
        if stats is None or not stats.message_count:
            return None
        return stats.message_start_time, stats.message_end_time

    def messages(self, topic: str) -> Iterator[tuple[int, str, Callable[[], Any]]]:
        """(log time ns, type name, decode) per message of `topic`, in log-time order."""
        decoders: dict[int, Callable[[bytes], Any] | None] = {}
        # an indexed file in log-time order; one read front to back (cut short) in file order,
        # so that what comes before a cut is given before the cut is found
        ordered = self.indexed
        found = self._query().iter_messages(topics=[topic], log_time_order=ordered)
        for schema, channel, message in found:
            if channel.id not in decoders:
                decoders[channel.id] = next(
                    (
                        d
                        for f in self.factories
                        if (d := f.decoder_for(channel.message_encoding, schema)) is not None
                    ),
                    None,
                )
            decode = decoders[channel.id]
            if decode is None:
                enc = channel.message_encoding
                raise SourceError(
                    f"{self.path}: topic {topic} is {enc}-encoded "
                    f"{schema.name if schema else ''}, which no installed decoder reads"
                    + (" (pip install mcap-protobuf-support)" if enc == "protobuf" else "")
                )
            yield (
                message.log_time,
                schema.name if schema else "",
                functools.partial(decode, message.data),
            )

    def metadata(self, name: str) -> dict[str, str] | None:
        for record in self._query().iter_metadata():
            if record.name == name:
                return dict(record.metadata)
        return None

    def attachment(self, name: str) -> bytes | None:
        for att in self._query().iter_attachments():
            if att.name == name:
                return bytes(att.data)
        return None

    def close(self) -> None:
        self._file.close()


class _Bag:
    """A ROS 2 bag folder or a ROS 1 bag, through rosbags' AnyReader."""

    def __init__(self, path: Path) -> None:
        try:
            from rosbags.highlevel import AnyReader
        except ImportError as exc:
            raise _missing(exc) from None
        self.path = path
        self._reader = AnyReader([path])
        try:
            self._reader.open()
        except Exception as exc:
            raise SourceError(f"cannot read bag {path}: {exc}") from None
        self.indexed = True

    def topics(self) -> list[Topic]:
        out: dict[str, Topic] = {}
        for conn in self._reader.connections:
            t = out.get(conn.topic)
            count = conn.msgcount + (t.count if t else 0)
            out[conn.topic] = Topic(conn.topic, conn.msgtype, count)
        return list(out.values())

    def span_ns(self) -> tuple[int, int] | None:
        return int(self._reader.start_time), int(self._reader.end_time)

    def messages(self, topic: str) -> Iterator[tuple[int, str, Callable[[], Any]]]:
        conns = [c for c in self._reader.connections if c.topic == topic]
        deserialize = self._reader.deserialize
        for conn, log_time, raw in self._reader.messages(connections=conns):
            yield log_time, conn.msgtype, functools.partial(deserialize, raw, conn.msgtype)

    def attachment(self, name: str) -> bytes | None:
        return None  # bags have none

    def metadata(self, name: str) -> dict[str, str] | None:
        return None

    def close(self) -> None:
        self._reader.close()


def open_container(path: Path) -> _Mcap | _Bag:
    if not path.exists():
        raise SourceError(f"recording not found: {path}")
    if path.is_file() and path.suffix.lower() == ".mcap":
        return _Mcap(path)
    return _Bag(path)
