"""Write tokenizer metadata as a vocab-only GGUF (no tensors) that llama.cpp opens with vocab_only.

Tokenizer keys get the value types llama.cpp's loader checks (convert_hf_to_gguf.py writes the same):
ids uint32, flags bool, tokens/merges string arrays, scores float32, token types int32, the
precompiled charsmap uint8. Besides general.architecture/general.name only the architecture's own
keys present in the metadata are copied: llama.cpp needs no hyper-parameters for a vocab-only load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError
from ..fileio import write_output
from .constants import GGUFValueType, Keys
from .dtypes import ARRAY_TYPES
from .reader import JoinedStrings

K = Keys.Tokenizer
V = GGUFValueType

_STRING_KEYS = {K.MODEL, K.PRE, K.CHAT_TEMPLATE, K.HF_JSON, K.RWKV}
_STRING_ARRAYS = {K.LIST, K.MERGES, K.CHAT_TEMPLATES}
_NUMERIC_ARRAYS = {K.SCORES: V.FLOAT32, K.TOKEN_TYPE: V.INT32, K.PRECOMPILED_CHARSMAP: V.UINT8}
_BOOL_KEYS = {K.ADD_BOS, K.ADD_EOS, K.ADD_SEP, K.ADD_PREFIX, K.REMOVE_EXTRA_WS}
_UINT_KEYS = {K.BOS_ID, K.EOS_ID, K.UNK_ID, K.SEP_ID, K.PAD_ID, K.MASK_ID, K.EOT_ID, K.EOM_ID, K.FIM_PRE_ID,
              K.FIM_SUF_ID, K.FIM_MID_ID, K.FIM_PAD_ID, K.FIM_REP_ID, K.FIM_SEP_ID, K.PREFIX_ID, K.SUFFIX_ID,
              K.MIDDLE_ID, K.TOKEN_TYPE_COUNT}


def _bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")  # tokens read from GGUF keep invalid UTF-8 as surrogates


def _tokenizer_value(key: str, value: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(value as GGUFWriter takes it, type, item type) for a tokenizer key; FormatError on a wrong value."""
    if key in _STRING_ARRAYS:
        if not isinstance(value, (list, JoinedStrings)) or not all(isinstance(t, (str, bytes)) for t in value):
            raise FormatError(f"{key} is {type(value).__name__}, expected a list of strings", key=key)
        return [_bytes(t) if isinstance(t, str) else t for t in value], V.ARRAY, V.STRING
    if key in _NUMERIC_ARRAYS:
        arr = np.asarray(value)
        if arr.ndim != 1 or arr.dtype.kind not in "iuf":
            raise FormatError(f"{key} is not a 1-d numeric array", key=key)
        itype = _NUMERIC_ARRAYS[key]
        if key == K.PRECOMPILED_CHARSMAP:
            return arr.astype(np.uint8).tobytes(), V.ARRAY, itype
        if itype == V.FLOAT32:  # as minillama (and llama.cpp) read them: float32, beyond its range inf
            with np.errstate(over="ignore"):
                return arr.astype(np.float32).tolist(), V.ARRAY, itype
        return _int32_list(key, arr), V.ARRAY, itype
    if key in _BOOL_KEYS:
        if not isinstance(value, (bool, np.bool_)):
            raise FormatError(f"{key} is {value!r}, expected a bool", key=key)
        return bool(value), V.BOOL, None
    if key in _UINT_KEYS:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < 1 << 32:
            raise FormatError(f"{key} is {value!r}, expected a token id", key=key)
        return int(value), V.UINT32, None
    if key in _STRING_KEYS:
        if not isinstance(value, str):
            raise FormatError(f"{key} is {type(value).__name__}, expected a string", key=key)
        return _bytes(value), V.STRING, None
    return _other_value(key, value)


