"""Train a BPE vocab on text and write it as a vocab-only GGUF (and, SPM-style, as a llama2.c tokenizer.bin).

    from minillama.tokenizer.train import train_bpe
    tv = train_bpe(["a.txt", "b.txt"], 8000, kind="bytelevel", pre="llama3", special_tokens=["<|endoftext|>"])
    tv.write_gguf("tok.gguf"); tv.tokenizer().encode("Hello")

Two kinds of vocab:

* ``bytelevel``: GPT-2 style (``tokenizer.ggml.model = "gpt2"``). Text is split into words by the
  named llama.cpp pre-tokenizer (any name of ``minillama.tokenizer.pretokenize.PRE_TOKENIZERS``
  with GPT-2 byte-level text; the same patterns the tokenizer will split with), each word becomes
  its GPT-2 byte-level characters, and merges are learned inside words. The vocab is the special
  tokens (CONTROL) first, then the 256 byte characters in code point order, then one token per
  merge, exactly the ids Hugging Face tokenizers' BpeTrainer gives.
* ``spm``: SentencePiece-style BPE as llama.cpp runs it (``tokenizer.ggml.model = "llama"``):
  spaces become ``▁`` with a dummy ``▁`` before each document (add_space_prefix), words are ``▁``
  plus a run of letters, one digit, or ``▁`` plus a run of other characters (whitespace runs and
  newlines apart), and characters outside ``character_coverage`` fall back to bytes. The vocab is
  llama2's layout: ``<unk>``, ``<s>``, ``</s>`` at 0, 1, 2, further special tokens, the 256
  ``<0xXX>`` BYTE tokens, the merged tokens in merge order with score ``-rank`` (llama.cpp merges
  by score, so later merges lose to earlier ones), then the single characters, most frequent first,
  scored below every merge.

The algorithm: count words once (a streaming pass; only the word counts are kept), turn each
distinct word into a list of symbol ids, count adjacent pairs (weighted by word count, every
window, as Hugging Face does) and index each pair to the words holding it. Then repeat: pop the
most frequent pair from a heap of (count, pair) entries, where a popped entry whose count is stale
is pushed back with its current count (lazy invalidation); record the merge; rewrite only the words
in that pair's index and change only the counts of the pairs they lose and gain; push the gained
pairs. Each merge costs time proportional to the places it changes.

Ties break deterministically, as in Hugging Face tokenizers: among pairs of equal count, the pair
whose left token has the smaller id wins, then the smaller right id; ids count special tokens first
(bytelevel), then base symbols in code point order, then merged tokens in the order they were
made. Training stops at ``vocab_size`` tokens or when the best pair occurs fewer than
``min_frequency`` times. A merge whose result is already a token reuses that token (the merge is
still recorded); a merge whose result would be a special or ``<0xXX>`` token is never made.
The same input and settings give the same files, byte for byte.

Round trip: ``decode(encode(s)) == s`` for every string with an SPM-style vocab that has no
``▁`` in s (llama.cpp decodes ``▁`` as a space) and with a byte-level vocab whose pre-tokenizer
leaves llama.cpp's ``clean_spaces`` off (``qwen2``, ``gpt-4o``, ``tekken``, ``smollm``, ...). With
the others (``llama3``, ``gpt-2``, ...) llama.cpp's detokenizer drops the space before ``?!.,``
and around ``'``, as Hugging Face's ``clean_up_tokenization_spaces`` does; the token pieces
(``token_to_piece``) still join back to exactly s.
"""

from __future__ import annotations

import codecs
import heapq
import io
import os
import re
import sys
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import regex

from ..errors import ArgumentError, ArgumentTypeError, FormatError, MinillamaError
from ..fileio import input_path, utf8_error
from ..gguffile.constants import Keys, TokenType
from .pretokenize import PreTokenizer
from .tables import PATTERNS, PRE_TOKENIZERS
from .text import SPACE
from .unicode import BYTE_TO_CHAR, BYTE_TOKEN, byte_token

if TYPE_CHECKING:
    from . import Tokenizer

__all__ = ["KINDS", "TrainedVocab", "train_bpe", "count_words", "learn_merges"]

