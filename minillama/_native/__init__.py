"""minillama's native core: C sources (one file per algorithm, no Python.h; module.c and bind*.c the bindings, one per area) built
by setup.py as the optional extension minillama._native._core. Where it is not built, the pure-Python
classes in minillama.tokenizer.encoders run instead (see MINILLAMA_BACKEND there)."""
