"""Checks of a data set directory before dataset.open trusts it: index.json's types and bounds, shard names
confined to the directory, sizes consistent with the files, doc_offsets.npy's shape and ends.

A damaged or hostile index (edited by hand, cut short, written by something else) is a MinillamaError that
names the file, what was expected and what was found, never a KeyError, TypeError or a memory map of a
file outside the directory.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ..errors import MinillamaError

ITEMSIZES = {"uint16": 2, "uint32": 4}  # the dtypes prepare() writes
SHARD_FILE = re.compile(r"shard-\d{5}\.bin")  # shards.shard_name's form: a bare name inside the directory
OFFSETS_FILE = "doc_offsets.npy"
MAX_COUNT = 1 << 62  # tokens or documents: beyond any file


def _count(where: str, rec: dict, key: str) -> int:
    value = rec.get(key) if isinstance(rec, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise MinillamaError(f"{where}: expected {key!r} to be a whole number from 0 to 2**62, found {value!r}")
    return value


def check_index(path: str, index: dict) -> np.dtype:
    """The little-endian dtype of the shards, after checking index (the parsed index.json of directory path)
    against the files beside it."""
    where = os.path.join(path, "index.json")
    dtype = index.get("dtype")
    if dtype not in ITEMSIZES:
        raise MinillamaError(f"{where}: expected 'dtype' to be one of {', '.join(ITEMSIZES)}, found {dtype!r}")
    itemsize = ITEMSIZES[dtype]
    shards = index.get("shards")
    if not isinstance(shards, list):
        raise MinillamaError(f"{where}: expected 'shards' to be a list, found {type(shards).__name__}")
    tokens = docs = 0
    for i, s in enumerate(shards):
        at = f"{where}, shard {i}"
        if not isinstance(s, dict):
            raise MinillamaError(f"{at}: expected an object, found {type(s).__name__}")
        name = s.get("file")
        if not isinstance(name, str) or not SHARD_FILE.fullmatch(name):
            raise MinillamaError(f"{at}: expected a file name like shard-00000.bin inside the directory, found "
                                 f"{name!r}")
        n, d = _count(at, s, "tokens"), _count(at, s, "docs")
        if _count(at, s, "first_token") != tokens or _count(at, s, "first_doc") != docs:
            raise MinillamaError(f"{at}: expected first_token {tokens} and first_doc {docs} (the shards before it), "
                                 f"found {s['first_token']} and {s['first_doc']}")
        f = os.path.join(path, name)
        try:
            size = os.stat(f).st_size
        except OSError as exc:
            raise MinillamaError(f"{f}: expected a shard of {n} ids, found {exc.strerror.lower()}") from None
        if not os.path.isfile(f) or size != n * itemsize:
            raise MinillamaError(f"{f}: expected {n} ids ({n * itemsize} bytes), found "
                                 f"{size if os.path.isfile(f) else 'not a file'} bytes")
        tokens, docs = tokens + n, docs + d
    for key, total in (("tokens", tokens), ("docs", docs)):
        if _count(where, index, key) != total:
            raise MinillamaError(f"{where}: expected {key!r} to be {total} (the shards' sum), found {index[key]!r}")
    if index.get("doc_offsets") != OFFSETS_FILE:
        raise MinillamaError(f"{where}: expected 'doc_offsets' to be {OFFSETS_FILE!r}, found "
                             f"{index.get('doc_offsets')!r}")
    return np.dtype(dtype).newbyteorder("<")


def load_offsets(path: str, n_docs: int, n_tokens: int) -> np.ndarray:
    """doc_offsets.npy of directory path, memory-mapped, after checking it holds n_docs + 1 int64 offsets from
    0 to n_tokens."""
    f = os.path.join(path, OFFSETS_FILE)
    try:
        offsets = np.load(f, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise MinillamaError(f"{f}: expected the document offsets of the data set, found no such file (run "
                             "'minillama dataset' again to rewrite it)") from None
    except (OSError, ValueError) as exc:
        raise MinillamaError(f"{f}: expected a .npy array of document offsets, found {exc}") from None
    if offsets.dtype != np.dtype("<i8") or offsets.shape != (n_docs + 1,):
        raise MinillamaError(f"{f}: expected {n_docs + 1} int64 offsets, found {offsets.shape} {offsets.dtype}")
    if offsets[0] != 0 or offsets[-1] != n_tokens:
        raise MinillamaError(f"{f}: expected offsets from 0 to {n_tokens}, found {offsets[0]} to {offsets[-1]}")
    return offsets
