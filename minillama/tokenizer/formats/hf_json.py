"""Read a Hugging Face tokenizer.json (byte-level BPE, WordPiece, Unigram) into GGUF-style tokenizer metadata.

What llama.cpp's convert_hf_to_gguf.py writes for such a model (get_vocab_base + gguf.SpecialVocab):

* tokens: model.vocab plus added_tokens by id, gaps filled with "[PAD{i}]" (UNUSED); an added token
  is CONTROL when marked special or when it looks special (<|...|>, <pad>, <mask>, <unused...>),
  else USER_DEFINED (with U+2581 turned into spaces); the rest are NORMAL;
* merges: "a b" strings, or [a, b] pairs joined with a space (spaces inside a part become U+0120);
* tokenizer.ggml.pre: the converter hashes the tokenization of a fixed text; here the
  pre_tokenizer section is matched against a table of known configurations (PRE_TOKENIZERS);
* special ids and add_bos/add_eos: as gguf.SpecialVocab derives them from the post_processor and,
  when present beside the file, tokenizer_config.json and config.json.

A lone tokenizer.json does not name its bos/eos ids (the converter takes them from
tokenizer_config.json); then bos is the post_processor template's leading special token and eos
its trailing one, or else the first token found among conventional texts (_BOS_TEXTS, and for eos
llama.cpp's end-of-turn texts first: Llama 3's <|eot_id|>, as its Instruct models name it).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...errors import FormatError, UnsupportedError
from ...gguffile.constants import Keys, TokenType
from ..tables import KEY_LOWERCASE, KEY_STRIP_ACCENTS, LLAMA3_ORIGINAL, SPECIAL_ID_KEY
from ..text import SPACE, SURROGATES

K = Keys.Tokenizer
G = Keys.General

# --- pre-tokenizer configurations -----------------------------------------------------------------------------
# A pre_tokenizer section is reduced to a tuple of steps (see _signature); each known tuple names the
# llama.cpp pre-tokenizer that splits text the same way. Verified against llama.cpp's own ids on the shared
# conformance texts by building Hugging Face tokenizers from the GGUF test vocabs (tests/tokenizer/test_loaders.py).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

Step = tuple[Any, ...]
_BYTES_REGEX = ("ByteLevel", True)    # GPT-2's own regex, then bytes -> unicode
_BYTES_ONLY = ("ByteLevel", False)    # bytes -> unicode after an explicit Split


def _isolated(regex: str) -> Step:
    return ("Split", regex, "Isolated", False)


PRE_TOKENIZERS: dict[tuple[Step, ...], str] = {
    (_BYTES_REGEX,): "gpt-2",
    (_isolated(LLAMA3_ORIGINAL), _BYTES_ONLY): "llama-bpe",
    (_isolated(QWEN2_REGEX), _BYTES_ONLY): "qwen2",
    (_isolated(GPT4O_REGEX), _BYTES_ONLY): "gpt-4o",
    (("Digits", True), _BYTES_REGEX): "starcoder",
    (("Punctuation", "Contiguous"), _BYTES_REGEX, ("Digits", False), _isolated("[0-9][0-9][0-9]")): "falcon",
    (_isolated("[\r\n]"), _isolated(r"\s?\p{L}+"), _isolated(r"\s?\p{P}+"), _isolated("[一-龥ࠀ-一가-퟿]+"),
     ("Digits", True), _BYTES_ONLY): "deepseek-coder",
}

# Token texts the converter treats as control tokens even when not marked special.
_LOOKS_SPECIAL = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
# Texts tried, in order, for eos when nothing names it (llama.cpp's end-of-turn list, then plain eos texts).
_EOS_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "</s>", "<eos>")
# ... and for bos when the post_processor names none.
_BOS_TEXTS = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|endoftext|>")
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_ADD_KEYS = {"bos": K.ADD_BOS, "eos": K.ADD_EOS, "sep": K.ADD_SEP}


def looks_like_json(head: bytes) -> bool:
    """True when the file starts (after whitespace and a UTF-8 BOM) with '{' and then '"' or '}'."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    if not text.startswith(b"{"):
        return False
    rest = text[1:].lstrip(b" \t\r\n")
    return not rest or rest[:1] in (b'"', b"}")


def _fail(path: str, message: str, key: str | None = None) -> FormatError:
    return FormatError(message, path=path, key=key)


def _expect(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise _fail(path, f"{what} is {type(value).__name__} {str(value)[:60]!r}, expected {names}", what)
    return value


def _signature(pre: Any, path: str) -> tuple[Step, ...]:
    """The pre_tokenizer section as a flat tuple of steps that decide how text splits."""
    if pre is None:
        raise UnsupportedError(f"{path}: tokenizer.json has no pre_tokenizer; expected a byte-level BPE "
                               "(ByteLevel, or Split + ByteLevel)")
    _expect(pre, dict, path, "pre_tokenizer")
    kind = pre.get("type")
    if kind == "Sequence":
        steps: list[Step] = []
        for sub in _expect(pre.get("pretokenizers"), list, path, "pre_tokenizer.pretokenizers"):
            steps += _signature(sub, path)
        return tuple(steps)
    if kind == "ByteLevel":
        if pre.get("add_prefix_space", False):
            raise UnsupportedError(f"{path}: ByteLevel pre_tokenizer with add_prefix_space=true is not supported "
                                   "(llama.cpp never adds a space prefix to byte-level BPE)")
        return (("ByteLevel", bool(pre.get("use_regex", True))),)
    if kind == "Split":
        pattern = _expect(pre.get("pattern"), dict, path, "pre_tokenizer Split.pattern")
        if "Regex" in pattern:
            regex = _expect(pattern["Regex"], str, path, "Split.pattern.Regex")
        elif "String" in pattern:
            regex = "(?:" + "".join("\\" + c if not c.isalnum() else c for c in
                                    _expect(pattern["String"], str, path, "Split.pattern.String")) + ")"
        else:
            raise _fail(path, f"Split.pattern has keys {sorted(pattern)}, expected 'Regex' or 'String'")
        behavior = _expect(pre.get("behavior"), str, path, "Split.behavior")
        return (("Split", regex, behavior, bool(pre.get("invert", False))),)
    if kind == "Digits":
        return (("Digits", bool(pre.get("individual_digits", False))),)
    if kind == "Punctuation":
        return (("Punctuation", _expect(pre.get("behavior"), str, path, "Punctuation.behavior")),)
    raise UnsupportedError(f"{path}: pre_tokenizer type {kind!r} is not supported; expected ByteLevel, Split, "
                           "Digits or a Sequence of them")


def pre_name(pre: Any, path: str = "<tokenizer.json>") -> str:
    """The llama.cpp pre-tokenizer name (tokenizer.ggml.pre) for a tokenizer.json pre_tokenizer section."""
    sig = _signature(pre, path)
    name = PRE_TOKENIZERS.get(sig)
    if name is None:
        shown = "; ".join(f"{s[0]} {s[1]!r}" if s[0] == "Split" else " ".join(map(str, s)) for s in sig)
        raise UnsupportedError(f"{path}: unknown pre-tokenizer [{shown}]; known: byte-level BPE configurations "
                               f"of {', '.join(sorted(set(PRE_TOKENIZERS.values())))}")
    return name


def _looks_special(text: str) -> bool:
    return (text in _LOOKS_SPECIAL or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _merges(raw: Any, path: str) -> list[str]:
    merges = _expect(raw, list, path, "model.merges")
    if not merges:
        return []
    if isinstance(merges[0], str):
        if not all(isinstance(m, str) for m in merges):
            raise _fail(path, "model.merges mixes strings and other values, expected all 'a b' strings")
        return merges
    out = []
    for i, m in enumerate(merges):
        if not (isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m)):
            raise _fail(path, f"model.merges[{i}] is {str(m)[:60]!r}, expected an 'a b' string or an [a, b] pair")
        out.append(" ".join(p.replace(" ", "\u0120") for p in m))
    return out


# config.json's vocab_size may pad the vocab (embedding rows rounded up): by a few hundred tokens in real
# models; a padding of more is refused rather than made (16M [PAD] tokens would take gigabytes).
MAX_PADDING = 1 << 16
PADDING_KEY = "minillama.config_json_padding"


# JSON files found beside a tokenizer.json and passed instead of it, by keys they have.
_OTHER_JSON = (("a transformers config.json", {"architectures", "model_type", "hidden_size"}),
               ("a tokenizer_config.json", {"tokenizer_class", "added_tokens_decoder", "model_max_length"}))


def _no_surrogates(texts: Iterable[str], path: str, key: str) -> None:
    """FormatError when a text holds a lone surrogate (JSON's unpaired \\ud800 escape): it has no UTF-8 form."""
    bad = SURROGATES.search("\0".join(texts))
    if bad is not None:
        raise _fail(path, f"{key} holds the lone surrogate U+{ord(bad.group()):04X} (a \\u escape with no pair), "
                          "expected text that has a UTF-8 form (Hugging Face tokenizers refuses it too)", key)


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError as e:
        raise FormatError(f"{what} is not UTF-8 text (byte {e.start}), expected JSON", path=path,
                          offset=e.start) from None
    except RecursionError:
        raise FormatError(f"{what} nests too deeply, expected JSON a tokenizer writes", path=path) from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", path=path,
                          offset=e.pos) from None
    except ValueError as e:  # an integer literal longer than Python's int_max_str_digits (4,300)
        raise FormatError(f"{what} holds a value JSON from a tokenizer never has, expected ids and counts "
                          f"of a few digits, found: {e}", path=path) from None


def _content(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _special_vocab(j: dict[str, Any], added: list[dict[str, Any]], n_vocab: int, tc: dict[str, Any] | None,
                   config: dict[str, Any] | None) -> tuple[dict[str, int], dict[str, bool], str | None, str | None]:
    """gguf.SpecialVocab's special ids and add_* flags, plus the template's leading/trailing special tokens."""
    ids: dict[str, int] = {}
    add: dict[str, bool] = {}
    types = list(_SPECIAL_TYPES)
    tc = dict(tc) if tc else None

    def set_id(typ: str, tid: Any) -> None:
        if isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < n_vocab and typ not in ids:
            ids[typ] = tid

    bos, cls, eos = _config_specials(tc)
    first = last = None
    for proc in _post_processors(j.get("post_processor")):
        if proc.get("type") == "RobertaProcessing":
            add.update(bos=True, eos=True, sep=True)
        elif proc.get("type") == "TemplateProcessing":
            single = proc.get("single") or []
            if isinstance(single, list) and len(single) > 1:
                first, last, bos, eos = _template_ends(single, tc, types, add, bos, cls, eos)
    if tc:
        for typ in types:
            flag = tc.get(f"add_{typ}_token")
            if isinstance(flag, bool):
                add[typ] = flag
            text = _content(tc.get(f"{typ}_token"))
            if text is not None:
                set_id(typ, next((a.get("id") for a in added if a.get("content") == text), None))
    if config:
        for typ in types:
            tid = config.get(f"{typ}_token_id")
            if tid is None and isinstance(config.get("text_config"), dict):
                tid = config["text_config"].get(f"{typ}_token_id")
            set_id(typ, tid)
    return ids, add, first, last


def _config_specials(tc: dict[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    """(bos, cls, eos) texts of tokenizer_config.json; cls stands in for a missing bos and sep for a missing eos
    (written back into tc, as gguf.SpecialVocab does)."""
    get = (tc or {}).get
    bos, cls, eos, sep = (_content(get(f"{typ}_token")) for typ in ("bos", "cls", "eos", "sep"))
    if not bos and cls and tc:
        tc["bos_token"] = bos = cls
    if not eos and sep and tc:
        tc["eos_token"] = eos = sep
    return bos, cls, eos


def _post_processors(post: Any) -> list[dict[str, Any]]:
    """The post_processor's steps (the processors of a Sequence, else itself)."""
    if not isinstance(post, dict):
        return []
    procs = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []


def _template_ends(single: list[Any], tc: dict[str, Any] | None, types: list[str], add: dict[str, bool],
                   bos: str | None, cls: str | None,
                   eos: str | None) -> tuple[str | None, str | None, str | None, str | None]:
    """(first, last, bos, eos) after a TemplateProcessing 'single' template: its leading special token is bos
    and sets add_bos, its trailing one eos and add_eos (a trailing token other than tokenizer_config's eos
    becomes eos, and the old eos eot or eom)."""
    first = _template_special(single[0])
    if first:
        if not tc:
            bos = first
        add["bos"] = first in (bos, cls)
    last = _template_special(single[-1])
    if last:
        if not tc:
            eos = last
        elif last != eos:
            extra = next((x for x in ("eot", "eom") if x not in types), None)
            if extra is not None:
                types.append(extra)
                tc[f"{extra}_token"] = eos
            tc["eos_token"] = eos = last
        add["eos"] = last == eos
    return first, last, bos, eos


def _template_special(item: Any) -> str | None:
    if isinstance(item, dict) and isinstance(item.get("SpecialToken"), dict):
        tid = item["SpecialToken"].get("id")
        return tid if isinstance(tid, str) and tid else None
    return None


def _fallback_ids(ids: dict[str, int], tokens: list[str], candidates: Iterable[tuple[str, Iterable[Any]]]) -> None:
    """For each role not in ids, the id of the first of its candidate texts that is a token (if any)."""
    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
    for typ, texts in candidates:
        if typ not in ids:
            tid = next((index[t] for t in texts if t in index), None)
            if tid is not None:
                ids[typ] = tid


def _end_first(end: str | None, texts: tuple[str, ...]) -> tuple[str, ...]:
    """texts, after the template's leading or trailing special token when it has one."""
    return ((end,) if end else ()) + texts


def hf_json_metadata(j: Any, path: str = "<tokenizer.json>", tokenizer_config: dict[str, Any] | None = None,
                     config: dict[str, Any] | None = None, name: str = "") -> dict[str, Any]:
    """GGUF-style metadata for a parsed tokenizer.json (and optional tokenizer_config.json / config.json)."""
    model, mtype = _model(j, path)
    if mtype in OTHER_MODELS:
        md = OTHER_MODELS[mtype](j, model, path, tokenizer_config)
        if name:
            md[G.NAME] = name
        return md
    _check_bpe(model, mtype, path)
    pre = pre_name(j.get("pre_tokenizer"), path)
    vocab = _expect(model.get("vocab"), dict, path, "model.vocab")
    merges = _merges(model.get("merges", []), path)
    added = _expect(j.get("added_tokens", []), list, path, "added_tokens")
    by_id, added_by_id = _bpe_ids(vocab, added, path)
    n, padding = _bpe_size(by_id, config, path)
    _no_surrogates(by_id.values(), path, "model.vocab")
    _no_surrogates(merges, path, "model.merges")
    tokens, types = _bpe_tokens(by_id, added_by_id, n)
    ids, add, first, last = _special_vocab(j, list(added_by_id.values()), n, tokenizer_config, config)
    _fallback_ids(ids, tokens, (("bos", _end_first(first, _BOS_TEXTS)), ("eos", _end_first(last, _EOS_TEXTS))))

    md: dict[str, Any] = {G.ARCHITECTURE: "llama"}
    if padding:  # said by `inspect` (a key convert does not write: it is about this reading, not the vocab)
        md[PADDING_KEY] = padding
    if name:
        md[G.NAME] = name
    md.update({K.MODEL: "gpt2", K.PRE: pre, K.LIST: tokens, K.TOKEN_TYPE: np.asarray(types, np.int32),
               K.MERGES: merges})
    for typ, tid in ids.items():
        if typ in SPECIAL_ID_KEY:
            md[SPECIAL_ID_KEY[typ]] = tid
    for typ, flag in add.items():
        if typ in _ADD_KEYS:
            md[_ADD_KEYS[typ]] = flag
    return md


def _model(j: Any, path: str) -> tuple[dict[str, Any], Any]:
    """The 'model' object of a tokenizer.json and its type (FormatError for other JSON)."""
    _expect(j, dict, path, "tokenizer.json")
    if "model" not in j:
        looks = next((name for name, keys in _OTHER_JSON if keys & j.keys()), "not a tokenizer.json")
        raise _fail(path, f"a JSON file without a 'model' object ({looks}), expected a Hugging Face tokenizer.json",
                    "model")
    model = _expect(j.get("model"), dict, path, "model")
    return model, model.get("type", "BPE" if "merges" in model else None)


def _check_bpe(model: dict[str, Any], mtype: Any, path: str) -> None:
    """UnsupportedError for a model type or BPE option llama.cpp's converter does not take as a GPT-2 BPE."""
    if mtype != "BPE":
        raise UnsupportedError(f"{path}: tokenizer.json model type {mtype!r} is not supported; expected 'BPE', "
                               "'WordPiece' or 'Unigram'")
    if model.get("byte_fallback"):
        raise UnsupportedError(f"{path}: BPE with byte_fallback (a SentencePiece-style vocab) is not supported; "
                               "convert its tokenizer.model instead")
    for opt in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(opt):
            raise UnsupportedError(f"{path}: BPE with {opt}={model[opt]!r} is not supported")


def _bpe_ids(vocab: dict[str, Any], added: list[Any],
             path: str) -> tuple[dict[int, str], dict[int, dict[str, Any]]]:
    """(text of each id, added token of each id), checked: ids are ints >= 0, added tokens have id and content."""
    by_id: dict[int, str] = {}
    for text, tid in vocab.items():
        _expect(tid, int, path, f"model.vocab[{text!r}]")
        if tid < 0:
            raise _fail(path, f"model.vocab[{text!r}] is {tid}, expected an id >= 0", "model.vocab")
        by_id[tid] = text
    added_by_id: dict[int, dict[str, Any]] = {}
    for i, a in enumerate(added):
        _expect(a, dict, path, f"added_tokens[{i}]")
        tid = _expect(a.get("id"), int, path, f"added_tokens[{i}].id")
        text = _expect(a.get("content"), str, path, f"added_tokens[{i}].content")
        if tid < 0:
            raise _fail(path, f"added_tokens[{i}].id is {tid}, expected an id >= 0", "added_tokens")
        by_id[tid] = text
        added_by_id[tid] = a
    if not by_id:
        raise _fail(path, "model.vocab is empty, expected tokens", "model.vocab")
    return by_id, added_by_id


def _bpe_size(by_id: dict[int, str], config: dict[str, Any] | None, path: str) -> tuple[int, int]:
    """(vocab size, [PAD] tokens added to reach config.json's vocab_size, as llama.cpp's converter does)."""
    n = max(by_id) + 1
    if n > 1 << 24 or n > 4 * len(by_id) + 1024:
        raise _fail(path, f"largest token id {n - 1} for {len(by_id)} tokens, expected ids close to 0..{len(by_id) - 1}")
    size = (config or {}).get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > n:
        if size - n > MAX_PADDING:
            raise _fail(path, f"config.json beside it has vocab_size {size}, which would add {size - n} [PAD] "
                              f"tokens to the {n} of tokenizer.json; expected at most {MAX_PADDING} more", "vocab_size")
        return size, size - n  # llama.cpp's converter pads to config.json's vocab_size with [PAD{i}] tokens
    return n, 0


def _bpe_tokens(by_id: dict[int, str], added_by_id: dict[int, dict[str, Any]],
                n: int) -> tuple[list[str], list[int]]:
    """Tokens and token types of ids 0..n-1: gaps are [PAD<id>] (UNUSED), added tokens CONTROL when special
    (or looking special), else USER_DEFINED with U+2581 as spaces."""
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added_by_id:
            if added_by_id[i].get("special") or _looks_special(text):
                types.append(TokenType.CONTROL)
            else:
                text = text.replace(SPACE, " ")
                types.append(TokenType.USER_DEFINED)
            tokens.append(text)
        else:
            tokens.append(text)
            types.append(TokenType.NORMAL)
    return tokens, types


# --- WordPiece and Unigram: what convert_hf_to_gguf.py writes for BERT and T5 models ----------------------------


def _added(j: dict[str, Any], path: str) -> dict[int, dict[str, Any]]:
    """added_tokens by id (checked)."""
    out = {}
    for i, a in enumerate(_expect(j.get("added_tokens", []), list, path, "added_tokens")):
        _expect(a, dict, path, f"added_tokens[{i}]")
        out[_expect(a.get("id"), int, path, f"added_tokens[{i}].id")] = a
        _expect(a.get("content"), str, path, f"added_tokens[{i}].content")
    return out


def _normalizers(j: dict[str, Any]) -> list[dict[str, Any]]:
    norm = j.get("normalizer")
    if not isinstance(norm, dict):
        return []
    subs = norm.get("normalizers") if norm.get("type") == "Sequence" else [norm]
    return [n for n in subs if isinstance(n, dict)] if isinstance(subs, list) else []


def _id_of(tokens: list[str], text: Any) -> int | None:
    text = _content(text)
    if text is None:
        return None
    try:
        return tokens.index(text)
    except ValueError:
        return None


def _wordpiece_metadata(j: dict[str, Any], model: dict[str, Any], path: str,
                        tc: dict[str, Any] | None) -> dict[str, Any]:
    """BertModel.set_vocab: '##' continuations lose their mark, word-initial tokens get a U+2581 phantom
    prefix, '[...]' tokens stay as they are; special added tokens are CONTROL."""
    raw, added = _wordpiece_vocab(j, model, path)
    n = len(raw)
    tokens = [t if t.startswith("[") and t.endswith("]") else t[2:] if t.startswith("##") else SPACE + t
              for t in raw]
    types = [TokenType.CONTROL if added.get(i, {}).get("special") else TokenType.NORMAL for i in range(n)]
    get = (tc or {}).get
    ids = {"unk": _id_of(raw, get("unk_token") or model.get("unk_token", "[UNK]")),
           "bos": _id_of(raw, get("cls_token") or "[CLS]"), "sep": _id_of(raw, get("sep_token") or "[SEP]"),
           "pad": _id_of(raw, get("pad_token") or "[PAD]"), "mask": _id_of(raw, get("mask_token") or "[MASK]")}
    md: dict[str, Any] = {G.ARCHITECTURE: "bert", K.MODEL: "bert", K.PRE: "default", K.LIST: tokens,
                          K.TOKEN_TYPE: np.asarray(types, np.int32)}
    for typ, tid in ids.items():
        if tid is not None:
            md[SPECIAL_ID_KEY[typ]] = tid
    md[K.ADD_BOS], md[K.ADD_SEP] = ids["bos"] is not None, ids["sep"] is not None
    md.update(_bert_normalizer(j))
    return md


def _wordpiece_vocab(j: dict[str, Any], model: dict[str, Any],
                     path: str) -> tuple[list[str], dict[int, dict[str, Any]]]:
    """(the texts of ids 0..n-1, added tokens by id); the ids must have no gaps."""
    vocab = _expect(model.get("vocab"), dict, path, "model.vocab")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise UnsupportedError(f"{path}: WordPiece with continuing_subword_prefix={prefix!r} is not supported "
                               "(llama.cpp's converter expects '##')")
    added = _added(j, path)
    by_id: dict[int, str] = {}
    for text, tid in vocab.items():
        by_id[_expect(tid, int, path, f"model.vocab[{text!r}]")] = text
    for tid, a in added.items():
        by_id[tid] = a["content"]
    n = max(by_id, default=-1) + 1
    if n == 0 or n != len(by_id) or min(by_id) < 0:
        raise _fail(path, f"WordPiece ids are not 0..{len(by_id) - 1} without gaps (smallest {min(by_id, default=0)}, "
                    f"largest {n - 1})", "model.vocab")
    return [by_id[i] for i in range(n)], added


def _bert_normalizer(j: dict[str, Any]) -> dict[str, Any]:
    """The BertNormalizer options llama.cpp reads: lowercase when false, strip_accents when set."""
    md: dict[str, Any] = {}
    for norm in _normalizers(j):
        if norm.get("type") == "BertNormalizer":
            lowercase = norm.get("lowercase", True)
            if lowercase is False:
                md[KEY_LOWERCASE] = False
            if isinstance(norm.get("strip_accents"), bool):
                md[KEY_STRIP_ACCENTS] = norm["strip_accents"]
    return md


def _unigram_metadata(j: dict[str, Any], model: dict[str, Any], path: str,
                      tc: dict[str, Any] | None) -> dict[str, Any]:
    """T5Model.set_vocab from a converted SentencePiece Unigram: pieces, scores and types, the normalizer's
    precompiled charsmap, add_space_prefix from the Metaspace pre-tokenizer, remove_extra_whitespaces from
    the converter's Replace(' {2,}') step."""
    pieces = _expect(model.get("vocab"), list, path, "model.vocab")
    unk_id = model.get("unk_id")
    added = _added(j, path)
    tokens, scores, types = _unigram_pieces(pieces, bool(model.get("byte_fallback")), added, unk_id, path)
    md: dict[str, Any] = {G.ARCHITECTURE: "t5", K.MODEL: "t5", K.PRE: "default", K.LIST: tokens,
                          K.SCORES: np.asarray(scores, np.float32), K.TOKEN_TYPE: np.asarray(types, np.int32)}
    md.update(_unigram_normalizer(j, path))
    add_prefix = _metaspace_prefix(j.get("pre_tokenizer"))
    if add_prefix is not None:
        md[K.ADD_PREFIX] = add_prefix
    if isinstance(unk_id, int) and 0 <= unk_id < len(tokens):
        md[K.UNK_ID] = unk_id
    ids, add, first, last = _special_vocab(j, list(added.values()), len(tokens), tc, None)
    _fallback_ids(ids, tokens, (("bos", _BOS_TEXTS), ("eos", _end_first(last, _EOS_TEXTS)), ("pad", ("<pad>",))))
    for typ, tid in ids.items():
        if typ in SPECIAL_ID_KEY and typ != "unk":
            md[SPECIAL_ID_KEY[typ]] = tid
    md[K.ADD_BOS] = add.get("bos", False)
    md[K.ADD_EOS] = add.get("eos", True)  # the converter's T5 default (SentencePiece appends </s>)
    return md


def _unigram_pieces(pieces: list[Any], byte_fallback: bool, added: dict[int, dict[str, Any]], unk_id: Any,
                    path: str) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of model.vocab's [piece, score] pairs (FormatError when empty)."""
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    for i, entry in enumerate(pieces):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)):
            raise _fail(path, f"model.vocab[{i}] is {str(entry)[:60]!r}, expected a [piece, score] pair", "model.vocab")
        text = entry[0]
        tokens.append(text)
        scores.append(float(entry[1]))
        a = added.get(i)
        if i == unk_id:
            types.append(TokenType.UNKNOWN)
        elif a is not None:
            types.append(TokenType.CONTROL if a.get("special") else TokenType.USER_DEFINED)
        elif byte_fallback and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(TokenType.BYTE)
        else:
            types.append(TokenType.NORMAL)
    if not tokens:
        raise _fail(path, "model.vocab is empty, expected [piece, score] pairs", "model.vocab")
    return tokens, scores, types


def _unigram_normalizer(j: dict[str, Any], path: str) -> dict[str, Any]:
    """The precompiled charsmap (when not empty) and remove_extra_whitespaces of the normalizer steps."""
    md: dict[str, Any] = {}
    remove_extra = False
    for norm in _normalizers(j):
        if norm.get("type") == "Precompiled" and isinstance(norm.get("precompiled_charsmap"), str):
            try:
                blob = base64.b64decode(norm["precompiled_charsmap"], validate=True)
            except ValueError:
                raise _fail(path, "normalizer Precompiled.precompiled_charsmap is not base64", "normalizer") from None
            if blob:
                md[K.PRECOMPILED_CHARSMAP] = np.frombuffer(blob, np.uint8).copy()
        elif norm.get("type") == "Replace" and norm.get("pattern") == {"Regex": " {2,}"}:
            remove_extra = True
    md[K.REMOVE_EXTRA_WS] = remove_extra
    return md


def _metaspace_prefix(pre: Any) -> bool | None:
    """add_space_prefix of the first Metaspace pre-tokenizer step (None: there is none)."""
    steps = (pre.get("pretokenizers") or []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    metas = [p for p in steps if isinstance(p, dict) and p.get("type") == "Metaspace"]
    if not metas:
        return None
    return metas[0].get("prepend_scheme", "always") != "never" and metas[0].get("add_prefix_space", True) is not False


OTHER_MODELS = {"WordPiece": _wordpiece_metadata, "Unigram": _unigram_metadata}


def read_hf_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Tokenizer metadata from a Hugging Face tokenizer.json (with tokenizer_config.json/config.json beside it)."""
    path = os.fspath(path)
    j = _read_json(path, "tokenizer.json")
    folder = os.path.dirname(os.path.abspath(path))
    extra: dict[str, Any] = {}
    for fname in ("tokenizer_config.json", "config.json"):
        p = os.path.join(folder, fname)
        if os.path.isfile(p):
            v = _read_json(p, fname)
            extra[fname] = v if isinstance(v, dict) else None
    stem = os.path.basename(path)
    stem = stem[:-len(".json")] if stem.endswith(".json") else stem
    stem = stem.removesuffix("tokenizer").rstrip("-_.") or os.path.basename(folder)
    md = hf_json_metadata(j, path, extra.get("tokenizer_config.json"), extra.get("config.json"), stem)
    template = _chat_template(folder, extra.get("tokenizer_config.json"))
    if template:
        md[K.CHAT_TEMPLATE] = template
    return md


def _chat_template(folder: str, tc: dict[str, Any] | None) -> str | None:
    """The chat template beside a tokenizer.json, as transformers' from_pretrained and llama.cpp's converter
    find it: chat_template.jinja, else tokenizer_config.json's chat_template (a list of named templates: the
    one named "default")."""
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8", errors="replace") as f:
            return f.read()
    value = (tc or {}).get("chat_template")
    if isinstance(value, list):
        value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"), None)
    return value if isinstance(value, str) else None
