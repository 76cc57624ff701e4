"""Qwen3-Coder: XML calls, <tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>;
a value is text for a string parameter, else JSON when it parses (llama.cpp converts by the tool's schema)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .base import ToolCall

MARKERS = ("<tool_call>", "<function=")
_CALL = re.compile(r"\s*(?:<tool_call>\s*)?<function=([^>\n]+)>(.*?)</function>\s*(?:</tool_call>)?", re.S)
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _value(text: str, schema: Any) -> Any:
    if isinstance(schema, dict) and schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls), or None when a call is not whole or names an unknown function."""
    m = re.search(r"<tool_call>|<function=", text)
    if m is None:
        return text, []
    calls, i = [], m.start()
    while i < len(text):
        c = _CALL.match(text, i)
        if c is None or c.group(1) not in tools:
            return None
        props = (tools[c.group(1)] or {}).get("properties") or {}
        args, j, body = {}, 0, c.group(2)
        while (p := _PARAM.match(body, j)) is not None:
            args[p.group(1)] = _value(p.group(2), props.get(p.group(1)))
            j = p.end()
        if body[j:].strip():
            return None
        calls.append(ToolCall(c.group(1), json.dumps(args, ensure_ascii=False, separators=(",", ":"))))
        i = c.end()
        if not text[i:].strip():
            break
    return text[:m.start()], calls
