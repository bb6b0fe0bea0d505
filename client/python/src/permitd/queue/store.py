"""Where a queue keeps its items and permit accounting: ``SqliteStore`` (durable) or
``MemoryStore`` (nothing survives the process).

A store is a small key-value interface with atomic batches. The record layout is
the Rust and TypeScript queues':

- ``m/client`` -> the client id the store belongs to;
- ``i/{item id}`` -> an item record;
- ``k/{semaphore key}`` -> a key record (grants and leases held);
- ``r/{seq, 20 digits}`` -> a released item id, oldest first.

The queue writes a step's changes and waits for ``write`` to return (durable)
before it sends the step's messages or admits its items, so a claim the holder
saw, or a lease permit drawn, is never lost to a crash.

``SqliteStore`` is one SQLite file from the standard library's ``sqlite3``, in
WAL mode with ``synchronous=FULL``: each ``write`` is one transaction whose
commit is fsynced before it returns, so an acknowledged enqueue and a seen claim
survive a power cut (``tests/test_power_loss.py`` cuts the power under it on
powerfs). A new file's directory entry is durable only once its directory is
fsynced: SQLite does that when it creates the WAL (which, in the same
directory, covers the database file too), and the store does it once more
after creating the database file, so a fresh store does not rest on that
detail of SQLite's.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from typing import Any, Dict, List, Optional, Protocol, Tuple

from ..errors import ClientIdMismatchError
from .state import Dirty, QueueState, Record

CLIENT_RECORD = "m/client"
ITEM_PREFIX = "i/"
KEY_PREFIX = "k/"
RELEASED_PREFIX = "r/"


class QueueStore(Protocol):
    def load(self) -> Dict[str, Any]:
        """Every record."""

    def write(self, puts: Dict[str, str], deletes: List[str]) -> None:
        """Writes ``puts`` (record name -> JSON text) and removes ``deletes`` atomically;
        durable once it returns."""

    def close(self) -> None:
        """Releases the store's resources."""


class MemoryStore:
    """Keeps records in memory: for tests, and runners that may lose their queue on restart."""

    def __init__(self) -> None:
        self._records: Dict[str, str] = {}

    def load(self) -> Dict[str, Any]:
        return {name: json.loads(value) for name, value in self._records.items()}

    def write(self, puts: Dict[str, str], deletes: List[str]) -> None:
        for name in deletes:
            self._records.pop(name, None)
        self._records.update(puts)

    def close(self) -> None:
        pass


class SqliteStore:
    """One SQLite file (see the module docs). Safe to call from one thread at a time;
    the queue calls it from its own single worker thread."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        existed = os.path.exists(self.path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        if not existed:
            _sync_directory(os.path.dirname(self.path))

    def load(self) -> Dict[str, Any]:
        with self._lock:
            rows = self._db.execute("SELECT name, value FROM records").fetchall()
        return {name: json.loads(value) for name, value in rows}

    def write(self, puts: Dict[str, str], deletes: List[str]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM records WHERE name = ?", [(name,) for name in deletes])
                self._db.executemany(
                    "INSERT OR REPLACE INTO records (name, value) VALUES (?, ?)",
                    list(puts.items()),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _sync_directory(path: str) -> None:
    descriptor = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Loaded:
    """What a store holds, decoded."""

    def __init__(self) -> None:
        self.items: List[Record] = []
        self.keys: List[Tuple[str, Record]] = []
        self.released: List[Tuple[int, str]] = []


def load_queue(store: QueueStore, client_id: str) -> Loaded:
    """Reads a store's records back, claiming an empty store for ``client_id``."""
    records = store.load()
    stored = records.get(CLIENT_RECORD)
    if stored is None:
        store.write({CLIENT_RECORD: _text(client_id)}, [])
    elif stored != client_id:
        raise ClientIdMismatchError(str(stored), client_id)
    loaded = Loaded()
    for name, value in records.items():
        if name.startswith(ITEM_PREFIX):
            loaded.items.append(value)
        elif name.startswith(KEY_PREFIX):
            loaded.keys.append((name[len(KEY_PREFIX) :], value))
        elif name.startswith(RELEASED_PREFIX):
            loaded.released.append((int(name[len(RELEASED_PREFIX) :]), str(value)))
    return loaded


def changes(state: QueueState[Any], dirty: Dirty) -> Optional[Tuple[Dict[str, str], List[str]]]:
    """The records ``dirty`` names, as ``state`` has them now, as JSON text (so a write in
    another thread sees them as they were); ``None`` when nothing changed."""
    puts: Dict[str, str] = {}
    deletes: List[str] = []
    for item_id in dirty.items:
        item = state.item(item_id)
        if item is not None:
            puts[ITEM_PREFIX + item_id] = _text(item)
        else:
            deletes.append(ITEM_PREFIX + item_id)
    for key in dirty.keys:
        record = state.key_record(key)
        if record is not None:
            puts[KEY_PREFIX + key] = _text(record)
        else:
            deletes.append(KEY_PREFIX + key)
    for seq, item_id in dirty.released_added:
        puts[_released_name(seq)] = _text(item_id)
    for seq, _ in dirty.released_removed:
        puts.pop(_released_name(seq), None)
        deletes.append(_released_name(seq))
    return (puts, deletes) if puts or deletes else None


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _released_name(seq: int) -> str:
    return f"{RELEASED_PREFIX}{seq:020d}"
