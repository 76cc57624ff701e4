"""minillama.tokenizer: open a model's tokenizer and encode/decode exactly as llama.cpp does.

    from minillama.tokenizer import Tokenizer
    tok = Tokenizer.from_file("model.gguf")        # or a llama2.c tokenizer.bin
    ids = tok.encode("Hello world", add_special=True, parse_special=False)
    tok.decode(ids); tok.decode_bytes(ids); tok.token_to_piece(ids[0])

The pipeline: file -> Vocab (load/, vocab.py) -> special-token split (special.py) -> merge model
(models/: score-based SPM or rank-based BPE with its pre-tokenizer) -> ids -> pieces (decode.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import resources

from .decode import PieceTable, StreamDecoder, out_of_range
from .load import read_metadata
from .models import Model, make_model
from .special import partition
from .vocab import Attr, Vocab

__all__ = ["Tokenizer", "Vocab", "Attr", "StreamDecoder", "default_vocab_path"]


def default_vocab_path() -> str:
    """Path of the small demo vocab that ships inside the package (made by scripts/make_default_vocab.py)."""
    return str(resources.files("minillama") / "data" / "default-vocab.gguf")


class Tokenizer:
    """A vocab plus its merge model: llama_tokenize / llama_detokenize / llama_token_to_piece in Python."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._model: Model = make_model(vocab)
        self._pieces: PieceTable | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Open a GGUF (v2/v3) or llama2.c tokenizer.bin file, recognised by its content."""
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
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        v, model = self.vocab, self._model
        before, after = model.affixes() if add_special else ((), ())
        out: list[int] = list(before)
        after_special = True
        for frag in partition(v, text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                out += model.encode(model.prepare(frag, after_special))  # type: ignore[attr-defined]
                after_special = False
        out += after
        return out

    # --- decoding ---------------------------------------------------------------------------
    @property
    def pieces(self) -> PieceTable:
        """Every token's bytes, computed on first use."""
        table = self._pieces
        if table is None:
            table = self._pieces = PieceTable(self.vocab)
        return table

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        """ids as a list, all of them non-negative (decode's table lookup reports ids too large)."""
        if not isinstance(ids, list):
            ids = [int(i) for i in ids]  # tuples, numpy arrays, generators
        if ids:
            lo = min(ids)
            if lo < 0:
                raise out_of_range(lo, self.vocab.n_vocab)
        return ids

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes of one token (control/unknown tokens empty unless special)."""
        if not 0 <= token_id < self.vocab.n_vocab:
            raise out_of_range(token_id, self.vocab.n_vocab)
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
