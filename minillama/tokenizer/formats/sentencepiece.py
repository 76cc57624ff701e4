"""Read a SentencePiece `.model` (a protobuf ModelProto) into GGUF-style tokenizer metadata.

A small wire-format reader of its own (varints, fixed32/64, length-delimited fields) walks the
three messages llama.cpp's converter uses, by field number (src/sentencepiece_model.proto):

* ModelProto: 1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec;
* SentencePiece: 1 piece, 2 score (float), 3 type (NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
  UNUSED 5, BYTE 6);
* TrainerSpec: 3 model_type (UNIGRAM 1, BPE 2), 40..43 unk/bos/eos/pad ids;
* NormalizerSpec: 2 precompiled_charsmap, 3 add_dummy_prefix, 4 remove_extra_whitespaces,
  5 escape_whitespaces.

The metadata is what convert_hf_to_gguf.py writes for the same file: a BPE model becomes
tokenizer.ggml.model "llama" (_set_vocab_sentencepiece), a unigram model "t5" (T5Model.set_vocab,
with the normalizer's flags and charsmap). Like the converter, a USER_DEFINED piece becomes a
NORMAL token (it asks sentencepiece IsUnknown/IsControl/IsUnused/IsByte only). The special ids
come from the trainer spec and add_bos/add_eos are llama.cpp's defaults for the model type, as in
the GGUFs llama.cpp's tools make from a lone .model file.
"""

from __future__ import annotations

import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FormatError, IgnoredNormalizerWarning, UnsupportedError
from ...gguffile.constants import Keys, TokenType

K = Keys.Tokenizer
G = Keys.General

# ModelProto.SentencePiece.Type -> gguf.TokenType, the way the converter maps them.
PIECE_TYPES = {1: TokenType.NORMAL, 2: TokenType.UNKNOWN, 3: TokenType.CONTROL, 4: TokenType.NORMAL,
               5: TokenType.UNUSED, 6: TokenType.BYTE}
PIECE_TYPE_NAMES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}
SP_MODEL_TYPE_NAMES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}

_WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 5: "fixed32"}
_F32 = struct.Struct("<f")


@dataclass
class TrainerSpec:
    """The TrainerSpec fields the converter reads (proto2 defaults when absent)."""

    model_type: int = 1
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1


@dataclass
class NormalizerSpec:
    """The NormalizerSpec fields the converter reads (proto2 defaults when absent)."""

    name: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


@dataclass
class SentencePieceModel:
    """The parts of a ModelProto that matter for tokenizing."""

    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)  # SentencePiece.Type values as in the file
    trainer: TrainerSpec = field(default_factory=TrainerSpec)
    normalizer: NormalizerSpec = field(default_factory=NormalizerSpec)


class _Wire:
    """Bounds-checked protobuf wire-format reads over one buffer, naming the message being read."""

    def __init__(self, buf: bytes, path: str) -> None:
        self.buf, self.path = buf, path

    def fail(self, message: str, offset: int) -> FormatError:
        return FormatError(f"{message}, expected a SentencePiece model (protobuf ModelProto)", path=self.path,
                           offset=offset)

    def varint(self, pos: int, end: int, what: str) -> tuple[int, int]:
        """A base-128 varint at pos (at most 10 bytes) and the position after it."""
        buf, result, shift, start = self.buf, 0, 0, pos
        while True:
            if pos >= end:
                raise self.fail(f"truncated varint in {what}: {end - start} bytes left", start)
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise self.fail(f"varint longer than 10 bytes in {what}", start)

    def fields(self, start: int, end: int, what: str):
        """(number, wire type, value, offset) per field of buf[start:end]: int, (start, end) span or raw bytes."""
        pos = start
        while pos < end:
            at = pos
            key, pos = self.varint(pos, end, what)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise self.fail(f"field number 0 in {what} (key byte {self.buf[at]:#04x})", at)
            if wire == 0:
                value, pos = self.varint(pos, end, f"{what} field {number}")
                yield number, wire, value, at
            elif wire == 2:
                n, pos = self.varint(pos, end, f"length of {what} field {number}")
                if n > end - pos:
                    raise self.fail(f"truncated {what} field {number}: {n} bytes announced, {end - pos} remain",
                                    pos)
                yield number, wire, (pos, pos + n), at
                pos += n
            elif wire in (1, 5):
                n = 8 if wire == 1 else 4
                if n > end - pos:
                    raise self.fail(f"truncated {what} field {number}: a {_WIRE_NAMES[wire]} value needs {n} "
                                    f"bytes, {end - pos} remain", pos)
                yield number, wire, self.buf[pos:pos + n], at
                pos += n
            else:
                raise self.fail(f"unsupported wire type {wire} for {what} field {number}", at)

    def expect(self, wire: int, want: int, what: str, at: int) -> None:
        if wire != want:
            raise self.fail(f"{what} has wire type {wire} ({_WIRE_NAMES.get(wire, 'group')}), "
                            f"expected {want} ({_WIRE_NAMES[want]})", at)

    def text(self, span: tuple[int, int], what: str) -> str:
        try:
            return self.buf[span[0]:span[1]].decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 (byte {e.start})", span[0] + e.start) from None


