"""From ids back to bytes: every token's piece precomputed once in a table, llama_detokenize's rules.

A piece is what llama.cpp's llama_token_to_piece(special=True) gives: byte tokens their byte,
SPM tokens with U+2581 as spaces, byte-level BPE tokens mapped back through GPT-2's byte table,
control/user-defined/unknown tokens their text. Decoding is a join over a table of those pieces.
"""

from __future__ import annotations

import operator
import re
from array import array
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from functools import partial
from itertools import accumulate
from types import ModuleType

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from .text import SPACE, to_bytes
from .unicode import BYTELEVEL_TO_LATIN1
from .vocab import Attr, Vocab

_SPECIAL = int(Attr.UNKNOWN | Attr.CONTROL)
_RAW = int(Attr.UNKNOWN | Attr.CONTROL | Attr.USER_DEFINED)

# llama.cpp's clean_up_tokenization_spaces: three passes, in order, each replacing short byte patterns
# (leftmost first, none a prefix of another). Decode runs them as regexes, the stream decoder as
# streaming substitutions (_StreamSub); both are made from this one table.
CLEAN_SPACES: tuple[dict[bytes, bytes], ...] = (
    {b" " + bytes((c,)): bytes((c,)) for c in b"?!.,"},   # no space before ? ! . ,
    {b" ' ": b"'"},                                       # none around a lone '
    {b" '" + s: b"'" + s for s in (b"s", b"m", b"re", b"ve")},  # none before 's 'm 're 've
)