K = Keys.Tokenizer
KINDS = ("bytelevel", "spm")
SPM_CONTROLS = ("<unk>", "<s>", "</s>")
DEFAULT_SPECIALS = {"bytelevel": ("<|endoftext|>",), "spm": ()}

Source = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]", io.TextIOBase]]]

# Reading: blocks of 1 MiB; a block is cut after a newline that precedes a non-space character and
# that is a word boundary, at least _MARGIN characters before the end of what has been read.
_BLOCK = 1 << 20
MAX_UNCUT_CHARS = 1 << 26  # text read on without a line break before training gives up (64 Mi characters)
_MARGIN = 1 << 12
_CUT = re.compile(r"\n(?=\S)")

# Words of SPM-style text (spaces already U+2581): newline runs; a run of spaces that leaves its last
# space to the next word; U+2581 + letters; U+2581 + one digit; U+2581 + other characters; spaces.
_SPM_WORDS = regex.compile(
    rf"[\r\n]+|{SPACE}+(?={SPACE}[^{SPACE}\r\n])|{SPACE}?[\p{{L}}\p{{M}}]+|{SPACE}?\p{{N}}"
    rf"|{SPACE}?[^{SPACE}\r\n\p{{L}}\p{{M}}\p{{N}}]+|{SPACE}+")

_BYTE_CHARS = frozenset(BYTE_TO_CHAR)

# Pair keys: left id << 24 | right id; heap entries: -count << 48 | key, so the smallest entry is
# the highest count, then the smallest (left, right).
_SHIFT = 24
_RIGHT = (1 << _SHIFT) - 1
_KEYBITS = 2 * _SHIFT
_KEYMASK = (1 << _KEYBITS) - 1
_MAX_TOKENS = 1 << _SHIFT
_BANNED = -(1 << 60)  # the count of a pair that must never merge: no word count brings it back up


# ---------------------------------------------------------------------------------------------
# The result


@dataclass
class TrainedVocab:
    """A trained vocab: tokens, types, scores and merges, with what llama.cpp needs to load it."""

    kind: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    scores: list[float]
    merges: list[str]  # "left right" in learning order (bytelevel: byte-level text; spm: with U+2581)
    special: dict[str, int] = field(default_factory=dict)  # bos/eos/unk/pad -> id
    add_bos: bool = False
    n_words: int = 0  # distinct words counted
    name: str = ""

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    def metadata(self) -> dict[str, Any]:
        """GGUF-style tokenizer metadata (gguf.Keys names), as write_vocab_gguf and Vocab.from_metadata take it."""
        md: dict[str, Any] = {"general.architecture": "llama",
                              "general.name": self.name or f"minillama {self.kind} BPE {self.n_vocab}"}
        if self.kind == "bytelevel":
            md[K.MODEL] = "gpt2"
            md[K.PRE] = self.pre
            md[K.LIST] = list(self.tokens)
            md[K.TOKEN_TYPE] = np.asarray(self.token_types, np.int32)
            md[K.MERGES] = list(self.merges)
        else:
            md[K.MODEL] = "llama"
            md[K.LIST] = list(self.tokens)
            md[K.SCORES] = np.asarray(self.scores, np.float32)
            md[K.TOKEN_TYPE] = np.asarray(self.token_types, np.int32)
            md[K.ADD_PREFIX] = True
        keys = {"bos": K.BOS_ID, "eos": K.EOS_ID, "unk": K.UNK_ID, "pad": K.PAD_ID}
        for role, key in keys.items():
            if role in self.special:
                md[key] = self.special[role]
        md[K.ADD_BOS] = self.add_bos
        md[K.ADD_EOS] = False
        if self.kind == "bytelevel":
            md[K.ADD_SEP] = False
        return md

    def tokenizer(self) -> Tokenizer:
        """A minillama Tokenizer over this vocab (what loading the written GGUF gives)."""
        from . import Tokenizer
        from .vocab import Vocab

        return Tokenizer(Vocab.from_metadata(self.metadata(), "<trained>"))

    def write_gguf(self, path: str | os.PathLike[str]) -> None:
        """Write the vocab-only GGUF at path, through a temporary file (no half-written file on error)."""
        from ..gguffile.writer import write_vocab_gguf

        write_vocab_gguf(self.metadata(), path)

    def llama2c_bytes(self) -> bytes:
        """The vocab in llama2.c's tokenizer.bin layout (SPM-style vocabs only)."""
        from .formats.llama2c import llama2c_bytes

        if self.kind != "spm":
            raise MinillamaError("llama2.c's tokenizer.bin holds scores, not merges: only an spm vocab can be "
                                 "written in it (write a byte-level vocab as GGUF)")
        return llama2c_bytes(self.tokens, self.scores)

    def write_llama2c(self, path: str | os.PathLike[str]) -> None:
        """Write llama2.c's tokenizer.bin at path (SPM-style vocabs only), through a temporary file."""
        from .formats.llama2c import write_llama2c

        write_llama2c(path, self.llama2c_bytes())


