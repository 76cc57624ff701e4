"""A constraint switched on when a call starts (llama.cpp's lazy grammars): under tool_choice "auto" the reply is
free text until a family's trigger ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>") appears, then the rest must be
a call whose arguments follow the function's schema."""

from __future__ import annotations

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
            rest = text[i + len(trigger):]
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


def triggers(family: str, call_json: str, parallel: bool) -> dict[str, Any]:
    """trigger -> the Lark grammar of what follows it, for a family (none for the others)."""
    ws = "/[ \\n]{0,2}/"  # a blank or two around the JSON, never a run of them
    if family == "hermes":
        more = f' ({ws} "<tool_call>" {ws} %json{call_json} {ws} "</tool_call>")*' if parallel else ""
        return {"<tool_call>": f'start: {ws} %json{call_json} {ws} "</tool_call>"{more}\n'}
    if family == "llama3":
        return {"<|python_tag|>": f"start: %json{call_json}\n"}
    if family == "mistral":
        from .mistral import grammar

        return {"[TOOL_CALLS]": grammar(call_json, parallel).replace('start: "[TOOL_CALLS]" ', "start: ")}
    return {}
