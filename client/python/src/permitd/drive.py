"""Running plans (``plan.py``): with ``httpx.Client`` in the calling thread, or with
``httpx.AsyncClient`` on the running event loop.

A driver performs each effect a plan yields and sends the outcome back. A
transport error is an outcome (``Failure``), never an exception, so the plan
decides what is retried. An interruption while an effect runs
(``KeyboardInterrupt``, asyncio cancellation) is thrown into the plan, so its
cleanup (releasing grants already held) still runs, its own effects performed
as usual, before the interruption goes on. An async ``request`` attempt
interrupted in flight is not cut off: the attempt runs on in the background and
its ``abandon`` hook returns what the answer granted (``permit.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from typing import Any, Awaitable, Optional, Set

import httpx

from .http11 import Http11Transport
from .plan import ClientConfig, Failure, Outcome, Plan, Response, Send, Sleep, T


def http_settings(config: ClientConfig) -> dict[str, Any]:
    """What both httpx clients are built with: TLS roots, HTTP/2 or not, no proxies from the environment."""
    verify: Any = True
    if config.ca_file is not None:
        verify = ssl.create_default_context(cafile=config.ca_file)
    # HTTP/2 alone when asked: prior knowledge on http:// (httpx offers no upgrade), ALPN h2 on https://.
    return {"verify": verify, "http2": config.http2, "http1": not config.http2, "trust_env": False}


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if str(error) else text


async def _unstoppable(attempt: asyncio.Future[Any]) -> Any:
    """``attempt``'s result, waiting through cancellations (each attempt has its own timeout)."""
    while True:
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            if attempt.done():
                return attempt.result()


def _timeout(send: Send, connect_ms: int) -> httpx.Timeout:
    return httpx.Timeout(send.timeout_ms / 1000, connect=min(send.timeout_ms, connect_ms) / 1000)


class SyncDriver:
    """Runs plans in the calling thread: HTTP/1.1 over ``http.client`` (``http11.py``
    says why), HTTP/2 and event streams over ``httpx.Client``."""

    def __init__(self, config: ClientConfig) -> None:
        settings = http_settings(config)
        self._settings = settings
        self._http: Optional[httpx.Client] = None
        tls = settings["verify"] if isinstance(settings["verify"], ssl.SSLContext) else None
        self._connect_ms = config.connect_timeout_ms
        self._http11 = None if config.http2 else Http11Transport(tls, config.connect_timeout_ms)
        self._lock = threading.Lock()

    @property
    def http(self) -> httpx.Client:
        """The httpx client, made on first use."""
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(**self._settings)
            return self._http

    def perform(self, send: Send) -> Outcome:
        if self._http11 is not None:
            return self._http11.perform(send)
        try:
            timeout = _timeout(send, self._connect_ms)
            answer = self.http.request(send.method, send.url, headers=send.headers, content=send.body, timeout=timeout)
        except httpx.HTTPError as error:
            return Failure(_describe(error))
        return Response(answer.status_code, answer.headers, answer.content)

    def run(self, plan: Plan[T]) -> T:
        value: Any = None
        interrupt: Optional[BaseException] = None
        while True:
            try:
                effect = plan.send(value) if interrupt is None else plan.throw(interrupt)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            interrupt = None
            try:
                if isinstance(effect, Sleep):
                    time.sleep(max(0.0, effect.seconds))
                    value = None
                else:
                    value = self.perform(effect)
            except BaseException as error:  # an interruption: the plan cleans up
                interrupt = error

    def close(self) -> None:
        if self._http11 is not None:
            self._http11.close()
        if self._http is not None:
            self._http.close()


class AsyncDriver:
    def __init__(self, config: ClientConfig) -> None:
        self.http = httpx.AsyncClient(**http_settings(config))
        self._connect_ms = config.connect_timeout_ms
        # Background tasks (abandoned requests' answers), kept so they are not collected mid-flight.
        self._background: Set[asyncio.Future[Any]] = set()

    async def perform(self, send: Send) -> Outcome:
        try:
            timeout = _timeout(send, self._connect_ms)
            answer = await self.http.request(send.method, send.url, headers=send.headers, content=send.body, timeout=timeout)
        except httpx.HTTPError as error:
            return Failure(_describe(error))
        return Response(answer.status_code, answer.headers, answer.content)

    async def run(self, plan: Plan[T]) -> T:
        """Performs the plan's effects. Once an interruption was thrown into the plan, its
        cleanup (releasing what it holds) runs to its end: a second cancellation meanwhile
        is not thrown in, since claimed grants left unreleased would never expire; the
        plan ends with the first interruption anyway."""
        value: Any = None
        interrupt: Optional[BaseException] = None
        cleaning_up = False
        while True:
            try:
                effect = plan.send(value) if interrupt is None else plan.throw(interrupt)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            interrupt = None
            if isinstance(effect, Sleep):
                work: Any = asyncio.sleep(max(0.0, effect.seconds))
            else:
                work = self.perform(effect)
            attempt = asyncio.ensure_future(work)
            try:
                value = await (_unstoppable(attempt) if cleaning_up else asyncio.shield(attempt))
            except BaseException as error:
                interrupt, cleaning_up = error, True
                if isinstance(effect, Send) and effect.abandon is not None:
                    self.spawn(self._settle_abandoned(attempt, effect))
                else:
                    attempt.cancel()

    async def _settle_abandoned(self, attempt: asyncio.Future[Outcome], send: Send) -> None:
        """Waits for an abandoned attempt's answer and runs what its ``abandon`` hook returns."""
        assert send.abandon is not None, "only attempts with a hook are settled"
        outcome = await attempt
        cleanup = send.abandon(outcome)
        if cleanup is not None:
            try:
                await self.run(cleanup)
            except Exception:
                pass  # the holder reclaims at the claim deadline, as after a lost answer

    def spawn(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.http.aclose()
