"""Read and write a llama2.c tokenizer.bin: int32 max_token_length, then per token float32 score, int32
length, bytes.

The file carries no token types or special ids; llama2.c's exporter wrote the LLaMA-2 SentencePiece
vocab with U+2581 turned into spaces and bos/eos as "\\n<s>\\n" / "\\n</s>\\n". This reader undoes that
and gives GGUF-style metadata for the same vocab: <unk> 0, <s> 1, </s> 2, <0xXX> byte tokens; the
writer does it again.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from ...errors import FormatError
from ...fileio import write_output
from ...gguffile.constants import Keys, TokenType
from ..text import SPACE  # a plain space in tokenizer.bin
from ..unicode import BYTE_TOKEN

K = Keys.Tokenizer
G = Keys.General
_ENTRY = struct.Struct("<fi")
_HEADER = struct.Struct("<i")
_BOS_EOS = (1, 2)  # ids of <s> and </s>, which llama2.c's exporter writes as "\n<s>\n" and "\n</s>\n"


def looks_like_llama2c(head: bytes, size: int) -> bool:
    """A plausible header: a small positive max_token_length followed by a first entry that fits."""
    if len(head) < 12:
        return False
    max_len, (_, n) = _HEADER.unpack_from(head)[0], _ENTRY.unpack_from(head, 4)
    return 0 < max_len <= 1 << 16 and 0 <= n <= max_len and 12 + n <= size


def read_llama2c(path: str | os.PathLike[str], n_vocab: int | None = None) -> dict[str, Any]:
    """Tokenizer metadata (gguf.Keys.Tokenizer names) from a llama2.c tokenizer.bin."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise FormatError(f"file of {len(data)} bytes, expected a llama2.c tokenizer.bin", path=path, offset=0)
    max_len = _HEADER.unpack_from(data)[0]
    if not 0 < max_len <= 1 << 16:
        raise FormatError(f"max_token_length {max_len}, expected 1..65536", path=path, offset=0)
    tokens: list[str] = []
    scores: list[float] = []
    pos, size = 4, len(data)
    while pos < size and (n_vocab is None or len(tokens) < n_vocab):
        if pos + 8 > size:
            raise FormatError(f"truncated entry of token {len(tokens)}", path=path, offset=pos)
        score, n = _ENTRY.unpack_from(data, pos)
        pos += 8
        if not 0 <= n <= max_len or pos + n > size:
            raise FormatError(f"token {len(tokens)} has length {n}, expected 0..{min(max_len, size - pos)}",
                              path=path, offset=pos - 4)
        tokens.append(data[pos:pos + n].decode("utf-8", "surrogateescape"))
        scores.append(score)
        pos += n
    if not tokens:
        raise FormatError("no tokens", path=path, offset=4)
    types = []
    for i, t in enumerate(tokens):
        if t.strip("\n") in ("<s>", "</s>") and i in _BOS_EOS:
            tokens[i] = t.strip("\n")
            types.append(TokenType.CONTROL)
        elif i == 0 and t == "<unk>":
            types.append(TokenType.UNKNOWN)
        elif BYTE_TOKEN.fullmatch(t):
            types.append(TokenType.BYTE)
        else:
            tokens[i] = t.replace(" ", SPACE)
            types.append(TokenType.NORMAL)
    return {
        G.ARCHITECTURE: "llama",
        G.NAME: os.path.basename(path),
        K.MODEL: "llama",
        K.LIST: tokens,
        K.SCORES: np.asarray(scores, np.float32),
        K.TOKEN_TYPE: np.asarray(types, np.int32),
        K.BOS_ID: 1,
        K.EOS_ID: 2,
        K.UNK_ID: 0,
    }


def llama2c_bytes(tokens: list[str], scores: list[float]) -> bytes:
    """An SPM-style vocab (U+2581 for spaces, <s>/</s> at 1/2) in llama2.c's tokenizer.bin layout."""
    pieces = []
    for i, t in enumerate(tokens):
        if i in _BOS_EOS:
            t = f"\n{t}\n"
        pieces.append(t.replace(SPACE, " ").encode("utf-8"))
    out = [_HEADER.pack(max(len(p) for p in pieces))]
    for p, s in zip(pieces, scores):
        out.append(_ENTRY.pack(s, len(p)))
        out.append(p)
    return b"".join(out)


def write_llama2c(path: str | os.PathLike[str], data: bytes) -> None:
    """Write tokenizer.bin bytes (llama2c_bytes) at path, as minillama.fileio.write_output writes outputs."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    write_output(path, write)
