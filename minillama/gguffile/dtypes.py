"""The one table of GGUF value types: how each is stored (numpy dtype, little-endian), how numpy arrays map
back to it, and its short name in `inspect` listings."""

from __future__ import annotations

import numpy as np

from .constants import GGUFValueType

V = GGUFValueType

# value type, numpy dtype of its items in the file (None: not a fixed-size scalar), short name
_TABLE: tuple[tuple[GGUFValueType, str | None, str], ...] = (
    (V.UINT8, "<u1", "u8"), (V.INT8, "<i1", "i8"),
    (V.UINT16, "<u2", "u16"), (V.INT16, "<i2", "i16"),
    (V.UINT32, "<u4", "u32"), (V.INT32, "<i4", "i32"),
    (V.UINT64, "<u8", "u64"), (V.INT64, "<i8", "i64"),
    (V.FLOAT32, "<f4", "f32"), (V.FLOAT64, "<f8", "f64"),
    (V.BOOL, "u1", "bool"),  # one byte in the file, numpy bool once read
    (V.STRING, None, "str"), (V.ARRAY, None, "arr"),
)

#: numpy dtype of each scalar value type as stored in a (little-endian) file.
FILE_DTYPES: dict[GGUFValueType, np.dtype] = {t: np.dtype(d) for t, d, _ in _TABLE if d is not None}

#: value type of a numpy array's items, as read_gguf returns arrays (bool arrays for BOOL).
ARRAY_TYPES: dict[np.dtype, GGUFValueType] = {
    (np.dtype(bool) if t == V.BOOL else dt): t for t, dt in FILE_DTYPES.items()}

#: short name of each value type: u32, f32, str, arr ...
SHORT_NAMES: dict[GGUFValueType, str] = {t: short for t, _, short in _TABLE}
