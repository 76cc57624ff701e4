"""tools/make_synthetic_arch.py as a module, loaded once: the synthetic models the architecture tests make."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from . import REPO


@functools.cache
def generator() -> ModuleType:
    """tools/make_synthetic_arch.py as a module."""
    spec = importlib.util.spec_from_file_location("make_synthetic_arch", REPO / "tools" / "make_synthetic_arch.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