# ---------------------------------------------------------------------------------------------
# Reading the input as a stream of documents


def _file_chunks(path: str) -> Iterator[str]:
    """The text of a UTF-8 file in blocks, newlines kept as they are ('-' is standard input)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    f = sys.stdin.buffer if path == "-" else open(input_path(path, "text file"), "rb")
    pos = 0
    try:
        while True:
            block = f.read(_BLOCK)
            pending = len(decoder.getstate()[0])  # bytes of a character the previous block cut
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                raise utf8_error(exc, path, pos - pending) from None
            if text:
                yield text
            if not block:
                return
            pos += len(block)
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def _stream_chunks(f: io.TextIOBase) -> Iterator[str]:
    """The text of an open text stream in blocks."""
    while block := f.read(_BLOCK):
        yield block


def _documents(source: Source) -> Iterator[tuple[str, Iterator[str]]]:
    """(name, chunks) per document: a path or open text file is one document, any other string is one."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    elif isinstance(source, io.TextIOBase):
        source = [source]
    for i, item in enumerate(source):
        if isinstance(item, os.PathLike) or (isinstance(item, str) and _is_path(item)):
            path = os.fspath(item)
            yield path, _file_chunks(path)
        elif isinstance(item, io.TextIOBase):
            yield getattr(item, "name", f"<stream {i}>"), _stream_chunks(item)
        elif isinstance(item, str):
            if _LOOKS_LIKE_PATH.fullmatch(item):
                raise MinillamaError(f"{item}: no such file (a str that names no file is trained on as text, "
                                     "but this one looks like a file name)")
            yield f"<text {i}>", iter((item,))
        else:
            raise ArgumentTypeError(f"training input item {i} is {type(item).__name__}; expected a path, a text file "
                            "or a str")


# A str that is no existing file but looks like a file name (no whitespace, a text-file extension) is
# taken for a mistyped path rather than trained on as text.
_LOOKS_LIKE_PATH = re.compile(r"\S+\.(?:txt|text|md|json|jsonl|csv|tsv|raw)")


def _is_path(s: str) -> bool:
    """A string names an input file when it is '-' or the path of an existing file."""
    return s == "-" or (len(s) < 4096 and "\n" not in s and "\0" not in s and os.path.isfile(s))


def _total_bytes(source: Source) -> int | None:
    """Total size of the input when it is only files, for the progress bar; else None."""
    items = [source] if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(items, (list, tuple)):
        return None
    total = 0
    for item in items:
        if isinstance(item, os.PathLike) or (isinstance(item, str) and _is_path(item) and item != "-"):
            total += os.path.getsize(item)
        else:
            return None
    return total


