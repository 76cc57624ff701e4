"""DeepSeek R1: <｜tool▁calls▁begin｜> then per call
<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>, then <｜tool▁calls▁end｜>."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .base import ToolCall

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
MARKERS = (BEGIN,)
_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>(?:function)?<｜tool▁sep｜>([^\n]+)\n```json\n(.*?)\n```\s*<｜tool▁call▁end｜>",
                   re.S)


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls), or None when the calls block is not whole or names an unknown function."""
    start = text.find(BEGIN)
    if start < 0:
        return text, []
    calls, i = [], start + len(BEGIN)
    while (c := _CALL.match(text, i)) is not None:
        name, args = c.group(1).strip(), c.group(2).strip()
        try:
            ok = isinstance(json.loads(args), dict)
        except ValueError:
            ok = False
        if name not in tools or not ok:
            return None
        calls.append(ToolCall(name, args))
        i = c.end()
    rest = text[i:].strip()
    if not calls or rest not in ("", END):
        return None
    return text[:start], calls
