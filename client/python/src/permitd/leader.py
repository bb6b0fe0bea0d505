"""Which node to ask next: the remembered leader first, then the others in turn.

Any node accepts any call (a follower forwards to the leader), so the leader is
an optimisation that saves a hop. permitd names the leader's node id in the
``x-permitd-leader`` header of every v1 answer (and of a ``not_leader`` 503); a
URL there is accepted too. An id maps to an endpoint once the endpoints' ids
are known: the client asks each node's ``/cluster/status`` when an unknown id
shows up. A node that failed is skipped until the others were tried. Same
rules as the Rust client's ``leader.rs`` and the TypeScript ``leader.ts``.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Union
from urllib.parse import urlsplit

from .errors import ConfigError

#: Most endpoints one client remembers (configured plus learned).
MAX_ENDPOINTS = 64


def parse_endpoint(text: str) -> str:
    """Normalises a node URL; ``host:port`` without a scheme means ``http://``."""
    trimmed = text.strip().rstrip("/")
    if trimmed == "":
        raise ConfigError("empty endpoint")
    url = urlsplit(trimmed if "://" in trimmed else f"http://{trimmed}")
    if url.scheme not in ("http", "https"):
        raise ConfigError(f"unsupported scheme {url.scheme}: in {text}")
    if url.query or url.fragment or url.username or url.password or not url.hostname:
        raise ConfigError(f"a base URL takes a host and no query, fragment or credentials: {text}")
    return f"{url.scheme}://{url.netloc.lower()}{url.path.rstrip('/')}"


def parse_endpoints(texts: Union[str, Sequence[str]]) -> List[str]:
    """Parses a comma- or space-separated endpoint list, dropping duplicates."""
    parts = [part for text in ([texts] if isinstance(texts, str) else texts) for part in re.split(r"[\s,]+", text)]
    endpoints: List[str] = []
    for part in parts:
        if part == "":
            continue
        endpoint = parse_endpoint(part)
        if endpoint not in endpoints:
            endpoints.append(endpoint)
    if not endpoints:
        raise ConfigError("no endpoints configured")
    return endpoints


LeaderHint = Union[int, str]
"""What a leader header says: a node id, or a base URL."""


def parse_leader_hint(value: Optional[str]) -> Optional[LeaderHint]:
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        return parse_endpoint(text)
    except ConfigError:
        return None


class LeaderTracker:
    """The endpoints, which of them leads, and whom to ask next."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ConfigError("no endpoints configured")
        self.endpoints: List[str] = list(dict.fromkeys(endpoints))[:MAX_ENDPOINTS]
        self._node_ids: List[Optional[int]] = [None] * len(self.endpoints)
        self._leader_index: Optional[int] = None
        self._unmapped_leader: Optional[int] = None
        self._cursor = 0

    def leader(self) -> Optional[str]:
        return None if self._leader_index is None else self.endpoints[self._leader_index]

    def wants_node_ids(self) -> bool:
        """A leader id was named that no endpoint is known to have."""
        return self._unmapped_leader is not None

    def learn_node_id(self, endpoint: str, node_id: int) -> None:
        if endpoint not in self.endpoints:
            return
        index = self.endpoints.index(endpoint)
        self._node_ids = [None if (other != index and known == node_id) else known for other, known in enumerate(self._node_ids)]
        self._node_ids[index] = node_id
        if self._unmapped_leader == node_id:
            self._unmapped_leader = None
            self._leader_index = index

    def pick(self) -> str:
        """The node to ask next: the leader if known, else the next in turn."""
        index = self._leader_index if self._leader_index is not None else self._cursor % len(self.endpoints)
        return self.endpoints[index]

    def answered(self, endpoint: str, hint: Optional[LeaderHint]) -> None:
        named = None if hint is None else self._resolve(hint)
        if named is not None:
            self._leader_index = named
        elif endpoint in self.endpoints:
            self._leader_index = self.endpoints.index(endpoint)

    def failed(self, endpoint: str, hint: Optional[LeaderHint]) -> None:
        """``endpoint`` failed; a leader it named (other than itself) is asked next."""
        failed = self.endpoints.index(endpoint) if endpoint in self.endpoints else -1
        named = None if hint is None else self._resolve(hint)
        if named is not None and named != failed:
            self._leader_index = named
            return
        if self._leader_index is not None and self._leader_index == failed:
            self._leader_index = None
        self._cursor = (failed + 1 if failed >= 0 else self._cursor + 1) % len(self.endpoints)

    def _resolve(self, hint: LeaderHint) -> Optional[int]:
        if isinstance(hint, int):
            if hint in self._node_ids:
                self._unmapped_leader = None
                return self._node_ids.index(hint)
            self._unmapped_leader = hint
            return None
        if hint in self.endpoints:
            return self.endpoints.index(hint)
        if len(self.endpoints) >= MAX_ENDPOINTS:
            return None
        self.endpoints.append(hint)
        self._node_ids.append(None)
        return len(self.endpoints) - 1
