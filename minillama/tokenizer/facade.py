"""The Tokenizer facade: a vocab plus its encoder, with llama.cpp's encode / decode and the Hugging Face,
transformers and tiktoken calls over them (see minillama.tokenizer's docstring for what it promises).

The work is done below it: special-token splitting and control (special.py), the encoders (encoders/),
character offsets (offsets.py), token healing (healing.py), batches and padding (batch.py), decoding
(decode.py), transformers' shapes (hf_api.py). Those modules never import this one.
"""

from __future__ import annotations

import gc
import os
import threading
import warnings
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..backend import native_core
from ..errors import ArgumentError, ArgumentTypeError, DoubleBosWarning, MinillamaError, UnsupportedError
from ..fileio import input_path
from .batch import (
    batch_arrays,
    batch_texts,
    check_padding_args,
    encode_in_runs,
    padding_id,
    truncation_affixes,
    with_affixes,
)
from .decode import PieceTable, StreamDecoder, check_id, check_ids
from .encoders import Encoder, make_encoder
from .formats import model_file, read_metadata
from .healing import completion
from .hf_api import (
    BatchEncoding,
    PaddingSide,
    as_tensors,
    check_max_length,
    check_padding_side,
    conversations,
    cut_after_final,
    open_final_message,
    pad,
    skip_flags,
)
from .offsets import SPANS
from .special import SpecialSet, always_matched, partition, partition_spans, raw_special_ids, special_control
from .text import ESCAPES, as_bytes_text, has_surrogates
from .vocab import Attr, Vocab

if TYPE_CHECKING:
    from ..chat_template import ChatTemplate

_GC_PAUSE_CHARS = 1 << 14  # texts longer than this encode with the cyclic GC paused

_NONE: frozenset[int] = frozenset()


