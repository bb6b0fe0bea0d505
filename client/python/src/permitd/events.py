"""``GET /v1/events``: lifecycle events as Server-Sent Events, read as an iterator
that resumes from its cursor.

The node called serves the stream from its own applied entries, so any node will
do: the stream opens on the first endpoint that answers. Each message's id is the
stream's cursor after it: the log index of its entry when the stream covers one
shard (a key's, or any stream at one shard), one index per shard joined by commas
(``12,0,7``) when a stream of every key merges several shards. When a stream
breaks or a node ends it, the iterator opens it again (on any node) right after
the last id it saw, whatever its form (``cursor=``): no event repeats, none is
skipped. A 410 ``too_far_behind`` (the node no longer keeps events that old)
and a ``stream_error`` message are raised as ``RejectedError``: re-read the state
(usage, holders) and stream from now. Same parser as the Rust ``events.rs``.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Optional

from . import wire
from .errors import RejectedError, UnexpectedAnswerError

#: Longest SSE line the parser holds before giving up on the stream, in bytes.
MAX_EVENT_LINE_BYTES = 1024 * 1024
#: The event that ends a stream that fell behind; its data is an error body.
STREAM_ERROR_EVENT = "stream_error"
#: Reconnections of one stream in a row, without an event between, before giving up.
MAX_RECONNECTS = 20


@dataclass
class SseMessage:
    """One Server-Sent Events message: ``data`` is one JSON event record. ``id`` is the
    entry's log index when the stream covers one shard (``None`` for a merged stream's
    cursor); ``cursor`` is the id as sent, what a stream resumes after."""

    event: str
    id: Optional[int]
    data: str
    cursor: Optional[str] = None

    def record(self) -> Dict[str, Any]:
        """The event record, decoded."""
        value = json.loads(self.data)
        if not isinstance(value, dict):
            raise UnexpectedAnswerError("/v1/events", "an event that is not an object")
        return value


class SseParser:
    """The SSE wire format, incrementally: bytes in, whole messages out."""

    def __init__(self) -> None:
        self._line = bytearray()
        self._event = ""
        self._id: Optional[str] = None
        self._data: list[str] = []
        self._has_data = False
        self.ready: Deque[SseMessage] = deque()

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._line += chunk[start:]
                if len(self._line) > MAX_EVENT_LINE_BYTES:
                    raise UnexpectedAnswerError("/v1/events", f"an event line passed {MAX_EVENT_LINE_BYTES} bytes")
                return
            self._line += chunk[start:end]
            line = self._line.decode("utf-8", "replace").rstrip("\r")
            self._line = bytearray()
            self._line_received(line)
            start = end + 1

    def _line_received(self, line: str) -> None:
        if line == "":
            if self._has_data:
                index = int(self._id) if self._id is not None and _is_index(self._id) else None
                self.ready.append(SseMessage(self._event, index, "\n".join(self._data), self._id))
            self._event, self._id, self._data, self._has_data = "", None, [], False
            return
        if line.startswith(":"):
            return  # a comment: the node's keep-alive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True


def stream_error(data: str) -> RejectedError:
    """A ``stream_error`` message as the error it carries."""
    try:
        error = wire.parse("ErrorAnswer", json.loads(data))["error"]
    except (ValueError, wire.WireError):
        return RejectedError(500, "internal", f"a stream error without the error body: {data}")
    status = 410 if error["code"] == "too_far_behind" else 500
    return RejectedError(status, error["code"], error["message"], error.get("field"))


def _is_index(text: str) -> bool:
    """Whether an id is a plain log index: ASCII digits only (``str.isdigit`` also
    takes other scripts' digits)."""
    return text != "" and all("0" <= char <= "9" for char in text)


class Cursor:
    """Where a stream resumes: the key, and the first log index to ask for until a
    message was seen, then the last id seen (the node's cursor, passed back opaque)."""

    def __init__(self, key: Optional[str], from_index: Optional[int]) -> None:
        self.key = key
        self.from_index = from_index
        self.after: Optional[str] = None
        self.reconnects = 0

    def query(self) -> Dict[str, str]:
        query: Dict[str, str] = {}
        if self.key is not None:
            query["key"] = self.key
        if self.after is not None:
            query["cursor"] = self.after
        elif self.from_index is not None:
            query["from"] = str(self.from_index)
        return query

    def seen(self, message: SseMessage) -> None:
        if message.event == STREAM_ERROR_EVENT:
            raise stream_error(message.data)
        self.reconnects = 0
        if message.cursor is not None:
            self.after = message.cursor

    def broken(self, reason: str) -> None:
        self.reconnects += 1
        if self.reconnects > MAX_RECONNECTS:
            raise UnexpectedAnswerError("/v1/events", f"the stream broke {MAX_RECONNECTS} times in a row; last: {reason}")
