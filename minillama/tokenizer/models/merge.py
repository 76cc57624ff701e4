"""What the two merge models (bpe.py: by rank, spm.py: by score) share around their merge loops.

The loops themselves stay in each model, written out: they are the hot path, each pair's priority is
computed differently (a merge rank of "left right", or the score rank of the token left + right), and
llama.cpp's staleness tests differ with it (the same rank again; the same symbol sizes).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from .base import links


def linked_list(n: int) -> tuple[list[int] | array, list[int] | array]:
    """(next, previous) of n symbols in a row, -1 past either end: the linked list a heap merge unlinks
    merged symbols from (llama.cpp's llm_symbol.n and .p)."""
    nxt = links(range(1, n + 1))
    nxt[-1] = -1
    return nxt, links(range(-1, n - 1))


def with_bytes(syms: list[str], ids: list[int | None], fallback: Callable[[str], list[int]]) -> list[int]:
    """ids (each symbol's id, None for a symbol that is no token) with each None replaced by the ids fallback
    gives for its symbol (its bytes). Callers return ids themselves when no None is in them: the usual case,
    kept free of a call."""
    out: list[int] = []
    for s, i in zip(syms, ids, strict=True):
        if i is None:
            out += fallback(s)
        else:
            out.append(i)
    return out
