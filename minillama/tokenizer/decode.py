"""From ids back to bytes: every token's piece precomputed once in one arena, llama_detokenize's rules.

A piece is what llama.cpp's llama_token_to_piece(special=True) gives: byte tokens their byte,
SPM tokens with U+2581 as spaces, byte-level BPE tokens mapped back through GPT-2's byte table,
control/user-defined/unknown tokens their text. Decoding is a join over a table of those pieces.
"""

from __future__ import annotations

import re

import numpy as np

from .unicode import BYTE_TO_CHAR
from .vocab import Attr, Vocab

_SPECIAL = int(Attr.UNKNOWN | Attr.CONTROL)
_RAW = int(Attr.UNKNOWN | Attr.CONTROL | Attr.USER_DEFINED)
_BYTELEVEL_TO_LATIN1 = {ord(c): b for b, c in enumerate(BYTE_TO_CHAR)}

# llama.cpp's clean_up_tokenization_spaces passes, applied in order.
_CLEAN = (
    (re.compile(rb" (?=[?!.,])"), b""),
    (re.compile(rb" ' "), b"'"),
    (re.compile(rb" (?='(?:[sm]|re|ve))"), b""),
)


def _token_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _bytelevel_decode(text: str) -> bytes:
    """GPT-2 byte-level text back to bytes; characters outside the table as llama.cpp renders them."""
    try:
        return text.translate(_BYTELEVEL_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in text:
            b = _BYTELEVEL_TO_LATIN1.get(ord(ch))
            if b is not None:
                out.append(b)
            else:
                utf8 = "\ufffd".encode() if 0xDC80 <= ord(ch) <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
                out += b"[UNK_BYTE_0x" + utf8.hex().encode() + _token_bytes(text) + b"]"
        return bytes(out)


def _byte_value(text: str) -> int:
    try:
        return int(text[3:5], 16)
    except ValueError:
        return 0


def piece_of(vocab: Vocab, i: int) -> bytes:
    """llama_token_to_piece(i, special=True), computed from the vocab."""
    text, attr = vocab.tokens[i], vocab.attrs[i]
    if attr & _RAW:
        return _token_bytes(text)
    if attr & Attr.NORMAL:
        if vocab.model == "bpe" and not vocab.escape_whitespaces:
            return _bytelevel_decode(text)
        return _token_bytes(text.replace("\u2581", " "))
    if attr & Attr.BYTE:
        return bytes([_byte_value(text)])
    return b""


class PieceTable:
    """All pieces in one bytes arena with offsets, plus the per-id lookups decoding needs."""

    def __init__(self, vocab: Vocab) -> None:
        pieces = [piece_of(vocab, i) for i in range(vocab.n_vocab)]
        self.arena = b"".join(pieces)
        self.offsets = np.zeros(len(pieces) + 1, np.int64)
        np.cumsum([len(p) for p in pieces], out=self.offsets[1:])
        self.pieces = pieces  # the arena's slices, kept as objects so decode is one join
        self.pieces_plain = [b"" if a & _SPECIAL else p for p, a in zip(pieces, vocab.attrs, strict=True)]
        self.vocab = vocab

    def piece(self, i: int) -> bytes:
        o = self.offsets
        return self.arena[o[i]:o[i + 1]]

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        """llama_detokenize: pieces joined, the dummy prefix space removed, spaces cleaned up."""
        v = self.vocab
        bos, eos = v.special.get("bos"), v.special.get("eos")
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == eos:
            ids = ids[:-1]
        if not ids:
            return b""
        table = self.pieces if unparse_special else self.pieces_plain
        out = b"".join([table[i] for i in ids])
        if remove_space and table[ids[0]][:1] == b" ":
            out = out[1:]
        if v.clean_spaces:
            for rx, repl in _CLEAN:
                out = rx.sub(repl, out)
        return out
