"""The sync client's HTTP/1.1 transport: ``http.client`` connections kept alive per
thread and endpoint.

Why not httpx here: a lone acquire is two calls, and the client's budget is 0.5 ms
over the same calls made raw. On this project's loaded 2-core VM, 1,000 GETs of
``/healthz`` took p50 851 µs and 462 µs of CPU each through ``httpx.Client``,
538 µs and 267 µs through ``httpcore``, 391 µs and 143 µs through ``http.client``:
httpx alone would spend the budget twice over. With this transport an acquire
costs 0.28 ms of CPU more than the raw calls (p50, ``bench/acquire_overhead.py``).
httpx still carries the async client, HTTP/2 (``http2=True``) and the event
streams.

A connection that was kept alive may have been closed by the node meanwhile: a
call that fails on a reused connection before any answer came is sent once more
on a fresh one, at once (every write of the protocol replays safely: a
``requestId``, cumulative reports, whole configurations).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import weakref
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

from .plan import Failure, Outcome, Response, Send

#: Errors of a kept-alive connection the node closed while it sat idle.
STALE_CONNECTION_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Http11Transport:
    def __init__(self, tls: Optional[ssl.SSLContext], connect_timeout_ms: int) -> None:
        self._tls = tls
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._local = threading.local()
        #: Every open connection of every thread, to close them all at ``close``; weak, so
        #: the connections of a thread that ended go with its thread-local slots.
        self._all: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._lock = threading.Lock()

    def _connections(self) -> Dict[Tuple[str, str], http.client.HTTPConnection]:
        connections: Optional[Dict[Tuple[str, str], http.client.HTTPConnection]] = getattr(self._local, "connections", None)
        if connections is None:
            connections = {}
            self._local.connections = connections
        return connections

    def _connect(self, scheme: str, netloc: str, timeout_s: float) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(netloc, timeout=timeout_s, context=self._tls or ssl.create_default_context())
        return http.client.HTTPConnection(netloc, timeout=timeout_s)

    def perform(self, send: Send) -> Outcome:
        url = urlsplit(send.url)
        target = url.path + (f"?{url.query}" if url.query else "")
        slot = (url.scheme, url.netloc)
        connections = self._connections()
        timeout_s = send.timeout_ms / 1000
        for fresh in (False, True):
            connection = connections.get(slot)
            reused = connection is not None and not fresh
            if connection is None or fresh:
                with self._lock:
                    if connection is not None:
                        connection.close()
                        self._all.discard(connection)
                    connection = self._connect(url.scheme, url.netloc, timeout_s)
                    self._all.add(connection)
                connections[slot] = connection
            try:
                if connection.sock is None:
                    connection.timeout = min(timeout_s, self._connect_timeout_s)
                    connection.connect()
                connection.timeout = timeout_s
                if connection.sock is not None:
                    connection.sock.settimeout(timeout_s)
                connection.request(send.method, target, body=send.body, headers=send.headers)
                answer = connection.getresponse()
                body = answer.read()
            except STALE_CONNECTION_ERRORS as error:
                connection.close()
                if reused:
                    continue
                return Failure(f"{type(error).__name__}: {error}")
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                reason = "timed out" if isinstance(error, socket.timeout) else f"{type(error).__name__}: {error}"
                return Failure(reason)
            headers = {name.lower(): value for name, value in answer.getheaders()}
            if answer.will_close:
                connection.close()
            return Response(answer.status, headers, body)
        return Failure("the connection closed twice")  # not reached: the fresh attempt returns

    def close(self) -> None:
        with self._lock:
            for connection in list(self._all):
                connection.close()
            self._all.clear()
