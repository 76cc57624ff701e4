"""Tokenizer file formats: one module per format, each with its reader (and writer, where there is one).

A file -> GGUF-style tokenizer metadata. The readers know files, nothing of merging. FORMATS is the one
table that tells formats apart by content (never by name): read_metadata, `inspect` and `convert` all
sniff through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import FormatError, InputError
from ...fileio import input_path
from .gguf_tokenizer import looks_like_gguf, read_gguf_tokenizer
from .hf_json import looks_like_json, read_hf_json
from .llama2c import looks_like_llama2c, read_llama2c
from .sentencepiece import looks_like_sentencepiece, read_sentencepiece


class Format(NamedTuple):
    """One tokenizer file format: its name in reports, how it is shown, how it is recognised and read."""

    name: str  # the report's "format"
    display: str  # how `inspect` shows it
    expected: str  # how an error names it ("expected a GGUF file, ...")
    sniff: Callable[[bytes, int], bool]  # (first bytes, file size) -> is it this format?
    read: Callable[[str], dict[str, Any]]  # path -> GGUF-style tokenizer metadata


# In the order they are tried: each test is only asked when the ones before it said no.
FORMATS: tuple[Format, ...] = (
    Format("gguf", "GGUF", "a GGUF file", looks_like_gguf, read_gguf_tokenizer),
    Format("sentencepiece", "SentencePiece model", "a SentencePiece .model",
           lambda head, size: looks_like_sentencepiece(head), read_sentencepiece),
    Format("tokenizer.json", "Hugging Face tokenizer.json", "a Hugging Face tokenizer.json",
           lambda head, size: looks_like_json(head), read_hf_json),
    Format("llama2.c", "llama2.c tokenizer.bin", "a llama2.c tokenizer.bin", looks_like_llama2c, read_llama2c),
)
GGUF = FORMATS[0]

EXPECTED = ", ".join(f.expected for f in FORMATS[:-1]) + " or " + FORMATS[-1].expected
HEAD_BYTES = 64  # what the sniff tests see of a file


def detect_format(head: bytes, size: int) -> Format | None:
    """The format of a file from its first bytes and its size (None: none of FORMATS)."""
    return next((f for f in FORMATS if f.sniff(head, size)), None)


def sniff_file(path: str | os.PathLike[str]) -> tuple[str, Format, int]:
    """(path checked as an input file, its format, its size); FormatError for an empty or unrecognised file."""
    path = input_path(path, "model file")
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
        size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise FormatError(f"empty file, expected {EXPECTED}", path=path, offset=0)
    fmt = detect_format(head, size)
    if fmt is None:
        raise FormatError(f"unrecognised file (starts with {head[:8]!r}{_hint(head)}), expected {EXPECTED}",
                          path=path, offset=0)
    return path, fmt, size


def model_file(path: str | os.PathLike[str]) -> str:
    """The file to read for a model path: path itself, or for a Hugging Face model directory (what
    from_pretrained takes) the tokenizer.json in it; InputError for a directory without one."""
    if not isinstance(path, (str, os.PathLike)):
        return path  # not a path at all: input_path names what it got
    path = os.fspath(path)
    if not os.path.isdir(path):
        return path
    inside = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(inside):
        raise InputError(f"cannot read {path!r}: expected a model file ({EXPECTED}) or a Hugging Face model "
                         "directory holding tokenizer.json, found a directory without a tokenizer.json")
    return inside


def read_metadata(path: str | os.PathLike[str], lazy: bool = False) -> dict[str, Any]:
    """Tokenizer metadata of any supported file, chosen by content (not by name). lazy: a GGUF's merges as a
    JoinedStrings (what a Vocab keeps: the native core reads them as one text)."""
    path, fmt, _ = sniff_file(path)
    return read_gguf_tokenizer(path, lazy=True) if lazy and fmt is GGUF else fmt.read(path)


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


__all__ = ["FORMATS", "GGUF", "EXPECTED", "Format", "detect_format", "sniff_file", "model_file", "read_metadata",
           "read_llama2c", "read_sentencepiece", "read_hf_json"]
