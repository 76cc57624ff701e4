"""gguf's constants (Keys, TokenType, GGUFValueType, GGUF_MAGIC) without the rest of the gguf package.

`import gguf` runs its __init__, which imports its reader, writer, vocab (sentencepiece) and metadata (yaml):
~0.08 s of the start of every run that loads a tokenizer, which needs only these constants. gguf/constants.py
imports nothing of gguf's, so it is loaded here from the installed package by its path, as a module of its own;
gguf itself is left as it is (where it is already imported, its own module serves). Where both are loaded the
IntEnums are two sets of classes; they compare, hash and pack as their ints, which is all minillama and
GGUFWriter do with them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def _constants() -> ModuleType:
    """gguf.constants: the imported one, else the installed file loaded by itself (gguf's __init__ not run)."""
    mod = sys.modules.get("gguf.constants")
    if mod is not None:
        return mod
    spec = importlib.util.find_spec("gguf")  # finds the package without running it
    if spec is None or spec.origin is None:
        import gguf.constants  # the package's own error

        return gguf.constants
    name = __name__ + "._gguf"
    file_spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(spec.origin), "constants.py"))
    if file_spec is None or file_spec.loader is None:
        import gguf.constants

        return gguf.constants
    mod = importlib.util.module_from_spec(file_spec)
    sys.modules[name] = mod  # as an import would (dataclasses and enums look their module up)
    file_spec.loader.exec_module(mod)
    return mod


_c = _constants()
Keys = _c.Keys
TokenType = _c.TokenType
GGUFValueType = _c.GGUFValueType
GGUF_MAGIC: int = _c.GGUF_MAGIC

__all__ = ["Keys", "TokenType", "GGUFValueType", "GGUF_MAGIC"]
