"""minillama: the tokenization layer of a small GGUF-aware LLM runtime, exact to llama.cpp."""

__version__ = "0.1.0"
