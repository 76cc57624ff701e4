"""The request bodies the server accepts: one table per endpoint, field -> (JSON type, the API's keyword).

A field that is not in its endpoint's table, or whose value has the wrong JSON type, is refused with an
ApiError (HTTP 400, OpenAI's error object naming the field as `param`) before any work starts; values are
checked by the API itself (minillama.api), whose ArgumentError becomes a 400 too. A field mapped to None
is accepted and not passed on (OpenAI's `model` and `user`). `null` means "the default" for every optional
field, as OpenAI's API takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ApiError", "Field", "COMPLETION", "CHAT", "EMBEDDING", "TOKENIZE", "DETOKENIZE", "api_kwargs"]


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
    """A message's content: text, or a list of {"type": "text", "text": ...} parts."""
    return isinstance(v, str) or (isinstance(v, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v))


def _messages(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and _content(m.get("content"))
        and set(m) <= {"role", "content", "name"} for m in v)


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
    "object of token id -> number": lambda v: isinstance(v, dict) and all(
        k.lstrip("-").isdigit() and _number(b) for k, b in v.items()),
    "1": lambda v: v == 1,
}


@dataclass(frozen=True)
class Field:
    """One accepted field: its JSON type (a TYPES key), the API keyword it becomes (None: not passed on)."""

    type: str
    kwarg: str | None
    required: bool = False


def _f(type: str, kwarg: str | None = "", required: bool = False) -> Field:
    return Field(type, kwarg, required)


# The controls both generation endpoints pass to the API under the same name.
_CONTROLS = {name: _f(t) for name, t in {
    "max_tokens": "integer", "temperature": "number", "top_p": "number", "top_k": "integer", "min_p": "number",
    "stop": "string or array of strings", "seed": "integer", "repeat_penalty": "number", "repeat_last_n": "integer",
    "presence_penalty": "number", "frequency_penalty": "number", "logit_bias": "object of token id -> number",
    "response_format": "object", "stream": "boolean"}.items()}
# OpenAI fields accepted and not passed on: the model name (one model is served), the end user's id, n and
# best_of when 1 (one choice per request).
_OPENAI = {"model": _f("string", None), "user": _f("string", None), "n": _f("1", None),
           "stream_options": _f("object")}

COMPLETION: dict[str, Field] = {"prompt": _f("string, array of strings or array of token ids", required=True),
                                **_CONTROLS, **_OPENAI, "best_of": _f("1", None), "logprobs": _f("integer"),
                                "echo": _f("boolean")}
CHAT: dict[str, Field] = {"messages": _f("array of messages {role, content}", required=True), **_CONTROLS,
                          **_OPENAI, "max_completion_tokens": _f("integer", "max_tokens"),
                          "logprobs": _f("boolean"), "top_logprobs": _f("integer")}
EMBEDDING: dict[str, Field] = {"input": _f("string or array of strings", required=True), "model": _f("string", None),
                               "user": _f("string", None), "encoding_format": _f("string", None)}
# llama.cpp's /tokenize and /detokenize; `vocab` (ours) picks a --vocab file by name for the playground.
TOKENIZE: dict[str, Field] = {"content": _f("string", required=True), "add_special": _f("boolean"),
                              "parse_special": _f("boolean"), "with_pieces": _f("boolean"), "vocab": _f("string")}
DETOKENIZE: dict[str, Field] = {"tokens": _f("array of token ids", required=True), "vocab": _f("string")}


def api_kwargs(body: Any, fields: Mapping[str, Field]) -> dict[str, Any]:
    """body's fields as keyword arguments (renamed as the table says; nulls and kwarg-None fields dropped).

    ApiError (400) for a body that is not an object, a missing required field, an unknown field or a value of
    the wrong type, naming the field."""
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
        if spec.kwarg is not None:
            out[spec.kwarg or name] = value
    return out


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
    """v as JSON, cut to 40 characters."""
    import json

    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
