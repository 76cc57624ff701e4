"""What the converting APIs (/v1/responses, /v1/messages) share: their server-sent events, which name each
event (`event: <type>` then `data: {...}`), and the error an exception raised midway in a stream becomes."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse

from ..errors import ContextLengthError, MinillamaError
from .params import ApiError

__all__ = ["event", "stream_error", "new_id"]

log = logging.getLogger("minillama.serve")


def event(name: str, data: Any) -> bytes:
    """One named server-sent event."""
    return (f"event: {name}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode("utf-8", "backslashreplace")
            + b"\n\n")


def stream_error(exc: BaseException) -> ApiError:
    """The error a stream reports for exc, raised once its 200 was sent: bad input is a 400, anything else a 500
    (logged here with its traceback, which the client never sees)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, MinillamaError):
        return ApiError(400, str(exc))
    log.error("stream failed", exc_info=exc)
    return ApiError(500, f"internal server error ({type(exc).__name__})", type="server_error")


def new_id(prefix: str) -> str:
    """A fresh id such as msg_0123abcd... (prefix, an underscore, 24 hex digits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


class EventStream(StreamingResponse):
    """A text/event-stream response that always closes its source, even when it never ran (client gone)."""

    def __init__(self, events: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()


async def first_of(items: AsyncIterator[Any]) -> Any:
    """The stream's first item (None when it is empty), taken before the 200 is sent so that an error the first
    step raises (a prompt too long for the context) is still a 4xx; the stream is closed if that raises."""
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await items.aclose()
        raise
