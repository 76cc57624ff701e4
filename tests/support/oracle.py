"""The llama.cpp oracle: shared/tools/llamacpp_oracle.py driving llama.cpp itself (needs xllamacpp + cffi),
for expected values no file holds."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys

import pytest

from support.paths import NO_SHARED_REASON, SHARED

_EXTRA_CDEF = """
struct llama_vocab;
int32_t llama_vocab_bos(const struct llama_vocab * vocab);
int32_t llama_vocab_eos(const struct llama_vocab * vocab);
int32_t llama_vocab_eot(const struct llama_vocab * vocab);
bool llama_vocab_is_eog(const struct llama_vocab * vocab, int32_t token);
int llama_vocab_type(const struct llama_vocab * vocab);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, int32_t token, char * buf, int32_t length,
                             int32_t lstrip, bool special);
"""

#: llama.cpp's enum llama_vocab_type -> the names minillama uses for ``Tokenizer.model``.
LLAMA_VOCAB_TYPES = {1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv"}


@functools.lru_cache(maxsize=1)
def _oracle_module():
    """The oracle module, or a string saying why it is unavailable."""
    if SHARED is None:
        return NO_SHARED_REASON
    tools = SHARED / "tools"
    if not (tools / "llamacpp_oracle.py").exists():
        return f"llama.cpp oracle tool missing: {tools / 'llamacpp_oracle.py'}"
    try:
        importlib.import_module("xllamacpp")
        importlib.import_module("cffi")
    except ImportError as e:
        return f"llama.cpp oracle unavailable ({e}); pip install xllamacpp==2026.10.11549 cffi"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    try:
        return importlib.import_module("llamacpp_oracle")
    except Exception as e:  # a broken native library must not break collection
        return f"llama.cpp oracle failed to import: {e!r}"


def oracle_available() -> bool:
    return not isinstance(_oracle_module(), str)


class OracleHandle:
    """llama.cpp for one GGUF: the shared tool's Oracle plus a few more llama.h calls (special ids, pieces)."""

    def __init__(self, path: str):
        import cffi

        mod = _oracle_module()
        self.path = path
        self.oracle = mod.Oracle(path)
        self.n_vocab = self.oracle.n_vocab
        self._ffi = cffi.FFI()
        self._ffi.cdef(_EXTRA_CDEF)
        import xllamacpp

        self._lib = self._ffi.dlopen(os.path.join(os.path.dirname(xllamacpp.__file__), "xllamacpp.abi3.so"))
        # the tool's vocab pointer belongs to another FFI instance: pass it on by address
        addr = int(mod._ffi.cast("uintptr_t", self.oracle.vocab))
        self._vocab = self._ffi.cast("struct llama_vocab *", addr)

    def tokenize(self, text, add_special=False, parse_special=False) -> list[int]:
        return self.oracle.tokenize(text, add_special, parse_special)

    def detokenize(self, ids, remove_special=False, unparse_special=False) -> bytes:
        return self.oracle.detokenize(list(ids), remove_special, unparse_special)

    def piece(self, tok: int, special: bool = True) -> bytes:
        n = 256
        while True:
            buf = self._ffi.new(f"char[{n}]")
            k = self._lib.llama_token_to_piece(self._vocab, tok, buf, n, 0, special)
            if k >= 0:
                return bytes(self._ffi.buffer(buf, k))
            n = -k

    @staticmethod
    def _opt(tok: int) -> int | None:
        return None if tok < 0 else tok

    @property
    def bos_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_bos(self._vocab))

    @property
    def eos_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_eos(self._vocab))

    @property
    def eot_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_eot(self._vocab))

    @property
    def model(self) -> str | None:
        return LLAMA_VOCAB_TYPES.get(self._lib.llama_vocab_type(self._vocab))

    def is_eog(self, tok: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, tok))


@functools.cache
def _oracle_for(path: str) -> OracleHandle:
    return OracleHandle(path)


def get_oracle(path: str | os.PathLike) -> OracleHandle:
    """llama.cpp loaded on ``path`` (vocab only), cached; skips when the oracle is unavailable."""
    mod = _oracle_module()
    if isinstance(mod, str):
        pytest.skip(mod)
    return _oracle_for(str(path))


# ---------------------------------------------------------------------------------------------------------------------
# small tokenizers built by the tests themselves (no shared/ needed)
