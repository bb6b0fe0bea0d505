"""``SemaphoreClient`` (sync) and ``AsyncSemaphoreClient``: every call of the v1 API
against a list of nodes, the same surface as the Rust client.

Both are thin: each method builds a plan (``plan.py``, ``permit.py``) and runs
it with its driver (``drive.py``), so the two behave alike by construction.
Settings come from the arguments, else from the environment:
``PERMITD_ENDPOINTS`` (comma-separated base URLs; the loopback cluster of the
repository's ``cluster.toml`` when unset), ``PERMITD_TOKEN`` and
``PERMITD_CA_FILE`` (the CA of ``https://`` nodes). ``http2=True`` needs the
``h2`` extra (``pip install 'permitd[http2]'``). Times are in seconds.

A sync client may be shared by threads; an async client belongs to one event
loop. Close either (``close()``/``aclose()``, or use it as a context manager).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union, cast

import httpx

from . import wire
from .backoff import Backoff
from .drive import AsyncDriver, SyncDriver
from .errors import RejectedError
from .events import Cursor, SseMessage, SseParser
from .permit import PermitBase, acquire_plan, release_plan
from .plan import (
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    DEFAULT_CALL_TIMEOUT_MS,
    RETRYABLE_STATUSES,
    ClientConfig,
    ClientCore,
    Plan,
    rejected,
    segments_path,
)

#: Endpoints when neither the caller nor ``PERMITD_ENDPOINTS`` names any: ``permitd up``'s.
DEFAULT_ENDPOINTS = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
#: Limit on opening an event stream on one node, in seconds.
EVENT_CONNECT_TIMEOUT_S = 2.0
#: Longest silence on an event stream before it is taken as broken, in seconds (a node
#: sends a keep-alive comment every 15 s).
EVENT_READ_TIMEOUT_S = 45.0

F = TypeVar("F", bound=Callable[..., Any])
BatchResult = Union[wire.SemaphoreResponse, RejectedError]


def client_config(
    endpoints: Union[str, Sequence[str], None],
    token: Optional[str],
    ca_file: Optional[str],
    http2: bool,
    call_timeout: float,
    attempt_timeout: float,
) -> ClientConfig:
    """Settings from the arguments, falling back on ``PERMITD_*`` variables."""
    if endpoints is None:
        endpoints = os.environ.get("PERMITD_ENDPOINTS") or DEFAULT_ENDPOINTS
    return ClientConfig(
        endpoints=[endpoints] if isinstance(endpoints, str) else list(endpoints),
        token=token if token is not None else os.environ.get("PERMITD_TOKEN") or None,
        ca_file=ca_file if ca_file is not None else os.environ.get("PERMITD_CA_FILE") or None,
        http2=http2,
        call_timeout_ms=int(call_timeout * 1000),
        attempt_timeout_ms=int(attempt_timeout * 1000),
    )


def _path(*segments: str) -> List[str]:
    return list(segments)


class _Plans:
    """The plans of the admin and read calls, by name, for both clients."""

    def __init__(self, core: ClientCore) -> None:
        self.core = core

    def usage(self, key: str) -> Plan[wire.Usage]:
        return self.core.get(_path("v1", "semaphores", key, "usage"), "Usage")

    def key_config(self, key: str) -> Plan[Dict[str, Any]]:
        return self.core.get(_path("v1", "semaphores", key, "config"), "KeyConfig")

    def set_key_config(self, key: str, update: Mapping[str, Any]) -> Plan[Dict[str, Any]]:
        return self.core.call("PUT", _path("v1", "semaphores", key, "config"), dict(update), "KeyConfig")

    def set_group(self, key: str, group: str, config: Mapping[str, Any]) -> Plan[Any]:
        return self.core.call("PUT", _path("v1", "semaphores", key, "groups", group), dict(config))

    def delete_group(self, key: str, group: str) -> Plan[Any]:
        return self.core.call("DELETE", _path("v1", "semaphores", key, "groups", group))

    def keys_page(self, after: Optional[str], limit: Optional[int]) -> Plan[Dict[str, Any]]:
        query = {name: str(value) for name, value in (("after", after), ("limit", limit)) if value is not None}
        return self.core.get(_path("v1", "semaphores"), "KeyList", query)

    def keys(self) -> Plan[List[Dict[str, Any]]]:
        keys: List[Dict[str, Any]] = []
        after: Optional[str] = None
        while True:
            page = yield from self.keys_page(after, None)
            keys.extend(page["keys"])
            after = page.get("next")
            if after is None:
                return keys

    def holders(self, key: str) -> Plan[Dict[str, Any]]:
        return self.core.get(_path("v1", "semaphores", key, "holders"), None)

    def force_release(self, key: str, client_id: str) -> Plan[Dict[str, Any]]:
        return self.core.call("POST", _path("v1", "semaphores", key, "clients", client_id, "release"))

    def delete_key(self, key: str, force: bool) -> Plan[Dict[str, Any]]:
        # One requestId for every attempt: a retry after a lost answer replays it.
        query = {"requestId": str(uuid.uuid4())}
        if force:
            query["force"] = "true"
        return self.core.call("DELETE", _path("v1", "semaphores", key), shape="KeyDeleted", query=query)

    def create_token(self, spec: Mapping[str, Any]) -> Plan[Dict[str, Any]]:
        return self.core.call("POST", _path("v1", "tokens"), dict(spec))

    def tokens(self) -> Plan[List[Dict[str, Any]]]:
        answer = yield from self.core.get(_path("v1", "tokens"), None)
        return cast(List[Dict[str, Any]], answer["tokens"])

    def revoke_token(self, token_id: int) -> Plan[Any]:
        return self.core.call("DELETE", _path("v1", "tokens", str(token_id)))

    def cluster_status(self) -> Plan[wire.ClusterStatus]:
        return self.core.get(_path("cluster", "status"), "ClusterStatus")

    def cluster_shards(self) -> Plan[wire.ShardMap]:
        return self.core.get(_path("cluster", "shards"), "ShardMap")

    def release(self, permit: PermitBase) -> Plan[None]:
        if permit.released:
            return
        permit.released = True
        yield from release_plan(self.core, permit.key, permit.client_id, permit.grants)


class Permit(PermitBase):
    """Claimed permits of one key; ``with`` releases them on exit."""

    def __init__(self, client: SemaphoreClient, key: str, group: str, client_id: str, grants: Any) -> None:
        super().__init__(key, group, client_id, grants)
        self._client = client

    def release(self) -> None:
        """Reports every permit released; a second call does nothing."""
        self._client._run(self._client._plans.release(self))

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class AsyncPermit(PermitBase):
    """Claimed permits of one key; ``async with`` releases them on exit, cancellation included."""

    def __init__(self, client: AsyncSemaphoreClient, key: str, group: str, client_id: str, grants: Any) -> None:
        super().__init__(key, group, client_id, grants)
        self._client = client

    async def release(self) -> None:
        """Reports every permit released; a second call does nothing. Shielded: a
        cancelled caller does not cut the release off (claimed grants never expire)."""
        task = self._client._driver.spawn(self._client._run(self._client._plans.release(self)))
        await asyncio.shield(task)

    async def __aenter__(self) -> AsyncPermit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class SemaphoreClient:
    """The blocking client; see the module docs."""

    def __init__(
        self,
        endpoints: Union[str, Sequence[str], None] = None,
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        http2: bool = False,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_MS / 1000,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT_MS / 1000,
    ) -> None:
        self.config = client_config(endpoints, token, ca_file, http2, call_timeout, attempt_timeout)
        self._core = ClientCore(self.config)
        self._plans = _Plans(self._core)
        self._driver = SyncDriver(self.config)

    def _run(self, plan: Plan[Any]) -> Any:
        return self._driver.run(plan)

    def close(self) -> None:
        self._driver.close()

    def __enter__(self) -> SemaphoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def leader(self) -> Optional[str]:
        """The node currently asked first for calls naming no key (the meta shard's leader)."""
        return self._core.leader()

    def leader_of_key(self, key: str) -> Optional[str]:
        """The node a call about ``key`` is sent to first: its shard's leader, once an answer
        named it and its endpoint is known."""
        return self._core.leader_of_key(key)

    def shard_count(self) -> int:
        """The cluster's shard count, as the answers said (1 until one says otherwise)."""
        return self._core.shard_count()

    def endpoints(self) -> List[str]:
        return list(self._core.tracker.endpoints)

    def next_request_at(self, key: str) -> Optional[int]:
        """The key's ``nextRequestAt`` from its last answer, in ms since the epoch."""
        return self._core.next_request_at(key)

    # ---- permits ----

    def acquire(self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, client_id: Optional[str] = None) -> Permit:
        """Waits for ``count`` claimed permits of ``key`` for ``group`` (see ``permit.py``)."""
        client_id, grants = self._run(acquire_plan(self._core, key, group, count, client_id, timeout))
        return Permit(self, key, group, client_id, grants)

    @contextmanager
    def permit(
        self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, client_id: Optional[str] = None
    ) -> Iterator[Permit]:
        """``with client.permit(key, group) as p:``: acquired on entry, released on exit."""
        with self.acquire(key, group, count, timeout=timeout, client_id=client_id) as held:
            yield held

    def with_permit(
        self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, fence_arg: Optional[str] = None
    ) -> Callable[[F], F]:
        """Decorates a function to run under a permit (its fence passed as ``fence_arg`` if named)."""

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function):
                raise TypeError("SemaphoreClient.with_permit decorates plain functions; use AsyncSemaphoreClient's for coroutines")

            @functools.wraps(function)
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.permit(key, group, count, timeout=timeout) as held:
                    if fence_arg is not None:
                        kwargs[fence_arg] = held.fence
                    return function(*args, **kwargs)

            return cast(F, run)

        return decorate

    # ---- messages ----

    def request(self, key: str, message: Mapping[str, Any], *, timeout: Optional[float] = None) -> wire.SemaphoreResponse:
        """Sends a ``request`` (``type``, ``v`` and a ``requestId`` are filled in) and waits for its round."""
        return cast(wire.SemaphoreResponse, self._run(self._core.request(key, message, _ms(timeout))))

    def sync(self, key: str, message: Mapping[str, Any], *, timeout: Optional[float] = None) -> wire.SemaphoreResponse:
        """Sends a ``sync`` (reports only); applied without waiting for a round."""
        return cast(wire.SemaphoreResponse, self._run(self._core.sync(key, message, _ms(timeout))))

    def batch(self, items: Sequence[Mapping[str, Any]], *, timeout: Optional[float] = None) -> List[BatchResult]:
        """``POST /v1/batch``: each item ``{"key", "message"}``; each item's answer or ``RejectedError``."""
        return cast(List[BatchResult], self._run(self._core.batch(items, _ms(timeout))))

    # ---- reads and admin ----

    def usage(self, key: str) -> wire.Usage:
        return cast(wire.Usage, self._run(self._plans.usage(key)))

    def key_config(self, key: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self._run(self._plans.key_config(key)))

    def set_key_config(self, key: str, update: Mapping[str, Any]) -> Dict[str, Any]:
        """Replaces the key's configuration (omitted fields take the cluster defaults)."""
        return cast(Dict[str, Any], self._run(self._plans.set_key_config(key, update)))

    def set_group(self, key: str, group: str, config: Mapping[str, Any]) -> None:
        self._run(self._plans.set_group(key, group, config))

    def delete_group(self, key: str, group: str) -> None:
        self._run(self._plans.delete_group(key, group))

    def keys_page(self, after: Optional[str] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], self._run(self._plans.keys_page(after, limit)))

    def keys(self) -> List[Dict[str, Any]]:
        """Every key with state, with its usage, following pages to the end."""
        return cast(List[Dict[str, Any]], self._run(self._plans.keys()))

    def holders(self, key: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], self._run(self._plans.holders(key)))

    def force_release(self, key: str, client_id: str) -> Dict[str, Any]:
        """Drops ``client_id``'s grants, leases and remembered answers on ``key`` (admin)."""
        return cast(Dict[str, Any], self._run(self._plans.force_release(key, client_id)))

    def delete_key(self, key: str, force: bool = False) -> Dict[str, Any]:
        """Deletes ``key``'s settings and state (admin); a key in use fails with
        ``key_in_use`` unless ``force``, which releases its holders first."""
        return cast(Dict[str, Any], self._run(self._plans.delete_key(key, force)))

    def create_token(self, spec: Mapping[str, Any]) -> Dict[str, Any]:
        return cast(Dict[str, Any], self._run(self._plans.create_token(spec)))

    def tokens(self) -> List[Dict[str, Any]]:
        return cast(List[Dict[str, Any]], self._run(self._plans.tokens()))

    def revoke_token(self, token_id: int) -> None:
        self._run(self._plans.revoke_token(token_id))

    def cluster_status(self) -> wire.ClusterStatus:
        return cast(wire.ClusterStatus, self._run(self._plans.cluster_status()))

    def cluster_shards(self) -> wire.ShardMap:
        """Every shard and its leader, as the answering node sees them (admin token)."""
        return cast(wire.ShardMap, self._run(self._plans.cluster_shards()))

    # ---- events ----

    def events(self, key: Optional[str] = None, from_index: Optional[int] = None) -> Iterator[SseMessage]:
        """The event stream of ``key`` (every key's when ``None``) from log index
        ``from_index`` (only new events when ``None``); resumes after a break."""
        cursor = Cursor(key, from_index)
        backoff = Backoff()
        while True:
            reason = "no endpoint answered"
            for endpoint in self.endpoints():
                try:
                    yield from self._stream(endpoint, cursor)
                    reason = f"{endpoint} ended the stream"
                except httpx.HTTPError as error:
                    reason = f"{endpoint}: {error}"
                cursor.broken(reason)
            time.sleep(backoff.next_delay_ms(self.config.random()) / 1000)

    def _stream(self, endpoint: str, cursor: Cursor) -> Iterator[SseMessage]:
        url = f"{endpoint}/{segments_path(['v1', 'events'])}"
        timeout = httpx.Timeout(EVENT_READ_TIMEOUT_S, connect=EVENT_CONNECT_TIMEOUT_S)
        with self._driver.http.stream("GET", url, params=cursor.query(), headers=_auth(self.config), timeout=timeout) as answer:
            if answer.status_code != 200:
                error = rejected(answer.status_code, answer.read().decode("utf-8", "replace"))
                if answer.status_code in RETRYABLE_STATUSES:
                    raise httpx.TransportError(str(error))
                raise error
            parser = SseParser()
            for chunk in answer.iter_raw():
                parser.feed(chunk)
                while parser.ready:
                    message = parser.ready.popleft()
                    cursor.seen(message)
                    yield message