class Tokenizer:
    """A vocab plus its encoder: llama_tokenize / llama_detokenize / llama_token_to_piece in Python."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._encoder: Encoder = make_encoder(vocab)
        self._raw_special = raw_special_ids(vocab)
        self._pieces: PieceTable | None = None
        self._lock = threading.Lock()
        self._warn_bos = self._bos_text if vocab.add_bos else ""  # text whose presence means a double bos
        self.padding_side: PaddingSide = "right"  # transformers' attribute: where padding goes by default
        self._pad_override: int | None = None  # tok.pad_id = ... (the vocab's pad token otherwise)
        self._template_override: tuple[str | None] | None = None  # tok.chat_template = ...
        # The fast path of encode (one call into the native core, no special-token search): where the encoder has
        # one and no special token is matched in plain text (no user-defined ones, none cutting a character).
        plain = getattr(self._encoder, "encode_plain", None)
        self._plain = plain if plain is not None and not always_matched(vocab) and not self._raw_special else None
        self._flat = getattr(self._encoder, "encode_flat", None) if self._plain is not None else None

    def __reduce__(self) -> tuple:
        """Pickle as the vocab's tables alone (process pools, Ray actors): the encoder, its word caches,
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
        vocab = Vocab.from_metadata(read_metadata(path, lazy=True), path)
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
    def kind(self) -> str:
        """The tokenizer kind: 'spm' (SentencePiece scores), 'bpe' (merges), 'wpm' (WordPiece) or 'ugm' (Unigram):
        llama.cpp's vocab types, which its `tokenizer.ggml.model` values name ('llama'; 'gpt2' and 'gemma4';
        'bert'; 't5'). It says which encoder runs."""
        return self.vocab.kind

    @property
    def model(self) -> str:
        """`kind` under its older name (after `tokenizer.ggml.model`); the forward pass is minillama.model.Model."""
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
        """The beginning-of-sequence id (None when the vocab has none)."""
        return self.vocab.special.get("bos")

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id (None when the vocab has none)."""
        return self.vocab.special.get("eos")

    @property
    def eot_id(self) -> int | None:
        """The end-of-turn id (None when the vocab has none)."""
        return self.vocab.special.get("eot")

    @property
    def unk_id(self) -> int | None:
        """The unknown-token id (None when the vocab has none)."""
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

    # --- transformers' and tiktoken's names for the same facts ---------------------------------------------------
    def __len__(self) -> int:
        """transformers' len(tokenizer): every token, added ones included (n_vocab)."""
        return self.vocab.n_vocab

    @property
    def vocab_size(self) -> int:
        """transformers' vocab_size. transformers leaves out tokens added to a model's own vocab (llama 3.2's
        tokenizer.json: 128,000 of 128,256); a GGUF does not record which those are, so this is n_vocab, the
        rows of the model's embedding and output."""
        return self.vocab.n_vocab

    @property
    def max_token_value(self) -> int:
        """tiktoken's max_token_value: the highest id (n_vocab - 1)."""
        return self.vocab.n_vocab - 1

    def _special_text(self, role: str) -> str | None:
        token_id = self.vocab.special.get(role)
        return None if token_id is None else self.vocab.tokens[token_id]

    @property
    def bos_token_id(self) -> int | None:
        """transformers' bos_token_id (bos_id)."""
        return self.vocab.special.get("bos")

    @property
    def eos_token_id(self) -> int | None:
        """transformers' eos_token_id (eos_id)."""
        return self.vocab.special.get("eos")

    @property
    def unk_token_id(self) -> int | None:
        """transformers' unk_token_id (unk_id)."""
        return self.vocab.special.get("unk")

    @property
    def sep_token_id(self) -> int | None:
        """transformers' sep_token_id (WordPiece's [SEP])."""
        return self.vocab.special.get("sep")

    @property
    def mask_token_id(self) -> int | None:
        """transformers' mask_token_id (WordPiece's [MASK])."""
        return self.vocab.special.get("mask")

    @property
    def pad_token_id(self) -> int | None:
        """transformers' pad_token_id: pad_id, settable the same way."""
        return self.pad_id

    @pad_token_id.setter
    def pad_token_id(self, token_id: int | None) -> None:
        self.pad_id = token_id

    @property
    def bos_token(self) -> str | None:
        """transformers' bos_token: the bos token's text ("<|begin_of_text|>", "<s>"), None when there is none."""
        return self._special_text("bos")

    @property
    def eos_token(self) -> str | None:
        """transformers' eos_token: the eos token's text, None when there is none."""
        return self._special_text("eos")

    @property
    def unk_token(self) -> str | None:
        """transformers' unk_token: the unknown token's text, None when there is none."""
        return self._special_text("unk")

    @property
    def sep_token(self) -> str | None:
        """transformers' sep_token: the separator token's text, None when there is none."""
        return self._special_text("sep")

    @property
    def mask_token(self) -> str | None:
        """transformers' mask_token: the mask token's text, None when there is none."""
        return self._special_text("mask")

    @property
    def pad_token(self) -> str | None:
        """transformers' pad_token: the text of pad_id's token. Settable with a token's text, as transformers
        users write tok.pad_token = tok.eos_token (None: the vocab's own pad token again)."""
        token_id = self.pad_id
        return None if token_id is None else self.vocab.tokens[token_id]

    @pad_token.setter
    def pad_token(self, token: str | None) -> None:
        if token is None:
            self.pad_id = None
            return
        if not isinstance(token, str):
            raise ArgumentTypeError(f"pad_token must be a token's text (str) or None, got {type(token).__name__}")
        token_id = self.vocab.token_to_id.get(token)
        if token_id is None:
            raise ArgumentError(f"pad_token must be a token of this vocab, got {token!r}, which is none")
        self.pad_id = token_id

    def is_eog(self, token_id: int) -> bool:
        """True for ids that end generation (eos, eot, eom and the ids llama.cpp recognises by text)."""
        return token_id in self.vocab.eog_ids

    # --- encoding ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False, *,
               allowed_special: SpecialSet | None = None, disallowed_special: SpecialSet | None = None,
               truncation: bool = False, max_length: int | None = None,
               add_special_tokens: bool | None = None) -> list[int]:
        """llama_tokenize(text, add_special, parse_special): ids for text.

        add_special_tokens (transformers' name) gives transformers' encode: add_special=add_special_tokens and
        control tokens written in the text matched (parse_special=True), as tok(text) does.

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
        minillama.tokenizer's docstring). For byte-level BPE and byte-fallback SPM vocabs,
        ``decode(encode(s, add_special=False)) == s`` for every valid str s, up to llama.cpp's
        clean-up of spaces before punctuation in vocabs that ask for it, and for SPM, U+2581 (which
        is its space marker) and the space llama.cpp adds after a special token.
        """
        if add_special_tokens is not None:
            if not add_special:
                raise ArgumentError("pass add_special_tokens (transformers' name) or add_special, not both (got "
                                    f"add_special=False, add_special_tokens={add_special_tokens!r})")
            add_special, parse_special = bool(add_special_tokens), True
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
        v, encoder = self.vocab, self._encoder
        before, after = encoder.affixes() if add_special else ((), ())
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
                    frag = encoder.prepare(frag, after_special)
                    if escaped or (raw and ESCAPES.search(frag)):  # a special token cut a character
                        out += encoder.encode_escaped(frag)
                    else:
                        out += encoder.encode(frag)
                    after_special = False
        finally:
            if pause_gc:
                gc.enable()
        out += after
        return out

    def _encode_truncated(self, text: str, add_special: bool, parse_special: bool, max_length: int | None,
                          **special: Any) -> list[int]:
        """encode() cut to max_length ids, the ids add_special adds kept (HF's truncation)."""
        before, after = truncation_affixes(self._encoder, max_length, add_special)
        if add_special and self._warn_bos and text.startswith(self._warn_bos):
            self._warn_double_bos()
        ids = self.encode(text, False, parse_special, **special)
        if max_length is None:
            return before + ids + after
        return before + ids[:max_length - len(before) - len(after)] + after

    def encode_ordinary(self, text: str) -> list[int]:
        """tiktoken's encode_ordinary: the ids of text with special tokens as plain text and no bos/eos added."""
        return self.encode(text, add_special=False, parse_special=False)

    def encode_ordinary_batch(self, text: Iterable[str], *, num_threads: int = 8) -> list[list[int]]:
        """tiktoken's encode_ordinary_batch: encode_ordinary of every text, in order, on num_threads threads."""
        return self.encode_batch(text, num_threads, add_special=False, parse_special=False)  # type: ignore[return-value]

    def __call__(self, text: str | Sequence[str], *, add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | None = None, max_length: int | None = None, return_tensors: str | None = None,
                 padding_side: PaddingSide | None = None, return_attention_mask: bool = True,
                 return_offsets_mapping: bool = False) -> BatchEncoding:
        """transformers' tokenizer(text): a BatchEncoding of input_ids and attention_mask, for one text (lists of
        ids) or a list of texts (lists of lists). Control tokens written in the text are matched, as
        transformers matches added tokens; add_special_tokens adds bos/eos as the vocab says. padding=True /
        'longest' / 'max_length' pads with pad_id on padding_side (default tok.padding_side); truncation=True
        with max_length cuts each text's ids; return_tensors='np' gives int64 arrays with a batch axis.
        return_offsets_mapping=True adds "offset_mapping": each token's (start, end) character span in its
        text, as encode_with_offsets gives it ((0, 0) for added bos/eos and padding)."""
        batched = not isinstance(text, str)
        if batched and (isinstance(text, bytes) or not isinstance(text, Sequence)):
            raise ArgumentTypeError(f"tokenizer() takes a str or a list of str, got {type(text).__name__}")
        side = check_padding_side(self.padding_side if padding_side is None else padding_side)
        cut = check_max_length(truncation, max_length)
        texts = list(text) if batched else [text]
        spans: list[list[tuple[int, int]]] = []
        if return_offsets_mapping:
            rows = []
            for t in texts:
                ids, offs = self._encode_spans(t, add_special_tokens, cut)
                rows.append(ids)
                spans.append(offs)
        else:
            rows = [self._encode_truncated(t, add_special_tokens, True, cut) if cut is not None
                    else self.encode(t, add_special_tokens, True) for t in texts]
        rows, masks = pad(rows, padding, max_length, self.pad_id, side)
        enc = {"input_ids": rows if batched else rows[0]}
        if return_attention_mask:
            enc["attention_mask"] = masks if batched else masks[0]
        enc = as_tensors(enc, return_tensors, batched)
        if return_offsets_mapping:
            padded = [[(0, 0)] * (len(r) - len(o)) + o if side == "left" else o + [(0, 0)] * (len(r) - len(o))
                      for r, o in zip(rows, spans)]
            enc["offset_mapping"] = (padded if batched else padded[0]) if return_tensors is None \
                else np.array(padded, dtype=np.int64).reshape(len(padded), -1, 2)
        return BatchEncoding(enc)

    def _encode_spans(self, text: str, add_special: bool, cut: int | None) -> tuple[list[int], list[tuple[int, int]]]:
        """tok(text)'s ids (control tokens matched, cut to `cut` ids as _encode_truncated cuts them) with each
        token's character span."""
        if cut is None:
            return self.encode_with_offsets(text, add_special, True)
        before, after = truncation_affixes(self._encoder, cut, add_special)
        ids, offs = self.encode_with_offsets(text, False, True)
        keep = cut - len(before) - len(after)
        return before + ids[:keep] + after, [(0, 0)] * len(before) + offs[:keep] + [(0, 0)] * len(after)

    def _encode_run(self, texts: list[str]) -> list[list[int]]:
        """encode(t, add_special=False) of each text, through the fast path in one call to the core (the GIL
        released once): encode_batch's work where the fast path applies."""
        got = self._encoder.encode_many(texts)  # type: ignore[attr-defined]
        return [ids if ids is not None else self.encode(t, False) for t, ids in zip(texts, got)]

    def encodes_in_core(self, parse_special: bool = False) -> bool:
        """Whether encode_concat(..., parse_special) runs in the native core with the GIL released for the whole
        call: then threads sharing this Tokenizer encode in parallel (else they take turns holding the GIL)."""
        return self._flat is not None and not parse_special

    def encode_concat(self, texts: Sequence[str], add_special: bool = True, parse_special: bool = False,
                      suffix: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """encode(t, add_special, parse_special) + suffix of every text, concatenated: (ids, ends), int32 ids and
        the int64 end of each text's ids in them. Where encodes_in_core(parse_special), one call to the native
        core with the GIL released does it all, with no list of ints made per text (minillama dataset's
        batches); else, and for a text that call leaves to encode (lone surrogates), each text is encoded."""
        texts = list(texts)
        suffix = list(suffix)
        if self.encodes_in_core(parse_special):
            before, after = self._encoder.affixes() if add_special else ((), ())
            # the core checks each text is a str (else None: the loop below) and whether one starts with the bos
            # text, with no Python run per text (threads encoding batches would take turns holding the GIL for it)
            got = self._flat(texts, list(before), [*after, *suffix], self._warn_bos if add_special else "")  # type: ignore[misc]
            if got is not None:
                if got[2]:
                    self._warn_double_bos()
                return np.frombuffer(got[0], np.int32), np.frombuffer(got[1], np.int64)
        ids = array("i")  # 4 bytes an id kept, not a list's 8
        ends = np.empty(len(texts), np.int64)
        for i, t in enumerate(texts):
            ids.fromlist(self.encode(t, add_special, parse_special))
            ids.fromlist(suffix)
            ends[i] = len(ids)
        return np.frombuffer(ids, np.int32), ends

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
        """Ids of the control tokens to match in text (tiktoken's allowed_special): see special.special_control."""
        return special_control(self.vocab, text, parse_special, allowed_special, disallowed_special)

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
        v, encoder, pieces = self.vocab, self._encoder, self.pieces.pieces
        spans_of = SPANS[v.kind]
        before, after = encoder.affixes() if add_special else ((), ())
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
            prepared = encoder.prepare(frag, after_special)
            fids = encoder.encode(prepared)
            spans = spans_of(encoder, pieces, frag, prepared, fids)
            ids += fids
            offsets += [(a + start, b + start) for a, b in spans]
            after_special = False
        ids += after
        offsets += [(0, 0)] * len(after)
        return ids, offsets

    def _completion(self, text: str, add_special: bool, parse_special: bool) -> tuple[list[int], list[int], str]:
        """(stable ids, the trailing ids taken off, the text they stood for): see encode_for_completion."""
        ids, offsets = self.encode_with_offsets(text, add_special, parse_special)
        return completion(self._encoder, self.vocab, text, ids, offsets, add_special)

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
        texts, num_threads = batch_texts(texts, num_threads)
        side = check_padding_side(self.padding_side if padding_side is None else padding_side)
        check_padding_args(return_array, pad_to, pad_id)
        before, after = truncation_affixes(self._encoder, truncate, add_special)
        if pad_to is not None:
            pad_id = padding_id(pad_to, pad_id, self.pad_id, self.vocab.n_vocab)
        # add_special is applied after truncation so that the affixes are kept
        inner_special = add_special and truncate is None
        fast = self._plain is not None and not parse_special  # the core encodes each run in one call
        encode_run = self._encode_run if fast else \
            (lambda run: [self.encode(t, inner_special, parse_special) for t in run])
        out = encode_in_runs(encode_run, texts, num_threads)
        # the ids add_special adds, added here where encode did not add them (as encode(t, add_special=True))
        if add_special and (fast or truncate is not None) and self._warn_bos \
                and any(t.startswith(self._warn_bos) for t in texts):
            self._warn_double_bos()
        if truncate is not None:
            out = with_affixes(out, before, after, truncate)
        elif fast and add_special:
            out = with_affixes(out, *self._encoder.affixes())
        if not return_array:
            return out
        return batch_arrays(out, pad_to, pad_id, side)

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

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | None | list[int | None]:
        """transformers' convert_tokens_to_ids: the id of one token text, or of each in a sequence; a text that
        is no token gives unk_token_id (None when the vocab has no unknown token), as transformers does."""
        lookup, unk = self.vocab.token_to_id, self.unk_token_id
        if isinstance(tokens, str):
            return lookup.get(tokens, unk)
        if isinstance(tokens, bytes) or not isinstance(tokens, Iterable):
            raise ArgumentTypeError(f"convert_tokens_to_ids() takes a str or a sequence of str, got "
                                    f"{type(tokens).__name__}")
        return [lookup.get(t, unk) for t in tokens]

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """transformers' tokenize: the token texts of tok(text) ("Ġworld", "▁world", "##s"), control tokens
        written in the text matched and, by default, no bos/eos added."""
        return self.convert_ids_to_tokens(self.encode(text, add_special_tokens, True))  # type: ignore[return-value]

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
        return check_ids(ids, self.vocab.n_vocab)

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
        last message open for the model to continue. Any other keyword argument is a template variable, read or
        not (e.g. enable_thinking=False), as transformers passes them; the options minillama does not implement
        (sanitize_control_tokens, return_assistant_tokens_mask) raise UnsupportedError.
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
        return f"Tokenizer(kind={self.kind!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"

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