def _pass_sub(table: dict[bytes, bytes]) -> Callable[[bytes], bytes]:
    """One clean-up pass as a function of bytes: every pattern of table replaced, leftmost first."""
    rx = re.compile(b"|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)))
    return partial(rx.sub, lambda m: table[m.group()])


_CLEAN = tuple(_pass_sub(t) for t in CLEAN_SPACES)


def _bytelevel_decode(text: str) -> bytes:
    """GPT-2 byte-level text back to bytes; characters outside the table as llama.cpp renders them."""
    try:
        return text.translate(BYTELEVEL_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in text:
            b = BYTELEVEL_TO_LATIN1.get(ord(ch))
            if b is not None:
                out.append(b)
            else:
                utf8 = "\ufffd".encode() if 0xDC80 <= ord(ch) <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
                out += b"[UNK_BYTE_0x" + utf8.hex().encode() + to_bytes(text) + b"]"
        return bytes(out)


_STRTOL_HEX = re.compile(r"[ \t\n\v\f\r]*([+-]?)(?:0[xX](?=[0-9A-Fa-f]))?([0-9A-Fa-f]*)")


def _byte_value(text: str) -> int:
    """llama.cpp's token_to_byte: strtol(text[3:5], 16) as a uint8_t, whatever the text holds.

    A BYTE token is meant to read <0xXX>; for any other text this is what strtol makes of those two
    characters (leading spaces, a sign, the longest hex prefix, 0 when there is none), mod 256."""
    m = _STRTOL_HEX.match(to_bytes(text)[3:5].decode("latin-1"))  # bytes 3 and 4, as in C++
    digits = m.group(2) if m else ""
    value = int(digits, 16) if digits else 0
    return (-value if m and m.group(1) == "-" else value) & 0xFF


def piece_of(vocab: Vocab, i: int) -> bytes:
    """llama_token_to_piece(i, special=True), computed from the vocab."""
    text, attr = vocab.tokens[i], vocab.attrs[i]
    if attr & _RAW:
        return to_bytes(text)
    if attr & Attr.NORMAL:
        if vocab.kind == "bpe" and not vocab.escape_whitespaces:
            return _bytelevel_decode(text)
        return to_bytes(text.replace(SPACE, " "))
    if attr & Attr.BYTE:
        return bytes([_byte_value(text)])
    return b""


def out_of_range(token_id: int, n_vocab: int) -> ArgumentError:
    """The error for an id outside the vocab, naming the id and the vocab size (a ValueError)."""
    return ArgumentError(f"token id {token_id} is out of range for a vocab of {n_vocab} tokens "
                         f"(expected 0..{n_vocab - 1})")


def not_an_id(value: object) -> ArgumentTypeError:
    """The error for a token id that is not an integer (a TypeError and a ValueError)."""
    return ArgumentTypeError(f"token ids must be integers, got {type(value).__name__} {str(value)[:40]!r}")


def check_id(token_id: object, n_vocab: int) -> int:
    """token_id as an int in [0, n_vocab), or the error naming what is wrong with it."""
    try:
        i = operator.index(token_id)  # type: ignore[arg-type]
    except TypeError:
        raise not_an_id(token_id) from None
    if not 0 <= i < n_vocab:
        raise out_of_range(i, n_vocab)
    return i


def check_ids(ids: Iterable[int], n_vocab: int) -> list[int]:
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
    if not ids:
        return ids
    try:
        array("I").fromlist(ids)  # every item an int >= 0, checked in C (min() took 2.5 times as long)
    except (OverflowError, TypeError):  # a negative or huge id, or no int: found and named below
        try:
            lo = min(ids)
            negative = lo < 0
        except TypeError:
            for i in ids:
                check_id(i, n_vocab)
            raise
        if negative:
            raise out_of_range(lo, n_vocab) from None
    return ids


def _lookup(table: list[bytes], ids: list[int]) -> tuple[bytes, ...] | list[bytes]:
    """table[i] for every id, in C (itemgetter); ids must already be known non-negative."""
    try:
        return operator.itemgetter(*ids)(table) if len(ids) > 1 else [table[ids[0]]]
    except (IndexError, TypeError, OverflowError):
        for i in ids:
            check_id(i, len(table))
        raise


class PieceTable:
    """Every token's piece as a bytes object, with and without control pieces, so decode is one join; with the
    native core (core: its module), also the same pieces in C, which joins a list of ids in one pass."""

    def __init__(self, vocab: Vocab, core: ModuleType | None = None) -> None:
        pieces = [piece_of(vocab, i) for i in range(vocab.n_vocab)]
        self.pieces = pieces
        self.pieces_plain = [b"" if a & _SPECIAL else p for p, a in zip(pieces, vocab.attrs, strict=True)]
        self.vocab = vocab
        self._native = None
        if core is not None and pieces:
            offsets = np.fromiter(accumulate(map(len, pieces), initial=0), np.int64, len(pieces) + 1)
            special = np.fromiter((bool(a & _SPECIAL) for a in vocab.attrs), np.uint8, len(pieces))
            self._native = core.Pieces(b"".join(pieces), offsets, special)

    def _span(self, ids: list[int], remove_special: bool) -> tuple[int, int, bool]:
        """(start, end, remove_space): llama_detokenize's run of ids[start:end] (the added bos/eos left out when
        remove_special), and whether the dummy prefix space comes off the first piece."""
        v = self.vocab
        start, end = 0, len(ids)
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == v.special.get("bos"):
            remove_space = False
            start = 1
        if remove_special and v.add_eos and end > start and ids[-1] == v.special.get("eos"):
            end -= 1
        return start, end, remove_space

    def detokenize_native(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes | None:
        """detokenize() of a list in one call to the core; None without the core or when an item is not an int id
        of the vocab (detokenize's checks then name it)."""
        native = self._native
        if native is None:
            return None
        start, end, remove_space = self._span(ids, remove_special)
        out = native.join(ids, start, end, not unparse_special, remove_space)
        if out is not None and self.vocab.clean_spaces:
            for clean in _CLEAN:
                out = clean(out)
        return out

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        """llama_detokenize: pieces joined, the dummy prefix space removed, spaces cleaned up."""
        start, end, remove_space = self._span(ids, remove_special)
        if start or end < len(ids):
            ids = ids[start:end]
        if not ids:
            return b""
        table = self.pieces if unparse_special else self.pieces_plain
        out = b"".join(_lookup(table, ids))
        if remove_space and table[ids[0]][:1] == b" ":
            out = out[1:]
        if self.vocab.clean_spaces:
            for clean in _CLEAN:
                out = clean(out)
        return out


class _StreamSub:
    """Streaming find-and-replace of short byte patterns, leftmost first, non-overlapping.

    Holds back at most a pattern's length minus one byte; no pattern may be a prefix of another.
    """

    def __init__(self, table: dict[bytes, bytes]) -> None:
        self.table = table
        self.prefixes = {p[:k] for p in table for k in range(1, len(p))}
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        buf, table, prefixes = self.buf, self.table, self.prefixes
        for c in data:
            buf += bytes((c,))
            while buf:
                if buf in table:
                    out += table[buf]
                    buf = b""
                elif buf in prefixes:
                    break
                else:
                    out.append(buf[0])
                    buf = buf[1:]
        self.buf = buf
        return bytes(out)

    def finish(self) -> bytes:
        buf, self.buf = self.buf, b""
        return buf


def _clean_spaces_stream() -> list[_StreamSub]:
    """The three clean-up passes of llama_detokenize, as streaming substitutions (same order)."""
    return [_StreamSub(table) for table in CLEAN_SPACES]


class StreamDecoder:
    """Token ids in, text out as soon as it is complete: for generation loops.

    A UTF-8 character split over several tokens is held until its last byte arrives; bytes that
    can never complete become U+FFFD once the next character starts (or at flush). The SPM dummy
    prefix space is removed from the first piece only, and llama.cpp's space clean-up is applied
    with a lookahead of at most three bytes, so the concatenation of every push() and flush()
    equals Tokenizer.decode(ids). Work per token is constant.
    """

    def __init__(self, table: PieceTable, skip_special_tokens: bool = True) -> None:
        import codecs

        self._pieces = table.pieces_plain if skip_special_tokens else table.pieces
        self._n = len(self._pieces)
        self._remove_space = table.vocab.add_space_prefix
        self._subs = _clean_spaces_stream() if table.vocab.clean_spaces else []
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text that is now complete (possibly '')."""
        token_id = check_id(token_id, self._n)
        data = self._pieces[token_id]
        if self._remove_space:
            self._remove_space = False
            if data[:1] == b" ":
                data = data[1:]
        for sub in self._subs:
            data = sub.feed(data)
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End of stream: return what was held back (incomplete characters become U+FFFD)."""
        data = b""
        for sub in self._subs:
            data = sub.feed(data) + sub.finish()
        return self._utf8.decode(data, final=True)
