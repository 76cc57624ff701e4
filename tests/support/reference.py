"""llama.cpp's reference data in shared/: the conformance files (texts and the ids llama.cpp gave) and
llama.cpp's own test-tokenizer-0 .inp/.out files."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from support.paths import require_shared, shared_roots

#: Separator of llama.cpp's ``*.gguf.inp`` files and of ``shared/conformance/cases.txt``.
LLAMACPP_TEST_SEP = "\n__ggml_vocab_test__\n"


def conformance_vocabs() -> list[str]:
    """Names (file stems) of every conformance/*.jsonl in shared/ and its supported pending folders, or [] without
    shared/. For parametrization."""
    return sorted(p.stem for root in shared_roots() for p in (root / "conformance").glob("*.jsonl"))


@functools.cache
def _read_conformance(path: str) -> tuple[dict, ...]:
    with open(path, encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def read_conformance(vocab_name: str, directory: str = "conformance") -> tuple[dict, ...]:
    """Rows of shared/<directory>/<vocab_name>.jsonl: text, ids, ids_special, detok_hex (all from llama.cpp).
    directory: "conformance" (600 texts) or "conformance-diverse" (1,500 paragraphs of code, docs, 18 languages)."""
    for root in shared_roots()[1:]:
        if (root / directory / (vocab_name + ".jsonl")).is_file():
            return _read_conformance(str(root / directory / (vocab_name + ".jsonl")))
    return _read_conformance(str(require_shared(directory, vocab_name + ".jsonl")))


def split_llamacpp_inp(raw: str) -> list[str]:
    """Split a llama.cpp ``.inp`` file the way tests/test-tokenizer-0.cpp does.

    The file is the texts joined by the separator, and it ends with the separator; test-tokenizer-0 scans for
    separators from the start and stops at the end of the data, so the trailing separator does not start a further
    (empty) text.  Empty texts in the middle are real cases (the ids line is empty).
    """
    texts = raw.split(LLAMACPP_TEST_SEP)
    if raw.endswith(LLAMACPP_TEST_SEP):
        texts.pop()
    return texts


def read_llamacpp_inp_out(gguf: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs from <gguf>.inp / <gguf>.out (ids: add_special=False, parse_special=False)."""
    # newline="" keeps "\r" characters in the texts exactly as written (llama.cpp reads the file in binary).
    with open(str(gguf) + ".inp", encoding="utf-8", newline="") as f:
        texts = split_llamacpp_inp(f.read())
    with open(str(gguf) + ".out", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline (std::getline does not yield a further empty line)
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} inputs but {len(lines)} output lines"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]
