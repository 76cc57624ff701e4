"""The test suite's support code (test modules import from here, never from each other).

paths: the checkout, shared/ (skip with the reason when absent), the real model, cached tokenizers;
reference: llama.cpp's expected outputs in shared/; oracle: llama.cpp itself; fixtures: small tokenizers and
GGUF files the tests build (on minillama's own writer); protobuf: hand-made SentencePiece files;
report: readable mismatch reports; terminal: a pseudo-terminal driver for `minillama chat`; limits: running
code under memory/time limits; merge_words, derived_vocabs: generated inputs and vocabs; batching: a model's
batched single-token steps beside the same steps alone.

Expected token ids come only from llama.cpp (conformance files / oracle), sentencepiece or Hugging Face
tokenizers -- never from minillama itself. tests/conftest.py puts tests/ on sys.path, so `import support`
works under plain `pytest` and `python -m pytest` alike.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DATA = TESTS / "data"  # expected outputs recorded from llama.cpp, transformers and others by tools/

# Plain `pytest` (unlike `python -m pytest`) does not put the repository root on sys.path: make the checkout
# importable when minillama is not installed.
if importlib.util.find_spec("minillama") is None:
    sys.path.insert(0, str(REPO))
