"""minillama.tokenizer: open a model's tokenizer and encode/decode exactly as llama.cpp does.

    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file("model.gguf")  # or tokenizer.bin, a SentencePiece .model, a tokenizer.json
    ids = tok.encode("Hello world", add_special=True, parse_special=False)
    tok.decode(ids); tok.decode_bytes(ids); tok.token_to_piece(ids[0])

For users of Hugging Face tokenizers, tiktoken and transformers: encode_with_offsets, allowed_special /
disallowed_special, encode_for_completion (token healing), apply_chat_template (transformers' signature and
defaults), tok(text) (a BatchEncoding), token_to_id / id_to_token / convert_ids_to_tokens / get_vocab /
get_vocab_size, decode_batch / batch_decode, skip_special_tokens, truncation / max_length, pad_id /
padding_side, chat_template, encode_batch(return_array=True, pad_to=..., truncate=...), and tiktoken's
encode_ordinary, eot_token and decode_single_token_bytes.

The pipeline: file -> Vocab (formats/, vocab.py) -> special-token split (special.py) -> merge model
(models/: score-based SPM or rank-based BPE with its pre-tokenizer) -> ids -> pieces (decode.py).

Text is taken as its UTF-8 bytes, which is what llama.cpp tokenizes. A Python str may also hold lone
surrogates, which have no UTF-8 form; `encode` gives them one meaning, in one place:

* U+DC80..U+DCFF stand for the raw bytes 0x80..0xFF (Python's 'surrogateescape'), so text read with
  ``data.decode("utf-8", "surrogateescape")`` tokenizes exactly as llama.cpp tokenizes ``data``,
  invalid UTF-8 included (SPM and Unigram vocabs see the bytes, byte-level BPE and WordPiece see
  U+FFFD for each invalid byte, as in llama.cpp). Escapes that together form valid UTF-8 are that
  character: "\udcc3\udca9" is "é".
* Any other surrogate (U+D800..U+DC7F, U+DD00..U+DFFF) becomes U+FFFD.

Nothing else is changed: NUL bytes, control characters, unassigned code points and text of any
length without a space are tokenized as llama.cpp does. For valid str input `encode` never raises;
the only exceptions are a vocab lacking what llama.cpp's algorithm needs for that text (FormatError,
where llama.cpp aborts) and bad arguments.

Errors: everything raised on purpose is a minillama.errors.MinillamaError -- FormatError for files
that are not what they claim, UnsupportedError for valid files using what is not implemented,
ArgumentError (a ValueError) / ArgumentTypeError (also a TypeError) for bad arguments.

Threads: a Tokenizer may be shared by any number of threads and gives the same results as in one
thread: its word caches are plain dicts (a get or set is atomic under the GIL; the bounded cache
clears itself when full) and tables built on first use are built under a lock, once.
"""

from __future__ import annotations

import gc
import os
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, DoubleBosWarning, MinillamaError, UnsupportedError
from ..fileio import input_path
from .decode import PieceTable, StreamDecoder, check_id, out_of_range
from .formats import model_file, read_metadata
from .hf_api import (
    BatchEncoding,
    PaddingSide,
    as_tensors,
    check_max_length,
    check_padding_side,
    check_template_kwargs,
    conversations,
    cut_after_final,
    open_final_message,
    pad,
    skip_flags,
)
from .models import Model, make_model, native_core
from .offsets import SPANS
from .special import always_matched, find_special, partition, partition_spans, raw_special_ids
from .text import ESCAPES, as_bytes_text, has_surrogates
from .vocab import Attr, Vocab

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate

_GC_PAUSE_CHARS = 1 << 14  # texts longer than this encode with the cyclic GC paused
_RUNS_PER_THREAD = 4  # encode_batch hands each thread about this many runs of texts (balance vs. overhead)

#: tiktoken's allowed_special / disallowed_special: "all", or a collection of token texts.
SpecialSet = Literal["all"] | Iterable[str]

__all__ = ["Tokenizer", "Vocab", "Attr", "StreamDecoder", "BatchEncoding", "default_vocab_path"]


def default_vocab_path() -> str:
    """Path of the small demo vocab that ships inside the package (made by scripts/make_default_vocab.py)."""
    return str(resources.files("minillama") / "data" / "default-vocab.gguf")


_NONE: frozenset[int] = frozenset()