class _WordCounter:
    """Counts the words of documents, reading each in blocks; a word never spans two documents."""

    def __init__(self, split: Callable[[str], list[str]], prepare: Callable[[str, bool], str],
                 specials: list[str]) -> None:
        self.split = split
        self.prepare = prepare  # (text, starts a document) -> the text the pre-tokenizer sees
        self.counts: Counter[str] = Counter()
        self.specials = (re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
                         if specials else None)
        self.longest = max(map(len, specials), default=1)

    def _emit(self, text: str, first: bool) -> None:
        if text:
            self.counts.update(self.split(self.prepare(text, first)))

    def add(self, chunks: Iterable[str], on_chunk: Callable[[str], None] | None = None, name: str = "") -> None:
        """Count the words of one document given as consecutive pieces of text."""
        buf, first, retry_at = "", True, _BLOCK
        for chunk in chunks:
            if on_chunk is not None:
                on_chunk(chunk)
            scan = max(0, len(buf) - self.longest + 1)
            buf += chunk
            if self.specials is not None:  # special-token texts cut the document (they are never learned)
                while (m := self.specials.search(buf, scan)) is not None:
                    self._emit(buf[:m.start()], first)
                    buf, first, retry_at, scan = buf[m.end():], True, _BLOCK, 0
            if len(buf) >= retry_at:
                rest = self._cut(buf, first)
                if rest is None:
                    if len(buf) > MAX_UNCUT_CHARS:  # /dev/zero, one endless line: memory would grow without end
                        raise FormatError(f"expected a line break at least every {MAX_UNCUT_CHARS:,} characters "
                                          f"(words are counted between them), found none in {len(buf):,}",
                                          path=name or None)
                    retry_at = 2 * len(buf)  # no safe cut yet: read on (pathological text only)
                else:
                    buf, first, retry_at = rest, False, _BLOCK
        self._emit(buf, first)

    def _cut(self, buf: str, first: bool) -> str | None:
        """Count the words of buf up to a safe cut and return the rest; None when there is no safe cut.

        A cut is safe where a newline precedes a non-space character, the words of the whole buffer
        have a boundary there, and at least _MARGIN characters follow (so that no pattern's
        lookahead or greedy run reaches the end of the buffer).
        """
        limit = len(buf) - _MARGIN
        cands = [m.end() for m in _CUT.finditer(buf, len(buf) // 2, limit)]
        if not cands:
            return None
        text = self.prepare(buf, first)
        off = len(text) - len(buf)  # SPM's dummy prefix
        words = self.split(text)
        ends = list(accumulate(map(len, words)))
        for q in reversed(cands[-16:]):
            k = bisect_left(ends, q + off)
            if k < len(ends) and ends[k] == q + off:
                self.counts.update(words[:k + 1])
                return buf[q:]
        return None


def _spm_prepare(text: str, first: bool) -> str:
    """SPM-style text: spaces as U+2581, a dummy U+2581 at the start of a document."""
    text = text.replace(" ", SPACE)
    return SPACE + text if first else text


def _pre_tokenizer(kind: str, pre: str) -> tuple[Callable[[str], list[str]], Callable[[str, bool], str]]:
    """(split, prepare) for a kind of vocab and a pre-tokenizer name."""
    if kind == "spm":
        return _SPM_WORDS.findall, _spm_prepare
    spec = PRE_TOKENIZERS.get(pre)
    if spec is None:
        raise MinillamaError(f"unknown pre-tokenizer {pre!r}; expected one of the {len(PRE_TOKENIZERS)} names "
                             f"llama.cpp knows, e.g. 'llama3', 'gpt-2', 'qwen2'")
    if not spec.byte_encode or spec.escape_whitespaces:
        raise MinillamaError(f"pre-tokenizer {pre!r} is for vocabs without GPT-2 byte-level text; a byte-level "
                             "vocab needs another (e.g. 'llama3', 'gpt-2', 'qwen2')")
    return PreTokenizer(PATTERNS[spec.patterns]).split, lambda text, first: text


def count_words(source: Source, kind: str = "bytelevel", pre: str = "llama3",
                special_tokens: Iterable[str] = (), progress: bool | None = None) -> Counter[str]:
    """Word -> count over the input, split as the trained tokenizer will split (SPM: with U+2581)."""
    split, prepare = _pre_tokenizer(kind, pre)
    counter = _WordCounter(split, prepare, [s for s in special_tokens if s])
    bar = _bar(progress, total=_total_bytes(source), desc="reading", unit="B", unit_scale=True)
    try:
        on_chunk = None if bar is None else (lambda chunk: bar.update(len(chunk.encode("utf-8", "replace"))))
        for name, chunks in _documents(source):
            counter.add(chunks, on_chunk, name)
    finally:
        if bar is not None:
            bar.close()
    return counter.counts


def _bar(progress: bool | None, **kwargs: Any) -> Any:
    """A tqdm progress bar on stderr, or None when progress is off (by default: when stderr is not a TTY)."""
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(file=sys.stderr, mininterval=0.25, **kwargs)


# ---------------------------------------------------------------------------------------------
# Learning merges


def _initial_pairs(words: list[list[int]], counts: list[int]) -> tuple[dict[int, int], Callable[[int], list[int]]]:
    """Pair key -> weighted count over the words, and key -> the words holding it (ascending, each once).

    Counted with numpy over the flattened words: the pairs of base symbols are most of the work and
    few of them are ever merged, so their word lists stay in one array, sliced when a merge needs one.
    """
    lens = np.fromiter(map(len, words), np.int64, len(words))
    flat = np.fromiter(chain.from_iterable(words), np.int64, int(lens.sum()))
    if len(flat) < 2:
        return {}, lambda key: []
    left, right = flat[:-1], flat[1:]
    ok = (left >= 0) & (right >= 0)  # the -1 sentinel ends every word: no pair spans two words
    keys = (left[ok] << _SHIFT) | right[ok]
    if not len(keys):  # every word a single symbol: nothing to merge
        return {}, lambda key: []
    wid = np.repeat(np.arange(len(words), dtype=np.int64), lens)[:-1][ok]
    order = np.argsort(keys, kind="stable")  # stable: word ids stay ascending within a key
    keys, wid = keys[order], wid[order]
    weight = np.asarray(counts, np.int64)[wid]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    uniq = keys[starts].tolist()
    pc = dict(zip(uniq, np.add.reduceat(weight, starts).tolist()))
    keep = np.r_[True, (keys[1:] != keys[:-1]) | (wid[1:] != wid[:-1])]  # each word once per key
    held, held_keys = wid[keep], keys[keep]
    bounds = np.r_[np.flatnonzero(np.r_[True, held_keys[1:] != held_keys[:-1]]), len(held)].tolist()
    slot = dict(zip(uniq, range(len(uniq))))

    def initial(key: int) -> list[int]:
        i = slot.get(key)
        return [] if i is None else held[bounds[i]:bounds[i + 1]].tolist()

    return pc, initial


def learn_merges(words: list[list[int]], counts: list[int], tokens: list[str], index: dict[str, int],
                 n_vocab: int, min_frequency: int = 2, banned: frozenset[str] = frozenset(),
                 progress: bool | None = None) -> list[tuple[int, int]]:
    """Learn merges until tokens has n_vocab entries; returns the (left, right) id pairs in order.

    words: each distinct word as symbol ids followed by a -1 sentinel (rewritten in place); counts:
    their counts; tokens/index: the symbols so far and their ids (appended to); banned: strings a
    merge must never produce. Ties: smallest (left, right) ids.
    """
    if n_vocab > _MAX_TOKENS:
        raise MinillamaError(f"vocab_size {n_vocab} is too large (at most {_MAX_TOKENS})")
    state = _PairCounts(words, counts, tokens, index)
    threshold = max(1, min_frequency)
    merges: list[tuple[int, int]] = []
    bar = _bar(progress, total=max(0, n_vocab - len(tokens)), desc="merging", unit="merge")
    done = 0
    try:
        while len(tokens) < n_vocab:
            k = state.best(threshold)
            if k is None:
                break
            a, b = state.canon[k >> _SHIFT], state.canon[k & _RIGHT]
            s = tokens[a] + tokens[b]
            if s in banned:
                state.ban(k)
                continue
            merges.append((a, b))
            state.merge(k, a, b, *state.token(s))
            if bar is not None:
                done += 1
                if not done & 63:
                    bar.update(64)
    finally:
        if bar is not None:
            bar.update(done & 63)
            bar.close()
    return merges


class _PairCounts:
    """The pairs of the words being merged: count per pair key, the words holding each, a heap by count.

    The heap holds -count << 48 | key entries; a popped entry whose count is stale is pushed back with
    its current count (lazy invalidation). where: pair key made by a merge -> the words that held it
    (some may no longer); the pairs of base symbols come from initial().
    """

    def __init__(self, words: list[list[int]], counts: list[int], tokens: list[str], index: dict[str, int]) -> None:
        self.words, self.counts, self.tokens, self.index = words, counts, tokens, index
        self.canon = list(range(len(tokens)))  # id -> the int object the words hold (list.count/index test identity first)
        for i in index.values():
            self.canon[i] = i
        self.pc, self.initial = _initial_pairs(words, counts)  # pair key -> count (weighted, every window)
        self.where: dict[int, list[int]] = {}
        self.heap = [(-c << _KEYBITS) + k for k, c in self.pc.items()]
        heapq.heapify(self.heap)

    def best(self, threshold: int) -> int | None:
        """The key of the most frequent pair (ties: smallest left, then right id), None below threshold."""
        heap, get = self.heap, self.pc.get
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            e = pop(heap)
            k = e & _KEYMASK
            c = -(e >> _KEYBITS)
            cur = get(k, 0)
            if c != cur:  # stale entry: the pair lost occurrences since it was pushed
                if cur > 0:
                    push(heap, (-cur << _KEYBITS) + k)
                continue
            return k if c >= threshold else None
        return None

    def ban(self, k: int) -> None:
        """The pair k must never merge: no word count brings it back up."""
        self.pc[k] = _BANNED

    def token(self, s: str) -> tuple[int, bool]:
        """(id, reused) of the merged string s: its existing token, else a new one."""
        x = self.index.get(s)
        if x is not None:
            return x, True
        x = len(self.tokens)
        self.tokens.append(s)
        self.index[s] = x
        self.canon.append(x)
        return x, False

    def merge(self, k: int, a: int, b: int, x: int, reused: bool) -> None:
        """Rewrite a b as x in every word holding the pair k; move the counts of the neighbouring pairs
        (left a -> left x, b right -> x right) and push the pairs gained."""
        S = _SHIFT
        pc, where, words, counts = self.pc, self.where, self.words, self.counts
        get, wget = pc.get, where.get
        gained: list[int] = []
        gain = gained.append
        made: list[int] = []  # the pairs this word gains, one per occurrence
        new = made.append
        xs = x << S
        same = a == b
        held = where.pop(k, None)
        for wi in self.initial(k) if held is None else held:
            w = words[wi]
            na = w.count(a)
            if not na:
                continue
            c = counts[wi]
            i = -1
            while na:
                i = w.index(a, i + 1)
                na -= 1
                if w[i + 1] == b:  # the -1 sentinel ends every word, so w[i + 1] and w[i + 2] exist
                    left = w[i - 1]  # the sentinel again when i == 0
                    if left >= 0:
                        ls = left << S
                        pc[ls | a] -= c
                        nk = ls | x
                        pc[nk] = get(nk, 0) + c
                        new(nk)
                    right = w[i + 2]
                    if right >= 0:
                        pc[b << S | right] -= c
                        nk = xs | right
                        pc[nk] = get(nk, 0) + c
                        new(nk)
                    w[i] = x
                    del w[i + 1]
                    if same:
                        na -= 1
            for nk in made:  # the words holding each new pair, each once, in word order
                lst = wget(nk)
                if lst is None:
                    where[nk] = [wi]
                    gain(nk)
                else:
                    if lst[-1] != wi:
                        lst.append(wi)
                    if reused:
                        gain(nk)
            made.clear()
        del pc[k]
        heap, push = self.heap, heapq.heappush
        for nk in (sorted(set(gained)) if reused else gained):
            n = pc[nk]
            if n > 0:
                push(heap, (-n << _KEYBITS) + nk)


# ---------------------------------------------------------------------------------------------
# The two kinds


def _roles(specials: list[str], first_id: int) -> dict[str, int]:
    """bos/eos/unk/pad ids among byte-level special tokens, recognised by their text."""
    roles: dict[str, int] = {}
    for i, s in enumerate(specials, first_id):
        low = s.lower()
        if "bos" in low or "begin_of_text" in low or "startoftext" in low or s == "<s>":
            roles.setdefault("bos", i)
        elif "eos" in low or "end_of_text" in low or "endoftext" in low or s == "</s>":
            roles.setdefault("eos", i)
        elif low in ("<unk>", "[unk]", "<|unk|>"):
            roles.setdefault("unk", i)
        elif "pad" in low:
            roles.setdefault("pad", i)
    if specials:
        roles.setdefault("eos", roles.get("bos", first_id))
        roles.setdefault("bos", roles["eos"])  # GPT-2: <|endoftext|> is both
    return roles


def _byte_words(counts: Iterable[str], byte_id: list[int]) -> list[list[int]]:
    """Each word as the ids of its UTF-8 bytes (byte_id[b]) followed by the -1 sentinel."""
    get = byte_id.__getitem__  # the very int objects of byte_id: learn_merges compares them by identity first
    return [[*map(get, w.encode("utf-8", "surrogateescape")), -1] for w in counts]


def _train_bytelevel(counts: Counter[str], vocab_size: int, pre: str, specials: list[str],
                     min_frequency: int, progress: bool | None) -> TrainedVocab:
    base = sorted(BYTE_TO_CHAR)
    tokens = specials + base
    if vocab_size < len(tokens):
        raise MinillamaError(f"vocab_size {vocab_size} is smaller than the {len(specials)} special tokens plus "
                             "256 byte tokens")
    index = {t: i for i, t in enumerate(base, len(specials))}
    words = _byte_words(counts, [index[c] for c in BYTE_TO_CHAR])
    merges = learn_merges(words, list(counts.values()), tokens, index, vocab_size, min_frequency,
                          frozenset(specials), progress)
    types = [int(TokenType.CONTROL)] * len(specials) + [int(TokenType.NORMAL)] * (len(tokens) - len(specials))
    roles = _roles(specials, 0)
    return TrainedVocab("bytelevel", pre, tokens, types, [0.0] * len(tokens),
                        [f"{tokens[a]} {tokens[b]}" for a, b in merges], roles,
                        add_bos=roles.get("bos") is not None and roles.get("bos") != roles.get("eos"),
                        n_words=len(counts))


def _train_spm(counts: Counter[str], vocab_size: int, specials: list[str], min_frequency: int,
               character_coverage: float, progress: bool | None) -> TrainedVocab:
    extra = [s for s in specials if s not in SPM_CONTROLS]
    fixed = [*SPM_CONTROLS, *extra, *(byte_token(b) for b in range(256))]
    budget = vocab_size - len(fixed)
    if budget < 1:
        raise MinillamaError(f"vocab_size {vocab_size} is too small: an spm vocab has {len(fixed)} control and "
                             "byte tokens and at least the U+2581 token")
    chars = _char_counts(counts)
    has_nul = chars.pop("\0", None) is not None  # llama.cpp reads token texts as C strings: no NUL token
    kept = _covering_chars(chars, character_coverage, budget)
    alphabet = sorted(kept)
    index = {ch: i for i, ch in enumerate(alphabet)}
    if has_nul or len(kept) < len(chars):  # rare characters (and NUL) become bytes: no merge crosses them
        counts = _split_at_rare(counts, alphabet)
    words = [[*map(index.__getitem__, w), -1] for w in counts]
    tokens = list(alphabet)
    merges = learn_merges(words, list(counts.values()), tokens, index, budget, min_frequency, frozenset(fixed),
                          progress)
    merged = tokens[len(alphabet):]
    order = sorted(kept, key=lambda ch: (-chars[ch], ch))
    n_merged = len(merged)
    all_tokens = fixed + merged + order
    scores = [0.0] * len(fixed) + [-float(i) for i in range(n_merged)] + \
        [-float(n_merged + j) for j in range(len(order))]
    types = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)] + \
        [int(TokenType.CONTROL)] * len(extra) + [int(TokenType.BYTE)] * 256 + \
        [int(TokenType.NORMAL)] * (n_merged + len(order))
    return TrainedVocab("spm", "default", all_tokens, types, scores,
                        [f"{tokens[a]} {tokens[b]}" for a, b in merges],
                        {"unk": 0, "bos": 1, "eos": 2}, add_bos=True, n_words=len(counts))


