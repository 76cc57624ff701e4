"""What `minillama serve` refuses before a route runs, and how long it waits on a client.

* Connections (protocol()): uvicorn's h11 protocol with two timers it lacks. The request line and headers must
  arrive within header_timeout seconds of the connection opening (or of a request's first byte on a kept-alive
  connection), else the connection is closed: a client that sends half a header and stops (slowloris) holds
  nothing for long. A reply the client does not take (the socket's buffers full) must make progress within
  write_timeout seconds, else the connection is aborted. Headers are at most MAX_HEADER_BYTES (h11's limit).
* Requests (Guard, an ASGI middleware): a Host header that is not one of the server's own names is refused
  with 403 (DNS rebinding: a page whose name resolves to 127.0.0.1 would otherwise be served), and so is an
  Origin header (browsers send one with every cross-site POST, a plain form's text/plain included) that is
  neither the server's own origin nor one of --cors-origins (blind CSRF: any page the user opens could make
  the server generate). The body must arrive within body_timeout seconds of the headers, else 408.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from .limits import DEFAULT_TIMEOUT
from .params import ApiError

__all__ = ["Guard", "protocol", "MAX_HEADER_BYTES", "LOCAL_HOSTS"]

#: The longest request line and headers (h11's own default).
MAX_HEADER_BYTES = 16 << 10
#: Names a Host header may always use (and any IP address: a DNS rebinding needs a name).
LOCAL_HOSTS = frozenset({"localhost"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def protocol(header_timeout: float, write_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol class with the header and write timers (give it as uvicorn.Config(http=...))."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _armed_for: Any = None  # the request cycle current when the header timer started
        _write_timer: asyncio.TimerHandle | None = None
        _write_backlog = 0

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm_headers()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_headers()  # the first bytes of a new request on a kept-alive connection
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not None and self.cycle is not self._armed_for:
                self._header_timer.cancel()  # its headers are complete: a request cycle began
                self._header_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._header_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._write_timer = None
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._arm_write()

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _arm_headers(self) -> None:
            self._armed_for = self.cycle
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _arm_write(self) -> None:
            self._write_backlog = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(write_timeout, self._write_stalled)

        def _write_stalled(self) -> None:
            self._write_timer = None
            if self.transport.is_closing():
                return
            if self.transport.get_write_buffer_size() < self._write_backlog:  # slow but reading: wait on
                self._arm_write()
            else:
                self.transport.abort()

    return GuardedH11


def _host_name(host: str) -> str:
    """The name in a Host header or an origin's netloc, without the port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guard:
    """ASGI middleware: 403 for a Host or Origin that is not allowed, CORS headers for --cors-origins, 408 for a
    body slower than body_timeout. allowed_hosts may hold "*" (any Host), cors_origins "*" (any Origin)."""

    def __init__(self, app: Any, *, bound_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
                 cors_origins: Iterable[str] = (), body_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.app = app
        self.hosts = set(LOCAL_HOSTS) | {_host_name(h) for h in allowed_hosts if h.strip()}
        if bound_host.lower() in WILDCARDS:  # every interface: the machine's own name too
            self.hosts.add(socket.gethostname().lower())
        else:
            self.hosts.add(_host_name(bound_host))
        self.origins = {o.strip().rstrip("/").lower() for o in cors_origins if o.strip()}
        self.body_timeout = body_timeout

    def host_allowed(self, host: str) -> bool:
        """Whether a Host header (name[:port]) names this server."""
        name = _host_name(host)
        return "*" in self.hosts or name in self.hosts or _is_address(name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if host and not self.host_allowed(host):
            await _refuse(send, f"expected a Host header naming this server (localhost, an IP address or one of "
                                f"--allowed-hosts), found {host!r}", "host_not_allowed")
            return
        origin = headers.get("origin")
        cross = None  # the origin to name in Access-Control-Allow-Origin
        if origin is not None and not self._same_origin(origin, host):
            if "*" not in self.origins and origin.rstrip("/").lower() not in self.origins:
                await _refuse(send, f"expected no Origin or this server's own ({'http://' + host if host else 'none'})"
                                    f" or one of --cors-origins, found {origin!r}", "origin_not_allowed")
                return
            cross = origin
        if cross is not None and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(send, cross, headers.get("access-control-request-headers"))
            return
        await self.app(scope, self._timed(receive), _with_cors(send, cross) if cross is not None else send)

    @staticmethod
    def _same_origin(origin: str, host: str) -> bool:
        parts = urlsplit(origin)
        return bool(host) and parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()

    def _timed(self, receive: Any) -> Any:
        """receive, the body's parts awaited until body_timeout after the headers (then ApiError 408)."""
        deadline = time.monotonic() + self.body_timeout
        complete = False

        async def timed() -> Any:
            nonlocal complete
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                raise ApiError(408, f"expected the whole request body within {self.body_timeout:g} s of its "
                                    "headers (--timeout), found it incomplete", code="request_timeout") from None
            if message.get("type") != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        return timed


async def _refuse(send: Any, message: str, code: str) -> None:
    """403 with OpenAI's error object."""
    body = json.dumps(ApiError(403, message, type="permission_error", code=code).body()).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _preflight(send: Any, origin: str, asked: str | None) -> None:
    """A CORS preflight's answer: the methods the API uses, the headers asked for (the API key's among them)."""
    extra = [*_cors_headers(origin), (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
             (b"access-control-allow-headers", (asked or "Authorization, Content-Type").encode("latin-1")),
             (b"access-control-max-age", b"600")]
    await send({"type": "http.response.start", "status": 204, "headers": extra})
    await send({"type": "http.response.body", "body": b""})


def _with_cors(send: Any, origin: str) -> Any:
    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", []), *_cors_headers(origin)])
        await send(message)

    return sending
