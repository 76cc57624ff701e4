"""Vocabs derived from the shared ones for cases no shipped vocab covers, and the texts run on them.

Each recipe changes a shared GGUF's tokenizer metadata and writes it as a vocab-only GGUF.
`tools/make_derived_expected.py` writes llama.cpp's ids for every (vocab, text) to
`tests/data/derived_expected.json`; `tests/tokenizer/test_derived_vocabs.py` checks minillama against them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TOKENS, TYPES, SCORES, PRE = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
                              "tokenizer.ggml.pre")
USER_DEFINED, CONTROL = 4, 3
# Special tokens that are not whole UTF-8: the lead byte of "é", two of the three bytes of "日", and a
# continuation byte followed by "x".
PARTIAL_UTF8 = ["\udcc3", "\udce6\udc97", "\udca9x"]


def _add_tokens(texts: list[str], token_type: int) -> Callable[[dict[str, Any]], None]:
    def edit(md: dict[str, Any]) -> None:
        md[TOKENS] = list(md[TOKENS]) + texts
        md[TYPES] = np.concatenate([np.asarray(md[TYPES], np.int32), np.full(len(texts), token_type, np.int32)])
        if SCORES in md:
            md[SCORES] = np.concatenate([np.asarray(md[SCORES], np.float32), np.zeros(len(texts), np.float32)])
    return edit


def _set_pre(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(md: dict[str, Any]) -> None:
        md[PRE] = name
    return edit


# name -> (shared vocab it starts from, the change)
RECIPES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    **{f"{base}-partial-{kind}": (f"ggml-vocab-{base}.gguf", _add_tokens(PARTIAL_UTF8, ttype))
       for base in ("gpt-2", "llama-spm", "unigram8k", "bert-bge")
       for kind, ttype in (("user", USER_DEFINED), ("control", CONTROL))},
    "gpt-2-pre-tiny_aya": ("ggml-vocab-gpt-2.gguf", _set_pre("tiny_aya")),
    "gpt-2-pre-cohere2moe": ("ggml-vocab-gpt-2.gguf", _set_pre("cohere2moe")),
    # gpt-oss's pre-tokenizer (no vocab with it is shipped): llama.cpp's gpt-4o regex on Llama 3's 128k BPE vocab
    "llama-bpe-pre-gpt-4o": ("ggml-vocab-llama-bpe.gguf", _set_pre("gpt-4o")),
}


def _digit_texts() -> list[str]:
    """Digit runs of every length mod 3 next to letters, spaces, punctuation and non-ASCII digits."""
    runs = ["7", "45", "456", "4567", "12345", "123456", "1234567", "0000000001", "3141592653589793"]
    contexts = ["{}", "{}x", "x{}", " {} ", "a{}b", "{}.5", "${},00", "{}-{}", "({})", "{}\n", "v{}.{}"]
    texts = [c.format(r, r) for r, c in itertools.product(runs, contexts)]
    texts += ["١٢٣٤٥", "१२३४५६७", "٣4٥6", "１２３４５", "12³45", "Ⅻ1234", "2026-11-23T16:05:30Z",
              "call 555-0123 or +44 20 7946 0958", "pi=3.14159, e=2.71828", "0x1F2E3D4C", "1e10 1E-7",
              "The 1990s, 2000s and 2010s", "room 101010 and 1010101", "ab12cd345ef6789"]
    return texts


PARTIAL_TEXTS = ["é", "日本語", "café au lait é", "éx", "a\udcc3b", "日", "\udce6\udc97", "x\udca9x",
                 "é<s>é", " é ", "ééé", "ééx", "[CLS]é[SEP]", "naïve résumé 日本", "\udca9xé\udca9x"]


#: Case and contraction splits the gpt-4o regex makes ([^a-z] runs before lowercase, 's/'T/'Re matched either case).
CASE_TEXTS = ["HELLO World's THEY'RE don'T camelCaseWord XMLHttpRequest", "ÉCOLE été Ǆungla ǅx", "1234567 a12b",
              "getHTTPResponseCode(x)\n\n  ", "I'M HERE, you'Ll see; WE'VE 3.14e10 🙂 日本語テキスト"]


def _diverse_lines(n: int = 300) -> list[str]:
    """n non-empty lines drawn (seed 0) from ../shared/corpus/diverse.txt (code, docs and man pages in 18 languages)."""
    import random

    from support.paths import require_shared

    text = (require_shared("corpus") / "diverse.txt").read_text(encoding="utf-8")
    lines = [line for line in text.split("\n") if line.strip()]
    return random.Random(0).sample(lines, n)


def texts_for(name: str) -> list[str]:
    if name.endswith("-pre-gpt-4o"):
        return CASE_TEXTS + _diverse_lines()
    return _digit_texts() if "-pre-" in name else PARTIAL_TEXTS


def build(name: str, shared_vocab_dir: Path, out_dir: Path) -> Path:
    """Write the derived vocab `name` into out_dir (once) and return its path."""
    from minillama.gguffile.writer import write_vocab_gguf
    from minillama.tokenizer.formats import read_metadata

    out = out_dir / f"{name}.gguf"
    if not out.exists():
        base, edit = RECIPES[name]
        md = dict(read_metadata(str(shared_vocab_dir / base)))
        edit(md)
        write_vocab_gguf(md, out)
    return out
