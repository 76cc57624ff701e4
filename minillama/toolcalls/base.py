"""What every tool-call format shares: a parsed call, a parsed reply, and the helpers the formats use."""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

_ID_CHARS = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A fresh tool-call id: 32 random letters and digits, as llama.cpp's server makes them."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(32))


@dataclass
class ToolCall:
    """One call: the function's name, its arguments as JSON text (as the model wrote them, or as OpenAI's API
    carries them), and the id the model gave (else one is made when the reply is built)."""

    name: str
    arguments: str
    id: str | None = None

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's tool_calls entry (with "index" for a streamed delta)."""
        out: dict[str, Any] = {"id": self.id or new_call_id(), "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass
class Parsed:
    """A reply split as llama.cpp splits it: the text for the user, the thinking, the calls."""

    content: str
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def json_prefix(text: str, start: int = 0) -> tuple[Any, int] | None:
    """The JSON value that starts at text[start] (after blanks) and where it ends, or None when none parses."""
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        value, end = json.JSONDecoder().raw_decode(text, i)
    except ValueError:
        return None
    return value, end


def call_of(obj: Any, names: Collection[str], args_key: str = "arguments") -> ToolCall | None:
    """{"name": ..., args_key: {...}} (the arguments an object or its JSON text) as a call to one of names (the
    tools' names; a call to any other name is no call)."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(args_key, {})
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
    elif not isinstance(args, dict):
        return None
    else:
        args = json.dumps(args, ensure_ascii=False)
    ident = obj.get("id")
    return ToolCall(obj["name"], args, ident if isinstance(ident, str) and ident else None)


def held_back(text: str, markers: Collection[str]) -> int:
    """How much of text can be streamed as content now: up to the first marker, or to a tail that may be the
    start of one (held until the next text says which)."""
    cut = len(text)
    for m in markers:
        i = text.find(m)
        if i >= 0:
            cut = min(cut, i)
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                cut = min(cut, len(text) - k)
                break
    return cut


def raw_value(text: str, start: int, end: int, key: str) -> str | None:
    """The JSON text of key's value inside the object at text[start:end], as the model wrote it (llama.cpp keeps
    the model's spacing in the arguments)."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:\s*', text[start:end])
    if not m:
        return None
    got = json_prefix(text, start + m.end())
    return text[start + m.end():got[1]].strip() if got and got[1] <= end else None


def schema_json(schema: dict[str, Any]) -> str:
    """schema as the JSON text a Lark grammar embeds, laid out as constrain.JSON_OPTIONS says."""
    from ..constrain import JSON_OPTIONS

    return json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)
