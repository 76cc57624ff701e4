"""minillama.ngram: the default placeholder language model, an n-gram model over token ids.

    from minillama.ngram import NGramModel
    lm = NGramModel.train_files(tok, ["notes.txt"], order=4)   # or NGramModel.train(tok, ["some text", ...])
    lm.save("notes.ngram.npz"); lm = NGramModel.load("notes.ngram.npz", tok)
    for chunk in generate(lm, tok, "The", 50): ...              # minillama.generate

It predicts the next token from the last ``order - 1`` tokens, so what it writes is placeholder text in
the style of its training text, nothing more: it stands in for a real model while the rest of the
runtime (tokenizer, sampling, streaming, chat) is built and tested.

Training: each document is encoded with the tokenizer (``add_special=True``, so bos is added as the
vocab says); the end-of-sequence id (eos, else eot) is appended unless the document already holds an
end-of-generation token, so the model learns where text ends and replies stop. A leading bos only
serves as context (it is never predicted). Every n-gram of length 1..order inside a document is
counted; documents are never joined. Files are split into paragraphs at blank lines, each a document.
(`minillama chat` trains on paragraphs rendered as conversations, so it also learns the turn format:
see minillama.chat.train_chat_ngram.)

Smoothing: interpolated Witten-Bell (parameter-free). With c(h) the tokens seen after context h,
c(h, w) those that were w and T(h) the number of distinct ones,

    P(w | h) = (c(h, w) + T(h) * P(w | h')) / (c(h) + T(h))        h' = h without its first token

down to the unigram level, which is the plain frequency c(w) / N (so only tokens seen in training are
ever produced; with no training data at all the distribution is uniform). A context never seen uses
P(w | h') directly. The result is a true distribution over the vocab (it sums to 1).

File format (``save``/``load``): a numpy ``.npz`` archive read with ``allow_pickle=False``:
``meta`` (UTF-8 JSON as uint8: format "minillama-ngram", version, order, n_vocab, smoothing, counts,
tokenizer description) and, for each context length k in 0..order-1, ``ctx{k}`` (int32, contexts x k,
sorted), ``off{k}`` (int64, contexts + 1 offsets), ``next{k}`` (int32 next ids) and ``count{k}``
(int64 counts). Everything is checked on load; problems raise FormatError naming what was expected
and what was found. The vocab size is recorded and a tokenizer of another size is refused.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ArgumentError, FormatError
from .fileio import paragraphs, read_text, write_output

if TYPE_CHECKING:
    from .generate import Sampler
    from .tokenizer import Tokenizer

__all__ = ["NGramModel", "default_corpus_path", "paragraphs", "read_paragraphs", "DEFAULT_ORDER", "FORMAT", "VERSION", "SMOOTHING"]

DEFAULT_ORDER = 4  # 4-grams: on a few thousand tokens of text, whole phrases of it come back
FORMAT = "minillama-ngram"
VERSION = 1
SMOOTHING = "witten-bell"
ZIP_MAGIC = b"PK\x03\x04"

Context = tuple[int, ...]


def default_corpus_path() -> str:
    """Path of the package's own text (the default vocab's training corpus), the default n-gram's training text."""
    return str(resources.files("minillama") / "data" / "default-corpus.txt")


