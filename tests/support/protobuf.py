"""Hand-made SentencePiece protobufs (ModelProto pieces, trainer and normalizer specs) and a reader of their
fields, for files sentencepiece itself would not write."""

from __future__ import annotations

import struct


def pb_varint(v: int) -> bytes:
    """A protobuf varint (a negative number as its 64-bit two's complement)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def pb_field(number: int, wire: int, payload: bytes | int) -> bytes:
    """One protobuf field: its key, then a varint, a length-delimited payload or fixed bytes."""
    key = pb_varint(number << 3 | wire)
    if wire == 0:
        return key + pb_varint(payload)  # type: ignore[arg-type]
    if wire == 2:
        return key + pb_varint(len(payload)) + payload  # type: ignore[arg-type]
    return key + payload  # type: ignore[operator]


def sp_piece(text: str, score: float, ptype: int | None = None) -> bytes:
    """One ModelProto.pieces entry of a SentencePiece model."""
    body = pb_field(1, 2, text.encode()) + pb_field(2, 5, struct.pack("<f", score))
    return pb_field(1, 2, body + (pb_field(3, 0, ptype) if ptype is not None else b""))


def tiny_sp_model(*, extra: bytes = b"", trainer: bytes | None = None) -> bytes:
    """A hand-made 6-piece SentencePiece model (BPE), with extra fields or another trainer spec."""
    pieces = (sp_piece("<unk>", 0, 2) + sp_piece("<s>", 0, 3) + sp_piece("</s>", 0, 3) + sp_piece("\u2581a", -1.0)
              + sp_piece("a", -2.0) + sp_piece("\u2581", -3.0))
    if trainer is None:
        trainer = pb_field(3, 0, 2) + pb_field(43, 0, -1) + pb_field(35, 0, 1)
    return pieces + pb_field(2, 2, trainer) + extra + pb_field(3, 2, pb_field(3, 0, 1) + pb_field(4, 0, 0))


def pb_read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at buf[i:] and the index after it."""
    result = shift = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def pb_fields(buf: bytes):
    """(field number, value) of a protobuf message: ints for varints, bytes for length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = pb_read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = pb_read_varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = pb_read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, v


def normalizer_spec(model_proto: bytes) -> dict:
    """ModelProto.normalizer_spec (field 3): precompiled_charsmap (2), add_dummy_prefix (3),
    remove_extra_whitespaces (4), with sentencepiece's defaults (True) when a flag is absent."""
    spec = {"precompiled_charsmap": b"", "add_dummy_prefix": True, "remove_extra_whitespaces": True}
    for field, v in pb_fields(model_proto):
        if field == 3:
            for f, x in pb_fields(v):
                if f == 2:
                    spec["precompiled_charsmap"] = x
                elif f == 3:
                    spec["add_dummy_prefix"] = bool(x)
                elif f == 4:
                    spec["remove_extra_whitespaces"] = bool(x)
    return spec
