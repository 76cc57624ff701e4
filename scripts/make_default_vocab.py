"""Train the small default byte-level BPE vocab that ships as minillama/data/default-vocab.gguf.

The training text is minillama/data/default-corpus.txt, which lives in this repository (and ships
in the package, where `minillama chat` trains its placeholder n-gram on it); nothing
from outside the repository is used. The output is deterministic: the same corpus always gives
the same bytes.

Usage: python scripts/make_default_vocab.py [--corpus PATH] [--out PATH] [--vocab-size N]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import time

import gguf
import regex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CORPUS = os.path.join(ROOT, "minillama", "data", "default-corpus.txt")
DEFAULT_OUT = os.path.join(ROOT, "minillama", "data", "default-vocab.gguf")
DEFAULT_VOCAB_SIZE = 1000

# The GPT-2 pre-tokenizer, the one llama.cpp uses for tokenizer.ggml.pre == "gpt-2".
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
CONTROL_TOKENS = ["<|endoftext|>"]

Pair = tuple[str, str]
Word = tuple[str, ...]


def bytes_to_unicode() -> dict[int, str]:
    """Return GPT-2's map from each byte value to a printable unicode character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def count_words(text: str, byte_map: dict[int, str]) -> dict[Word, int]:
    """Split text with the GPT-2 regex and count each pre-token as a tuple of byte characters."""
    counts: collections.Counter[str] = collections.Counter(GPT2_PATTERN.findall(text))
    return {tuple(byte_map[b] for b in piece.encode("utf-8")): n for piece, n in counts.items()}


def count_pairs(words: dict[Word, int]) -> collections.Counter[Pair]:
    """Count every adjacent symbol pair, weighted by how often its word occurs."""
    pairs: collections.Counter[Pair] = collections.Counter()
    for word, n in words.items():
        for pair in itertools.pairwise(word):
            pairs[pair] += n
    return pairs


def merge_word(word: Word, pair: Pair) -> Word:
    """Replace each left-to-right occurrence of pair in word with the joined symbol."""
    a, b = pair
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train(text: str, vocab_size: int) -> tuple[list[str], list[Pair]]:
    """Learn merges until the vocab (bytes + merges + control tokens) has vocab_size entries."""
    byte_map = bytes_to_unicode()
    vocab = [byte_map[b] for b in range(256)]
    known = set(vocab)
    merges: list[Pair] = []
    words = count_words(text, byte_map)
    pairs = count_pairs(words)
    while len(vocab) + len(CONTROL_TOKENS) < vocab_size and pairs:
        # Most frequent pair; ties go to the lexicographically smallest pair.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        if joined not in known:
            known.add(joined)
            vocab.append(joined)
        # Re-merge only the words that contain the pair and patch the pair counts.
        new_words: dict[Word, int] = {}
        for word, n in words.items():
            if best[0] in word and best in itertools.pairwise(word):
                merged = merge_word(word, best)
                for p in itertools.pairwise(word):
                    pairs[p] -= n
                for p in itertools.pairwise(merged):
                    pairs[p] += n
                word = merged
            new_words[word] = new_words.get(word, 0) + n
        words = new_words
        for p in [p for p, c in pairs.items() if c <= 0]:
            del pairs[p]
    return vocab, merges


def write_gguf(path: str, vocab: list[str], merges: list[Pair]) -> None:
    """Write a vocab-only GGUF with the keys llama.cpp's converter writes for a gpt2 tokenizer."""
    tokens = vocab + CONTROL_TOKENS
    types = [gguf.TokenType.NORMAL] * len(vocab) + [gguf.TokenType.CONTROL] * len(CONTROL_TOKENS)
    eot = tokens.index("<|endoftext|>")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("minillama-default")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_bos_token_id(eot)
    writer.add_eos_token_id(eot)
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    """Train the vocab from the corpus and write the GGUF."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, help="training text (UTF-8)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="GGUF file to write")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="total tokens")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    with open(args.corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    vocab, merges = train(text, args.vocab_size)
    write_gguf(args.out, vocab, merges)
    elapsed = time.perf_counter() - start
    print(
        f"wrote {args.out}: {len(vocab) + len(CONTROL_TOKENS)} tokens, {len(merges)} merges, "
        f"{os.path.getsize(args.out)} bytes, {elapsed:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
