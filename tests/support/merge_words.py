"""Words for the merge-model tests (test_bpe.py, test_spm.py): lengths either side of a model's heap threshold,
random words over small alphabets (many equal pairs) and one-letter runs."""

from __future__ import annotations

import random

ALPHABETS = ["abcdefghijklmnopqrstuvwxyz", "ab", "the", "éàüßø", "日本語の文字"]


def lengths(heap_min_len: int, heap: bool) -> list[int]:
    """Word lengths the plain loop merges (heap False) or the heap does (True)."""
    if heap:
        return [heap_min_len, heap_min_len + 1, 64, 100, 257, 1000, 4000]
    return [1, 2, 3, 5, 8, 13, heap_min_len - 2, heap_min_len - 1]


def words(seed: int, sizes: list[int], alphabet: str, runs: bool = True) -> list[str]:
    """A random word over alphabet of each size, then (runs) a run of its first letter of each size."""
    rng = random.Random(seed)
    out = ["".join(rng.choice(alphabet) for _ in range(n)) for n in sizes]
    return out + [alphabet[0] * n for n in sizes] if runs else out


def very_long_words(seed: int) -> list[str]:
    """Words far past any heap threshold, repeating and not."""
    return ["a" * 20000, "ab" * 7001, *words(seed, [12000], "qwertyuiop", runs=False)]
