"""The request bodies the server accepts: one table per endpoint, field -> (JSON type, range, the API's keyword).

A body nested deeper than MAX_DEPTH levels, or holding a lone surrogate ("\\ud800", not Unicode text: llama.cpp's
JSON parser refuses it too) in any string, is refused first; then a field that is not in its endpoint's table,
whose value has the wrong JSON type, or a number outside its range (every number must be finite: 1e400 parses
as infinity and is refused) is refused with an ApiError (HTTP 400, OpenAI's error object naming the field as
`param`) before any work starts; the rest is checked by the API itself (minillama.api), whose ArgumentError
becomes a 400 too. A field mapped to None is accepted and not passed on (OpenAI's `model` and `user`). `null`
means "the default" for every optional field, as OpenAI's API takes it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api import MAX_LOGPROBS, MAX_TOP_LOGPROBS
from ..request import huge_int_text

__all__ = ["ApiError", "Field", "COMPLETION", "CHAT", "EMBEDDING", "TOKENIZE", "DETOKENIZE", "MAX_DEPTH",
           "api_kwargs", "check_body"]

#: Deepest nesting of arrays and objects a request body may have (a JSON schema in response_format included).
MAX_DEPTH = 64
#: The largest finite 32-bit float: llama.cpp keeps the sampling controls as floats.
FLT_MAX = 3.4028234663852886e38
INT32_MAX, UINT64_MAX = 2**31 - 1, 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_TOKEN_ID = re.compile("-?[0-9]+")


class ApiError(Exception):
    """An error answered with OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """The JSON body of the response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(_int(i) for i in v)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


def _content(v: Any) -> bool:
    """A message's content: text, or a list of parts ({"type": "text", "text": ...}; the API refuses other
    types by name, e.g. image_url: the model takes text only)."""
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(p, dict) for p in v))


def _message(m: Any) -> bool:
    """One message: {role, content} (and name); an assistant's may hold tool_calls (its content then null or
    absent), a tool result's its tool_call_id."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return False
    calls = m.get("tool_calls")
    if calls is not None and not (m["role"] == "assistant" and isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
            and isinstance(c["function"].get("arguments", "{}"), str | dict) for c in calls)):
        return False
    content = m.get("content")
    return (_content(content) or (content is None and bool(calls))) and set(m) <= {
        "role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}


def _messages(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_message(m) for m in v)


#: JSON type name (as said in the error message) -> the check.
TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": _int,
    "number": _number,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "string or array of strings": lambda v: isinstance(v, str) or _strings(v),
    "string, array of strings or array of token ids": lambda v: isinstance(v, str) or _strings(v) or _ids(v),
    "array of token ids": _ids,
    "array of messages {role, content}": _messages,
    "array": lambda v: isinstance(v, list),
    "string or object": lambda v: isinstance(v, str | dict),
    "string or array": lambda v: isinstance(v, str | list),
    "array or object": lambda v: isinstance(v, list | dict),
    "array of strings": _strings,
    "string, array of strings or array of token ids or arrays": lambda v: isinstance(v, str) or _strings(v) or _ids(v)
    or (isinstance(v, list) and bool(v) and all(_ids(x) for x in v)),
    "object of token id -> number or false": lambda v: isinstance(v, dict) and all(
        _TOKEN_ID.fullmatch(k) and (_number(b) or b is False) for k, b in v.items()),
    "1": lambda v: _int(v) and v == 1,
}


@dataclass(frozen=True)
class Field:
    """One accepted field: its JSON type (a TYPES key), the API keyword it becomes (None: not passed on) and,
    for a number (or logit_bias' values), its range: lo (excluded when lo_open) to hi."""

    type: str
    kwarg: str | None
    required: bool = False
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def in_range(self, v: float) -> bool:
        """v within the range (False for NaN and the infinities)."""
        if self.lo is None or self.hi is None:
            return True
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi

    def range_text(self) -> str:
        """The range in words, e.g. "from 0 to 1" or "greater than 0 and at most 3.4e+38"."""
        lo, hi = _bound(self.lo), _bound(self.hi)
        return f"greater than {lo} and at most {hi}" if self.lo_open else f"from {lo} to {hi}"


def _f(type: str, kwarg: str | None = "", required: bool = False, lo: float | None = None,
       hi: float | None = None, lo_open: bool = False) -> Field:
    return Field(type, kwarg, required, lo, hi, lo_open)


