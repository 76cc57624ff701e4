"""minillama.gguffile: the one GGUF layer (reader, vocab-only writer, numpy <-> GGUF value types).

The tokenizer, the embedding, `inspect` and the forward pass all read GGUF files through read_gguf.
"""

from __future__ import annotations

from .reader import GGUFFile, JoinedStrings, TensorInfo, is_gguf, join_strings, read_gguf
from .writer import write_vocab_gguf

__all__ = ["GGUFFile", "JoinedStrings", "TensorInfo", "is_gguf", "join_strings", "read_gguf", "write_vocab_gguf"]