def _int32(v: int) -> int:
    """A proto int32/enum varint as a signed value (negative numbers are sign-extended to 64 bits)."""
    v &= (1 << 64) - 1
    if v >= 1 << 63:
        v -= 1 << 64
    return v


def parse_model_proto(data: bytes, path: str = "<bytes>") -> SentencePieceModel:
    """Parse a serialized ModelProto (pieces, trainer_spec, normalizer_spec); other fields are skipped."""
    w = _Wire(data, path)
    model = SentencePieceModel()
    seen_trainer = False
    for number, wire, value, at in w.fields(0, len(data), "ModelProto"):
        if number == 1:
            w.expect(wire, 2, f"ModelProto.pieces[{len(model.pieces)}]", at)
            _piece(w, value, model)
        elif number == 2:
            w.expect(wire, 2, "ModelProto.trainer_spec", at)
            _trainer(w, value, model.trainer)
            seen_trainer = True
        elif number == 3:
            w.expect(wire, 2, "ModelProto.normalizer_spec", at)
            _normalizer(w, value, model.normalizer)
    if not model.pieces:
        raise w.fail(f"no pieces in {len(data)} bytes", 0)
    if not seen_trainer:
        raise w.fail("no trainer_spec (field 2)", len(data))
    return model


def _piece(w: _Wire, span: tuple[int, int], model: SentencePieceModel) -> None:
    i = len(model.pieces)
    what = f"ModelProto.pieces[{i}]"
    piece, score, ptype = None, 0.0, 1
    for number, wire, value, at in w.fields(span[0], span[1], what):
        if number == 1:
            w.expect(wire, 2, f"{what}.piece", at)
            piece = w.text(value, f"{what}.piece")
        elif number == 2:
            w.expect(wire, 5, f"{what}.score", at)
            score = _F32.unpack(value)[0]
        elif number == 3:
            w.expect(wire, 0, f"{what}.type", at)
            ptype = _int32(value)
            if ptype not in PIECE_TYPES:
                raise w.fail(f"{what}.type is {ptype}, expected one of "
                             + ", ".join(f"{k} ({v})" for k, v in PIECE_TYPE_NAMES.items()), at)
    if piece is None:
        raise w.fail(f"{what} has no piece text (field 1)", span[0])
    model.pieces.append(piece)
    model.scores.append(score)
    model.types.append(ptype)