def _bound(x: float | None) -> str:
    return "3.4e+38" if x == FLT_MAX else "-3.4e+38" if x == -FLT_MAX else f"{x:,}" if _int(x) else f"{x:g}"


# The controls both generation endpoints pass to the API under the same name, with their ranges: the API's own
# (minillama.request.SamplingParams, which the API builds with the Request it runs), llama.cpp's types (32-bit
# floats and ints), the seed's 64 bits.
_CONTROLS = {
    "max_tokens": _f("integer", lo=-1, hi=INT32_MAX), "temperature": _f("number", lo=0, hi=FLT_MAX),
    "top_p": _f("number", lo=0, hi=1, lo_open=True), "top_k": _f("integer", lo=0, hi=INT32_MAX),
    "min_p": _f("number", lo=0, hi=1), "stop": _f("string or array of strings"),
    "seed": _f("integer", lo=-1, hi=UINT64_MAX), "repeat_penalty": _f("number", lo=0, hi=FLT_MAX, lo_open=True),
    "repeat_last_n": _f("integer", lo=-1, hi=INT32_MAX),
    "presence_penalty": _f("number", lo=-FLT_MAX, hi=FLT_MAX), "frequency_penalty": _f("number", lo=-FLT_MAX,
                                                                                          hi=FLT_MAX),
    "logit_bias": _f("object of token id -> number or false", lo=-FLT_MAX, hi=FLT_MAX),
    "response_format": _f("object"), "stream": _f("boolean")}
# OpenAI fields accepted and not passed on: the model name (one model is served), the end user's id, n and
# best_of when 1 (one choice per request).
_OPENAI = {"model": _f("string", None), "user": _f("string", None), "n": _f("1", None),
           "stream_options": _f("object")}

COMPLETION: dict[str, Field] = {"prompt": _f("string, array of strings or array of token ids", required=True),
                                **_CONTROLS, **_OPENAI, "best_of": _f("1", None),
                                "logprobs": _f("integer", lo=0, hi=MAX_LOGPROBS), "echo": _f("boolean")}
CHAT: dict[str, Field] = {"messages": _f("array of messages {role, content}", required=True), **_CONTROLS,
                          **_OPENAI, "max_completion_tokens": _f("integer", "max_tokens", lo=-1, hi=INT32_MAX),
                          "logprobs": _f("boolean"), "top_logprobs": _f("integer", lo=0, hi=MAX_TOP_LOGPROBS),
                          "tools": _f("array"), "tool_choice": _f("string or object"),
                          "parallel_tool_calls": _f("boolean"), "reasoning_format": _f("string"),
                          "chat_template_kwargs": _f("object"), "reasoning_effort": _f("string"),
                          "reasoning_budget_tokens": _f("integer", lo=-1, hi=INT32_MAX),
                          "thinking_budget_tokens": _f("integer", "reasoning_budget_tokens", lo=-1, hi=INT32_MAX),
                          "reasoning_budget_message": _f("string")}
EMBEDDING: dict[str, Field] = {"input": _f("string, array of strings or array of token ids or arrays", required=True),
                               "model": _f("string", None), "user": _f("string", None),
                               "encoding_format": _f("string")}
# llama.cpp's /tokenize and /detokenize; `vocab` (ours) picks a --vocab file by name for the playground.
TOKENIZE: dict[str, Field] = {"content": _f("string", required=True), "add_special": _f("boolean"),
                              "parse_special": _f("boolean"), "with_pieces": _f("boolean"), "vocab": _f("string")}
DETOKENIZE: dict[str, Field] = {"tokens": _f("array of token ids", required=True), "vocab": _f("string")}


def encoding_base64(fmt: str) -> bool:
    """embeddings' encoding_format: True for "base64", False for "float"; ApiError for anything else."""
    if fmt not in ("float", "base64"):
        raise ApiError(400, f"expected 'encoding_format' to be \"float\" or \"base64\", found {_short(fmt)}",
                       param="encoding_format", code="invalid_value")
    return fmt == "base64"