def _batch_texts(texts: Iterable[str], num_threads: int | None) -> tuple[list[str], int]:
    """encode_batch's texts as a list of str and its thread count, both checked."""
    if isinstance(texts, (str, bytes)):
        raise ArgumentTypeError(f"encode_batch() takes a sequence of str, got one {type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ArgumentTypeError(f"encode_batch() takes str items, item {i} is {type(t).__name__}")
    if num_threads is None:
        num_threads = os.cpu_count() or 1
    elif isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise ArgumentTypeError(f"num_threads must be an int or None, got {type(num_threads).__name__}")
    elif num_threads < 1:
        raise ArgumentError(f"num_threads must be at least 1, got {num_threads}")
    return texts, num_threads


def _batch_arrays(out: list[list[int]], pad_to: Literal["longest"] | int | None,
                  pad_id: int | None, side: PaddingSide = "right") -> tuple[np.ndarray, np.ndarray]:
    """encode_batch's (ids, attention_mask) arrays: the id lists padded to one width on side."""
    lengths = [len(ids) for ids in out]
    longest = max(lengths, default=0)
    if pad_to is None:
        if len(set(lengths)) > 1:
            raise ArgumentError(f"the texts give {min(lengths)} to {longest} ids: pass pad_to='longest' (or a "
                                "length) to pad them into one array")
        width = longest
    else:
        width = longest if pad_to == "longest" else int(pad_to)
        if longest > width:
            i = lengths.index(longest)
            raise ArgumentError(f"text {i} gives {longest} ids, more than pad_to={width}: pass truncate={width}")
    ids_arr = np.full((len(out), width), pad_id if pad_id is not None else 0, np.int32)
    mask = np.zeros((len(out), width), np.int32)
    for r, ids in enumerate(out):
        cols = slice(width - len(ids), width) if side == "left" else slice(0, len(ids))
        ids_arr[r, cols] = ids
        mask[r, cols] = 1
    return ids_arr, mask


class Tokenizer:
    """A vocab plus its merge model: llama_tokenize / llama_detokenize / llama_token_to_piece in Python."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._encoder: Model = make_model(vocab)
        self._raw_special = raw_special_ids(vocab)
        self._pieces: PieceTable | None = None
        self._lock = threading.Lock()
        self._warn_bos = self._bos_text if vocab.add_bos else ""  # text whose presence means a double bos
        self.padding_side: PaddingSide = "right"  # transformers' attribute: where padding goes by default
        self._pad_override: int | None = None  # tok.pad_id = ... (the vocab's pad token otherwise)
        self._template_override: tuple[str | None] | None = None  # tok.chat_template = ...
        # The fast path of encode (one call into the native core, no special-token search): where the model has
        # one and no special token is matched in plain text (no user-defined ones, none cutting a character).
        plain = getattr(self._encoder, "encode_plain", None)
        self._plain = plain if plain is not None and not always_matched(vocab) and not self._raw_special else None

    def __reduce__(self) -> tuple:
        """Pickle as the vocab's tables alone (process pools, Ray actors): the model, its word caches,
        the piece table and the lock are rebuilt on the other side, so no file needs to be there."""
        return type(self), (self.vocab,)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, ignore_merges: bool | None = None) -> Tokenizer:
        """Open a GGUF (v2/v3), llama2.c tokenizer.bin, SentencePiece .model or Hugging Face tokenizer.json
        file, recognised by its content, not its name; or a Hugging Face model directory (its tokenizer.json,
        with tokenizer_config.json and config.json beside it, as from_pretrained reads one).

        ignore_merges (BPE vocabs only) overrides what llama.cpp's pre-tokenizer decides: None follows
        llama.cpp (llama-bpe and a few others take a word that is a whole token as that token); False gives
        Hugging Face tokenizers' ids for a tokenizer.json that says "ignore_merges": false (llama 3's).
        """
        path = input_path(model_file(path), "model file")
        vocab = Vocab.from_metadata(read_metadata(path), path)
        if ignore_merges is not None:
            if vocab.kind != "bpe":
                raise ArgumentError(f"ignore_merges applies to BPE vocabs, expected one; {path} holds a "
                                    f"{vocab.kind!r} vocab")
            vocab.ignore_merges = bool(ignore_merges)
        return cls(vocab)

    # --- properties -------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return self.vocab.n_vocab

    @property
    def model(self) -> str:
        """The tokenizer kind: 'spm' (SentencePiece scores), 'bpe' (merges), 'wpm' (WordPiece) or 'ugm' (Unigram)."""
        return self.vocab.kind

    @property
    def pre(self) -> str:
        """The pre-tokenizer name (`tokenizer.ggml.pre`; 'default' for SPM)."""
        return self.vocab.pre

    @property
    def backend(self) -> str:
        """Who encodes: 'native' (the compiled core) or 'pure' (Python); chosen when the tokenizer is built,
        from MINILLAMA_BACKEND=auto|native|pure and whether the core covers this vocab."""
        return self._encoder.backend

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special.get("eos")

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special.get("eot")

    @property
    def unk_id(self) -> int | None:
        return self.vocab.special.get("unk")

    @property
    def pad_id(self) -> int | None:
        """The padding id: the vocab's pad token unless set (tok.pad_id = tok.eos_id, as transformers users set
        pad_token); what encode_batch, tok(...) and apply_chat_template pad with."""
        return self._pad_override if self._pad_override is not None else self.vocab.special.get("pad")

    @pad_id.setter
    def pad_id(self, token_id: int | None) -> None:
        self._pad_override = None if token_id is None else check_id(token_id, self.vocab.n_vocab)

    @property
    def eot_token(self) -> int | None:
        """tiktoken's eot_token, the end-of-text id: the vocab's eos (llama.cpp's eot_id is end-of-turn)."""
        return self.vocab.special.get("eos")

    @property
    def chat_template(self) -> str | None:
        """The chat template apply_chat_template renders (transformers' tokenizer.chat_template): the file's
        tokenizer.chat_template unless set; None when there is none."""
        if self._template_override is not None:
            return self._template_override[0]
        source = self.vocab.metadata.get("tokenizer.chat_template")
        return source if isinstance(source, str) and source.strip() else None

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        if source is not None and not isinstance(source, str):
            raise ArgumentTypeError(f"chat_template must be a str or None, got {type(source).__name__}")
        self._template_override = (source,)

    @property
    def add_bos(self) -> bool:
        """Whether encode(add_special=True) prepends bos."""
        return self.vocab.add_bos

    def is_eog(self, token_id: int) -> bool:
        """True for ids that end generation (eos, eot, eom and the ids llama.cpp recognises by text)."""
        return token_id in self.vocab.eog_ids

    # --- encoding ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False, *,
               allowed_special: SpecialSet | None = None, disallowed_special: SpecialSet | None = None,
               truncation: bool = False, max_length: int | None = None) -> list[int]:
        """llama_tokenize(text, add_special, parse_special): ids for text.

        truncation=True, max_length=N (transformers' names) keeps at most N ids, the bos/eos add_special
        adds included and kept (the text's ids are cut at the end).

        allowed_special / disallowed_special follow tiktoken: "all" or a collection of control-token
        texts. Allowed tokens written in the text become their ids; a disallowed one raises
        ArgumentError naming it and its position; the rest are plain text. They apply only when given:
        with neither, encode behaves as it always has (parse_special decides). Giving allowed_special
        alone disallows every other control token, as tiktoken does; parse_special=True is
        allowed_special="all".

        add_special adds bos/eos as the vocab's flags say; parse_special matches control tokens
        written in the text (user-defined tokens are always matched, as in llama.cpp).

        text is any str: it is tokenized as its UTF-8 bytes; lone surrogates U+DC80..U+DCFF stand
        for the raw bytes 0x80..0xFF (surrogateescape) and other lone surrogates become U+FFFD (see
        the module docstring). For byte-level BPE and byte-fallback SPM vocabs,
        ``decode(encode(s, add_special=False)) == s`` for every valid str s, up to llama.cpp's
        clean-up of spaces before punctuation in vocabs that ask for it, and for SPM, U+2581 (which
        is its space marker) and the space llama.cpp adds after a special token.
        """
        plain = self._plain
        if plain is not None and type(text) is str and not parse_special and allowed_special is None \
                and disallowed_special is None and not truncation and max_length is None \
                and (ids := plain(text)) is not None:
            if add_special:
                if self._warn_bos and text.startswith(self._warn_bos):
                    self._warn_double_bos()
                before, after = self._encoder.affixes()
                return [*before, *ids, *after]
            return ids
        if not isinstance(text, str):
            raise ArgumentTypeError(f"encode() takes a str, got {type(text).__name__}")
        if truncation or max_length is not None:
            return self._encode_truncated(text, add_special, parse_special, check_max_length(truncation, max_length),
                                          allowed_special=allowed_special, disallowed_special=disallowed_special)
        allowed: frozenset[int] = _NONE
        if allowed_special is not None or disallowed_special is not None:
            allowed = self._special_control(text, parse_special, allowed_special, disallowed_special)
        if add_special and self._warn_bos and text.startswith(self._warn_bos):
            self._warn_double_bos()
        escaped = False
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: the rare, slow path
                text = as_bytes_text(text)
                escaped = ESCAPES.search(text) is not None
        v, model = self.vocab, self._encoder
        before, after = model.affixes() if add_special else ((), ())
        out: list[int] = list(before)
        after_special = True
        # A long text allocates many small lists that are never cyclic; the cyclic collector
        # would walk them again and again (~15% of a first call on 278 KB). It is paused, not
        # disabled for good: re-enabled on the way out unless someone else had turned it off.
        pause_gc = len(text) > _GC_PAUSE_CHARS and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            raw = self._raw_special
            for frag in partition(v, text, parse_special, allowed, raw):
                if isinstance(frag, int):
                    out.append(frag)
                    after_special = True
                else:
                    frag = model.prepare(frag, after_special)
                    if escaped or (raw and ESCAPES.search(frag)):  # a special token cut a character
                        out += model.encode_escaped(frag)
                    else:
                        out += model.encode(frag)
                    after_special = False
        finally:
            if pause_gc:
                gc.enable()
        out += after
        return out

    def _encode_truncated(self, text: str, add_special: bool, parse_special: bool, max_length: int | None,
                          **special: Any) -> list[int]:
        """encode() cut to max_length ids, the ids add_special adds kept (HF's truncation)."""
        before, after = self._truncation_affixes(max_length, add_special)
        if add_special and self._warn_bos and text.startswith(self._warn_bos):
            self._warn_double_bos()
        ids = self.encode(text, False, parse_special, **special)
        if max_length is None:
            return before + ids + after
        return before + ids[:max_length - len(before) - len(after)] + after

    def encode_ordinary(self, text: str) -> list[int]:
        """tiktoken's encode_ordinary: the ids of text with special tokens as plain text and no bos/eos added."""
        return self.encode(text, add_special=False, parse_special=False)

    def __call__(self, text: str | Sequence[str], *, add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | None = None, max_length: int | None = None, return_tensors: str | None = None,
                 padding_side: PaddingSide | None = None, return_attention_mask: bool = True) -> BatchEncoding:
        """transformers' tokenizer(text): a BatchEncoding of input_ids and attention_mask, for one text (lists of
        ids) or a list of texts (lists of lists). Control tokens written in the text are matched, as
        transformers matches added tokens; add_special_tokens adds bos/eos as the vocab says. padding=True /
        'longest' / 'max_length' pads with pad_id on padding_side (default tok.padding_side); truncation=True
        with max_length cuts each text's ids; return_tensors='np' gives int64 arrays with a batch axis."""
        batched = not isinstance(text, str)
        if batched and (isinstance(text, bytes) or not isinstance(text, Sequence)):
            raise ArgumentTypeError(f"tokenizer() takes a str or a list of str, got {type(text).__name__}")
        side = check_padding_side(self.padding_side if padding_side is None else padding_side)
        cut = check_max_length(truncation, max_length)
        texts = list(text) if batched else [text]
        rows = [self._encode_truncated(t, add_special_tokens, True, cut) if cut is not None
                else self.encode(t, add_special_tokens, True) for t in texts]
        rows, masks = pad(rows, padding, max_length, self.pad_id, side)
        enc = {"input_ids": rows if batched else rows[0]}
        if return_attention_mask:
            enc["attention_mask"] = masks if batched else masks[0]
        return BatchEncoding(as_tensors(enc, return_tensors, batched))

    def _encode_run(self, texts: list[str]) -> list[list[int]]:
        """encode(t, add_special=False) of each text, through the fast path in one call to the core (the GIL
        released once): encode_batch's work where the fast path applies."""
        got = self._encoder.encode_many(texts)  # type: ignore[attr-defined]
        return [ids if ids is not None else self.encode(t, False) for t, ids in zip(texts, got)]

    def _warn_double_bos(self) -> None:
        warnings.warn(f"the text already starts with the bos text {self._bos_text!r} and add_special=True adds bos "
                      "as well (pass add_special=False, or strip it)", DoubleBosWarning, stacklevel=3)

    @property
    def _bos_text(self) -> str:
        """The bos token's text ('' without bos): the prefix that, already in a text, would give bos twice."""
        bos = self.vocab.special.get("bos")
        return self.vocab.tokens[bos] if bos is not None else ""

    def _special_control(self, text: str, parse_special: bool, allowed_special: SpecialSet | None,
                         disallowed_special: SpecialSet | None) -> frozenset[int]:
        """Ids of the control tokens to match in text (tiktoken's allowed_special); raises ArgumentError for
        a disallowed one present in text. Empty, and nothing checked, when neither argument is given."""
        if allowed_special is None and disallowed_special is None:
            return frozenset()
        v = self.vocab
        mask = int(Attr.CONTROL | Attr.UNKNOWN)
        controls = {v.tokens[i]: i for i in v.special_cache if v.attrs[i] & mask}

        def ids_of(arg: SpecialSet, name: str) -> frozenset[int]:
            if isinstance(arg, str):
                if arg != "all":
                    raise ArgumentError(f"{name} must be 'all' or a collection of token texts, got the str {arg!r}")
                return frozenset(controls.values())
            if not isinstance(arg, Iterable):
                raise ArgumentTypeError(f"{name} must be 'all' or a collection of token texts, "
                                        f"got {type(arg).__name__}")
            out = set()
            for t in arg:
                if t not in controls:
                    raise ArgumentError(f"{name}: {t!r} is not a control token of this vocab (expected one of "
                                        f"{', '.join(repr(c) for c in list(controls)[:8])}"
                                        f"{', ...' if len(controls) > 8 else ''})")
                out.add(controls[t])
            return frozenset(out)

        allowed = ids_of(allowed_special, "allowed_special") if allowed_special is not None else frozenset()
        if parse_special:
            allowed = frozenset(controls.values())
        disallowed = ids_of("all" if disallowed_special is None else disallowed_special, "disallowed_special")
        found = find_special(v, text, disallowed - allowed)
        if found is not None:
            pos, sid = found
            raise ArgumentError(f"the text holds the special token {v.tokens[sid]!r} at character {pos}, which is "
                                "disallowed: pass allowed_special={...} to encode it as that token, or "
                                "disallowed_special=() to encode it as plain text")
        return allowed

    def encode_with_offsets(self, text: str, add_special: bool = True, parse_special: bool = False, *,
                            allowed_special: SpecialSet | None = None,
                            disallowed_special: SpecialSet | None = None) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, offsets): encode()'s ids and the (start, end) character span in text of each token.

        As Hugging Face tokenizers' Encoding.offsets: tokens that cover part of a character (byte
        tokens) get that character's span; added bos/eos/[CLS]/[SEP] get (0, 0). Spans are in order and
        never overlap, but in a character whose bytes two tokens split (both spans hold it); characters no token stands for
        (WordPiece whitespace, dropped characters) lie between spans. Text with lone surrogates has no
        character offsets to give: ArgumentError.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"encode_with_offsets() takes a str, got {type(text).__name__}")
        if has_surrogates(text):
            raise ArgumentError("encode_with_offsets() needs valid Unicode text; this text holds lone surrogates "
                                "(use encode() for raw bytes)")
        allowed = self._special_control(text, parse_special, allowed_special, disallowed_special)
        v, model, pieces = self.vocab, self._encoder, self.pieces.pieces
        spans_of = SPANS[v.kind]
        before, after = model.affixes() if add_special else ((), ())
        ids: list[int] = list(before)
        offsets: list[tuple[int, int]] = [(0, 0)] * len(before)
        after_special = True
        for start, end, sid in partition_spans(v, text, parse_special, allowed):
            if sid >= 0:
                ids.append(sid)
                offsets.append((start, end))
                after_special = True
                continue
            frag = text[start:end]
            prepared = model.prepare(frag, after_special)
            fids = model.encode(prepared)
            spans = spans_of(model, pieces, frag, prepared, fids)
            ids += fids
            offsets += [(a + start, b + start) for a, b in spans]
            after_special = False
        ids += after
        offsets += [(0, 0)] * len(after)
        return ids, offsets

    def _completion(self, text: str, add_special: bool, parse_special: bool) -> tuple[list[int], list[int], str]:
        """(stable ids, the trailing ids taken off, the text they stood for): see encode_for_completion."""
        ids, offsets = self.encode_with_offsets(text, add_special, parse_special)
        n_after = len(self._encoder.affixes()[1]) if add_special else 0
        n_before = len(self._encoder.affixes()[0]) if add_special else 0
        body_end = len(ids) - n_after
        if body_end <= n_before or self.vocab.attrs[ids[body_end - 1]] & int(Attr.CONTROL | Attr.UNKNOWN):
            return ids[:body_end], [], ""
        cut = offsets[body_end - 1][0]
        if text[cut:].strip() and not text[cut].isspace():
            specials = [offsets[k][1] for k in range(n_before, body_end)
                        if self.vocab.attrs[ids[k]] & int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)]
            cut = self._last_word_start(text, max(specials, default=0), cut)
        k = body_end - 1
        while k - 1 >= n_before and offsets[k - 1][0] >= cut and \
                not self.vocab.attrs[ids[k - 1]] & int(Attr.CONTROL | Attr.UNKNOWN):
            k -= 1
        return ids[:k], ids[k:body_end], text[offsets[k][0]:]

    def _last_word_start(self, text: str, frag_start: int, pos: int) -> int:
        """Where the unstable end of text begins: for BPE the last pre-token (the regex piece the next
        characters may extend, as tiktoken's encode_with_unstable), else the last whitespace-separated word
        with the space before it (which SPM tokens carry). frag_start: where the last plain fragment starts."""
        model = self._encoder
        frag = text[frag_start:]
        if self.vocab.kind == "bpe":
            prepared = model.prepare(frag, frag_start > 0)
            words = model.words(prepared)
            if words and len(prepared) == len(frag) and "".join(words) == prepared:
                return min(pos, frag_start + len(prepared) - len(words[-1]))
        while pos > frag_start and not text[pos - 1].isspace():
            pos -= 1
        if pos > frag_start and text[pos - 1] == " ":
            pos -= 1
        return pos

    def encode_for_completion(self, text: str, add_special: bool = True,
                              parse_special: bool = False) -> tuple[list[int], str]:
        """Token healing: (ids, prefix) -- the ids of the stable part of text, and the trailing text left out.

        The end of a prompt is unstable: "The quick bro" ends in " bro", which the model would rarely
        have seen before "wn". The tokens of the last word are left out -- for BPE vocabs the last
        pre-token, which gives tiktoken's encode_with_unstable stable tokens; for the others the last
        whitespace-separated word with the space before it -- and a generation loop lets the first
        sampled tokens only spell out prefix again (generate(..., heal=True)), so the result tokenizes
        like the full word. Trailing whitespace alone is the prefix
        when the text ends with it; a character split over byte tokens is never cut; a trailing special
        token is kept (prefix ""), and the eos that add_special may append is left off (a completion
        never follows it).
        """
        ids, _, prefix = self._completion(text, add_special, parse_special)
        return ids, prefix

    def take_cache_entries(self) -> list[tuple[str, list[int]]]:
        """The word-cache entries (word, ids) this Tokenizer computed since the last call, in order; the
        first call starts the record and returns []. For process pools: another process's Tokenizer of the
        same vocab takes them with add_cache_entries instead of computing those words again."""
        return self._encoder.take_new_entries()

    def add_cache_entries(self, entries: Iterable[tuple[str, list[int]]]) -> None:
        """Put entries from take_cache_entries() of a Tokenizer of this same vocab into this one's word cache
        (words it holds already stay). Ids do not change: an entry is what encoding its word computes."""
        self._encoder.add_entries(entries)

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None, *, add_special: bool = True,
                     parse_special: bool = False, return_array: bool = False,
                     pad_to: Literal["longest"] | int | None = None, truncate: int | None = None,
                     pad_id: int | None = None,
                     padding_side: PaddingSide | None = None) -> list[list[int]] | tuple[np.ndarray, np.ndarray]:
        """encode() of every text, in order, on a pool of num_threads threads sharing this Tokenizer.

        num_threads=None uses os.cpu_count() threads; 1 (or a single text) encodes in this thread.
        The threads share one set of caches, so words seen by one are not recomputed by another. On the
        native backend (Tokenizer.backend) the core releases the GIL while it encodes, so the threads
        really run in parallel; the pure-Python path holds the GIL and runs at about the speed of a plain
        loop (free-threaded builds aside). Each thread takes a few contiguous runs of texts, not one text
        at a time. Results equal [encode(t) for t in texts].

        For embedding models (as HF tokenizers' enable_truncation/enable_padding): truncate=N keeps at
        most N ids per text, the added bos/eos/[CLS]/[SEP] included and kept; return_array=True returns
        (ids, attention_mask), two int32 arrays of shape (len(texts), length), padded on padding_side
        ("right", or "left" for generation; default tok.padding_side) with pad_id (default: tok.pad_id;
        ArgumentError when there is none) to the longest text (pad_to="longest") or to pad_to=N ids. Without
        pad_to all texts must give the same length.
        """
        texts, num_threads = _batch_texts(texts, num_threads)
        side = check_padding_side(self.padding_side if padding_side is None else padding_side)
        if pad_to is not None and not return_array:
            raise ArgumentError("pad_to needs return_array=True (lists need no padding)")
        if pad_id is not None and pad_to is None:
            raise ArgumentError("pad_id is given but pad_to is not: pass pad_to='longest' or a length")
        before, after = self._truncation_affixes(truncate, add_special)
        if pad_to is not None:
            pad_id = self._pad_id(pad_to, pad_id)
        # add_special is applied after truncation so that the affixes are kept
        inner_special = add_special and truncate is None
        num_threads = min(num_threads, len(texts))
        fast = self._plain is not None and not parse_special  # the core encodes each run in one call
        encode_run = self._encode_run if fast else \
            (lambda run: [self.encode(t, inner_special, parse_special) for t in run])
        if num_threads <= 1:
            out = encode_run(texts)
        else:
            # runs of texts, not single texts: a task per text would cost more than a short text's encode
            step = -(-len(texts) // (num_threads * _RUNS_PER_THREAD))
            runs = [texts[i:i + step] for i in range(0, len(texts), step)]
            with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="minillama-encode") as pool:
                out = [ids for part in pool.map(encode_run, runs) for ids in part]
        if fast and inner_special:  # as encode(t, add_special=True) does
            if self._warn_bos and any(t.startswith(self._warn_bos) for t in texts):
                self._warn_double_bos()
            before, after = self._encoder.affixes()
            if before or after:
                out = [[*before, *ids, *after] for ids in out]
        if truncate is not None:
            if add_special and self._warn_bos and any(t.startswith(self._warn_bos) for t in texts):
                self._warn_double_bos()
            room = truncate - len(before) - len(after)
            out = [before + ids[:room] + after for ids in out]
        if not return_array:
            return out
        return _batch_arrays(out, pad_to, pad_id, side)

    def _truncation_affixes(self, truncate: int | None, add_special: bool) -> tuple[list[int], list[int]]:
        """encode_batch's check of truncate, and the ids add_special adds around each truncated text."""
        before: list[int] = []
        after: list[int] = []
        if truncate is None:
            return before, after
        if isinstance(truncate, bool) or not isinstance(truncate, int):
            raise ArgumentTypeError(f"truncate must be an int or None, got {type(truncate).__name__}")
        if add_special:
            before, after = self._encoder.affixes()
        if truncate < len(before) + len(after):
            raise ArgumentError(f"truncate={truncate} leaves no room for the {len(before) + len(after)} ids "
                                "add_special adds")
        return before, after

    def _pad_id(self, pad_to: Literal["longest"] | int, pad_id: int | None) -> int:
        """encode_batch's padding id (the vocab's pad token by default), pad_to checked."""
        if pad_id is None:
            pad_id = self.pad_id
            if pad_id is None:
                raise ArgumentError("this vocab has no pad token (tokenizer.ggml.padding_token_id): pass "
                                    "pad_id=<an id> to pad with, e.g. pad_id=tok.eos_id, or set tok.pad_id")
        pad_id = check_id(pad_id, self.vocab.n_vocab)
        if pad_to != "longest" and (isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 0):
            raise ArgumentError(f"pad_to must be None, 'longest' or a length >= 0, got {pad_to!r}")
        return pad_id

    # --- vocab ------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        """The id of a token text as the vocab writes it ("Ġworld", "▁world", "##ing"), or None."""
        return self.vocab.token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The token text of an id as the vocab writes it (not its decoded bytes: see token_to_piece)."""
        return self.vocab.tokens[check_id(token_id, self.vocab.n_vocab)]

    def get_vocab(self) -> dict[str, int]:
        """Every token text with its id (a new dict; HF tokenizers' get_vocab(with_added_tokens=True))."""
        return dict(self.vocab.token_to_id)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """HF tokenizers' get_vocab_size(with_added_tokens=True): every token, n_vocab. A GGUF does not record
        which tokens were added to the model's own, so with_added_tokens=False is refused."""
        if not with_added_tokens:
            raise ArgumentError("get_vocab_size(with_added_tokens=False): a GGUF does not record which tokens "
                                "were added to the model's vocab, expected with_added_tokens=True (n_vocab)")
        return self.vocab.n_vocab

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """transformers' convert_ids_to_tokens: the token text of one id, or of each id in a sequence;
        skip_special_tokens leaves out control and unknown tokens (bos, eos, <|...|>)."""
        if not isinstance(ids, (str, bytes)) and not isinstance(ids, Iterable):
            return self.id_to_token(ids)  # type: ignore[arg-type]
        mask = int(Attr.CONTROL | Attr.UNKNOWN) if skip_special_tokens else 0
        tokens, attrs = self.vocab.tokens, self.vocab.attrs
        return [tokens[i] for i in self._check_ids(ids) if not attrs[check_id(i, self.vocab.n_vocab)] & mask]

    # --- decoding ---------------------------------------------------------------------------
    @property
    def pieces(self) -> PieceTable:
        """Every token's bytes, computed on first use."""
        table = self._pieces
        if table is None:
            with self._lock:
                table = self._pieces
                if table is None:  # the core joins pieces where it encodes
                    core = native_core("auto") if self._encoder.backend == "native" else None
                    table = self._pieces = PieceTable(self.vocab, core)
        return table

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        """ids as a list, all of them non-negative (decode's table lookup reports ids too large)."""
        if isinstance(ids, (str, bytes)):
            raise ArgumentTypeError(f"token ids must be a sequence of int, got {type(ids).__name__}")
        if not isinstance(ids, list):
            if isinstance(ids, (AbstractSet, Mapping)):  # no order: the text would be a guess
                raise ArgumentTypeError(f"token ids must be a sequence of int in order, got a {type(ids).__name__}")
            if not isinstance(ids, Iterable):
                raise ArgumentTypeError(f"token ids must be a sequence of int, got {type(ids).__name__}")
            try:
                ids = [i.__index__() for i in ids]  # tuples, numpy arrays, generators
            except (AttributeError, TypeError):
                raise ArgumentTypeError(f"token ids must be a sequence of int, got a {type(ids).__name__} "
                                        "holding other values") from None
        if ids:
            try:
                lo = min(ids)
                negative = lo < 0
            except TypeError:
                for i in ids:
                    check_id(i, self.vocab.n_vocab)
                raise
            if negative:
                raise out_of_range(lo, self.vocab.n_vocab)
        return ids

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes of one token (control/unknown tokens empty unless special)."""
        token_id = check_id(token_id, self.vocab.n_vocab)
        table = self.pieces
        return table.pieces[token_id] if special else table.pieces_plain[token_id]

    def decode_bytes(self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False, *,
                     skip_special_tokens: bool | None = None) -> bytes:
        """llama_detokenize(ids, remove_special, unparse_special) as bytes.

        skip_special_tokens (HF's name, the same in every decode call and stream_decoder) sets both flags:
        True drops the added bos/eos and writes control tokens as nothing, False writes every token's text.
        """
        remove_special, unparse_special = skip_flags(skip_special_tokens, remove_special, unparse_special)
        table = self.pieces
        if type(ids) is list and (out := table.detokenize_native(ids, remove_special, unparse_special)) is not None:
            return out
        return table.detokenize(self._check_ids(ids), remove_special, unparse_special)

    def decode(self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False, *,
               skip_special_tokens: bool | None = None) -> str:
        """decode_bytes as text; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, remove_special, unparse_special,
                                 skip_special_tokens=skip_special_tokens).decode("utf-8", "replace")

    def decode_batch(self, batch: Iterable[Iterable[int]], remove_special: bool = False,
                     unparse_special: bool = False, *, skip_special_tokens: bool | None = None) -> list[str]:
        """decode() of every sequence of ids, in order (rows of an array too)."""
        if isinstance(batch, (str, bytes)):
            raise ArgumentTypeError(f"decode_batch() takes a sequence of id sequences, got {type(batch).__name__}")
        return [self.decode(ids, remove_special, unparse_special, skip_special_tokens=skip_special_tokens)
                for ids in batch]

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """transformers' batch_decode: decode() of every sequence, every token's text written out unless
        skip_special_tokens."""
        return self.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """tiktoken's decode_single_token_bytes: the bytes of one token, a control token's text included."""
        return self.token_to_piece(token, special=True)

    # --- chat -------------------------------------------------------------------------------
    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
                            tools: Sequence[Any] | None = None, documents: Sequence[Any] | None = None,
                            chat_template: str | None = None, add_generation_prompt: bool = False,
                            continue_final_message: bool | str = False, tokenize: bool = True,
                            sanitize_control_tokens: bool = False, padding: bool | str = False,
                            truncation: bool = False, max_length: int | None = None,
                            return_tensors: str | None = None, return_dict: bool = True,
                            return_assistant_tokens_mask: bool = False,
                            tokenizer_kwargs: Mapping[str, Any] | None = None,
                            **kwargs: Any) -> str | list[str] | list[int] | list[list[int]] | BatchEncoding:
        """transformers 5.23's apply_chat_template: the same parameters, defaults and results.

        The conversation (or a list of them) is rendered with tok.chat_template (or chat_template=) in the
        Jinja2 sandbox minillama chat uses, with tools, documents, the special-token texts and **kwargs as
        variables. tokenize=False returns the text; tokenize=True (the default) encodes it as tok(text,
        add_special_tokens=False, ...) does -- control tokens matched, no bos but the template's own -- and
        returns a BatchEncoding (return_dict=True, the default) or the ids. continue_final_message leaves the
        last message open for the model to continue. A keyword argument that is neither a parameter nor a
        variable the template reads is refused (ArgumentError naming it), as are the options minillama does
        not implement (sanitize_control_tokens, return_assistant_tokens_mask: UnsupportedError).
        """
        source = chat_template if chat_template is not None else self.chat_template
        if source is None:
            raise MinillamaError("this vocab has no chat template (tokenizer.chat_template): pass chat_template='...' "
                                 "or set tok.chat_template")
        for name, value in (("sanitize_control_tokens", sanitize_control_tokens),
                            ("return_assistant_tokens_mask", return_assistant_tokens_mask)):
            if value:
                raise UnsupportedError(f"apply_chat_template({name}=True) is not implemented, expected False")
        if continue_final_message and add_generation_prompt:
            raise ArgumentError("continue_final_message and add_generation_prompt exclude each other: the first "
                                "continues the last message, the second starts a new assistant message")
        # ChatTemplateError when the template does not compile, fails or passes a limit; ChatTemplateRefused
        # (also an ArgumentError) when its raise_exception() refuses the conversation
        tmpl = self.build_chat_template(source)
        check_template_kwargs(kwargs, source)
        chats, batched = conversations(conversation)
        rendered = []
        for chat in chats:
            final = open_final_message(chat, continue_final_message, source) if continue_final_message else None
            text = tmpl.render(chat, add_generation_prompt, tools=tools, documents=documents, **kwargs)
            rendered.append(text if final is None else cut_after_final(text, final))
        if not tokenize:
            return rendered if batched else rendered[0]
        enc = self(rendered if batched else rendered[0], add_special_tokens=False, padding=padding,
                   truncation=truncation or None, max_length=max_length, return_tensors=return_tensors,
                   **dict(tokenizer_kwargs or {}))
        return enc if return_dict else enc["input_ids"]

    def stream_decoder(self, skip_special_tokens: bool = True, *, skip_special: bool | None = None) -> StreamDecoder:
        """A decoder for one generated sequence: push(id) -> new text, flush() -> the rest.

        skip_special_tokens=True renders control tokens as nothing, like decode(unparse_special=False).
        skip_special is its old name, kept as a deprecated alias.
        """
        if skip_special is not None:
            warnings.warn("stream_decoder(skip_special=...) is deprecated: use skip_special_tokens=..., the name "
                          "decode and batch_decode take", DeprecationWarning, stacklevel=2)
            skip_special_tokens = skip_special
        return StreamDecoder(self.pieces, skip_special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"

    def build_chat_template(self, source: str | None = None) -> ChatTemplate | None:
        """source (default: tok.chat_template) as a ChatTemplate given this vocab's special-token texts and
        add_bos, or None when there is no template; ChatTemplateError when it does not compile."""
        from ..chat_template import SPECIAL_TOKEN_VARS, ChatTemplate

        source = self.chat_template if source is None else source
        if source is None:
            return None
        special = {var: self.token_to_piece(self.vocab.special[name], special=True).decode("utf-8", "replace")
                   for var, name in SPECIAL_TOKEN_VARS.items() if self.vocab.special.get(name) is not None}
        return ChatTemplate(source, bos_token=special.get("bos_token", ""), eos_token=special.get("eos_token", ""),
                            special_tokens=special, add_bos=self.add_bos)


# --- files: the calls `minillama inspect` and the CLI need, so that they import nothing below this face ------

def sniff_format(path: str | os.PathLike[str]) -> tuple[str, str, int]:
    """(path checked as an input file, its format's name -- 'gguf', 'sentencepiece', 'tokenizer.json' or
    'llama2.c' -- and its size), told apart by content; FormatError for an empty or unrecognised file."""
    from .formats import sniff_file

    path, fmt, size = sniff_file(path)
    return path, fmt.name, size


def format_display(name: str) -> str:
    """How `inspect` shows a format name ('GGUF', 'SentencePiece model', ...); the name itself when unknown."""
    from .formats import FORMATS

    return next((f.display for f in FORMATS if f.name == name), name)


def special_id_keys() -> dict[str, str]:
    """Each special-token role and the GGUF key of its id ('bos' -> 'tokenizer.ggml.bos_token_id'), in the
    order llama.cpp lists them."""
    from .tables import SPECIAL_ID_KEY

    return dict(SPECIAL_ID_KEY)


def vocab_piece(vocab: Vocab, token_id: int) -> bytes:
    """llama_token_to_piece(token_id, special=True) from a Vocab alone: no Tokenizer (nor encoder) is built,
    so a vocab whose encoder could not be made still shows its special pieces."""
    from .decode import piece_of

    return piece_of(vocab, token_id)


def padding_added(metadata: Mapping[str, Any]) -> int:
    """How many [PAD] tokens reading a tokenizer.json added to reach the vocab_size of the config.json beside
    it, as llama.cpp's converter does (0: none)."""
    from .formats.hf_json import PADDING_KEY

    return int(metadata.get(PADDING_KEY) or 0)


__all__ += ["read_metadata", "model_file", "sniff_format", "format_display", "special_id_keys", "vocab_piece",
            "padding_added"]