def _char_counts(counts: Counter[str]) -> Counter[str]:
    """Character -> occurrences over the counted words (U+2581 always present)."""
    chars: Counter[str] = Counter()
    for w, c in counts.items():
        for ch in w:
            chars[ch] += c
    chars[SPACE] += 0
    return chars


def _covering_chars(chars: Counter[str], character_coverage: float, budget: int) -> list[str]:
    """The most frequent characters that cover character_coverage of the text, U+2581 among them,
    at most budget of them."""
    by_freq = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
    total, kept, acc = sum(chars.values()), [], 0
    for ch, n in by_freq:
        if kept and acc >= character_coverage * total:
            break
        kept.append(ch)
        acc += n
    if SPACE not in kept:
        kept.append(SPACE)
    if len(kept) > budget:
        kept = [ch for ch in kept if ch != SPACE][:budget - 1] + [SPACE]
    return kept


def _split_at_rare(counts: Counter[str], alphabet: list[str]) -> Counter[str]:
    """The words cut at characters outside alphabet (which become bytes), the pieces counted."""
    rare = regex.compile("[^" + "".join(re.escape(ch) for ch in alphabet) + "]+")
    split: Counter[str] = Counter()
    for w, c in counts.items():
        for part in rare.split(w) if rare.search(w) else (w,):
            if part:
                split[part] += c
    return split


