"""Encoders: the tokenizer algorithms (SPM, BPE, WordPiece, Unigram), each turning one run of plain text (no
special tokens) into token ids. (`Model` is the forward pass, minillama.model; these are not models.)

The backend (minillama.backend: MINILLAMA_BACKEND, read when a tokenizer is built) chooses who runs an
algorithm: the compiled core where it is built and covers the vocab, or the Python classes here. A vocab the
core does not cover keeps its Python class.
"""

from __future__ import annotations

from ...backend import BACKENDS, backend_choice, native_core
from ..vocab import Vocab
from .base import Encoder
from .bpe import BPEEncoder, NativeBPEEncoder
from .spm import NativeSPMEncoder, SPMEncoder
from .ugm import NativeUGMEncoder, UGMEncoder
from .wpm import NativeWPMEncoder, WPMEncoder

ENCODERS: dict[str, type[Encoder]] = {"spm": SPMEncoder, "bpe": BPEEncoder, "wpm": WPMEncoder, "ugm": UGMEncoder}


# The native class of each kind the core covers (make_encoder falls back to ENCODERS where it returns None).
NATIVE: dict[str, type[NativeBPEEncoder] | type[NativeSPMEncoder] | type[NativeUGMEncoder] | type[NativeWPMEncoder]] = {
    "bpe": NativeBPEEncoder, "spm": NativeSPMEncoder, "ugm": NativeUGMEncoder, "wpm": NativeWPMEncoder}


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
