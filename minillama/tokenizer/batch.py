"""Encoding many texts at once (Tokenizer.encode_batch): checking the batch and its options, sharing the
texts out to threads, cutting each text's ids to a length while keeping the bos/eos add_special adds, and
padding the id lists into one array with its attention mask.

Plain functions over plain values (the texts, the encoder, ids): the Tokenizer facade calls them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from .decode import check_id
from .encoders import Encoder
from .hf_api import PaddingSide

RUNS_PER_THREAD = 4  # encode_batch hands each thread about this many runs of texts (balance vs. overhead)


def batch_texts(texts: Iterable[str], num_threads: int | None) -> tuple[list[str], int]:
    """encode_batch's texts as a list of str and its thread count, both checked."""
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
    return texts, num_threads


def check_padding_args(return_array: bool, pad_to: Literal["longest"] | int | None, pad_id: int | None) -> None:
    """encode_batch's padding options that go together: pad_to with return_array, pad_id with pad_to."""
    if pad_to is not None and not return_array:
        raise ArgumentError("pad_to needs return_array=True (lists need no padding)")
    if pad_id is not None and pad_to is None:
        raise ArgumentError("pad_id is given but pad_to is not: pass pad_to='longest' or a length")


def truncation_affixes(encoder: Encoder, truncate: int | None, add_special: bool) -> tuple[list[int], list[int]]:
    """encode_batch's check of truncate, and the ids add_special adds around each truncated text."""
    before: list[int] = []
    after: list[int] = []
    if truncate is None:
        return before, after
    if isinstance(truncate, bool) or not isinstance(truncate, int):
        raise ArgumentTypeError(f"truncate must be an int or None, got {type(truncate).__name__}")
    if add_special:
        before, after = encoder.affixes()
    if truncate < len(before) + len(after):
        raise ArgumentError(f"truncate={truncate} leaves no room for the {len(before) + len(after)} ids "
                            "add_special adds")
    return before, after


def padding_id(pad_to: Literal["longest"] | int, pad_id: int | None, default: int | None, n_vocab: int) -> int:
    """encode_batch's padding id (default, the tokenizer's pad_id, unless given), pad_to checked."""
    if pad_id is None:
        pad_id = default
        if pad_id is None:
            raise ArgumentError("this vocab has no pad token (tokenizer.ggml.padding_token_id): pass "
                                "pad_id=<an id> to pad with, e.g. pad_id=tok.eos_id, or set tok.pad_id")
    pad_id = check_id(pad_id, n_vocab)
    if pad_to != "longest" and (isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 0):
        raise ArgumentError(f"pad_to must be None, 'longest' or a length >= 0, got {pad_to!r}")
    return pad_id


def encode_in_runs(encode_run: Callable[[list[str]], list[list[int]]], texts: list[str],
                   num_threads: int) -> list[list[int]]:
    """encode_run over texts on up to num_threads threads, the results in order: each thread takes a few
    contiguous runs of texts, since a task per text would cost more than a short text's encode."""
    num_threads = min(num_threads, len(texts))
    if num_threads <= 1:
        return encode_run(texts)
    step = -(-len(texts) // (num_threads * RUNS_PER_THREAD))
    runs = [texts[i:i + step] for i in range(0, len(texts), step)]
    with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="minillama-encode") as pool:
        return [ids for part in pool.map(encode_run, runs) for ids in part]


def with_affixes(out: list[list[int]], before: list[int], after: list[int],
                 truncate: int | None = None) -> list[list[int]]:
    """Each id list between before and after (the ids add_special adds), first cut so that the whole holds at
    most truncate ids when truncate is given."""
    if truncate is None:
        return [[*before, *ids, *after] for ids in out] if before or after else out
    room = truncate - len(before) - len(after)
    return [before + ids[:room] + after for ids in out]


def batch_arrays(out: list[list[int]], pad_to: Literal["longest"] | int | None,
                 pad_id: int | None, side: PaddingSide = "right") -> tuple[np.ndarray, np.ndarray]:
    """encode_batch's (ids, attention_mask) arrays: the id lists padded to one width on side."""
    lengths = [len(ids) for ids in out]
    longest = max(lengths, default=0)
    if pad_to is None:
        if len(set(lengths)) > 1:
            raise ArgumentError(f"the texts give {min(lengths)} to {longest} ids: pass pad_to='longest' (or a "
                                "length) to pad them into one array")
        width = longest
    else:
        width = longest if pad_to == "longest" else int(pad_to)
        if longest > width:
            i = lengths.index(longest)
            raise ArgumentError(f"text {i} gives {longest} ids, more than pad_to={width}: pass truncate={width}")
    ids_arr = np.full((len(out), width), pad_id if pad_id is not None else 0, np.int32)
    mask = np.zeros((len(out), width), np.int32)
    for r, ids in enumerate(out):
        cols = slice(width - len(ids), width) if side == "left" else slice(0, len(ids))
        ids_arr[r, cols] = ids
        mask[r, cols] = 1
    return ids_arr, mask
