"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a thin converter onto the
chat path, as llama-server serves it: `system` and the messages' content blocks (text, tool_use, tool_result,
thinking) become chat messages, `tools` (input_schema) chat's tools, and the chat reply (or its chunks) becomes a
`message` with thinking, text and tool_use blocks (or Anthropic's events: message_start, content_block_start /
_delta / _stop, message_delta with the stop_reason and usage, message_stop). Errors come in Anthropic's shape,
{"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .params import CHAT, INT32_MAX, ApiError, Field
from .sse import event, new_id, stream_error

__all__ = ["FIELDS", "COUNT_FIELDS", "convert", "count_kwargs", "error_body", "Conversion"]

_PROMPT = {"messages": Field("array", "", required=True), "system": Field("string or array", ""),
           "tools": Field("array", ""), "tool_choice": Field("object", ""), "thinking": Field("object", ""),
           "model": Field("string", None)}
FIELDS: dict[str, Field] = {
    **_PROMPT, "max_tokens": Field("integer", "", required=True, lo=1, hi=INT32_MAX),
    "stop_sequences": Field("string or array of strings", ""), "temperature": CHAT["temperature"],
    "top_p": CHAT["top_p"], "top_k": CHAT["top_k"], "stream": Field("boolean", ""),
    "metadata": Field("object", None), "service_tier": Field("string", None)}
COUNT_FIELDS: dict[str, Field] = _PROMPT

#: HTTP status -> Anthropic's error type.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_body(exc: ApiError) -> dict[str, Any]:
    """exc as Anthropic's error object."""
    kind = ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def count_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """count_tokens' body as Llama.count_chat_tokens' keywords."""
    chat = _prompt(body)
    return {k: chat[k] for k in ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")
            if k in chat}


def convert(body: Mapping[str, Any]) -> Conversion:
    """The body (checked against FIELDS) as create_chat_completion's keywords, and the way back."""
    chat = _prompt(body)
    chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        stops = body["stop_sequences"]
        chat["stop"] = [stops] if isinstance(stops, str) else stops
    for name in ("temperature", "top_p", "top_k"):
        if name in body:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return Conversion(chat)


def _prompt(body: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords that make the prompt: messages (system first), tools, tool_choice, thinking."""
    chat: dict[str, Any] = {"messages": messages(body.get("system"), body["messages"])}
    tools = [_tool(t, i) for i, t in enumerate(body.get("tools") or ())]
    if tools:
        chat["tools"] = tools
        chat["parallel_tool_calls"] = True  # Anthropic's default: the model may ask for several tools at once
    if "tool_choice" in body:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled"):
            raise _bad(f"expected thinking.type to be 'enabled' or 'disabled', found {kind!r:.40}", "thinking")
        if kind == "disabled":
            chat["chat_template_kwargs"] = {"enable_thinking": False}
        else:  # llama-server's conversion: budget_tokens (10000 when left out) bounds the thinking
            budget = thinking.get("budget_tokens", 10000)
            if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget < 2**31:
                raise _bad(f"expected thinking.budget_tokens as an integer of 0 or more, found {budget!r:.40}",
                           "thinking")
            chat["reasoning_budget_tokens"] = budget
    return chat


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    texts = []
    for j, block in enumerate(system):
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            raise _bad(f"expected system[{j}] to be a text block {{\"type\": \"text\", \"text\": ...}}", "system")
        texts.append(block["text"])
    return "\n".join(texts)


def messages(system: Any, items: list[Any]) -> list[dict[str, Any]]:
    """Chat messages for Anthropic's: system first; each message's text blocks joined by newlines, an assistant's
    tool_use blocks as its tool_calls and thinking blocks as its reasoning_content, a user's tool_result blocks as
    tool messages (before the user's own text, which follows the results)."""
    out: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": _system(system)}]
    if not items:
        raise _bad("expected at least one message, found none", "messages")
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise _bad(f"expected {where}.role to be 'user' or 'assistant', found {role!r:.40}", "messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"expected {where}.content to be a string or an array of content blocks", "messages")
        texts, calls, results, thinking = [], [], [], ""
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "thinking" and role == "assistant":
                thinking += str(block.get("thinking", ""))
            elif kind == "redacted_thinking" and role == "assistant":
                continue
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                    raise _bad(f"expected {at} (a tool_use block) to have a string 'id' and 'name'", "messages")
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"],
                                           "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise _bad(f"expected {at}.tool_use_id (a tool_result's) to be a string", "messages")
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                "content": _result_text(block.get("content"), at)})
            else:
                raise _bad(f"expected {at} to be a block of type 'text', 'tool_use' or 'thinking' (assistant), or "
                           f"'tool_result' (user) (this model takes text only), found type {kind!r:.60}", "messages")
        out += results
        if texts or calls or thinking or not results:
            msg: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = thinking
            out.append(msg)
    return out


def _result_text(content: Any, at: str) -> str:
    """A tool_result's content (a string or text blocks) as one text."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for k, block in enumerate(content if isinstance(content, list) else [None]):
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            raise _bad(f"expected {at}.content[{k}] to be a text block (this model takes text only)", "messages")
        texts.append(block["text"])
    return "\n".join(texts)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    """An Anthropic tool ({name, description, input_schema}) as chat's function tool."""
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise _bad(f"expected tools[{i}] to be a custom tool {{name, description, input_schema}} (Anthropic's "
                   f"server tools do not run here), found type {kind!r:.40}", "tools")
    if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
        raise _bad(f"expected tools[{i}] to have a string 'name' and an object 'input_schema'", "tools")
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any]) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as chat's (auto, any: required, tool: that function, none) and parallel_tool_calls
    (None: not said)."""
    kind = choice.get("type")
    parallel = None if "disable_parallel_tool_use" not in choice else not choice["disable_parallel_tool_use"]
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _bad(f"expected tool_choice.type to be 'auto', 'any', 'tool' (with a 'name') or 'none', found "
               f"{json.dumps(choice)[:60]}", "tool_choice")


def _stop(finish: str | None, run: Any) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for the chat's finish_reason."""
    gen = getattr(run, "generation", None)
    matched = getattr(gen, "stop_string", "") if gen is not None else ""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    return ("stop_sequence", matched) if matched else ("end_turn", None)


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """chat's usage as Anthropic's: input_tokens are those the cache did not hold (cache_read_input_tokens)."""
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


@dataclass
class Conversion:
    """One request's chat keywords (chat) and its reply converted back (reply(), or events() for a stream)."""

    chat: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("msg"))

    def reply(self, result: Mapping[str, Any], run: Any) -> dict[str, Any]:
        """The chat.completion as a message: thinking, text and tool_use blocks, in that order."""
        choice = result["choices"][0]
        msg = choice["message"]
        content: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or ():
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": _input(call["function"]["arguments"])})
        stop_reason, stop_sequence = _stop(choice["finish_reason"], run)
        return {"id": self.id, "type": "message", "role": "assistant", "model": result["model"], "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": _usage(result["usage"])}

    async def events(self, first: Any, chunks: AsyncIterator[Any], run: Any) -> AsyncIterator[bytes]:
        """The chat chunks as Anthropic's events; an error midway is an `error` event in Anthropic's shape."""
        gen = getattr(run, "generation", None)
        prompt = len(gen.prompt_ids) if gen is not None else 0
        model = first.get("model", "") if isinstance(first, dict) else ""
        yield event("message_start", {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 0}}})
        blocks = _Blocks()
        finish, usage = None, None
        try:
            items = [] if first is None else [first]
            async for chunk in _chain(items, chunks):
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    for out in blocks.delta(choice.get("delta") or {}):
                        yield out
                    finish = choice.get("finish_reason") or finish
        except Exception as exc:  # noqa: BLE001 - the 200 is sent: the error goes in the stream
            yield event("error", error_body(stream_error(exc)))
            return
        for out in blocks.close():
            yield out
        stop_reason, stop_sequence = _stop(finish, run)
        final = _usage(usage) if usage else {"output_tokens": 0}
        yield event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                      "usage": final})
        yield event("message_stop", {"type": "message_stop"})


async def _chain(items: list[Any], rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item
    async for item in rest:
        yield item


def _input(arguments: str) -> Any:
    """A call's arguments (JSON text) as tool_use's input object ({} for text that is not a JSON object, as
    llama-server gives it)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Blocks:
    """The content blocks of one streamed message: the open one receives deltas; a new kind closes it."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                 "content_block": block}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def delta(self, delta: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if delta.get("reasoning_content"):
            if self.kind != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            if self.kind != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            if call.get("id"):
                out += self._start("tool_use", {"type": "tool_use", "id": call["id"], "name": function.get("name", ""),
                                                "input": {}})
            if function.get("arguments") and self.kind == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return out

    def close(self) -> list[bytes]:
        """The open block's stop (a thinking block's signature_delta first)."""
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.kind = None
        return out
