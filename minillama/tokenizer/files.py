"""What `minillama inspect` and the CLI ask about tokenizer files and vocabs without building a Tokenizer:
which format a file is in and how to name it, the GGUF keys of the special ids, one token's piece, how
much padding a tokenizer.json was given, and where the packaged demo vocab is. minillama.tokenizer
re-exports them, so that those callers import nothing below its public face.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .vocab import Vocab


def default_vocab_path() -> str:
    """Path of the small demo vocab that ships inside the package (made by scripts/make_default_vocab.py)."""
    from importlib import resources  # here, not at the top: with pathlib ~10 ms of every start

    return str(resources.files("minillama") / "data" / "default-vocab.gguf")


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
