"""Merge models: each turns one run of plain text (no special tokens) into token ids."""

from __future__ import annotations

from ..vocab import Vocab
from .base import Model
from .bpe import BPEModel
from .spm import SPMModel
from .ugm import UGMModel
from .wpm import WPMModel

MODELS: dict[str, type[Model]] = {"spm": SPMModel, "bpe": BPEModel, "wpm": WPMModel, "ugm": UGMModel}


def make_model(vocab: Vocab) -> Model:
    """The merge model for a vocab's kind (Vocab.from_metadata refuses every other kind)."""
    return MODELS[vocab.kind](vocab)


__all__ = ["Model", "make_model", "MODELS", "SPMModel", "BPEModel", "WPMModel", "UGMModel"]
