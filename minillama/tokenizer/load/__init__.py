"""Loaders: a model file -> GGUF-style tokenizer metadata. They know files, nothing of merging."""

from __future__ import annotations

import os
from typing import Any

from ...errors import FormatError
from ...fileio import input_path
from .gguf import GGUFFile, is_gguf, read_gguf
from .hf_json import looks_like_json, read_hf_json
from .llama2c import looks_like_llama2c, read_llama2c
from .sentencepiece import looks_like_sentencepiece, read_sentencepiece

EXPECTED = ("a GGUF file, a SentencePiece .model, a Hugging Face tokenizer.json or a llama2.c "
            "tokenizer.bin")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Tokenizer metadata of any supported file, chosen by content (not by name)."""
    path = input_path(path, "model file")
    with open(path, "rb") as f:
        head = f.read(64)
        size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise FormatError(f"empty file, expected {EXPECTED}", path=path, offset=0)
    if is_gguf(head):
        return read_gguf(path, tensors=False).metadata
    if looks_like_sentencepiece(head):
        return read_sentencepiece(path)
    if looks_like_json(head):
        return read_hf_json(path)
    if looks_like_llama2c(head, size):
        return read_llama2c(path)
    raise FormatError(f"unrecognised file (starts with {head[:8]!r}), expected {EXPECTED}", path=path, offset=0)


__all__ = ["read_metadata", "read_gguf", "is_gguf", "read_llama2c", "read_sentencepiece", "read_hf_json", "GGUFFile"]
