"""Mistral Nemo / Small: [TOOL_CALLS] then a JSON array of {"name", "arguments", "id"}."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .base import ToolCall, call_of, json_prefix

MARKERS = ("[TOOL_CALLS]",)


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls), or None when [TOOL_CALLS] is not followed by a whole array of calls to known functions."""
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    got = json_prefix(text, start + len("[TOOL_CALLS]"))
    if got is None or not isinstance(got[0], list) or not got[0] or text[got[1]:].strip():
        return None
    calls = [call_of(c, tools) for c in got[0]]
    if any(c is None for c in calls):
        return None
    return text[:start], [c for c in calls if c is not None]


def grammar(call: str, parallel: bool) -> str:
    """The Lark grammar of a reply that is only calls."""
    one = json.loads(call)
    items = {"type": "array", "items": one, "minItems": 1, "x-guidance": one.pop("x-guidance", {})}
    if not parallel:
        items["maxItems"] = 1
    return f'start: "[TOOL_CALLS]" %json{json.dumps(items)}\n'
