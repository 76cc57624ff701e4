"""Chat templates: a conversation rendered to prompt text as Hugging Face transformers' apply_chat_template does.

The template is the Jinja2 source a GGUF carries in `tokenizer.chat_template`. It runs in Jinja2's immutable
sandbox with transformers' settings (trim_blocks, lstrip_blocks, the loopcontrols extension, its `tojson`
filter without HTML escaping, the `raise_exception` and `strftime_now` globals, a plain `dict` and a
`namespace` that refuses underscore names) and sees what transformers passes: `messages` (plain dicts),
`tools`, `documents`, `add_generation_prompt`, the special token texts (`bos_token`, `eos_token`,
`unk_token`, `pad_token` when the vocab has them) and any further keyword arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

#: template variable -> the Tokenizer special id it names (transformers' special_tokens_map)
SPECIAL_TOKEN_VARS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unk", "pad_token": "pad"}


def piece_text(tok: Tokenizer, token_id: int | None) -> str:
    """A special token's text (its piece), '' when the vocab has no such token."""
    if token_id is None:
        return ""
    return tok.token_to_piece(token_id, special=True).decode("utf-8", "replace")


def _plain(value: Any) -> Any:
    """value rebuilt from plain JSON types (transformers' _plain_template_data): nothing else reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):  # numpy scalars: np.bool_(False) must stay falsy
        return _plain(value.item())
    return f"<{type(value).__name__}>"  # an inert placeholder: templates only test such values for presence


class ChatTemplate:
    """A Jinja2 chat template rendered exactly as transformers does (sandboxed, trim/lstrip blocks)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 special_tokens: Mapping[str, str] | None = None) -> None:
        import jinja2
        import jinja2.ext
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            """Let a template refuse a conversation (transformers' global of that name)."""
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
            """transformers' tojson filter: json.dumps without HTML escaping."""
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            """Today's date for templates that print it (transformers' global of that name)."""
            return datetime.now().strftime(fmt)

        class TemplateDict:
            """dict() for templates, without attribute access to the type."""

            def __call__(self, *args: Any, **kwargs: Any) -> dict:
                return dict(*args, **kwargs)

            def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
                return dict.fromkeys(*args, **kwargs)

        class TemplateNamespace(jinja2.utils.Namespace):
            """namespace() that refuses underscore-prefixed names (no reaching CPython internals)."""

            def __init__(*args: Any, **kwargs: Any) -> None:
                self, args = args[0], args[1:]
                attrs = dict(*args, **kwargs)
                for name in attrs:
                    TemplateNamespace._check(name)
                jinja2.utils.Namespace.__init__(self, attrs)

            def __setitem__(self, name: str, value: Any) -> None:
                TemplateNamespace._check(name)
                jinja2.utils.Namespace.__setitem__(self, name, value)

            @staticmethod
            def _check(name: Any) -> None:
                if isinstance(name, str) and name.startswith("_"):
                    raise jinja2.exceptions.SecurityError(f"chat templates cannot set the attribute {name!r}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        env.globals["dict"] = TemplateDict()
        env.globals["namespace"] = TemplateNamespace
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.special_tokens = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
        self._template = env.from_string(source)

    @classmethod
    def for_tokenizer(cls, source: str, tok: Tokenizer) -> ChatTemplate:
        """source with the tokenizer's special token texts (bos_token, eos_token, unk_token, pad_token)."""
        special = {var: piece_text(tok, tok.vocab.special.get(name)) for var, name in SPECIAL_TOKEN_VARS.items()
                   if tok.vocab.special.get(name) is not None}
        return cls(source, bos_token=special.get("bos_token", ""), eos_token=special.get("eos_token", ""),
                   special_tokens=special)

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> ChatTemplate | None:
        """The template in the tokenizer's metadata (`tokenizer.chat_template`), or None when it has none."""
        source = tok.vocab.metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            return None
        return cls.for_tokenizer(source, tok)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Any] | None = None, documents: Sequence[Any] | None = None, **kwargs: Any) -> str:
        """messages=[{role, content, ...}] as apply_chat_template(tokenize=False) renders them."""
        variables = {**self.special_tokens, **_plain(kwargs)}
        return self._template.render(messages=_plain(list(messages)), tools=_plain(tools),
                                     documents=_plain(documents), add_generation_prompt=add_generation_prompt,
                                     **variables)


def without_bos(text: str, bos_token: str, tok: Tokenizer) -> str:
    """Rendered text without a leading bos text when encoding adds bos itself (never two bos)."""
    if bos_token and tok.add_bos and text.startswith(bos_token):
        return text[len(bos_token):]
    return text
