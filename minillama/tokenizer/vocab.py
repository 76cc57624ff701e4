"""Vocab: tokens, scores, attributes, merges and special ids, with llama.cpp's load-time rules applied.

Loaders turn a file into GGUF-style metadata (a dict keyed by gguf.Keys.Tokenizer names);
`Vocab.from_metadata` then does what llama_vocab::impl::load does with it: defaults per model
type, the pre-tokenizer's flags, special ids, end-of-generation ids found by token text, the
special-token cache and per-model token attributes. Nothing here knows about merging.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntFlag
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FormatError, MissingPreTokenizerWarning, UnsupportedError
from ..gguffile.constants import Keys, TokenType
from ..gguffile.reader import JoinedStrings
from .tables import (
    ALWAYS_RENDERED,
    EOG_TEXTS,
    FORCED_PRE,
    GGML_MODEL_KINDS,
    KEY_LOWERCASE,
    KEY_STRIP_ACCENTS,
    SPECIAL_BY_TEXT,
    SPECIAL_ID_KEYS,
    SPECIAL_NAMES,
    PreSpec,
    pre_spec,
)

if TYPE_CHECKING:
    from types import ModuleType

    from .encoders.ugm_charsmap import Charsmap

K = Keys.Tokenizer


@dataclass(frozen=True)
class VocabArrays:
    """A vocab as flat machine arrays, for a compiled backend to read once at load (Vocab.arrays())."""

    token_bytes: bytes          # every token's text as UTF-8 (surrogate escapes as their raw bytes), one blob
    token_offsets: np.ndarray   # int64, n_vocab + 1: token i is token_bytes[offsets[i]:offsets[i + 1]]
    scores: np.ndarray          # float32, one per token
    attr_list: Sequence[int] = field(repr=False)          # the vocab's attrs, for `attrs`
    merge_strings: Sequence[str] = field(repr=False)      # the vocab's merges, for `merges`
    token_to_id: Mapping[str, int] = field(repr=False)

    @functools.cached_property
    def attrs(self) -> np.ndarray:
        """int32 Attr bits, one per token (made on first use: no backend reads them at load)."""
        return np.asarray(self.attr_list, np.int32)

    @functools.cached_property
    def merges(self) -> np.ndarray:
        """int32 (n_merges, 3): left id, right id, id of left+right; -1 where that is no token. Merges are split
        as llama.cpp splits them, at the first space after position 0. Resolved on first use (~0.5 s for
        llama3's 280k merges): the native core resolves them itself, in C (merges.c)."""
        get = self.token_to_id.get
        cuts = [(m, m.find(" ", 1)) for m in self.merge_strings]
        parts = [(m[:k], m[k + 1:]) if k > 0 else ("", "") for m, k in cuts]  # "" is never a token
        flat = [i for a, b in parts for i in (get(a, -1), get(b, -1), get(a + b, -1) if a else -1)]
        return np.array(flat, np.int32).reshape(len(parts), 3)


def _token_utf8(t: str) -> bytes:
    """A token's text as bytes: surrogate escapes are the raw bytes they stand for, other lone surrogates
    (a hostile tokenizer.json) their generalized UTF-8."""
    try:
        return t.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return t.encode("utf-8", "surrogatepass")


class Attr(IntFlag):
    """llama.cpp's llama_token_attr bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


TYPE_TO_ATTR = {TokenType.UNKNOWN: Attr.UNKNOWN, TokenType.UNUSED: Attr.UNUSED, TokenType.NORMAL: Attr.NORMAL,
                TokenType.CONTROL: Attr.CONTROL, TokenType.USER_DEFINED: Attr.USER_DEFINED,
                TokenType.BYTE: Attr.BYTE}

@dataclass
class Vocab:
    """Everything a tokenizer model needs from a file, with llama.cpp's defaults resolved."""

    kind: str                        # the tokenizer: 'spm', 'bpe', 'wpm', 'ugm'
    tokens: list[str]                # token texts (invalid UTF-8 kept as surrogate escapes)
    scores: np.ndarray               # float32, one per token (zeros when the file has none)
    attrs: list[int]                 # Attr bits per token
    # int32 Attr bits the token types alone give, before the special-token-by-text pass (Unigram builds
    # its tables from these, as llama.cpp does); None means attrs' NORMAL for every token
    type_attrs: np.ndarray | None = field(default=None, repr=False)
    merges: Sequence[str] = field(default_factory=list)  # a JoinedStrings when read from GGUF
    pre: str = ""
    pre_spec: PreSpec | None = None
    special: dict[str, int | None] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    remove_extra_whitespaces: bool = False
    clean_spaces: bool = False
    escape_whitespaces: bool = True
    ignore_merges: bool = False
    lowercase: bool = True           # WordPiece: BertNormalizer's lowercase
    strip_accents: bool = True       # WordPiece: BertNormalizer's strip_accents
    charsmap: Charsmap | None = field(default=None, repr=False)  # Unigram: the precompiled charsmap, parsed
    eog_ids: frozenset[int] = frozenset()
    special_cache: list[int] = field(default_factory=list)  # control/user-defined/unknown ids, longest first
    token_to_id: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def __getstate__(self) -> dict[str, Any]:
        """The fields alone: tables derived at run time (attributes starting with '_') are rebuilt, not pickled;
        so is the parsed charsmap when the metadata (pickled anyway) holds its blob."""
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        if self.charsmap is not None and K.PRECOMPILED_CHARSMAP in self.metadata:
            del state["charsmap"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "charsmap" not in state:
            self.charsmap = _read_charsmap(self.metadata)

    def arrays(self, core: ModuleType | None = None) -> VocabArrays:
        """The vocab as flat arrays (VocabArrays), built on first use and kept: the tables a compiled backend
        copies once (merges resolved only when asked for: VocabArrays.merges). core: the native module, which
        writes the token bytes in one pass (else, or for tokens with surrogates, they are encoded here)."""
        got = self.__dict__.get("_arrays")
        if got is None:
            blob = core.utf8_blob(self.tokens) if core is not None else None
            if blob is not None:
                data, offsets = blob[0], np.frombuffer(blob[1], np.int64)
            else:
                try:
                    blobs = list(map(str.encode, self.tokens))  # plain UTF-8, the common case (2x faster)
                except UnicodeEncodeError:
                    blobs = [_token_utf8(t) for t in self.tokens]
                data, offsets = b"".join(blobs), np.zeros(len(blobs) + 1, np.int64)
                np.cumsum(np.fromiter(map(len, blobs), np.int64, len(blobs)), out=offsets[1:])
            got = VocabArrays(data, offsets, np.ascontiguousarray(self.scores, np.float32), self.attrs, self.merges,
                              self.token_to_id)
            self.__dict__["_arrays"] = got
        return got

    @classmethod
    def from_metadata(cls, md: dict[str, Any], source: str = "<memory>") -> Vocab:
        """Apply llama.cpp's vocab loading rules to GGUF-style tokenizer metadata.

        Odd but valid vocabs load the way llama.cpp loads them: empty tokens are renamed [EMPTY_<id>],
        missing scores are zeros, token types outside the known ones are undefined, special ids outside
        the vocab are ignored, longer score/type arrays are cut to the token count, merges naming
        tokens that do not exist never apply. What llama.cpp refuses (or asserts on) fails here with
        FormatError naming the key: duplicate tokens, score/type arrays shorter than the token list,
        values of the wrong type, add_bos/add_eos/add_sep set without the token id, a Unigram
        precompiled charsmap that is not one, a WordPiece normalizer option that is not a bool.
        """
        if not isinstance(md, dict):
            raise FormatError(f"tokenizer metadata is {type(md).__name__}, expected a dict", path=source)
        kind, defaults = _kind(md, source)
        special: dict[str, int | None] = dict.fromkeys(SPECIAL_NAMES)
        special.update(defaults)
        pre = FORCED_PRE.get(md[K.MODEL], _read_pre(md, source))
        flags, spec = _kind_flags(kind, pre, special, source)
        flags["add_space_prefix"] = read_flag(md, K.ADD_PREFIX, flags["add_space_prefix"], source)
        flags["remove_extra_whitespaces"] = read_flag(md, K.REMOVE_EXTRA_WS, False, source)
        tokens, token_to_id = _read_tokens(md, source)
        n = len(tokens)
        scores = _numeric(md, K.SCORES, n, source, np.float32)
        type_attrs = _type_attrs(md, n, source)
        merges = _read_merges(md, kind, source)
        _read_special_ids(md, special, n)
        _read_add_flags(md, flags, spec, special, source)
        attrs = type_attrs.tolist()
        eog, touched = _find_special_by_text(special, tokens, token_to_id, attrs, type_attrs)
        vocab = cls(kind=kind, tokens=tokens, scores=scores if scores is not None else np.zeros(n, np.float32),
                    attrs=attrs, type_attrs=type_attrs, merges=merges, pre=pre if kind == "bpe" else "default",
                    pre_spec=spec, special=special, eog_ids=frozenset(eog), token_to_id=token_to_id, metadata=md,
                    **flags)
        mask = int(Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)  # special: by type, or as set just above
        candidates = sorted({*np.flatnonzero(type_attrs & mask).tolist(), *touched})
        vocab.special_cache = sorted([i for i in candidates if attrs[i] & mask],
                                     key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
        _per_model_attrs(vocab, md)
        if kind == "wpm":  # BertNormalizer options as llama.cpp loads them: strip_accents defaults to lowercase
            vocab.lowercase = read_flag(md, KEY_LOWERCASE, True)
            vocab.strip_accents = read_flag(md, KEY_STRIP_ACCENTS, vocab.lowercase)
        elif kind == "ugm":
            vocab.charsmap = _read_charsmap(md)
        return vocab


def _kind(md: dict[str, Any], source: str) -> tuple[str, dict[str, int | None]]:
    """The tokenizer kind tokenizer.ggml.model names, and its default special ids."""
    model_key = md.get(K.MODEL)
    if not isinstance(model_key, str):
        raise FormatError(f"missing or non-string {K.MODEL}, expected e.g. 'llama' or 'gpt2'", path=source,
                          key=K.MODEL)
    if model_key not in GGML_MODEL_KINDS:
        raise UnsupportedError(f"{source}: tokenizer model {K.MODEL} = {model_key!r} is not supported; "
                               f"expected one of {', '.join(GGML_MODEL_KINDS)}")
    return GGML_MODEL_KINDS[model_key]


def _read_pre(md: dict[str, Any], source: str) -> str:
    pre = md.get(K.PRE, "")
    if pre is None:
        pre = ""
    if not isinstance(pre, str):  # llama.cpp reads the key as a string for every model type
        raise FormatError(f"{K.PRE} is {type(pre).__name__}, expected a string", path=source, key=K.PRE)
    return pre


def _kind_flags(kind: str, pre: str, special: dict[str, int | None],
                source: str) -> tuple[dict[str, bool], PreSpec | None]:
    """The flags' defaults for a kind (a BPE vocab's from its pre-tokenizer, which may also drop bos)."""
    flags = {"add_bos": kind in ("spm", "wpm"), "add_eos": kind == "ugm", "add_sep": kind == "wpm",
             "add_space_prefix": kind != "wpm", "escape_whitespaces": True, "clean_spaces": kind == "wpm",
             "ignore_merges": False}
    if kind != "bpe":
        return flags, None
    if not pre:
        warnings.warn(f"{source}: a BPE vocab without {K.PRE}: llama.cpp falls back to the 'default' "
                      "pre-tokenizer, which splits most byte-level BPE vocabs differently from the "
                      "model's own tokenizer (convert it with a llama.cpp that knows its pre-tokenizer)",
                      MissingPreTokenizerWarning, stacklevel=4)
    spec = pre_spec(pre)
    flags.update(add_space_prefix=False, escape_whitespaces=spec.escape_whitespaces, clean_spaces=spec.clean_spaces,
                 ignore_merges=spec.ignore_merges, add_sep=spec.add_sep)
    if spec.add_bos is not None:
        flags["add_bos"] = spec.add_bos
    if spec.no_bos:
        special["bos"] = None
    return flags, spec


def _all_str(items: list[Any]) -> bool:
    """Whether every item is exactly a str (no subclass), checked in C (a generator costs 3x more at load)."""
    return set(map(type, items)) <= {str}


def _read_tokens(md: dict[str, Any], source: str) -> tuple[list[str], dict[str, int]]:
    """The token texts (empty ones named after their id) and text -> id; duplicates are a FormatError."""
    tokens = md.get(K.LIST)
    if not isinstance(tokens, list) or not _all_str(tokens):
        found = "missing" if tokens is None else f"a {type(tokens).__name__}" if not isinstance(tokens, list) \
            else "an array holding " + next(type(t).__name__ for t in tokens if type(t) is not str)
        raise FormatError(f"{K.LIST} is {found}, expected an array of strings", path=source, key=K.LIST)
    n = len(tokens)
    if n == 0:
        raise FormatError("the vocab has no tokens", path=source, key=K.LIST)
    token_to_id = dict(zip(tokens, range(n)))
    if "" in token_to_id:  # llama.cpp names empty tokens after their id
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        token_to_id = dict(zip(tokens, range(n)))
    if len(token_to_id) != n:
        seen: dict[str, int] = {}
        for i, t in enumerate(tokens):
            j = seen.setdefault(t, i)
            if j != i:
                raise FormatError(f"duplicate token in vocabulary: {t!r} has ids {j} and {i}", path=source,
                                  key=K.LIST)
    return tokens, token_to_id


def _type_attrs(md: dict[str, Any], n: int, source: str) -> np.ndarray:
    """The Attr bits the token types give (NORMAL without types; types outside the known ones UNDEFINED)."""
    types = _numeric(md, K.TOKEN_TYPE, n, source, np.int32)
    if types is None:
        return np.full(n, int(Attr.NORMAL), np.int32)
    table = np.zeros(8, np.int32)  # type -> attr; out-of-range types are UNDEFINED (0)
    for t, a in TYPE_TO_ATTR.items():
        table[int(t)] = int(a)
    return np.where((types >= 0) & (types < 8), table[np.clip(types, 0, 7)], 0).astype(np.int32)


def _read_merges(md: dict[str, Any], kind: str, source: str) -> Sequence[str]:
    merges = md.get(K.MERGES, [])
    if isinstance(merges, JoinedStrings):  # strings by construction (GGUF's reader): not split here
        return merges
    if kind == "bpe" and K.MERGES not in md:
        raise FormatError(f"BPE vocab without {K.MERGES}", path=source, key=K.MERGES)
    if not isinstance(merges, list) or not _all_str(merges):
        raise FormatError(f"{K.MERGES} is {type(merges).__name__}, expected an array of strings", path=source,
                          key=K.MERGES)
    return merges


def _read_special_ids(md: dict[str, Any], special: dict[str, int | None], n: int) -> None:
    """The file's special ids over the defaults; ids outside the vocab (defaults or not) are ignored."""
    for name in special:
        if special[name] is not None and not 0 <= special[name] < n:  # type: ignore[operator]
            special[name] = None
    for name, key in SPECIAL_ID_KEYS:
        v = md.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
            special[name] = v


def _read_add_flags(md: dict[str, Any], flags: dict[str, bool], spec: PreSpec | None,
                    special: dict[str, int | None], source: str) -> None:
    """add_bos/add_eos/add_sep from the file; one set without its token id is a FormatError."""
    for flag, key in (("add_bos", K.ADD_BOS), ("add_eos", K.ADD_EOS), ("add_sep", K.ADD_SEP)):
        flags[flag] = read_flag(md, key, flags[flag], source)
    if spec is not None and spec.newline_tokens and not flags["add_bos"]:
        flags["add_bos"] = True  # llama.cpp's Gemma 4 workaround
    for flag, name, key in (("add_bos", "bos", K.ADD_BOS), ("add_eos", "eos", K.ADD_EOS),
                            ("add_sep", "sep", K.ADD_SEP)):
        if flags[flag] and special[name] is None:
            raise FormatError(f"{key} is true but the vocab has no {name} token id", path=source, key=key)


def _read_charsmap(md: dict[str, Any]) -> Charsmap | None:
    """A Unigram vocab's precompiled charsmap, parsed (None when the file has none or an empty one)."""
    from .encoders.ugm_charsmap import Charsmap  # the encoders package imports this module

    blob = md.get(K.PRECOMPILED_CHARSMAP)
    if blob is None or (isinstance(blob, np.ndarray) and blob.size == 0):
        return None
    arr = blob if isinstance(blob, np.ndarray) else None
    if arr is None or arr.ndim != 1 or arr.dtype.itemsize != 1 or arr.dtype.kind not in "iu":
        found = f"an array of {arr.dtype}" if arr is not None else type(blob).__name__
        raise FormatError(f"precompiled charsmap is {found}, expected an int8/uint8 array",
                          key=K.PRECOMPILED_CHARSMAP)
    return Charsmap(np.ascontiguousarray(arr).view(np.uint8).tobytes())


def read_flag(md: dict[str, Any], key: str, default: bool, source: str | None = None) -> bool:
    """A bool metadata key (default when absent); anything else is a FormatError naming the key."""
    v = md.get(key, default)
    if not isinstance(v, (bool, np.bool_)):
        raise FormatError(f"{key} is {v!r}, expected a bool", path=source, key=key)
    return bool(v)


def _numeric(md: dict[str, Any], key: str, n: int, source: str, dtype: type) -> np.ndarray | None:
    v = md.get(key)
    if v is None:
        return None
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind not in "iuf":
        found = f"an array of {v.dtype}" if isinstance(v, np.ndarray) else type(v).__name__
        raise FormatError(f"{key} is {found}, expected a numeric array with one entry per token", path=source,
                          key=key)
    if len(v) < n:
        raise FormatError(f"{key} has {len(v)} entries, expected {n} (one per token)", path=source, key=key)
    with np.errstate(over="ignore", invalid="ignore"):  # a float64 score beyond float32 is inf, as a cast gives
        return np.ascontiguousarray(v[:n], dtype=dtype)


def _find_special_by_text(special: dict[str, int | None], tokens: list[str], token_to_id: dict[str, int],
                          attrs: list[int], type_attrs: np.ndarray) -> tuple[set[int], set[int]]:
    """Special ids recognised by token text, and the end-of-generation set (llama.cpp's heuristics). attrs starts
    as type_attrs; returns the eog set and the ids whose attrs this changed."""
    control = int(Attr.CONTROL)
    touched: set[int] = set()
    for name, texts in SPECIAL_BY_TEXT.items():
        if special[name] is not None:
            continue
        for t in texts:
            i = token_to_id.get(t)
            if i is not None:
                special[name] = i
                attrs[i] |= control
                touched.add(i)
                break
    # control + "unused" = unused: the control tokens are those of their type and those marked just above
    for i in sorted({*np.flatnonzero(type_attrs & control).tolist(), *touched}):
        if attrs[i] & control and "unused" in tokens[i]:
            attrs[i] |= int(Attr.UNUSED)
            touched.add(i)
    eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if special[k] is not None}
    for t in EOG_TEXTS:
        i = token_to_id.get(t)
        if i is not None:
            eog.add(i)
            attrs[i] |= control
            touched.add(i)
    for t in ALWAYS_RENDERED:
        i = token_to_id.get(t)
        if i is not None:
            attrs[i] = int(Attr.USER_DEFINED)
            touched.add(i)
    eog |= {special[k] for k in ("eos", "eot", "eom") if special[k] is not None}  # type: ignore[misc]
    texts = {tokens[i]: i for i in eog}
    if (("<|return|>" in texts and "<|call|>" in texts) or ("<|calls|>" in texts and "<|flush|>" in texts)) \
            and "<|end|>" in texts:
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = int(Attr.USER_DEFINED)
        touched.add(texts["<|end|>"])
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = int(Attr.NORMAL)
        touched.add(texts["</s>"])
    return eog, touched  # type: ignore[return-value]


def _per_model_attrs(vocab: Vocab, md: dict[str, Any]) -> None:
    """Per-model lstrip/rstrip attributes llama.cpp sets by model and pre-tokenizer name."""
    name = str(md.get("general.name", "")).lower()
    arch = str(md.get("general.architecture", ""))
    pre = str(md.get(K.PRE, ""))
    ids, attrs = vocab.token_to_id, vocab.attrs

    def setattr_(text: str, bit: Attr, on: bool) -> None:
        i = ids.get(text)
        if i is not None:
            attrs[i] = (attrs[i] | int(bit)) if on else (attrs[i] & ~int(bit))

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        setattr_("<mask>", Attr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for i in vocab.special_cache:
            attrs[i] |= int(Attr.RSTRIP)
        setattr_("</s>", Attr.RSTRIP, True)
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            setattr_(t, Attr.RSTRIP, False)
    elif "modern-bert" in name:
        setattr_("[MASK]", Attr.LSTRIP, True)
