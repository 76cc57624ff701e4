"""Which backend runs the hot paths: the switch MINILLAMA_BACKEND (auto, the default | native | pure), read when a
tokenizer or a model is built, never per call.

auto uses the compiled core (minillama._native._core) where it is built; native requires it (a clear error
when it is not, so that CI cannot pass on the pure path by accident); pure never imports it. The tokenizer's
encoders and the forward pass both ask here, so neither depends on the other for it.
"""

from __future__ import annotations

import os
from types import ModuleType

from .errors import ArgumentError, UnsupportedError

BACKENDS = ("auto", "native", "pure")


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
        from ._native import _core
    except ImportError as e:
        if choice == "native":
            raise UnsupportedError(f"MINILLAMA_BACKEND=native, but the native core minillama._native._core is not "
                                   f"built ({e}): install with a C compiler (pip install -e .) or set "
                                   "MINILLAMA_BACKEND=auto or pure") from None
        return None
    return _core
