"""minillama.tokenizer: open a model's tokenizer and encode/decode exactly as llama.cpp does.

    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file("model.gguf")  # or tokenizer.bin, a SentencePiece .model, a tokenizer.json
    ids = tok.encode("Hello world", add_special=True, parse_special=False)
    tok.decode(ids); tok.decode_bytes(ids); tok.token_to_piece(ids[0])

The pipeline: file -> Vocab (load/, vocab.py) -> special-token split (special.py) -> merge model
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
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from ..errors import ArgumentError, ArgumentTypeError
from .decode import PieceTable, StreamDecoder, check_id, out_of_range
from .load import read_metadata
from .models import Model, make_model
from .special import partition
from .vocab import Attr, Vocab

_GC_PAUSE_CHARS = 1 << 14  # texts longer than this encode with the cyclic GC paused

__all__ = ["Tokenizer", "Vocab", "Attr", "StreamDecoder", "default_vocab_path"]


def default_vocab_path() -> str:
    """Path of the small demo vocab that ships inside the package (made by scripts/make_default_vocab.py)."""
    return str(resources.files("minillama") / "data" / "default-vocab.gguf")


# Surrogates that are not escapes of raw bytes 0x80..0xFF.
_NOT_ESCAPE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
_ESCAPE = re.compile("[\udc80-\udcff]")


def as_bytes_text(text: str) -> str:
    """text (which failed a strict UTF-8 encode) as the bytes it stands for, decoded with 'surrogateescape'.

    Surrogates other than U+DC80..U+DCFF become U+FFFD; escapes stand for their raw bytes, and escapes
    that together form valid UTF-8 become that character, so that every raw byte left is one llama.cpp
    would also find invalid.
    """
    text = _NOT_ESCAPE.sub("\ufffd", text)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")


class Tokenizer:
    """A vocab plus its merge model: llama_tokenize / llama_detokenize / llama_token_to_piece in Python."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._model: Model = make_model(vocab)
        self._pieces: PieceTable | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        """Pickle as the vocab's tables alone (process pools, Ray actors): the model, its word caches,
        the piece table and the lock are rebuilt on the other side, so no file needs to be there."""
        return type(self), (self.vocab,)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Open a GGUF (v2/v3), llama2.c tokenizer.bin, SentencePiece .model or Hugging Face tokenizer.json
        file, recognised by its content, not its name."""
        path = os.fspath(path)
        return cls(Vocab.from_metadata(read_metadata(path), path))

    # --- properties -------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return self.vocab.n_vocab

    @property
    def model(self) -> str:
        """Merge model: 'spm' (scores) or 'bpe' (merges)."""
        return self.vocab.model

    @property
    def pre(self) -> str:
        """The pre-tokenizer name (`tokenizer.ggml.pre`; 'default' for SPM)."""
        return self.vocab.pre

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
    def add_bos(self) -> bool:
        """Whether encode(add_special=True) prepends bos."""
        return self.vocab.add_bos

    def is_eog(self, token_id: int) -> bool:
        """True for ids that end generation (eos, eot, eom and the ids llama.cpp recognises by text)."""
        return token_id in self.vocab.eog_ids

    # --- encoding ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special): ids for text.

        add_special adds bos/eos as the vocab's flags say; parse_special matches control tokens
        written in the text (user-defined tokens are always matched, as in llama.cpp).

        text is any str: it is tokenized as its UTF-8 bytes; lone surrogates U+DC80..U+DCFF stand
        for the raw bytes 0x80..0xFF (surrogateescape) and other lone surrogates become U+FFFD (see
        the module docstring). For byte-level BPE and byte-fallback SPM vocabs,
        ``decode(encode(s, add_special=False)) == s`` for every valid str s, up to llama.cpp's
        clean-up of spaces before punctuation in vocabs that ask for it, and for SPM, U+2581 (which
        is its space marker) and the space llama.cpp adds after a special token.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError(f"encode() takes a str, got {type(text).__name__}")
        escaped = False
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: the rare, slow path
                text = as_bytes_text(text)
                escaped = _ESCAPE.search(text) is not None
        v, model = self.vocab, self._model
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
            for frag in partition(v, text, parse_special):
                if isinstance(frag, int):
                    out.append(frag)
                    after_special = True
                else:
                    frag = model.prepare(frag, after_special)
                    out += model.encode_escaped(frag) if escaped else model.encode(frag)
                    after_special = False
        finally:
            if pause_gc:
                gc.enable()
        out += after
        return out

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None, *, add_special: bool = True,
                     parse_special: bool = False) -> list[list[int]]:
        """encode() of every text, in order, on a pool of num_threads threads sharing this Tokenizer.

        num_threads=None uses os.cpu_count() threads; 1 (or a single text) encodes in this thread.
        The threads share one set of caches, so words seen by one are not recomputed by another. The
        encoding itself is Python code and holds the GIL: threads help mostly callers whose own work
        between calls waits on I/O, and on free-threaded builds; for CPU-bound batches on a standard
        build expect about the speed of a plain loop. Results equal [encode(t) for t in texts].
        """
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
        num_threads = min(num_threads, len(texts))
        if num_threads <= 1:
            return [self.encode(t, add_special, parse_special) for t in texts]
        with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="minillama-encode") as pool:
            return list(pool.map(lambda t: self.encode(t, add_special, parse_special), texts))

    # --- decoding ---------------------------------------------------------------------------
    @property
    def pieces(self) -> PieceTable:
        """Every token's bytes, computed on first use."""
        table = self._pieces
        if table is None:
            with self._lock:
                table = self._pieces
                if table is None:
                    table = self._pieces = PieceTable(self.vocab)
        return table

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        """ids as a list, all of them non-negative (decode's table lookup reports ids too large)."""
        if isinstance(ids, (str, bytes)):
            raise ArgumentTypeError(f"token ids must be a sequence of int, got {type(ids).__name__}")
        if not isinstance(ids, list):
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

    def decode_bytes(self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """llama_detokenize(ids, remove_special, unparse_special) as bytes."""
        return self.pieces.detokenize(self._check_ids(ids), remove_special, unparse_special)

    def decode(self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        """decode_bytes as text; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        """A decoder for one generated sequence: push(id) -> new text, flush() -> the rest.

        skip_special=True renders control tokens as nothing, like decode(unparse_special=False).
        """
        return StreamDecoder(self.pieces, skip_special)

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"