def vector_base64(item: Mapping[str, Any], base64: bool) -> dict[str, Any]:
    """An embedding's vector as OpenAI sends it with encoding_format "base64" (float32, little-endian, base64), or
    nothing to change."""
    if not base64:
        return {}
    import base64 as b64
    import struct

    vector = item["embedding"]
    return {"embedding": b64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")}


def check_body(body: Any) -> None:
    """ApiError (400) naming the field for a body nested deeper than MAX_DEPTH or holding a lone surrogate (in a
    value or a key). Iterative: a body parsed just under Python's recursion limit is walked without recursing."""
    stack: list[tuple[Any, int, str]] = [(body, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= MAX_DEPTH:
            raise _too_deep(where)
        if isinstance(value, dict):
            for k, v in value.items():
                path = f"{where}.{k}" if where else k
                _check_text(k, path)  # a field's name: named by its own (escaped) path
                stack.append((v, depth + 1, path))
        else:
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))


def _too_deep(where: str) -> ApiError:
    what = f"'{_top(where)}'" if where else "the request body"
    return ApiError(400, f"expected JSON nested at most {MAX_DEPTH} levels deep, found {what} nested deeper",
                    param=_top(where) or None, code="too_deep")


def too_deep_body() -> ApiError:
    """The error for a body too deep for the JSON parser itself (Python's recursion limit, ~1,000 levels)."""
    return _too_deep("")


def _check_text(s: str, where: str) -> None:
    m = _SURROGATE.search(s)
    if m is not None:
        name = json.dumps(where)[1:-1]  # the path itself may hold the surrogate: escaped
        raise ApiError(400, f"expected text in '{name}' to be Unicode, found a lone surrogate "
                       f"U+{ord(m.group()):04X} (not a character; JSON's \\u escapes must pair up)",
                       param=json.dumps(_top(where))[1:-1] or None, code="invalid_unicode")


def _top(where: str) -> str:
    """The top-level field of a path such as messages[0].content."""
    return re.split(r"[.\[]", where, maxsplit=1)[0]


def api_kwargs(body: Any, fields: Mapping[str, Field]) -> dict[str, Any]:
    """body's fields as keyword arguments (renamed as the table says; nulls and kwarg-None fields dropped).

    ApiError (400) for a body that is not an object, nested too deep or holding a lone surrogate, a missing
    required field, an unknown field, a value of the wrong type or a number out of its range, naming the field."""
    check_body(body)
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object as the request body, found {_json_type(body)}")
    for name, spec in fields.items():
        if spec.required and body.get(name) is None:
            raise ApiError(400, f"expected the field '{name}' ({spec.type}), found none", param=name,
                           code="missing_field")
    out: dict[str, Any] = {}
    for name, value in body.items():
        spec = fields.get(name)
        if spec is None:
            known = ", ".join(sorted(fields))
            raise ApiError(400, f"unknown field '{name}': this endpoint takes {known}", param=name,
                           code="unknown_field")
        if value is None:
            continue
        if not TYPES[spec.type](value):
            raise ApiError(400, f"expected '{name}' to be {_article(spec.type)}, found {_json_type(value)} "
                           f"{_short(value)}", param=name, code="invalid_type")
        value = _in_range(name, spec, value)
        if spec.kwarg is not None:
            out[spec.kwarg or name] = value
    return out


def _in_range(name: str, spec: Field, value: Any) -> Any:
    """value, checked against spec's range (logit_bias: each bias, false becoming -inf, llama.cpp's ban)."""
    if spec.lo is None:
        return value
    if isinstance(value, dict):
        for k, b in value.items():
            if b is not False and not spec.in_range(b):
                raise ApiError(400, f"expected each '{name}' value to be false (bans the token) or a number "
                               f"{spec.range_text()}, found {_short(b)} for token {k}", param=name,
                               code="out_of_range")
        return {k: -math.inf if b is False else b for k, b in value.items()}
    if not spec.in_range(value):
        raise ApiError(400, f"expected '{name}' to be {_article(spec.type)} {spec.range_text()}, found "
                       f"{_short(value)}", param=name, code="out_of_range")
    return value


def _article(type: str) -> str:
    if type == "1":
        return "1 (one choice per request)"
    return ("an " if type[0] in "aeiou" else "a ") + type


def _json_type(v: Any) -> str:
    """The JSON name of v's type."""
    for t, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
                    (dict, "object")):
        if isinstance(v, t):
            return name
    return "null"


def _short(v: Any) -> str:
    """v as JSON (non-ASCII escaped), cut to 40 characters; a huge integer by its size."""
    huge = huge_int_text(v)
    if huge is not None:
        return huge
    try:
        text = json.dumps(v, ensure_ascii=True)
    except (ValueError, RecursionError):
        text = f"({_json_type(v)})"
    return text if len(text) <= 40 else text[:37] + "..."
