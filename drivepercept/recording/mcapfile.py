"""The one MCAP writer: ROS 2 (CDR) and JSON channels, attachments, metadata.

`McapOut` wraps the `mcap` package's writer (chunked, zstd, indexed, so Foxglove seeks in
it) with the channel bookkeeping both of its users need: the `--mcap` sink and `simulate
--format mcap`. It is thread-safe (the sink's frames and the load sampler write from two
threads) and a context manager; a file that is not closed lacks its summary but its chunks
still read back in order (the MCAP format is append-only).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from drivepercept.errors import OutputError
from drivepercept.recording import messages

PROFILE_ROS2 = "ros2"


class McapOut:
    """An MCAP file being written.

    Args:
        path: the file to create (truncated if it exists).
        profile: the MCAP profile ("ros2" when the file holds ROS 2 messages a ROS tool
            should play, "" otherwise).
        chunk_size: bytes of messages per compressed chunk (the unit a reader seeks to).

    Raises:
        ConfigError: the `[ros]` extra is not installed.
        OutputError: the file cannot be created.
    """

    def __init__(self, path: Path | str, *, profile: str = "", chunk_size: int = 1 << 20) -> None:
        try:
            from mcap.writer import CompressionType, Writer
        except ImportError as exc:
            from drivepercept.recording import missing_ros_extra

            raise missing_ros_extra("writing MCAP", exc) from None
        self.path = Path(path)
        try:
            self._file: IO[bytes] = self.path.open("wb")
        except OSError as exc:
            raise OutputError(f"cannot create {self.path}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._writer = Writer(self._file, chunk_size=chunk_size, compression=CompressionType.ZSTD)
        self._writer.start(profile=profile, library="drivepercept")
        self._schemas: dict[tuple[str, str], int] = {}
        self._channels: dict[str, int] = {}
        self._closed = False
        self.messages_written = 0

    def _channel(self, topic: str, name: str, encoding: str, data: bytes, msg_enc: str) -> int:
        channel = self._channels.get(topic)
        if channel is None:
            schema = self._schemas.get((name, encoding))
            if schema is None:
                schema = self._writer.register_schema(name=name, encoding=encoding, data=data)
                self._schemas[(name, encoding)] = schema
            channel = self._writer.register_channel(
                topic=topic, message_encoding=msg_enc, schema_id=schema
            )
            self._channels[topic] = channel
        return channel

    def _add(self, channel: int, data: bytes, log_time_ns: int, publish_time_ns: int) -> None:
        try:
            self._writer.add_message(
                channel_id=channel,
                log_time=int(log_time_ns),
                publish_time=int(publish_time_ns),
                data=data,
            )
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.messages_written += 1

    def ros2(
        self,
        topic: str,
        typename: str,
        message: Any,
        *,
        log_time_ns: int,
        publish_time_ns: int | None = None,
    ) -> None:
        """Write a ROS 2 message (a `messages.typestore()` object of type `typename`)."""
        data = messages.serialize(message, typename)
        with self._lock:
            if self._closed:
                return
            channel = self._channels.get(topic)
            if channel is None:
                channel = self._channel(
                    topic, typename, "ros2msg", messages.msgdef(typename).encode(), "cdr"
                )
            self._add(channel, data, log_time_ns, publish_time_ns or log_time_ns)

    def json(
        self,
        topic: str,
        schema_name: str,
        message: Mapping[str, Any],
        *,
        log_time_ns: int,
        schema: Mapping[str, Any] | None = None,
    ) -> None:
        """Write a JSON message; `schema` defaults to `messages.SCHEMAS[schema_name]`."""
        data = messages.dumps(message)
        with self._lock:
            if self._closed:
                return
            channel = self._channels.get(topic)
            if channel is None:
                body = schema if schema is not None else messages.SCHEMAS[schema_name]
                channel = self._channel(
                    topic, schema_name, "jsonschema", json.dumps(body).encode(), "json"
                )
            self._add(channel, data, log_time_ns, log_time_ns)

    def attach(self, name: str, data: bytes, *, media_type: str, log_time_ns: int = 0) -> None:
        """Attach a whole file (e.g. the ground truth as COCO JSON)."""
        with self._lock:
            if not self._closed:
                try:
                    self._writer.add_attachment(
                        create_time=int(log_time_ns),
                        log_time=int(log_time_ns),
                        name=name,
                        media_type=media_type,
                        data=data,
                    )
                except OSError as exc:
                    raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def metadata(self, name: str, values: Mapping[str, str]) -> None:
        """A metadata record (string keys and values)."""
        with self._lock:
            if not self._closed:
                try:
                    self._writer.add_metadata(name, {str(k): str(v) for k, v in values.items()})
                except OSError as exc:
                    raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Write the summary and close the file; a second call does nothing.

        Raises:
            OutputError: the summary could not be written, or the file not flushed (a full
                disk); the message names the file (the chunks before still read).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed: OSError | None = None
            try:
                self._writer.finish()  # type: ignore[no-untyped-call]
            except OSError as exc:
                failed = exc
            try:  # the last of the buffer is flushed here: a full disk may say so only now
                self._file.close()
            except OSError as exc:
                failed = failed or exc
            if failed is not None:
                raise OutputError(f"cannot finish {self.path}: {failed.strerror or failed}")

    def __enter__(self) -> McapOut:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