def min_vocab_size(kind: str, specials: Sequence[str] | None = None) -> int:
    """The smallest vocab_size a training of this kind can make: its fixed tokens (+ U+2581 for spm)."""
    specials = list(DEFAULT_SPECIALS[kind] if specials is None else dict.fromkeys(specials))
    if kind == "spm":
        return len(SPM_CONTROLS) + len([s for s in specials if s not in SPM_CONTROLS]) + 256 + 1
    return len(specials) + 256


def _floor_parts(kind: str, specials: Sequence[str]) -> str:
    if kind == "spm":
        extra = len([s for s in specials if s not in SPM_CONTROLS])
        return f"<unk> <s> </s>, {extra} more special, 256 byte tokens and U+2581"
    return f"{len(specials)} special and 256 byte tokens"


def train_bpe(files_or_iterable: Source, vocab_size: int, kind: str = "bytelevel", pre: str = "llama3",
              special_tokens: Iterable[str] | None = None, min_frequency: int = 2, *,
              character_coverage: float = 0.9995, progress: bool | None = None, name: str = "") -> TrainedVocab:
    """Train a BPE vocab of at most vocab_size tokens (special and base tokens included).

    files_or_iterable: a path, or an iterable of paths, open text files and texts (a str that names
    an existing file is read as that file); each is one document. kind: "bytelevel" (GPT-2 style,
    split by the llama.cpp pre-tokenizer `pre`) or "spm" (SentencePiece style; `pre` is not used).
    special_tokens: CONTROL tokens (default: <|endoftext|> for bytelevel, none besides <unk> <s>
    </s> for spm); their text in the input cuts documents and is not learned. min_frequency: stop
    when the best pair occurs fewer times. character_coverage (spm): the share of the text the base
    characters cover; rarer characters become <0xXX> bytes. progress: a tqdm bar on stderr (default:
    when stderr is a terminal).
    """
    if kind not in KINDS:
        raise MinillamaError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise MinillamaError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if not 0.0 < character_coverage <= 1.0:
        raise MinillamaError(f"character_coverage must be in (0, 1], got {character_coverage}")
    specials = list(DEFAULT_SPECIALS[kind] if special_tokens is None else special_tokens)
    if any(not isinstance(s, str) or not s or "\0" in s for s in specials):
        raise MinillamaError("special tokens must be non-empty strings without NUL characters")
    specials = list(dict.fromkeys(specials))
    floor = min_vocab_size(kind, specials)
    if vocab_size < floor:
        raise ArgumentError(f"expected vocab_size of at least {floor} ({_floor_parts(kind, specials)}), "
                            f"found {vocab_size}")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ArgumentError(f"expected min_frequency of at least 1 (a pair that occurs), found {min_frequency!r}")
    clash = [s for s in specials if (s in _BYTE_CHARS if kind == "bytelevel" else BYTE_TOKEN.fullmatch(s))]
    if clash:
        raise MinillamaError(f"special token {clash[0]!r} would duplicate one of the 256 byte tokens")
    counts = count_words(files_or_iterable, kind, pre, specials, progress)
    if kind == "bytelevel":
        tv = _train_bytelevel(counts, vocab_size, pre, specials, min_frequency, progress)
    else:
        tv = _train_spm(counts, vocab_size, specials, min_frequency, character_coverage, progress)
    tv.name = name
    return tv