def read_paragraphs(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The paragraphs of UTF-8 text files, in order (MinillamaError naming a file that is not UTF-8)."""
    docs: list[str] = []
    for path in paths:
        docs += paragraphs(read_text(os.fspath(path)))
    return docs


# Each training token adds one entry per order: past 16 the tables only grow (and contexts that long never
# repeat in text a placeholder model learns from).
MAX_ORDER = 16


class NGramModel:
    """Counts of token n-grams and Witten-Bell interpolated next-token probabilities; implements LanguageModel."""

    def __init__(self, order: int, n_vocab: int) -> None:
        if not isinstance(order, int) or isinstance(order, bool) or not 1 <= order <= MAX_ORDER:
            raise ArgumentError(f"expected an order from 1 to {MAX_ORDER}, found {order!r}")
        if not isinstance(n_vocab, int) or isinstance(n_vocab, bool) or n_vocab < 1:
            raise ArgumentError(f"expected n_vocab to be an integer >= 1, found {n_vocab!r}")
        self.order = order
        self.n_vocab = n_vocab
        # _counts[k][context of k ids] = {next id: count}
        self._counts: list[dict[Context, dict[int, int]]] = [{} for _ in range(order)]
        self.n_sequences = 0
        self.tokenizer_info: dict[str, Any] = {}
        self._unigram: np.ndarray | None = None
        self._arrays: dict[Context, tuple[np.ndarray, np.ndarray, int]] = {}

    # --- training -----------------------------------------------------------------------------
    def add_sequence(self, ids: Sequence[int], context_only: int = 0) -> None:
        """Count every n-gram of one document; its first context_only ids are context, never predicted (bos)."""
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.n_vocab:
                raise ArgumentError(f"token id {i} is out of range for a vocab of {self.n_vocab} tokens")
        counts = self._counts
        for i in range(max(context_only, 0), len(ids)):
            w = ids[i]
            for k in range(min(self.order - 1, i) + 1):
                followers = counts[k].setdefault(tuple(ids[i - k:i]), {})
                followers[w] = followers.get(w, 0) + 1
        self.n_sequences += 1
        self._unigram = None
        self._arrays.clear()

    def add_text(self, tok: Tokenizer, text: str, parse_special: bool = False) -> None:
        """Encode one document with tok (bos as the vocab says) and count it, ending it with the end id.

        The end id (eos, else eot) is appended unless the document already holds an end-of-generation
        token (e.g. a chat transcript whose turns end with one, encoded with parse_special=True).
        """
        self.check_tokenizer(tok)
        ids = tok.encode(text, add_special=True, parse_special=parse_special)
        lead = 1 if ids and tok.bos_id is not None and ids[0] == tok.bos_id and tok.add_bos else 0
        end = tok.eos_id if tok.eos_id is not None else tok.eot_id
        if end is not None and not any(tok.is_eog(i) for i in ids[lead:]):
            ids.append(end)
        self.add_sequence(ids, context_only=lead)

    @classmethod
    def train(cls, tok: Tokenizer, texts: Iterable[str], order: int = DEFAULT_ORDER,
              parse_special: bool = False) -> NGramModel:
        """A new model of the given order trained on texts, each string one document."""
        model = cls(order, tok.n_vocab)
        model.tokenizer_info = describe_tokenizer(tok)
        for text in texts:
            model.add_text(tok, text, parse_special)
        return model

    @classmethod
    def train_files(cls, tok: Tokenizer, paths: Iterable[str | os.PathLike[str]],
                    order: int = DEFAULT_ORDER) -> NGramModel:
        """A new model trained on UTF-8 text files, each split into paragraphs at blank lines."""
        return cls.train(tok, read_paragraphs(paths), order)

    # --- queries ------------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        """Number of tokens counted (predicted positions) in training."""
        return sum(self._counts[0].get((), {}).values())

    def count(self, context: Sequence[int], token: int) -> int:
        """How often token followed exactly this context (of 0..order-1 ids) in training."""
        return self._followers(context).get(int(token), 0)

    def context_total(self, context: Sequence[int]) -> int:
        """c(h): how many tokens were seen after this context."""
        return sum(self._followers(context).values())

    def context_types(self, context: Sequence[int]) -> int:
        """T(h): how many distinct tokens were seen after this context."""
        return len(self._followers(context))

    def _followers(self, context: Sequence[int]) -> dict[int, int]:
        """The counts of what followed context (empty when never seen)."""
        ctx = tuple(int(i) for i in context)
        if len(ctx) >= self.order:
            raise ArgumentError(f"a {self.order}-gram model has contexts of at most {self.order - 1} ids, got {len(ctx)}")
        return self._counts[len(ctx)].get(ctx, {})

    def _unigram_probs(self) -> np.ndarray:
        """The unigram distribution (frequencies; uniform without training data), cached."""
        p = self._unigram
        if p is None:
            p = np.zeros(self.n_vocab, dtype=np.float64)
            followers = self._counts[0].get((), {})
            if followers:
                p[np.fromiter(followers.keys(), np.int64, len(followers))] = np.fromiter(
                    followers.values(), np.float64, len(followers))
                p /= p.sum()
            else:
                p[:] = 1.0 / self.n_vocab
            self._unigram = p
        return p

    def _context_arrays(self, ctx: Context) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(next ids, counts as floats, distinct count) after a seen context, cached; None when unseen."""
        got = self._arrays.get(ctx)
        if got is None:
            followers = self._counts[len(ctx)].get(ctx)
            if followers is None:
                return None
            n = len(followers)
            got = (np.fromiter(followers.keys(), np.int64, n), np.fromiter(followers.values(), np.float64, n), n)
            if len(self._arrays) > 100_000:
                self._arrays.clear()
            self._arrays[ctx] = got
        return got

    def probabilities(self, ids: Sequence[int]) -> np.ndarray:
        """P(next | the last order-1 ids) for every id of the vocab (float64, sums to 1)."""
        p = self._unigram_probs().copy()
        for k in range(1, min(self.order - 1, len(ids)) + 1):
            got = self._context_arrays(tuple(int(i) for i in ids[len(ids) - k:]))
            if got is None:  # a longer context containing this one cannot have been seen either
                break
            nxt, cnt, types = got
            denom = cnt.sum() + types
            p *= types / denom
            p[nxt] += cnt / denom
        return p

    def next_token(self, ids: Sequence[int], sampler: Sampler) -> int:
        """The LanguageModel protocol: the sampler picks one id among those with non-zero probability."""
        p = self.probabilities(ids)
        candidates = np.flatnonzero(p)
        return sampler.sample_probs(p[candidates], candidates)

    def check_tokenizer(self, tok: Tokenizer) -> None:
        """Refuse (ArgumentError) a tokenizer whose vocab size differs from the one this model counts ids of."""
        if tok.n_vocab != self.n_vocab:
            raise ArgumentError(f"this n-gram model was trained for a vocab of {self.n_vocab} tokens, "
                             f"but the tokenizer has {tok.n_vocab}")

    def __repr__(self) -> str:
        return (f"NGramModel(order={self.order}, n_vocab={self.n_vocab}, n_tokens={self.n_tokens}, "
                f"n_sequences={self.n_sequences})")

    # --- file format --------------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        """The JSON header of a saved model."""
        return {"format": FORMAT, "version": VERSION, "order": self.order, "n_vocab": self.n_vocab,
                "smoothing": SMOOTHING, "n_tokens": self.n_tokens, "n_sequences": self.n_sequences,
                "tokenizer": self.tokenizer_info}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model as a compressed .npz (no pickle) at exactly path (no suffix added), atomically
        (minillama.fileio.write_output)."""
        arrays: dict[str, np.ndarray] = {
            "meta": np.frombuffer(json.dumps(self._meta(), sort_keys=True).encode("utf-8"), np.uint8)}
        for k, table in enumerate(self._counts):
            contexts = sorted(table)
            offsets = np.zeros(len(contexts) + 1, np.int64)
            nxt: list[int] = []
            cnt: list[int] = []
            for j, ctx in enumerate(contexts):
                followers = table[ctx]
                for w in sorted(followers):
                    nxt.append(w)
                    cnt.append(followers[w])
                offsets[j + 1] = len(nxt)
            arrays[f"ctx{k}"] = np.array(contexts, np.int32).reshape(len(contexts), k)
            arrays[f"off{k}"] = offsets
            arrays[f"next{k}"] = np.array(nxt, np.int32)
            arrays[f"count{k}"] = np.array(cnt, np.int64)
        def write(out: str) -> None:
            with open(out, "wb") as f:
                np.savez_compressed(f, **arrays)  # type: ignore[arg-type]

        write_output(path, write)

    @classmethod
    def load(cls, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None) -> NGramModel:
        """Read a model written by save(), checking every part (FormatError); refuse a tokenizer of another size."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            head = f.read(4)
        if head != ZIP_MAGIC:
            raise FormatError(f"not a minillama n-gram file: expected a .npz (zip) archive starting with "
                              f"{ZIP_MAGIC!r}, found {head!r}", path=path, offset=0)
        try:
            _check_archive(path)
            with np.load(path, allow_pickle=False) as npz:
                model = cls._from_npz(npz, path)
        except FormatError:
            raise
        except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as exc:
            raise FormatError(f"not a readable minillama n-gram file: {exc}", path=path) from None
        if tokenizer is not None:
            model.check_tokenizer(tokenizer)
        return model

    @classmethod
    def _from_npz(cls, npz: Any, path: str) -> NGramModel:
        """Rebuild a model from the members of an opened .npz, checking each one."""
        names = set(npz.files)
        meta = _member(npz, names, "meta", path)
        if meta.dtype != np.uint8 or meta.ndim != 1:
            raise FormatError(f"expected 'meta' to be a uint8 vector, found {meta.dtype} of shape {meta.shape}",
                              path=path, key="meta")
        try:
            info = json.loads(meta.tobytes().decode("utf-8"))
        except RecursionError:
            raise FormatError("expected 'meta' to be a flat JSON object, found JSON nested too deep to read",
                              path=path, key="meta") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"expected 'meta' to hold UTF-8 JSON, found invalid data ({exc})",
                              path=path, key="meta") from None
        if not isinstance(info, dict):
            raise FormatError(f"expected 'meta' to be a JSON object, found {type(info).__name__}", path=path, key="meta")
        if info.get("format") != FORMAT:
            raise FormatError(f"expected format {FORMAT!r}, found {info.get('format')!r}", path=path, key="format")
        if info.get("version") != VERSION:
            raise FormatError(f"expected version {VERSION}, found {info.get('version')!r}", path=path, key="version")
        if info.get("smoothing") != SMOOTHING:
            raise FormatError(f"expected smoothing {SMOOTHING!r}, found {info.get('smoothing')!r}",
                              path=path, key="smoothing")
        order, n_vocab = info.get("order"), info.get("n_vocab")
        for key, value in (("order", order), ("n_vocab", n_vocab)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FormatError(f"expected {key} to be an integer >= 1, found {value!r}", path=path, key=key)
        assert isinstance(order, int) and isinstance(n_vocab, int)
        if order > len(names):  # checked before anything of size order is made
            raise FormatError(f"expected {4 * order + 1} members for order {order}, found {len(names)}",
                              path=path, key="order")
        expected = {"meta"} | {f"{p}{k}" for k in range(order) for p in ("ctx", "off", "next", "count")}
        missing = sorted(expected - names)
        if missing:
            raise FormatError(f"expected a member {missing[0]!r}, found only {sorted(names)}", path=path,
                              key=missing[0])
        extra = sorted(names - expected)
        if extra:
            raise FormatError(f"unexpected members {extra} for a {order}-gram model", path=path, key=extra[0])
        model = cls(order, n_vocab)
        tok_info = info.get("tokenizer", {})
        model.tokenizer_info = tok_info if isinstance(tok_info, dict) else {}
        n_seq = info.get("n_sequences", 0)
        model.n_sequences = n_seq if isinstance(n_seq, int) else 0
        for k in range(order):
            model._counts[k] = _read_table(npz, names, k, n_vocab, path)
        if info.get("n_tokens") != model.n_tokens:
            raise FormatError(f"expected n_tokens {info.get('n_tokens')!r} (from 'meta'), found {model.n_tokens} "
                              "unigram counts", path=path, key="count0")
        return model


# The arrays of a saved model take about 5x its .npz (measured: 2.6-5.2x); a member claiming far more
# than the archive could honestly hold (a zip bomb, a forged .npy header) is refused before it is read.
MAX_EXPANSION = 32
MAX_META_BYTES = 1 << 20


def _check_archive(path: str) -> None:
    """FormatError unless every member is a .npy whose header agrees with its size, all of them
    together no larger than MAX_EXPANSION times the archive (+1 MiB): nothing is allocated before."""
    budget = MAX_EXPANSION * os.path.getsize(path) + (1 << 20)
    total = 0
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".npy"):
                raise FormatError(f"expected only .npy members, found {name!r}", path=path, key=name)
            with zf.open(info) as f:
                try:
                    version = np.lib.format.read_magic(f)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(f)
                except ValueError as exc:
                    raise FormatError(f"expected a .npy header in {name!r}, found {exc}", path=path,
                                      key=name) from None
                header = f.tell()
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if header + nbytes != info.file_size:
                raise FormatError(f"expected {name!r} to hold {header + nbytes} bytes as its header says "
                                  f"(shape {shape}, {dtype}), found {info.file_size}", path=path, key=name)
            if name == "meta.npy" and nbytes > MAX_META_BYTES:
                raise FormatError(f"expected 'meta' of at most {MAX_META_BYTES} bytes, found {nbytes}",
                                  path=path, key="meta")
            total += nbytes
            if total > budget:
                raise FormatError(f"expected arrays of at most {budget} bytes in all ({MAX_EXPANSION}x the "
                                  f"archive), found {name!r} taking the total to {total}", path=path, key=name)


