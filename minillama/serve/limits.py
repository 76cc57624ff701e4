"""The server's limits and timeouts with their defaults: here, apart from the app, so that the CLI reads them
without importing Starlette and the app's modules read them without importing the package's __init__."""

from __future__ import annotations

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_HEADER_TIMEOUT", "EMBEDDING_MAX_INPUTS", "EMBEDDING_MAX_TOKENS"]

#: Seconds the server waits for a request's body or for a client to take the next part of a reply (--timeout), and
#: for a request's line and headers (--header-timeout): guard.py.
DEFAULT_TIMEOUT = 600.0
DEFAULT_HEADER_TIMEOUT = 20.0
#: Most inputs, and tokens over all inputs, per /v1/embeddings request (OpenAI's limits; app.py checks them).
EMBEDDING_MAX_INPUTS = 2048
EMBEDDING_MAX_TOKENS = 300_000
