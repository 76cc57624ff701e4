"""Hermes 2 Pro / Qwen 2.5 / Qwen 3: each call is JSON between <tool_call> and </tool_call>, any text before."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .base import ToolCall, call_of, json_prefix, raw_value

MARKERS = ("<tool_call>",)
_CLOSE = re.compile(r"\s*</tool_call>")


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls), or None when a <tool_call> does not hold a whole call to a known function."""
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls, i = [], start
    while i < len(text):
        if not text.startswith("<tool_call>", i):
            return None
        got = json_prefix(text, i + len("<tool_call>"))
        call = call_of(got[0], tools) if got else None
        close = _CLOSE.match(text, got[1]) if got else None
        if got is None or call is None or close is None:
            return None
        call.arguments = raw_value(text, i, got[1], "arguments") or call.arguments
        calls.append(call)
        i = close.end()
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
    return text[:start], calls


def grammar(call: str, parallel: bool) -> str:
    """The Lark grammar of a reply that is only calls (call: one call's JSON schema as JSON text)."""
    more = ' ("\\n" call)*' if parallel else ""
    return f'start: call{more}\ncall: "<tool_call>\\n" %json{call} "\\n</tool_call>"\n'
