"""GGUF as a tokenizer format: the tokenizer metadata of a GGUF file, and the vocab-only GGUF writer.

A thin layer over minillama.gguffile, which owns the file format (reader, writer, value types).
"""

from __future__ import annotations

import os
from typing import Any

from ...gguffile.reader import is_gguf, read_gguf
from ...gguffile.writer import write_vocab_gguf


def looks_like_gguf(head: bytes, size: int) -> bool:
    """True when the first bytes of a file are the GGUF magic (size is not needed)."""
    return is_gguf(head)


def read_gguf_tokenizer(path: str | os.PathLike[str], lazy: bool = False) -> dict[str, Any]:
    """All metadata of a GGUF file (the tokenizer.* keys among them); the tensor table is not read. lazy: the
    merges as a JoinedStrings (for a Vocab; inspect and convert get plain lists)."""
    return read_gguf(path, tensors=False, lazy=lazy).metadata


__all__ = ["looks_like_gguf", "read_gguf_tokenizer", "write_vocab_gguf"]
