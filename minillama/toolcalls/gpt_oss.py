"""gpt-oss (OpenAI's Harmony format): the reply is messages on channels, <|channel|>analysis<|message|>... (the
thinking), <|channel|>final<|message|>... (the answer) and <|channel|>commentary to=functions.NAME
<|constrain|>json<|message|>{...} (a call), later ones each after <|start|>assistant, each ended by <|end|> (or
<|call|>, or the end of the reply)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .base import Parsed, ToolCall

MARKERS = ("<|channel|>", "<|start|>")
_MSG = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>(analysis|commentary|final)"
                  r"(?:\s+to=functions\.([^\s<]+))?\s*(?:<\|constrain\|>\s*\w+)?<\|message\|>(.*?)"
                  r"(?:<\|end\|>|<\|call\|>|(?=<\|start\|>)|\Z)", re.S)


_FINAL = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>final<\|message\|>")


def unsplit(text: str) -> str:
    """The reply with reasoning_format "none", as llama.cpp gives it: the final channel's header taken out, the
    rest (thinking included) as written."""
    return _FINAL.sub("", text)


def parse_reply(text: str, tools: Mapping[str, Any]) -> Parsed | None:
    """The reply's thinking (analysis), answer (final) and calls (commentary to=functions.NAME), or None when it
    is not a sequence of Harmony messages (or a call names an unknown function or its arguments are not JSON)."""
    i, thinking, content, calls = 0, [], [], []
    while i < len(text):
        m = _MSG.match(text, i)
        if m is None:
            return None
        channel, to, body = m.groups()
        if to is not None:
            try:
                json.loads(body)
            except ValueError:
                return None
            if to not in tools:
                return None
            calls.append(ToolCall(to, body.strip()))
        elif channel == "analysis":
            thinking.append(body)
        else:
            content.append(body)
        i = m.end()
    return Parsed("".join(content), "".join(thinking), calls)
