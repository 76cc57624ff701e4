"""minillama.constrain: JSON output enforced while sampling (OpenAI's response_format), through llguidance.

    from minillama.constrain import json_constraint
    c = json_constraint(tok, {"type": "json_schema", "json_schema": {"schema": {"type": "object", ...}}})
    generate(model, tok, prompt, 256, constraint=c)     # every pick is one the grammar allows

Before each token the grammar's matcher says which ids may come next (a bit per id); the sampler picks only
among them, and the matcher is told the id picked. Ids and their bytes are minillama's own (the tokenizer
bridge gives llguidance every token's exact piece, so the mask is computed on the bytes the decoder emits),
and the end-of-generation ids are the only way out once the value is complete. So a reply that ends by itself
(finish_reason "stop") always parses and validates against the schema; one cut by max_tokens or the context
("length") may be unfinished, as with OpenAI.

Why llguidance (what llama.cpp's --json-schema and server use, via LLGUIDANCE): compared with outlines-core and
xgrammar it needs no other package (xgrammar requires torch, transformers and triton; outlines-core compiles a
schema to a regular expression and a whole-vocabulary index ahead of time, so "any JSON", which is recursive, is
not expressible and each new schema costs an index build), computes each mask lazily from an Earley parser in
tens of microseconds, and covers most of JSON Schema (refs, anyOf, patterns, lengths, numeric bounds). It is the
optional extra ``json`` (``pip install ".[json]"``), imported only when a response_format asks for it.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ArgumentError, ArgumentTypeError, UnsupportedError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["JsonConstraint", "json_constraint", "schema_of", "gbnf_to_lark", "grammar_constraint"]

#: How the JSON is laid out: no free whitespace (a model cannot pad the reply with newlines until max_tokens),
#: OpenAI's and json.dumps' separators.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_lock = threading.Lock()
_bridges: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()


def _llguidance() -> Any:
    """The llguidance module, or a MinillamaError saying how to install it."""
    try:
        import llguidance
    except ImportError:
        raise UnsupportedError('response_format needs the optional extra "json" (llguidance): '
                               'pip install ".[json]" in a checkout of minillama') from None
    return llguidance


def schema_of(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a response_format asks for: {"type": "json_object"} any JSON object (an optional "schema"
    key, as llama-cpp-python takes), {"type": "json_schema", "json_schema": {"schema": {...}}} that schema,
    {"type": "text"} or None nothing (None). ArgumentError for anything else."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ArgumentError(f"expected response_format as a dict with a 'type', found {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema") or {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ArgumentError("expected response_format {'type': 'json_schema', 'json_schema': {'name': ..., "
                                f"'schema': {{...}}}}, found {response_format!r:.200}")
        schema = spec["schema"]
    else:
        raise ArgumentError(f"expected response_format type 'text', 'json_object' or 'json_schema', found {kind!r}")
    if not isinstance(schema, Mapping | bool):
        raise ArgumentError(f"expected a JSON schema (an object), found {type(schema).__name__}")
    return dict(schema) if isinstance(schema, Mapping) else {} if schema else {"not": {}}


class _Bridge:
    """The tokenizer as llguidance's TokenizerWrapper sees it: every id's exact bytes (control tokens marked
    with a leading 0xFF, as llguidance's llama.cpp bridge marks them, so grammars never produce them as text)
    and minillama's own encode."""

    def __init__(self, tok: Tokenizer) -> None:
        pieces, plain = tok.pieces.pieces, tok.pieces.pieces_plain
        self.tokens = [p if q or not p else b"\xff" + p for p, q in zip(pieces, plain, strict=True)]
        self.special_token_ids = [i for i, (p, q) in enumerate(zip(pieces, plain, strict=True)) if p and not q]
        self.eos_token_id = _eog_ids(tok)[0]
        self.bos_token_id = tok.bos_id
        self.is_tokenizer_wrapper = True
        self._tok = tok

    def __call__(self, text: bytes | str) -> list[int]:
        s = text.decode("utf-8", "surrogateescape") if isinstance(text, bytes) else text
        return self._tok.encode(s, add_special=False, parse_special=False)


def _eog_ids(tok: Tokenizer) -> list[int]:
    """The ids that end a generation (eos, eot, ... as tok.is_eog says), eos first."""
    ids = [i for i in (tok.eos_id, tok.eot_id) if i is not None]
    ids += [i for i in range(tok.n_vocab) if tok.is_eog(i) and i not in ids]
    if not ids:
        raise UnsupportedError("constrained output needs an end-of-generation token, and this vocab has none")
    return ids


def _ll_tokenizer(tok: Tokenizer) -> Any:
    """llguidance's tokenizer for tok, built once per Tokenizer (about a second for a 50k vocab)."""
    llg = _llguidance()
    with _lock:
        ll = _bridges.get(tok)
        if ll is None:
            ll = _bridges[tok] = llg.LLTokenizer(_Bridge(tok), n_vocab=tok.n_vocab, eos_token=_eog_ids(tok))
        return ll


class JsonConstraint:
    """One reply's grammar state: which ids may come next (allowed) and the picks so far (accept)."""

    def __init__(self, tok: Tokenizer, schema: Mapping[str, Any] | None, *, lark: str | None = None) -> None:
        """schema: the JSON schema the reply must follow; or lark: a Lark grammar (llguidance's, %json{...}
        embedding a schema), e.g. a tool call's syntax around its arguments."""
        llg = _llguidance()
        self.schema = dict(schema or {})
        try:
            grammar = llg.LLMatcher.grammar_from_lark(lark) if lark is not None else \
                llg.LLMatcher.grammar_from_json_schema(json.dumps(self.schema), overrides=JSON_OPTIONS)
        except (TypeError, ValueError) as e:
            raise ArgumentError(f"expected a JSON schema that is valid JSON, found an error: {e}") from None
        self._n_vocab = tok.n_vocab
        self._accepted = 0  # tokens consumed so far
        self._matcher = llg.LLMatcher(_ll_tokenizer(tok), grammar, log_level=0)
        self._check("expected a JSON schema that llguidance can enforce, found one it rejects")

    def _check(self, what: str) -> None:
        if self._matcher.is_error():
            raise ArgumentError(f"{what}: {_first_line(self._matcher.get_error())}")

    def allowed(self) -> np.ndarray:
        """A bool per vocab id: the ids that keep the output a prefix of valid JSON (eog ids once it is complete)."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), np.uint8)
        self._check(f"the JSON grammar failed after {self._accepted} tokens")
        return np.unpackbits(bits, bitorder="little")[:self._n_vocab].astype(bool)

    def accept(self, token: int) -> None:
        """Advance the grammar past token (the sampler only picks allowed ids, so this always fits)."""
        if not self._matcher.consume_token(int(token)):
            # the sampler found no allowed id with a score above -inf (logit_bias false / -inf on all of them, or
            # the model's own scores) and fell back to eog, which the unfinished value does not allow
            raise ArgumentError(f"response_format's JSON schema allows none of the tokens that logit_bias and the "
                                f"model's scores leave, after {self._accepted} generated tokens: expected a "
                                "logit_bias that bans fewer tokens")
        self._accepted += 1

    @property
    def done(self) -> bool:
        """True when the output so far is a whole value that the schema accepts."""
        return bool(self._matcher.is_accepting())


def _first_line(error: str) -> str:
    """llguidance's error without its multi-line parser dump: the first line, at most 200 characters."""
    line = error.strip().split("\n", 1)[0]
    return line if len(line) <= 200 else line[:197] + "..."


def json_constraint(tok: Tokenizer, response_format: Mapping[str, Any] | None) -> JsonConstraint | None:
    """The constraint response_format asks for, or None when it asks for plain text."""
    schema = schema_of(response_format)
    return None if schema is None else JsonConstraint(tok, schema)


def gbnf_to_lark(grammar: str) -> str:
    """A GBNF grammar (llama.cpp's format, root ::= ...) or a Lark grammar as llguidance's Lark text, or an
    ArgumentError naming the problem (the grammar checked as llguidance compiles it)."""
    if not isinstance(grammar, str):
        raise ArgumentTypeError(f"expected a grammar as GBNF text, found {type(grammar).__name__}")
    _llguidance()
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(grammar)
    except Exception as e:  # noqa: BLE001 - the converter raises its own errors (and asserts) on bad text
        raise ArgumentError(f"expected a GBNF grammar (llama.cpp's format), found one that does not parse: "
                            f"{_first_line(str(e) or type(e).__name__)}") from None
    ok, error = _validate(lark)
    if not ok:
        raise ArgumentError(f"expected a grammar llguidance can enforce, found an error: {_first_line(error)}")
    return lark


def _validate(lark: str) -> tuple[bool, str]:
    """(True, "") when llguidance compiles the Lark grammar, else (False, its error)."""
    llg = _llguidance()
    try:
        error = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(lark))
    except (TypeError, ValueError) as e:
        return False, str(e)
    return (not error), error or ""


def grammar_constraint(tok: Tokenizer, grammar: str) -> JsonConstraint:
    """The constraint of a GBNF (or Lark) grammar: each reply a sentence of it."""
    return JsonConstraint(tok, None, lark=gbnf_to_lark(grammar))