def _int32_list(key: str, arr: np.ndarray) -> list[int]:
    """arr as int32 values (llama.cpp reads token types as int32); FormatError for what does not fit."""
    ok = np.isfinite(arr) & (arr == np.round(arr)) if arr.dtype.kind == "f" else np.ones(arr.shape, bool)
    if arr.dtype.kind in "iu" and arr.size:
        ok &= (arr >= -(1 << 31)) & (arr <= (1 << 31) - 1) if arr.dtype != np.uint64 else (arr < (1 << 31))
    elif arr.dtype.kind == "f":
        ok &= np.abs(np.where(ok, arr, 0)) < (1 << 31)
    bad = np.flatnonzero(~ok)
    if bad.size:
        i = int(bad[0])
        raise FormatError(f"expected int32 values (llama.cpp reads {key} as int32), found {arr[i].item()!r} at index {i}",
                          key=key)
    return arr.astype(np.int64).astype(np.int32).tolist()


_F32_MAX = float(np.finfo(np.float32).max)


def _other_value(key: str, value: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """A value of a key outside the known tokenizer keys, typed by its Python/numpy type."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value), V.BOOL, None
    if isinstance(value, (int, np.integer)):
        v = int(value)
        for vtype, lo, hi in ((V.UINT32, 0, 1 << 32), (V.INT64, -(1 << 63), 1 << 63), (V.UINT64, 0, 1 << 64)):
            if lo <= v < hi:
                return v, vtype, None
        raise FormatError(f"cannot write {key} = {v}: expected an integer that fits 64 bits", key=key)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v, (V.FLOAT32 if abs(v) <= _F32_MAX or v != v or v in (float("inf"), -float("inf"))
                   else V.FLOAT64), None
    if isinstance(value, str):
        return _bytes(value), V.STRING, None
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype in ARRAY_TYPES and len(value):
        return value.tolist(), V.ARRAY, ARRAY_TYPES[value.dtype]
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return [_bytes(t) for t in value], V.ARRAY, V.STRING
    raise FormatError(f"cannot write {key} = {str(value)[:60]!r} ({type(value).__name__}) to GGUF", key=key)


def write_vocab_gguf(metadata: Mapping[str, Any], out_path: str | os.PathLike[str], name: str | None = None,
                     types: Mapping[str, GGUFValueType] | None = None) -> None:
    """Write metadata's tokenizer and architecture keys as a vocab-only GGUF (types: read_gguf's value_types).

    out_path is written as minillama.fileio.write_output writes outputs: atomically, through symlinks,
    never replacing a device, FIFO or directory."""
    if not isinstance(metadata.get(K.MODEL), str) or not isinstance(metadata.get(K.LIST), list):
        raise FormatError(f"metadata without {K.MODEL} and {K.LIST}, expected tokenizer metadata")
    arch = metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        arch = "llama"
    write_output(out_path, lambda path: _write(metadata, path, arch, name, types or {}))


def _write(metadata: Mapping[str, Any], path: str, arch: str, name: str | None,
           types: Mapping[str, GGUFValueType]) -> None:
    from gguf import GGUFWriter  # the whole package, only where a file is written (constants.py)

    w = GGUFWriter(path, arch)
    title = name if name is not None else metadata.get(Keys.General.NAME)
    if isinstance(title, str) and title:
        w.add_key_value(Keys.General.NAME, _bytes(title), V.STRING)
    # the architecture's own keys (hyper-parameters) when the source has them (a GGUF does)
    for key, value in metadata.items():
        if key.startswith(arch + "."):
            t = types.get(key)
            if t is not None and t not in (V.ARRAY, V.STRING) and not isinstance(value, np.ndarray):
                w.add_key_value(key, value, t)
            else:
                v, t, sub = _other_value(key, value)
                w.add_key_value(key, v, t, sub)
    for key, value in metadata.items():
        if key.startswith("tokenizer."):
            v, t, sub = _tokenizer_value(key, value)
            if t == V.ARRAY and not len(v):
                continue  # GGUF has no empty arrays (e.g. a BPE vocab with no merges)
            w.add_key_value(key, v, t, sub)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
    finally:
        w.close()