def _member(npz: Any, names: set[str], name: str, path: str) -> np.ndarray:
    """One array of the archive, or FormatError naming the missing member."""
    if name not in names:
        raise FormatError(f"expected a member {name!r}, found only {sorted(names)}", path=path, key=name)
    return npz[name]


def _int_array(npz: Any, names: set[str], name: str, ndim: int, path: str) -> np.ndarray:
    """An integer array of the given rank from the archive (FormatError otherwise)."""
    a = _member(npz, names, name, path)
    if a.dtype.kind not in "iu" or a.ndim != ndim:
        raise FormatError(f"expected {name!r} to be a {ndim}-d integer array, found {a.dtype} of shape {a.shape}",
                          path=path, key=name)
    return a.astype(np.int64)


def _read_table(npz: Any, names: set[str], k: int, n_vocab: int, path: str) -> dict[Context, dict[int, int]]:
    """The counts of context length k from ctx{k}/off{k}/next{k}/count{k}, each checked."""
    ctx = _int_array(npz, names, f"ctx{k}", 2, path)
    off = _int_array(npz, names, f"off{k}", 1, path)
    nxt = _int_array(npz, names, f"next{k}", 1, path)
    cnt = _int_array(npz, names, f"count{k}", 1, path)
    m = ctx.shape[0]
    if ctx.shape[1] != k:
        raise FormatError(f"expected ctx{k} to have {k} columns, found {ctx.shape[1]}", path=path, key=f"ctx{k}")
    if k == 0 and m > 1:
        raise FormatError(f"expected at most one empty context, found {m}", path=path, key="ctx0")
    if off.shape[0] != m + 1 or (m + 1 and (off[0] != 0 or off[-1] != nxt.shape[0])):
        raise FormatError(f"expected off{k} to hold {m + 1} offsets from 0 to {nxt.shape[0]}, found "
                          f"{off.shape[0]} ({off[:1].tolist()}..{off[-1:].tolist()})", path=path, key=f"off{k}")
    if np.any(np.diff(off) <= 0):
        raise FormatError(f"expected off{k} to increase strictly (every context has a follower)", path=path,
                          key=f"off{k}")
    if cnt.shape != nxt.shape:
        raise FormatError(f"expected count{k} to have {nxt.shape[0]} entries like next{k}, found {cnt.shape[0]}",
                          path=path, key=f"count{k}")
    for name, a in ((f"ctx{k}", ctx), (f"next{k}", nxt)):
        if a.size and (a.min() < 0 or a.max() >= n_vocab):
            bad = int(a.min() if a.min() < 0 else a.max())
            raise FormatError(f"expected token ids in 0..{n_vocab - 1}, found {bad}", path=path, key=name)
    if cnt.size and cnt.min() < 1:
        raise FormatError(f"expected counts >= 1, found {int(cnt.min())}", path=path, key=f"count{k}")
    table: dict[Context, dict[int, int]] = {}
    contexts = [tuple(row) for row in ctx.tolist()]
    bounds = off.tolist()
    nxt_l, cnt_l = nxt.tolist(), cnt.tolist()
    for j, c in enumerate(contexts):
        a, b = bounds[j], bounds[j + 1]
        followers = dict(zip(nxt_l[a:b], cnt_l[a:b]))
        if len(followers) != b - a:
            raise FormatError(f"expected distinct next ids per context, found a repeat after context {list(c)}",
                              path=path, key=f"next{k}")
        table[c] = followers
    if len(table) != m:
        raise FormatError(f"expected distinct contexts, found a repeated one in ctx{k}", path=path, key=f"ctx{k}")
    return table


def describe_tokenizer(tok: Tokenizer) -> dict[str, Any]:
    """What a saved model records about the tokenizer it was trained with (informational, besides n_vocab)."""
    name = tok.vocab.metadata.get("general.name") if hasattr(tok.vocab, "metadata") else None
    return {"model": tok.kind, "pre": tok.pre, "n_vocab": tok.n_vocab,
            **({"name": name} if isinstance(name, str) else {})}
