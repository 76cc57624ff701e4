"""A constraint switched on when a call starts (llama.cpp's lazy grammars): under tool_choice "auto" the reply is
free text until a family's trigger ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", DeepSeek R1's
"<｜tool▁calls▁begin｜>", a bare Llama 3 '{"name"') appears, then the rest must be a call whose arguments follow
the function's schema (Qwen3-Coder's XML parameters: each value JSON of its property's schema, strings as text)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..constrain import JsonConstraint
from ..errors import ArgumentError

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer


class LazyConstraint:
    """Free picks until one of triggers (trigger -> the Lark grammar of what follows it) is in the reply; then
    that grammar, fed the reply's text after the trigger so far. A grammar the text already breaks leaves the
    reply free (it is then returned as content)."""

    lazy = True  # a reasoning budget neither applies nor feeds it while the model thinks

    def __init__(self, tok: Tokenizer, triggers: Mapping[str, str]) -> None:
        """triggers: trigger -> grammar of what follows it (of the trigger and what follows, for INCLUSIVE ones)."""
        self.tok, self.triggers = tok, dict(triggers)
        self.text = b""
        self.inner: JsonConstraint | None = None
        self.given_up = False

    def allowed(self) -> np.ndarray | None:
        """None (no constraint) until a trigger, then the grammar's mask."""
        return None if self.inner is None else self.inner.allowed()

    def accept(self, token: int) -> None:
        """Follow the reply; start the grammar at a trigger."""
        if self.inner is not None:
            self.inner.accept(token)
            return
        if self.given_up:
            return
        self.text += self.tok.token_to_piece(token, special=True)
        text = self.text.decode("utf-8", "replace")
        for trigger, lark in self.triggers.items():
            i = text.find(trigger)
            if i < 0:
                continue
            rest = text[i:] if trigger in INCLUSIVE else text[i + len(trigger):]
            try:
                inner = JsonConstraint(self.tok, None, lark=lark)
                for t in self.tok.encode(rest, add_special=False, parse_special=True) if rest else []:
                    inner.accept(t)
            except ArgumentError:
                self.given_up = True
                return
            self.inner = inner
            return

    @property
    def done(self) -> bool:
        return self.inner is not None and self.inner.done


#: Triggers that are the start of the call itself: the grammar covers them too (a bare Llama 3 call's '{"name"').
INCLUSIVE = frozenset({'{"name"'})


def _lit(text: str) -> str:
    """text as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _schema_json(schema: Any) -> str:
    from .base import schema_json

    return schema_json(dict(schema or {"type": "object"}))


def _deepseek_r1(names: Mapping[str, Any], parallel: bool) -> str:
    """What follows <｜tool▁calls▁begin｜>: calls (one unless parallel), each a function's name and its arguments
    as a ```json block following its schema, then <｜tool▁calls▁end｜>."""
    from .deepseek_r1 import END

    rules = [f'c{i}: {_lit("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + n + chr(10) + "```json" + chr(10))} '
             f'%json{_schema_json(p)} {_lit(chr(10) + "```<｜tool▁call▁end｜>")}' for i, (n, p) in enumerate(names.items())]
    call = " | ".join(f"c{i}" for i in range(len(rules)))
    more = " (WS call)*" if parallel else ""
    return f'start: WS call{more} WS {_lit(END)}\ncall: {call}\n' + "\n".join(rules) + '\nWS: /[ \\n]{0,2}/\n'


def _qwen3_coder(names: Mapping[str, Any], parallel: bool) -> str:
    """What follows <tool_call>: <function=NAME> with <parameter=KEY> blocks (string values as text without "</",
    others JSON of the property's schema), </function> and </tool_call>."""
    lines = []
    for i, (name, params) in enumerate(names.items()):
        props = (params or {}).get("properties") or {}
        alts = []
        for j, (key, schema) in enumerate(props.items()):
            head = _lit(f"<parameter={key}>\n")
            if isinstance(schema, Mapping) and schema.get("type") == "string":
                lines.append(f"p{i}_{j}: {head} /(?:[^<]|<[^\\/])*<\\/parameter>\\n?/")
            else:
                lines.append(f"p{i}_{j}: {head} %json{_schema_json(schema)} {_lit(chr(10) + '</parameter>' + chr(10))}")
            alts.append(f"p{i}_{j}")
        body = f"({' | '.join(alts)})*" if alts else '""'
        lines.append(f"f{i}: {_lit(f'<function={name}>' + chr(10))} {body} {_lit('</function>')} WS {_lit('</tool_call>')}")
    fn = " | ".join(f"f{i}" for i in range(len(names)))
    more = f' (WS {_lit("<tool_call>")} WS fn)*' if parallel else ""
    return f"start: WS fn{more}\nfn: {fn}\n" + "\n".join(lines) + "\nWS: /[ \\n]{0,2}/\n"


def triggers(family: str, call_json: str, parallel: bool, names: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """trigger -> the Lark grammar of what follows it, for a family (none for the others); names: function name ->
    its parameters' schema (the families whose calls are not one JSON object need them)."""
    ws = "/[ \\n]{0,2}/"  # a blank or two around the JSON, never a run of them
    if family == "hermes":
        more = f' ({ws} "<tool_call>" {ws} %json{call_json} {ws} "</tool_call>")*' if parallel else ""
        return {"<tool_call>": f'start: {ws} %json{call_json} {ws} "</tool_call>"{more}\n'}
    if family == "llama3":
        more = f' (";" {ws} %json{call_json})*' if parallel else ""
        return {"<|python_tag|>": f"start: %json{call_json}{more}\n", '{"name"': f"start: %json{call_json}{more}\n"}
    if family == "deepseek_r1" and names:
        from .deepseek_r1 import BEGIN

        return {BEGIN: _deepseek_r1(names, parallel)}
    if family == "qwen3_coder" and names:
        return {"<tool_call>": _qwen3_coder(names, parallel)}
    if family == "mistral":
        from .mistral import grammar

        return {"[TOOL_CALLS]": grammar(call_json, parallel).replace('start: "[TOOL_CALLS]" ', "start: ")}
    return {}