class AsyncSemaphoreClient:
    """The asyncio client; see the module docs. Same methods as ``SemaphoreClient``, awaited."""

    def __init__(
        self,
        endpoints: Union[str, Sequence[str], None] = None,
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        http2: bool = False,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_MS / 1000,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT_MS / 1000,
    ) -> None:
        self.config = client_config(endpoints, token, ca_file, http2, call_timeout, attempt_timeout)
        self._core = ClientCore(self.config)
        self._plans = _Plans(self._core)
        self._driver = AsyncDriver(self.config)

    async def _run(self, plan: Plan[Any]) -> Any:
        return await self._driver.run(plan)

    async def aclose(self) -> None:
        """Waits for background releases, then closes the connections."""
        await self._driver.close()

    async def __aenter__(self) -> AsyncSemaphoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def leader(self) -> Optional[str]:
        return self._core.leader()

    def leader_of_key(self, key: str) -> Optional[str]:
        return self._core.leader_of_key(key)

    def shard_count(self) -> int:
        return self._core.shard_count()

    def endpoints(self) -> List[str]:
        return list(self._core.tracker.endpoints)

    def next_request_at(self, key: str) -> Optional[int]:
        return self._core.next_request_at(key)

    # ---- permits ----

    async def acquire(
        self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, client_id: Optional[str] = None
    ) -> AsyncPermit:
        client_id, grants = await self._run(acquire_plan(self._core, key, group, count, client_id, timeout))
        return AsyncPermit(self, key, group, client_id, grants)

    @asynccontextmanager
    async def permit(
        self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, client_id: Optional[str] = None
    ) -> AsyncIterator[AsyncPermit]:
        """``async with client.permit(key, group) as p:``: acquired on entry, released on exit."""
        async with await self.acquire(key, group, count, timeout=timeout, client_id=client_id) as held:
            yield held

    def with_permit(
        self, key: str, group: str, count: int = 1, *, timeout: Optional[float] = None, fence_arg: Optional[str] = None
    ) -> Callable[[F], F]:
        """Decorates a coroutine function to run under a permit."""

        def decorate(function: F) -> F:
            if not inspect.iscoroutinefunction(function):
                raise TypeError("AsyncSemaphoreClient.with_permit decorates coroutine functions; use SemaphoreClient's for plain ones")

            @functools.wraps(function)
            async def run(*args: Any, **kwargs: Any) -> Any:
                async with self.permit(key, group, count, timeout=timeout) as held:
                    if fence_arg is not None:
                        kwargs[fence_arg] = held.fence
                    return await cast(Callable[..., Awaitable[Any]], function)(*args, **kwargs)

            return cast(F, run)

        return decorate

    # ---- messages ----

    async def request(self, key: str, message: Mapping[str, Any], *, timeout: Optional[float] = None) -> wire.SemaphoreResponse:
        return cast(wire.SemaphoreResponse, await self._run(self._core.request(key, message, _ms(timeout))))

    async def sync(self, key: str, message: Mapping[str, Any], *, timeout: Optional[float] = None) -> wire.SemaphoreResponse:
        return cast(wire.SemaphoreResponse, await self._run(self._core.sync(key, message, _ms(timeout))))

    async def batch(self, items: Sequence[Mapping[str, Any]], *, timeout: Optional[float] = None) -> List[BatchResult]:
        return cast(List[BatchResult], await self._run(self._core.batch(items, _ms(timeout))))

    # ---- reads and admin ----

    async def usage(self, key: str) -> wire.Usage:
        return cast(wire.Usage, await self._run(self._plans.usage(key)))

    async def key_config(self, key: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.key_config(key)))

    async def set_key_config(self, key: str, update: Mapping[str, Any]) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.set_key_config(key, update)))

    async def set_group(self, key: str, group: str, config: Mapping[str, Any]) -> None:
        await self._run(self._plans.set_group(key, group, config))

    async def delete_group(self, key: str, group: str) -> None:
        await self._run(self._plans.delete_group(key, group))

    async def keys_page(self, after: Optional[str] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.keys_page(after, limit)))

    async def keys(self) -> List[Dict[str, Any]]:
        return cast(List[Dict[str, Any]], await self._run(self._plans.keys()))

    async def holders(self, key: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.holders(key)))

    async def force_release(self, key: str, client_id: str) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.force_release(key, client_id)))

    async def delete_key(self, key: str, force: bool = False) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.delete_key(key, force)))

    async def create_token(self, spec: Mapping[str, Any]) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._plans.create_token(spec)))

    async def tokens(self) -> List[Dict[str, Any]]:
        return cast(List[Dict[str, Any]], await self._run(self._plans.tokens()))

    async def revoke_token(self, token_id: int) -> None:
        await self._run(self._plans.revoke_token(token_id))

    async def cluster_status(self) -> wire.ClusterStatus:
        return cast(wire.ClusterStatus, await self._run(self._plans.cluster_status()))

    async def cluster_shards(self) -> wire.ShardMap:
        """Every shard and its leader, as the answering node sees them (admin token)."""
        return cast(wire.ShardMap, await self._run(self._plans.cluster_shards()))

    # ---- events ----

    async def events(self, key: Optional[str] = None, from_index: Optional[int] = None) -> AsyncIterator[SseMessage]:
        """As ``SemaphoreClient.events``, as an async iterator."""
        cursor = Cursor(key, from_index)
        backoff = Backoff()
        while True:
            reason = "no endpoint answered"
            for endpoint in self.endpoints():
                try:
                    async for message in self._stream(endpoint, cursor):
                        yield message
                    reason = f"{endpoint} ended the stream"
                except httpx.HTTPError as error:
                    reason = f"{endpoint}: {error}"
                cursor.broken(reason)
            await asyncio.sleep(backoff.next_delay_ms(self.config.random()) / 1000)

    async def _stream(self, endpoint: str, cursor: Cursor) -> AsyncIterator[SseMessage]:
        url = f"{endpoint}/{segments_path(['v1', 'events'])}"
        timeout = httpx.Timeout(EVENT_READ_TIMEOUT_S, connect=EVENT_CONNECT_TIMEOUT_S)
        async with self._driver.http.stream("GET", url, params=cursor.query(), headers=_auth(self.config), timeout=timeout) as answer:
            if answer.status_code != 200:
                error = rejected(answer.status_code, (await answer.aread()).decode("utf-8", "replace"))
                if answer.status_code in RETRYABLE_STATUSES:
                    raise httpx.TransportError(str(error))
                raise error
            parser = SseParser()
            async for chunk in answer.aiter_raw():
                parser.feed(chunk)
                while parser.ready:
                    message = parser.ready.popleft()
                    cursor.seen(message)
                    yield message


def _ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(seconds * 1000)


def _auth(config: ClientConfig) -> Dict[str, str]:
    return {} if config.token is None else {"authorization": f"Bearer {config.token}"}
