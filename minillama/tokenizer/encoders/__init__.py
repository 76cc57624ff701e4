"""Encoders: the tokenizer algorithms (SPM, BPE, WordPiece, Unigram), each turning one run of plain text (no
special tokens) into token ids. (`Model` is the forward pass, minillama.model; these are not models.)

The backend. `MINILLAMA_BACKEND` (auto, the default | native | pure), read when a tokenizer is built,
chooses who runs an algorithm: the compiled core (minillama._native._core) where it is built and covers
the vocab (auto), the core or a clear error when it is not built (native), or the Python classes
here, never importing the core (pure). A vocab the core does not cover keeps its Python class.
"""

from __future__ import annotations

import os
from types import ModuleType

from ...errors import ArgumentError, UnsupportedError
from ..vocab import Vocab
from .base import Encoder
from .bpe import BPEEncoder, NativeBPEEncoder
from .spm import NativeSPMEncoder, SPMEncoder
from .ugm import NativeUGMEncoder, UGMEncoder
from .wpm import NativeWPMEncoder, WPMEncoder

ENCODERS: dict[str, type[Encoder]] = {"spm": SPMEncoder, "bpe": BPEEncoder, "wpm": WPMEncoder, "ugm": UGMEncoder}


BACKENDS = ("auto", "native", "pure")
# The native class of each kind the core covers (make_encoder falls back to ENCODERS where it returns None).
NATIVE: dict[str, type[NativeBPEEncoder] | type[NativeSPMEncoder] | type[NativeUGMEncoder] | type[NativeWPMEncoder]] = {
    "bpe": NativeBPEEncoder, "spm": NativeSPMEncoder, "ugm": NativeUGMEncoder, "wpm": NativeWPMEncoder}


def backend_choice() -> str:
    """MINILLAMA_BACKEND, checked: 'auto' when unset or empty."""
    choice = os.environ.get("MINILLAMA_BACKEND", "") or "auto"
    if choice not in BACKENDS:
        raise ArgumentError(f"MINILLAMA_BACKEND is {choice!r}, expected one of {', '.join(BACKENDS)}")
    return choice


def native_core(choice: str) -> ModuleType | None:
    """The compiled core for a backend choice: None for 'pure' (never imported) and for 'auto' when it is not
    built; for 'native' it must be there."""
    if choice == "pure":
        return None
    try:
        from ..._native import _core
    except ImportError as e:
        if choice == "native":
            raise UnsupportedError(f"MINILLAMA_BACKEND=native, but the native core minillama._native._core is not "
                                   f"built ({e}): install with a C compiler (pip install -e .) or set "
                                   "MINILLAMA_BACKEND=auto or pure") from None
        return None
    return _core


def make_encoder(vocab: Vocab) -> Encoder:
    """The encoder for a vocab's kind (Vocab.from_metadata refuses every other kind), native where the
    backend choice allows it and the core covers the vocab."""
    core = native_core(backend_choice())
    native = NATIVE.get(vocab.kind)
    if core is not None and native is not None:
        encoder = native.build(vocab, core)
        if encoder is not None:
            return encoder
    return ENCODERS[vocab.kind](vocab)


__all__ = ["Encoder", "make_encoder", "ENCODERS", "NATIVE", "BACKENDS", "backend_choice", "SPMEncoder", "BPEEncoder",
           "WPMEncoder", "UGMEncoder"]
