"""OpenAI's Responses API (`POST /v1/responses`) as a thin converter onto the chat path, stateless as llama-server
serves it: the body's `instructions` and `input` items become chat messages, its flat function tools chat's
tools, and the chat reply (or its chunks) becomes a `response` object with `reasoning`, `message` and
`function_call` output items (or Responses' streaming events, response.created ... response.completed).

What a stateless server cannot honour (previous_response_id, store: true, background, conversation) and what a
text-only model cannot take (image, file and audio parts, hosted tools) is a 400 naming the field.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .params import CHAT, INT32_MAX, ApiError, Field
from .sse import event, new_id, stream_error

__all__ = ["FIELDS", "convert", "Conversion"]

FIELDS: dict[str, Field] = {
    "input": Field("string or array", "", required=True), "instructions": Field("string", ""),
    "tools": Field("array", ""), "tool_choice": Field("string or object", ""),
    "parallel_tool_calls": Field("boolean", ""), "max_output_tokens": Field("integer", "", lo=1, hi=INT32_MAX),
    "temperature": CHAT["temperature"], "top_p": CHAT["top_p"], "stream": Field("boolean", ""),
    "text": Field("object", ""), "reasoning": Field("object", ""), "include": Field("array", ""),
    "store": Field("boolean", ""), "truncation": Field("string", ""),
    # refused with their reason (a stateless server)
    "previous_response_id": Field("string", ""), "background": Field("boolean", ""),
    "conversation": Field("string or object", ""),
    # accepted, not used: one model is served; the prompt cache is automatic
    "model": Field("string", None), "user": Field("string", None), "metadata": Field("object", None),
    "prompt_cache_key": Field("string", None), "safety_identifier": Field("string", None),
}

#: include values the server honours ("reasoning.encrypted_content": the reasoning item's field, always "").
INCLUDE = frozenset({"reasoning.encrypted_content"})


def _bad(message: str, param: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def convert(body: Mapping[str, Any]) -> Conversion:
    """The body (its fields checked against FIELDS) as create_chat_completion's keywords, and the way back."""
    stateless = "this server is stateless: it keeps no responses, so send the whole conversation as 'input'"
    if body.get("previous_response_id") is not None:
        raise _bad(f"'previous_response_id' is not supported: {stateless}", "previous_response_id", "unsupported")
    if body.get("conversation") is not None:
        raise _bad(f"'conversation' is not supported: {stateless}", "conversation", "unsupported")
    if body.get("store"):
        raise _bad(f"expected 'store' to be false or absent, found true: {stateless}", "store", "unsupported")
    if body.get("background"):
        raise _bad("expected 'background' to be false or absent, found true: responses are answered while the "
                   "request waits (or streamed)", "background", "unsupported")
    if body.get("truncation", "disabled") != "disabled":
        raise _bad(f"expected 'truncation' to be 'disabled', found {body['truncation']!r:.40}: a prompt longer than "
                   "the context is refused, never cut", "truncation")
    unknown = [i for i in body.get("include", ()) if i not in INCLUDE]
    if unknown:
        raise _bad(f"expected 'include' to hold only {', '.join(sorted(INCLUDE))}, found {unknown[0]!r:.60}",
                   "include", "unsupported")
    chat: dict[str, Any] = {"messages": messages(body.get("instructions"), body["input"]),
                            "parallel_tool_calls": body.get("parallel_tool_calls", True)}
    tools = [_tool(t, i) for i, t in enumerate(body.get("tools") or ())]
    if tools:
        chat["tools"] = tools
    if "tool_choice" in body:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    for name, kwarg in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if name in body:
            chat[kwarg] = body[name]
    if "text" in body:
        fmt = _text_format(body["text"])
        if fmt is not None:
            chat["response_format"] = fmt
    effort = _reasoning(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort  # a template variable (gpt-oss reads it)
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return Conversion(chat, body)


def messages(instructions: str | None, items: str | list[Any]) -> list[dict[str, Any]]:
    """Chat messages for the Responses input: instructions as the system message, then a string as the user's
    message, or each input item: messages (their text parts joined), function_call items as the assistant's
    tool_calls, function_call_output items as tool messages, reasoning items as the assistant's
    reasoning_content; consecutive assistant items make one message, as llama.cpp's server merges them."""
    out: list[dict[str, Any]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"expected {where} to be an input item (an object), found {type(item).__name__}", "input")
        kind = item.get("type", "message")
        last = out[-1] if out and out[-1]["role"] == "assistant" else None
        if kind == "message":
            role = item.get("role")
            text = _text(item.get("content"), where, role)
            if role == "assistant":
                if last is None:
                    out.append({"role": "assistant", "content": text})
                else:
                    last["content"] = (last.get("content") or "") + text
            elif role in ("user", "system", "developer"):
                out.append({"role": "system" if role == "developer" else role, "content": text})
            else:
                raise _bad(f"expected {where}.role to be 'user', 'system', 'developer' or 'assistant', found "
                           f"{role!r:.40}", "input")
        elif kind == "function_call":
            name, args, call_id = (item.get(k) for k in ("name", "arguments", "call_id"))
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise _bad(f"expected {where} (a function_call) to have string 'name', 'arguments' and 'call_id'",
                           "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if last is None:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(f"expected {where}.call_id (a function_call_output's) to be a string", "input")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": output if isinstance(output, str) else _text(output, f"{where}.output", "user")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            if last is None:
                out.append({"role": "assistant", "content": "", "reasoning_content": text})
            else:
                last["reasoning_content"] = text
        else:
            raise _bad(f"expected {where}.type to be 'message', 'function_call', 'function_call_output' or "
                       f"'reasoning', found {kind!r:.40}", "input", "unsupported")
    if not out:
        raise _bad("expected at least one input item, found none", "input")
    return out


#: content part types read as text: the user's and the assistant's.
_TEXT_PARTS = {"input_text": "text", "output_text": "text"}


def _text(content: Any, where: str, role: Any) -> str:
    """A message's content as one text: a string, or its text parts joined by newlines (as chat's parts are)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"expected {where}.content to be a string or an array of content parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and role == "assistant":
            texts.append(str(part.get("refusal", "")))
            continue
        if kind not in _TEXT_PARTS:
            raise _bad(f"expected {where}.content[{j}] to be a part of type 'input_text' or 'output_text' (this "
                       f"model takes text only), found type {kind!r:.60}", "input", "unsupported")
        if not isinstance(part.get("text"), str):
            raise _bad(f"expected {where}.content[{j}].text to be a string", "input")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    """A Responses function tool ({type, name, description, parameters, strict}) as chat's."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise _bad(f"expected tools[{i}] to be a tool of type 'function' (hosted tools such as web search do not "
                   f"run here), found type {kind!r:.40}", "tools", "unsupported")
    if not isinstance(tool.get("name"), str):
        raise _bad(f"expected tools[{i}].name to be a string", "tools")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    """Responses' tool_choice as chat's: the same words, or {"type": "function", "name"} nested as chat nests it."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(f"expected 'tool_choice' to be 'auto', 'none', 'required' or {{\"type\": \"function\", \"name\": "
               f"...}}, found {json.dumps(choice)[:60]}", "tool_choice")


def _text_format(text: Any) -> dict[str, Any] | None:
    """text.format as chat's response_format (None for plain text)."""
    if set(text) - {"format", "verbosity"}:  # verbosity: a hint for OpenAI's models, not a setting here
        raise _bad(f"expected 'text' to hold only 'format' and 'verbosity', found "
                   f"{sorted(set(text) - {'format', 'verbosity'})[0]!r:.40}", "text")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    raise _bad(f"expected text.format.type to be 'text', 'json_object' or 'json_schema', found {kind!r:.40}", "text")


def _reasoning(reasoning: Any) -> str | None:
    """reasoning.effort (for the template; a summary is not written: the reasoning item holds the whole text)."""
    if reasoning is None:
        return None
    if set(reasoning) - {"effort", "summary"}:
        raise _bad(f"expected 'reasoning' to hold only 'effort' and 'summary', found "
                   f"{sorted(set(reasoning) - {'effort', 'summary'})[0]!r:.40}", "reasoning")
    return reasoning.get("effort")


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """chat's usage as Responses' (input_tokens_details.cached_tokens: the prompt's tokens the cache held)."""
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": "", "status": status}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [] if text is None else [_text_part(text)]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


@dataclass
class Conversion:
    """One request's chat keywords (chat) and its reply converted back (reply(), or events() for a stream)."""

    chat: dict[str, Any]
    body: Mapping[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 model: str) -> dict[str, Any]:
        """The response object, the request's settings echoed as OpenAI echoes them."""
        b = self.body
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
                "model": model, "output": output, "parallel_tool_calls": self.chat["parallel_tool_calls"],
                "previous_response_id": None, "reasoning": {"effort": b.get("reasoning", {}).get("effort"),
                                                            "summary": None},
                "store": False, "temperature": b.get("temperature"), "text": b.get("text", {"format": {"type": "text"}}),
                "tool_choice": b.get("tool_choice", "auto"),
                "tools": [{**t, "strict": t.get("strict")} for t in b.get("tools") or ()],
                "top_p": b.get("top_p"), "truncation": "disabled", "usage": usage, "metadata": b.get("metadata") or {},
                "user": b.get("user")}

    def reply(self, result: Mapping[str, Any], run: Any) -> dict[str, Any]:
        """The chat.completion as a response: reasoning, message and function_call items, in that order."""
        choice = result["choices"][0]
        msg = choice["message"]
        output = []
        if msg.get("reasoning_content"):
            output.append(_reasoning_item(new_id("rs"), msg["reasoning_content"], "completed"))
        if msg.get("content"):
            output.append(_message_item(new_id("msg"), msg["content"], "completed"))
        for call in msg.get("tool_calls") or ():
            output.append(_call_item(new_id("fc"), call["id"], call["function"]["name"],
                                     call["function"]["arguments"], "completed"))
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        return self.response(status, output, _usage(result["usage"]), result["model"])

    async def events(self, first: Any, chunks: AsyncIterator[Any], run: Any) -> AsyncIterator[bytes]:
        """The chat chunks as Responses' streaming events: response.created and .in_progress, then each output item
        (output_item.added, its deltas, its .done events, output_item.done), then response.completed (or
        .incomplete); an error midway is an `error` event and response.failed."""
        stream = _EventWriter(self, first.get("model", "") if isinstance(first, dict) else "")
        for out in stream.start():
            yield out
        try:
            if first is not None:
                for out in stream.chunk(first):
                    yield out
            async for chunk in chunks:
                for out in stream.chunk(chunk):
                    yield out
        except Exception as exc:  # noqa: BLE001 - the 200 is sent: the error goes in the stream
            for out in stream.failed(stream_error(exc)):
                yield out
            return
        for out in stream.end():
            yield out


class _EventWriter:
    """The state of one streamed response: the output items so far and the one open (receiving deltas)."""

    def __init__(self, conv: Conversion, model: str) -> None:
        self.conv, self.model = conv, model
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item receiving deltas
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None

    def _event(self, kind: str, **data: Any) -> bytes:
        out = event(kind, {"type": kind, "sequence_number": self.seq, **data})
        self.seq += 1
        return out

    def start(self) -> list[bytes]:
        snapshot = self.conv.response("in_progress", [], None, self.model)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def chunk(self, chunk: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._delta("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._delta("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                if call.get("id"):
                    out += self._close()
                    out += self._open(_call_item(new_id("fc"), call["id"], function.get("name", ""), "",
                                                 "in_progress"))
                if function.get("arguments") and self.open is not None:
                    self.open["arguments"] += function["arguments"]
                    out.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                           output_index=len(self.output) - 1, delta=function["arguments"]))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def _delta(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != kind:
            out += self._close()
            if kind == "reasoning":
                out += self._open(_reasoning_item(new_id("rs"), "", "in_progress"))
                out.append(self._event("response.content_part.added", item_id=self.open["id"],
                                       output_index=len(self.output) - 1, content_index=0,
                                       part={"type": "reasoning_text", "text": ""}))
            else:
                out += self._open(_message_item(new_id("msg"), None, "in_progress"))
                self.open["content"].append(_text_part(""))
                out.append(self._event("response.content_part.added", item_id=self.open["id"],
                                       output_index=len(self.output) - 1, content_index=0, part=_text_part("")))
        item, index = self.open, len(self.output) - 1
        assert item is not None
        item["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self._event(name, item_id=item["id"], output_index=index, content_index=0, delta=text, **extra))
        return out

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        self.output.append(item)
        self.open = item
        return [self._event("response.output_item.added", output_index=len(self.output) - 1,
                            item=json.loads(json.dumps(item)))]

    def _close(self) -> list[bytes]:
        item, index = self.open, len(self.output) - 1
        if item is None:
            return []
        self.open = None
        item["status"] = "completed"
        out = []
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                out.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                       content_index=0, text=part["text"]))
            else:
                out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                       content_index=0, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def end(self) -> list[bytes]:
        out = self._close()
        status = "incomplete" if self.finish == "length" else "completed"
        out.append(self._event(f"response.{status}",
                               response=self.conv.response(status, self.output, self.usage, self.model)))
        return out

    def failed(self, exc: ApiError) -> list[bytes]:
        failed = self.conv.response("failed", self.output, self.usage, self.model)
        failed["error"] = {"code": exc.code or exc.type, "message": exc.message}
        return [self._event("error", code=exc.code or exc.type, message=exc.message, param=exc.param),
                self._event("response.failed", response=failed)]