def _trainer(w: _Wire, span: tuple[int, int], spec: TrainerSpec) -> None:
    ints = {3: "model_type", 40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
    for number, wire, value, at in w.fields(span[0], span[1], "TrainerSpec"):
        if number in ints:
            w.expect(wire, 0, f"TrainerSpec.{ints[number]}", at)
            setattr(spec, ints[number], _int32(value))


def _normalizer(w: _Wire, span: tuple[int, int], spec: NormalizerSpec) -> None:
    flags = {3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}
    for number, wire, value, at in w.fields(span[0], span[1], "NormalizerSpec"):
        if number == 1:
            w.expect(wire, 2, "NormalizerSpec.name", at)
            spec.name = w.text(value, "NormalizerSpec.name")
        elif number == 2:
            w.expect(wire, 2, "NormalizerSpec.precompiled_charsmap", at)
            spec.precompiled_charsmap = w.buf[value[0]:value[1]]
        elif number in flags:
            w.expect(wire, 0, f"NormalizerSpec.{flags[number]}", at)
            setattr(spec, flags[number], bool(value))


def looks_like_sentencepiece(head: bytes) -> bool:
    """A ModelProto as sentencepiece writes it: field 1 (pieces) first, itself starting with field 1 (piece)."""
    if len(head) < 3 or head[0] != 0x0A:
        return False
    n, pos, shift = 0, 1, 0
    while pos < len(head) and shift < 35:
        b = head[pos]
        n |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return n >= 2 and pos < len(head) and head[pos] == 0x0A
        shift += 7
    return False


def sentencepiece_metadata(model: SentencePieceModel, name: str = "") -> dict[str, Any]:
    """GGUF-style metadata for a parsed model, as convert_hf_to_gguf.py writes it."""
    mtype = model.trainer.model_type
    if mtype not in (1, 2):
        raise UnsupportedError(f"SentencePiece model_type {mtype} ({SP_MODEL_TYPE_NAMES.get(mtype, 'unknown')}) is not "
                               "supported; expected UNIGRAM (1) or BPE (2)")
    n = len(model.pieces)
    unigram = mtype == 1
    md: dict[str, Any] = {
        G.ARCHITECTURE: "t5" if unigram else "llama",
        K.MODEL: "t5" if unigram else "llama",
        K.PRE: "default",
        K.LIST: list(model.pieces),
        K.SCORES: np.asarray(model.scores, np.float32),
        K.TOKEN_TYPE: np.asarray([int(PIECE_TYPES[t]) for t in model.types], np.int32),
    }
    if name:
        md[G.NAME] = name
    norm = model.normalizer
    if unigram:
        md[K.ADD_PREFIX] = norm.add_dummy_prefix
        md[K.REMOVE_EXTRA_WS] = norm.remove_extra_whitespaces
        if norm.precompiled_charsmap:
            md[K.PRECOMPILED_CHARSMAP] = np.frombuffer(norm.precompiled_charsmap, np.uint8).copy()
    else:
        ignored = [what for what, on in (
            (f"normalization rule {norm.name!r}", norm.name not in ("", "identity") or norm.precompiled_charsmap),
            ("remove_extra_whitespaces", norm.remove_extra_whitespaces)) if on]
        if ignored:
            warnings.warn(f"{name or 'SentencePiece model'}: a BPE .model with {' and '.join(ignored)}, which "
                          "llama.cpp ignores (it does not normalize SPM text): ids will differ from "
                          "sentencepiece's on text that normalization changes", IgnoredNormalizerWarning,
                          stacklevel=2)
    if not unigram and not norm.add_dummy_prefix:
        md[K.ADD_PREFIX] = False  # the converter leaves it out (llama.cpp defaults to true); keep the model's
    t = model.trainer
    for key, tid in ((K.UNK_ID, t.unk_id), (K.BOS_ID, t.bos_id), (K.EOS_ID, t.eos_id), (K.PAD_ID, t.pad_id)):
        if 0 <= tid < n:
            md[key] = tid
    md[K.ADD_BOS] = not unigram
    md[K.ADD_EOS] = unigram
    return md


def read_sentencepiece(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Tokenizer metadata (gguf.Keys.Tokenizer names) from a SentencePiece .model file."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise FormatError("empty file, expected a SentencePiece model (protobuf ModelProto)", path=path, offset=0)
    model = parse_model_proto(data, path)
    try:
        return sentencepiece_metadata(model, os.path.splitext(os.path.basename(path))[0])
    except UnsupportedError as e:
        raise UnsupportedError(f"{path}: {e}") from None
