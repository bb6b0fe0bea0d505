"""Which node leads each shard, as the answers said: the table behind a keyed call's
first pick in a cluster of several shards (``leader.py`` holds it).

A cluster of S shards runs S Raft groups, each with its own leader, and a key's calls
are served by the leader of ``shard_of(key, S)``. Every v1 answer names the shard that
answered (``x-permitd-shard``) and that shard's leader (``x-permitd-leader``); answers
of clusters of more than one shard add the count (``x-permitd-shards``). This table
remembers the count and one leader per shard, so that a call for a key goes to its
shard's leader instead of taking a forwarding hop. Same rules as the Rust client's
``shard_leaders.rs`` and the TypeScript ``shard-leaders.ts``.

Invariants: the count is in ``[1, MAX_SHARDS]``, 1 until an answer says otherwise (a
bigger or zero count is ignored, so the table never holds more than ``MAX_SHARDS``
entries); there is one entry per shard of the current count, and a new count forgets
every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Literal, Optional, Tuple

from .shard import MAX_SHARDS, shard_of

#: The shard that serves calls naming no key: its leader is the one followed for them.
META_SHARD = 0

ShardLeader = Tuple[Literal["node", "endpoint"], int]
"""Where a shard's leader is: ``("node", id)`` (asked once an endpoint is known to be that
node) or ``("endpoint", index)`` (a position in the tracker's endpoint list, which only grows)."""


@dataclass(frozen=True)
class ShardHint:
    """What an answer's shard headers say: the shard that answered (``None`` on an answer
    covering every shard, a listing or a batch) and the cluster's shard count."""

    shard: Optional[int]
    shards: int


def parse_shard_hint(shard: Optional[str], shards: Optional[str]) -> Optional[ShardHint]:
    """The answer's ``x-permitd-shard`` and ``x-permitd-shards``, or ``None`` when it carries
    neither, or a value that is not a whole number. A shard without a count is of a cluster
    of one shard."""
    for text in (shard, shards):
        if text is not None and not (text.strip().isascii() and text.strip().isdigit()):
            return None
    if shard is None and shards is None:
        return None
    return ShardHint(shard=None if shard is None else int(shard), shards=1 if shards is None else int(shards))


class ShardLeaders:
    """The shard count and each shard's known leader."""

    def __init__(self) -> None:
        #: Position k holds shard k's leader, if known; as long as the count.
        self._leaders: List[Optional[ShardLeader]] = [None]

    def count(self) -> int:
        """The shard count the table follows."""
        return len(self._leaders)

    def learn_count(self, count: int) -> bool:
        """Takes ``count`` as the cluster's shard count; a count outside ``[1, MAX_SHARDS]``
        is ignored. Returns whether the count changed (every entry was forgotten then)."""
        if not 1 <= count <= MAX_SHARDS or count == self.count():
            return False
        self._leaders = [None] * count
        return True

    def shard_of(self, key: str) -> int:
        """The shard of ``key`` under the current count."""
        return shard_of(key, self.count())

    def leader(self, shard: int) -> Optional[ShardLeader]:
        """The known leader of ``shard``, if any."""
        return self._leaders[shard] if 0 <= shard < len(self._leaders) else None

    def set(self, shard: int, leader: ShardLeader) -> None:
        """Records ``leader`` as the leader of ``shard``; a shard outside the count is ignored."""
        if 0 <= shard < len(self._leaders):
            self._leaders[shard] = leader

    def forget(self, shard: int) -> None:
        """Forgets the leader of ``shard``."""
        if 0 <= shard < len(self._leaders):
            self._leaders[shard] = None

    def forget_where(self, matches: Callable[[ShardLeader], bool]) -> None:
        """Forgets every leader for which ``matches`` holds."""
        self._leaders = [None if leader is not None and matches(leader) else leader for leader in self._leaders]

    def known(self) -> List[ShardLeader]:
        """Every known leader."""
        return [leader for leader in self._leaders if leader is not None]
