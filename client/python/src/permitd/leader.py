"""Which node to ask next: the remembered leader first, then the others in turn.

Any node accepts any call (a follower forwards to the leader), so the leader is
an optimisation that saves a hop. permitd names the leader's node id in the
``x-permitd-leader`` header of every v1 answer (and of a ``not_leader`` 503); a
URL there is accepted too. An id maps to an endpoint once the endpoints' ids
are known: the client asks each node's ``/cluster/status`` when an unknown id
shows up. A node that failed is skipped until the others were tried.

In a cluster of several shards each shard has a leader of its own. The tracker then
keeps two things apart: the leader it follows for calls that name no key (the meta
shard's, learned from answers of that shard and from answers that name no shard, as
before shards), and one leader per shard (``ShardLeaders``), learned from each answer's
leader and shard headers. A call for a key asks its shard's leader first, else goes
where a call naming no key would. An answer that fails for a shard (``not_leader``,
``leader_changed``, a node unreachable) replaces that shard's leader with the one the
answer named, or forgets it, as it does the followed leader. Same rules as the Rust
client's ``leader.rs`` and the TypeScript ``leader.ts``.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Union
from urllib.parse import urlsplit

from .errors import ConfigError
from .shard_leaders import META_SHARD, ShardHint, ShardLeader, ShardLeaders

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
    """The endpoints, which of them leads (the meta shard, and each shard), and whom to ask next."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ConfigError("no endpoints configured")
        self.endpoints: List[str] = list(dict.fromkeys(endpoints))[:MAX_ENDPOINTS]
        self._node_ids: List[Optional[int]] = [None] * len(self.endpoints)
        #: The node asked first for calls naming no key: the meta shard's leader.
        self._leader_index: Optional[int] = None
        self._unmapped_leader: Optional[int] = None
        self._cursor = 0
        #: The shard count and each shard's leader.
        self._shards = ShardLeaders()
        #: Some shard's leader is a node id that no endpoint is known to have.
        self._unmapped_shard_leader = False

    def leader(self) -> Optional[str]:
        """The node asked first for calls naming no key, if one is remembered."""
        return None if self._leader_index is None else self.endpoints[self._leader_index]

    def leader_of_key(self, key: str) -> Optional[str]:
        """The known leader of ``key``'s shard, if its endpoint is known."""
        leader = self._shards.leader(self._shards.shard_of(key))
        index = None if leader is None else self._index_of(leader)
        return None if index is None else self.endpoints[index]

    def shard_count(self) -> int:
        """The shard count the tracker follows (1 until an answer names another)."""
        return self._shards.count()

    def wants_node_ids(self) -> bool:
        """A leader id was named that no endpoint is known to have."""
        return self._unmapped_leader is not None or self._unmapped_shard_leader

    def learn_node_id(self, endpoint: str, node_id: int) -> None:
        if endpoint not in self.endpoints:
            return
        index = self.endpoints.index(endpoint)
        self._node_ids = [None if (other != index and known == node_id) else known for other, known in enumerate(self._node_ids)]
        self._node_ids[index] = node_id
        if self._unmapped_leader == node_id:
            self._unmapped_leader = None
            self._leader_index = index
        self._unmapped_shard_leader = any(self._index_of(leader) is None for leader in self._shards.known())

    def pick(self) -> str:
        """The node to ask next for a call naming no key: the leader if known, else the next in turn."""
        index = self._leader_index if self._leader_index is not None else self._cursor % len(self.endpoints)
        return self.endpoints[index]

    def pick_for(self, key: Optional[str]) -> str:
        """The node to ask next for a call about ``key`` (``None``: naming no key): its shard's
        leader if known, else as ``pick``."""
        leader = None if key is None else self.leader_of_key(key)
        return leader if leader is not None else self.pick()

    def answered(self, endpoint: str, hint: Optional[LeaderHint]) -> None:
        named = None if hint is None else self._resolve(hint)
        if named is not None:
            self._leader_index = named
        elif endpoint in self.endpoints:
            self._leader_index = self.endpoints.index(endpoint)

    def answered_for(self, endpoint: str, hint: Optional[LeaderHint], shard: Optional[ShardHint]) -> None:
        """``answered`` for an answer with shard headers (``shard``): the count is learned, and
        the answering shard's leader is the node ``hint`` names (else the node that answered).
        Only the meta shard's answers (or any, in a cluster of one shard) move the leader
        followed for calls naming no key; another shard's answer makes the node that answered
        that leader only while none is known."""
        answering = self._learn_shards(shard)
        if answering is None:
            self.answered(endpoint, hint)
            return
        index = self.endpoints.index(endpoint) if endpoint in self.endpoints else None
        answerer: Optional[ShardLeader] = None if index is None else ("endpoint", index)
        leader = answerer if hint is None else self._shard_leader(hint)
        if leader is not None:
            self._shards.set(answering, leader)
        if self._follows_meta(answering):
            self.answered(endpoint, hint)
        elif self._leader_index is None:
            self._leader_index = index

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

    def failed_for(self, endpoint: str, key: Optional[str], hint: Optional[LeaderHint], shard: Optional[ShardHint]) -> None:
        """``failed`` for a call about ``key`` (if it named one), whose answer carried shard
        headers (``shard``) if it got one. The failing shard (the one that answered, else the
        key's) takes the leader ``hint`` names, unless that is the failed node; otherwise it
        forgets a leader that is the failed node. A node that gave no answer at all is
        forgotten as every shard's leader. The leader followed for calls naming no key takes
        ``hint`` only from the meta shard."""
        answering = self._learn_shards(shard)
        failing = answering if answering is not None else (None if key is None else self._shards.shard_of(key))
        failed = self.endpoints.index(endpoint) if endpoint in self.endpoints else None

        def is_failed(leader: ShardLeader) -> bool:
            return failed is not None and self._index_of(leader) == failed

        if failing is not None:
            named = None if hint is None else self._shard_leader(hint)
            if named is not None and not is_failed(named):
                self._shards.set(failing, named)
            else:
                known = self._shards.leader(failing)
                if known is not None and is_failed(known):
                    self._shards.forget(failing)
        if shard is None and hint is None and failed is not None:
            self._shards.forget_where(is_failed)
        meta = failing is None or self._follows_meta(failing)
        self.failed(endpoint, hint if meta else None)

    def _learn_shards(self, shard: Optional[ShardHint]) -> Optional[int]:
        """Learns the count from ``shard``, and returns the shard that answered when it is one of that count."""
        if shard is None:
            return None
        self._shards.learn_count(shard.shards)
        answering = shard.shard
        if answering is None or shard.shards != self._shards.count() or answering >= shard.shards:
            return None
        return answering

    def _follows_meta(self, shard: int) -> bool:
        """Whether answers of ``shard`` name the leader followed for calls naming no key."""
        return shard == META_SHARD or self._shards.count() == 1

    def _shard_leader(self, hint: LeaderHint) -> Optional[ShardLeader]:
        """The shard leader a hint names: a URL becomes an endpoint (added if there is room),
        an id is kept and flagged when no endpoint is known to have it."""
        if isinstance(hint, int):
            if hint not in self._node_ids:
                self._unmapped_shard_leader = True
            return ("node", hint)
        index = self._resolve(hint)
        return None if index is None else ("endpoint", index)

    def _index_of(self, leader: ShardLeader) -> Optional[int]:
        """The endpoint a shard leader is, if known."""
        kind, value = leader
        if kind == "endpoint":
            return value
        return self._node_ids.index(value) if value in self._node_ids else None

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
