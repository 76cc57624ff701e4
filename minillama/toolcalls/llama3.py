"""Llama 3.1 / 3.2 / 3.3: a call is {"name": ..., "parameters": {...}} after any text, optionally after
<|python_tag|>."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .base import ToolCall, call_of, json_prefix, raw_value

MARKERS = ("<|python_tag|>", '{"name"')
_START = re.compile(r'<\|python_tag\|>|\{\s*"name"')


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls), or None when what starts like a call is not a whole call to a known function."""
    m = _START.search(text)
    if m is None:
        return text, []
    content, i, calls = text[:m.start()], m.start(), []
    if text.startswith("<|python_tag|>", i):
        i += len("<|python_tag|>")
    while True:
        got = json_prefix(text, i)
        call = call_of(got[0], tools, "parameters") if got else None
        if got is None or call is None:
            return None
        call.arguments = raw_value(text, i, got[1], "parameters") or call.arguments
        calls.append(call)
        i = got[1]
        rest = text[i:].lstrip(" \t\r\n;")
        if not rest:
            return content, calls
        i = len(text) - len(rest)


def grammar(call: str, parallel: bool) -> str:
    """The Lark grammar of a reply that is only calls (call: one call's schema, "parameters" for the arguments)."""
    more = ' (";" call)*' if parallel else ""
    return f"start: call{more}\ncall: %json{call}\n"
