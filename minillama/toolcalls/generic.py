"""llama.cpp's generic format, for a template with no tool support of its own (SmolLM2's ChatML, say): the reply
is one JSON object, {"tool_calls": [{"name", "arguments", "id"?}]} (or {"tool_call": {...}} when calls are not
parallel) or {"response": "text"}, and the conversation is polyfilled -- the tools and that format described in
the system message, past calls and tool results written as text the template can take."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import ToolCall, call_of, json_prefix

MARKERS = ("{",)


def parse(text: str, tools: Mapping[str, Any]) -> tuple[str, list[ToolCall]] | None:
    """(content, calls): the reply's "response" or its calls; text that is not such an object is content."""
    got = json_prefix(text)
    if got is None or text[got[1]:].strip() or not isinstance(got[0], dict):
        return text, []
    obj = got[0]
    if set(obj) == {"response"} and isinstance(obj["response"], str):
        return obj["response"], []
    items = obj.get("tool_calls") if set(obj) == {"tool_calls"} else [obj.get("tool_call")] \
        if set(obj) == {"tool_call"} else None
    if not isinstance(items, list) or not items:
        return text, []
    calls = [call_of(c, tools) for c in items]
    if any(c is None for c in calls):
        return None
    return "", [c for c in calls if c is not None]


def schema(call: dict[str, Any], parallel: bool, required: bool) -> dict[str, Any]:
    """The JSON schema of the reply (call: one call's schema)."""
    calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
             "required": ["tool_calls"]} if parallel else \
        {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    if required:
        return calls
    return {"anyOf": [calls, {"type": "object", "properties": {"response": {"type": "string"}},
                              "required": ["response"]}]}


def system_text(tools: Sequence[Mapping[str, Any]], reply_schema: dict[str, Any]) -> str:
    """What the system message says: the tools, and the reply's JSON schema."""
    return ("You can call any of the following tools to satisfy the user's requests: "
            + json.dumps([t["function"] for t in tools], ensure_ascii=False, indent=2)
            + "\n\nRespond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
              "reply to the user's request, following this schema:\n"
            + json.dumps(reply_schema, ensure_ascii=False, indent=2))


def polyfill(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
             reply_schema: dict[str, Any]) -> list[dict[str, Any]]:
    """messages as a template without tool support can take them: the tools in the system message (added to the
    first one, or a new one), an assistant's calls as its JSON reply, a tool's result as a user message."""
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _object(c["function"].get("arguments")),
                      **({"id": c["id"]} if c.get("id") else {})} for c in m["tool_calls"]]
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)}
        elif m.get("role") == "tool":
            result = {"tool": m.get("name") or "", "content": m.get("content") or "",
                      **({"tool_call_id": m["tool_call_id"]} if m.get("tool_call_id") else {})}
            m = {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
        out.append(m)
    if tools:
        text = system_text(tools, reply_schema)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
