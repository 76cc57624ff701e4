"""One exception family for everything a user's file or argument can get wrong."""

from __future__ import annotations


class MinillamaError(Exception):
    """Base class of every error minillama raises on purpose."""


class FormatError(MinillamaError, ValueError):
    """The file is not what it claims to be (names the offset and key where reading failed)."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 key: str | None = None) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"offset {offset}")
        if key is not None:
            where.append(f"key {key!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.path, self.offset, self.key = path, offset, key


class UnsupportedError(MinillamaError):
    """A valid file that uses something minillama does not implement (a pre-tokenizer, a model type...)."""
