"""Loaders: a model file -> GGUF-style tokenizer metadata. They know files, nothing of merging."""

from __future__ import annotations

import os
from collections.abc import Callable
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
    raise FormatError(f"unrecognised file (starts with {head[:8]!r}{_hint(head)}), expected {EXPECTED}", path=path,
                      offset=0)


# Files people pass by mistake, recognised by their first bytes, with what to do instead.
_KNOWN_OTHERS: tuple[tuple[Callable[[bytes], bool], str], ...] = (
    (lambda h: len(h) > 9 and h[8:10] == b'{"', "a safetensors weights file: convert the model to GGUF with "
     "llama.cpp's convert_hf_to_gguf.py, or pass the tokenizer.json beside it"),
    (lambda h: h[:2] == b"PK", "a zip archive (a PyTorch .bin/.pt checkpoint?): pass the model's GGUF or its "
     "tokenizer.json / tokenizer.model"),
    (lambda h: h[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"), "a Python pickle: pass the model's "
     "GGUF or its tokenizer.json / tokenizer.model"),
)


def _hint(head: bytes) -> str:
    """': this looks like ...' for a known kind of file that is not a tokenizer, else ''."""
    return next((f"; this looks like {what}" for test, what in _KNOWN_OTHERS if test(head)), "")


__all__ = ["read_metadata", "read_gguf", "is_gguf", "read_llama2c", "read_sentencepiece", "read_hf_json", "GGUFFile"]
