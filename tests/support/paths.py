"""Where the tests find things: the checkout, the shared/ reference data (skipping with the reason when it is
absent), the real model MINILLAMA_TEST_GGUF names, and minillama tokenizers loaded once per session."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from support import REPO


def _shared_candidate() -> Path:
    env = os.environ.get("MINILLAMA_SHARED")
    return Path(env).expanduser() if env else REPO.parent / "shared"


SHARED_CANDIDATE = _shared_candidate()
SHARED: Path | None = SHARED_CANDIDATE if SHARED_CANDIDATE.is_dir() else None
NO_SHARED_REASON = (
    f"shared reference data not found at {SHARED_CANDIDATE} "
    "(expected ../shared beside the repository; set MINILLAMA_SHARED=/path/to/shared to run these tests, "
    "see the README's quick start)"
)


#: shared/pending/ folders (laid out as shared/: vocab/, conformance/, conformance-diverse/) of vocabs minillama
#: supports before shared/ moves them in: the tests read them as if they were in shared/ itself.
PENDING_SUPPORTED = ("gemma-4",)


def shared_roots() -> list[Path]:
    """shared/ and the supported pending/ folders that exist, in that order ([] without shared/)."""
    if SHARED is None:
        return []
    return [SHARED, *(p for p in (SHARED / "pending" / n for n in PENDING_SUPPORTED) if p.is_dir())]


def require_shared(*parts: str) -> Path:
    """Path inside shared/, or skip the calling test when shared/ (or that file) is absent."""
    if SHARED is None:
        pytest.skip(NO_SHARED_REASON)
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared reference file missing: {p}")
    return p


def vocab_path(name: str) -> Path:
    """shared/vocab/<name> (or a supported pending folder's vocab/<name>); ``.gguf`` is appended when the name has
    no extension."""
    if not name.endswith((".gguf", ".bin")):
        name += ".gguf"
    for root in shared_roots()[1:]:
        if (root / "vocab" / name).is_file():
            return root / "vocab" / name
    return require_shared("vocab", name)



@functools.cache
def _load_path(path: str):
    from minillama.tokenizer import Tokenizer

    return Tokenizer.from_file(path)


def load(vocab_name: str):
    """minillama Tokenizer for shared/vocab/<vocab_name>, cached (skips when shared/ is absent)."""
    return _load_path(str(vocab_path(vocab_name)))


def load_file(path: str | os.PathLike):
    """minillama Tokenizer for an arbitrary file, cached by path."""
    return _load_path(str(path))


def release_tokenizers() -> None:
    """Forget every cached tokenizer (big vocabs take memory)."""
    _load_path.cache_clear()


def params_or_skip(names: list[str], what: str) -> list:
    """Parameters for a vocab-parametrized test; one skipped placeholder with a clear reason when there are none."""
    if names:
        return names
    reason = NO_SHARED_REASON if SHARED is None else f"no {what} found under {SHARED}"
    return [pytest.param(None, id="no-shared-data", marks=pytest.mark.skip(reason=reason))]


def real_gguf() -> Path:
    """The real model file MINILLAMA_TEST_GGUF names (CI: SmolLM2-135M-Instruct.Q4_1.gguf), or skip with the reason."""
    path = os.environ.get("MINILLAMA_TEST_GGUF")
    if not path:
        pytest.skip("MINILLAMA_TEST_GGUF is not set (point it at SmolLM2-135M-Instruct.Q4_1.gguf); tests never download")
    if not Path(path).is_file():
        pytest.skip(f"MINILLAMA_TEST_GGUF={path} does not exist")
    return Path(path)
