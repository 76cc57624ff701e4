"""Model files from the internet: every corrupted file fails with a documented error (FormatError, or
UnsupportedError for a valid file using what is not implemented) or loads and works, within a memory
bound (tracemalloc peak) and a time bound measured here.

* every shared vocab file (GGUF, llama2.c tokenizer.bin, SentencePiece .model, tokenizer.json) is
  truncated at its section boundaries (GGUF: the header fields and every key/value; tokenizer.bin: the
  header and entries; .model: top-level fields), has its length and count fields replaced by huge
  values (2**60, 2**64 - 1, one more than the bytes left), and gets random bit flips;
* the regression inputs in tests/fuzz_seeds/ (what tools/fuzz/fuzz_readers.py found interesting) all
  load or fail as documented;
* hand-made odd vocabs (duplicate and empty tokens, missing bos/eos, merges of unknown tokens, short
  score/type arrays, wrong value types) load as llama.cpp loads them or fail with FormatError.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from support import TESTS
from support.paths import SHARED, params_or_skip
from support.protobuf import pb_read_varint

from minillama.errors import FormatError, MinillamaError, UnsupportedError
from minillama.tokenizer import Tokenizer, Vocab

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")

SEEDS = TESTS / "fuzz_seeds"
MB = 1 << 20
TIME_LIMIT = 30.0  # seconds per case: generous, a CI machine has 2 cores
TEXTS = ("Hello world! It's 2024.", " héllo  wörld\n\t中文 😀 \u2581", "\x00\udcff\udcc3a \ud800", "<s></s>[CLS]", "")


def _files() -> list[Path]:
    if SHARED is None:
        return []
    return sorted(p for p in (SHARED / "vocab").iterdir() if p.suffix in (".gguf", ".bin", ".model", ".json"))


def _ids(paths: list[Path]) -> list:
    if not paths:
        return params_or_skip([], "vocab files")  # the one reason every test without shared/ gives
    return [pytest.param(p, id=p.name) for p in paths]


def memory_bound(size: int) -> int:
    """Bytes a load of a file of `size` bytes may take at its peak: a correct load of every shared vocab
    stays under 11x the file size + 23 MB (llama-bpe: 78 MB for 7.5 MB); a corrupt one has no reason to
    take more."""
    return 12 * size + 32 * MB


def _rss_kib() -> tuple[int, int] | None:
    """(current, peak) resident set size in KiB (Linux), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


RSS_WORKS = _rss_kib() is not None and _reset_rss_peak()


class Peak:
    """Peak memory of a block: tracemalloc's peak of Python allocations ('trace', exact, slow: for cases
    where memory is the point), or the growth of the peak resident set ('rss', free: for the many cases
    that run whole loads; it also counts the pages of the memory-mapped file, so allow the file size)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode if mode == "trace" or RSS_WORKS else "trace"
        self.peak = 0

    def __enter__(self) -> Peak:
        if self.mode == "trace":
            tracemalloc.start()
        else:
            _reset_rss_peak()
            self.start = _rss_kib()[0]  # type: ignore[index]
        return self

    def __exit__(self, *exc) -> None:
        if self.mode == "trace":
            self.peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            self.peak = max(0, _rss_kib()[1] - self.start) * 1024  # type: ignore[index]


def check_case(data: bytes, tmp: Path, what: str, strict_bytes: int | None = None, mode: str = "rss") -> str:
    """Write data, open it, use it; assert a documented outcome within the time and memory bounds.

    strict_bytes (measured with tracemalloc) is for cases that must fail before reading much."""
    p = tmp / "case"
    p.write_bytes(data)
    t0 = time.perf_counter()
    with Peak("trace" if strict_bytes is not None else mode) as peak:
        try:
            try:
                tok = Tokenizer.from_file(p)
                outcome = "ok"
            except (FormatError, UnsupportedError) as e:
                assert str(e), what
                outcome = type(e).__name__
            if outcome == "ok":
                for text in TEXTS:
                    try:
                        ids = tok.encode(text, add_special=True, parse_special=True)
                    except FormatError:  # a vocab lacking what llama.cpp needs for this text
                        continue
                    assert all(0 <= i < tok.n_vocab for i in ids), what
                    tok.decode(ids)
                del tok
        except MinillamaError:
            raise
        except Exception as e:  # an undocumented exception: report which case
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
    dt = time.perf_counter() - t0
    assert dt < TIME_LIMIT, f"{what}: {dt:.1f} s"
    limit = strict_bytes if strict_bytes is not None else memory_bound(len(data)) + len(data)
    assert peak.peak <= limit, f"{what}: peak {peak.peak / MB:.1f} MB ({peak.mode}) > {limit / MB:.1f} MB"
    return outcome


def _warm(data: bytes, tmp: Path) -> None:
    """Open and use a file once, unmeasured: the process-wide tables a tokenizer kind builds on first use (the
    normalisers' per-code-point tables, the Unicode data) are then not counted against the first case measured,
    which made the bounds depend on which test ran first."""
    p = tmp / "warm"
    p.write_bytes(data)
    try:
        tok = Tokenizer.from_file(p)
        for text in TEXTS:
            tok.decode(tok.encode(text, add_special=True, parse_special=True))
    except MinillamaError:
        pass
    p.unlink()


# ---------------------------------------------------------------------------------------------------------
# where the sections and length fields of each kind of file are
# ---------------------------------------------------------------------------------------------------------

class GGUFLayout:
    """Offsets in a GGUF file, found by an independent walk: section starts and length/count fields."""

    def __init__(self, data: bytes) -> None:
        self.boundaries = [0, 4, 8, 16, 24]   # magic, version, tensor count, kv count, first kv
        self.counts = [(8, "tensor count"), (16, "kv count")]
        self.lengths: list[tuple[int, str, int]] = []   # (offset of a u64 length, what, item size)
        self.big_arrays: list[tuple[int, int, str]] = []  # (items start, end, key)
        n_kv = struct.unpack_from("<Q", data, 16)[0]
        pos = 24
        for _ in range(n_kv):
            self.boundaries.append(pos)
            klen = struct.unpack_from("<Q", data, pos)[0]
            key = data[pos + 8:pos + 8 + klen].decode()
            self.lengths.append((pos, f"length of key {key}", 1))
            pos += 8 + klen
            vtype = struct.unpack_from("<I", data, pos)[0]
            self.boundaries.append(pos)
            pos += 4
            pos = self._value(data, pos, vtype, key)
        self.boundaries.append(pos)
        self.end_of_kv = pos

    def _value(self, data: bytes, pos: int, vtype: int, key: str) -> int:
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vtype in sizes:
            return pos + sizes[vtype]
        if vtype == 8:
            n = struct.unpack_from("<Q", data, pos)[0]
            self.lengths.append((pos, f"length of the string {key}", 1))
            return pos + 8 + n
        assert vtype == 9, vtype
        itype, n = struct.unpack_from("<IQ", data, pos)
        self.lengths.append((pos + 4, f"length of the array {key}", 8 if itype == 8 else sizes.get(itype, 1)))
        self.boundaries.append(pos + 4)
        start = pos + 12
        if itype == 8:
            p = start
            self.lengths.append((p, f"length of {key}[0]", 1))
            for _ in range(n):
                p += 8 + struct.unpack_from("<Q", data, p)[0]
            end = p
        else:
            end = start + n * sizes[itype]
        if n > 1000:
            self.big_arrays.append((start, end, key))
            self.boundaries.append((start + end) // 2)
        return end


Case = tuple[str, bytes, "int | None", bool]  # what, data, strict tracemalloc bound, must fail


def _gguf_cases(data: bytes, big: bool) -> list[Case]:
    lay = GGUFLayout(data)
    first_big = lay.big_arrays[0][0] if lay.big_arrays else len(data)
    cases: list[Case] = []
    cuts = sorted(set(b for b in lay.boundaries if 0 < b < len(data)))
    if big:  # every cut up to the first big array, and a few after it
        after = [b for b in cuts if b > first_big]
        cuts = [b for b in cuts if b <= first_big] + after[:2] + after[-2:]
    for b in sorted(set(cuts)):
        for cut in (b, b + 1):  # at the boundary and one byte into the next field
            cases.append((f"truncated at {cut}", data[:cut], None, cut < lay.end_of_kv))
    fields = [(o, w, 1) for o, w in lay.counts] + lay.lengths
    for off, what, item in fields:
        remaining = len(data) - off - 8
        early = off < first_big
        values = (1 << 60, (1 << 64) - 1, remaining // item + 1) if early or "array" in what else ((1 << 64) - 1,)
        for value in values:
            b = bytearray(data)
            struct.pack_into("<Q", b, off, value)
            # before any big array nothing big was read: little memory (exact, tracemalloc)
            cases.append((f"{what} (at {off}) set to {value}", bytes(b), 2 * MB if early else None, True))
    rng = random.Random(len(data))
    for _ in range(4 if big else 10):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        cases.append(("random bit flips", bytes(b), None, False))
    for off, _, _ in fields[:6]:  # bit flips in the high bytes of counts and lengths
        b = bytearray(data)
        b[off + 7] ^= 1 << rng.randrange(8)
        cases.append((f"high bit flipped at {off + 7}", bytes(b), None, True))
    cases.append(("big-endian version", data[:4] + struct.pack(">I", 3) + data[8:], 1 * MB, True))
    cases.append(("version 4", data[:4] + struct.pack("<I", 4) + data[8:], 1 * MB, True))
    cases.append(("version 1", data[:4] + struct.pack("<I", 1) + data[8:], 1 * MB, True))
    cases.append(("wrong magic", b"GGUX" + data[4:], 1 * MB, True))
    cases.append(("zero-length", b"", 1 * MB, True))
    return cases


def _llama2c_cases(data: bytes) -> list[Case]:
    """tokenizer.bin has no token count: a cut at an entry boundary is a smaller valid vocab; a cut
    inside an entry must fail."""
    entries = []  # offsets of (score, length) of every entry
    pos = 4
    while pos < len(data):
        entries.append(pos)
        pos += 8 + struct.unpack_from("<i", data, pos + 4)[0]
    pick = entries[:4] + entries[len(entries) // 2:len(entries) // 2 + 2] + entries[-2:]
    cases: list[Case] = [(f"truncated at {b}", data[:b], 1 * MB, True) for b in (1, 3, 6, 11)]
    for e in pick:
        cases.append((f"truncated at entry {e}", data[:e], None, False))
        for b in (e + 4, e + 9):
            cases.append((f"truncated at {b}", data[:b], None, True))
    for value in (0, -1, (1 << 16) + 1, (1 << 31) - 1):
        cases.append((f"max_token_length {value}", struct.pack("<i", value) + data[4:], 1 * MB, True))
    for e in pick:
        for value in (-1, (1 << 31) - 1, 1 << 20, len(data)):
            b = bytearray(data)
            struct.pack_into("<i", b, e + 4, value)
            cases.append((f"entry at {e} length {value}", bytes(b), None, True))
    rng = random.Random(2)
    for _ in range(8):
        b = bytearray(data)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        cases.append(("random bit flip", bytes(b), None, False))
    return cases


def _proto_cases(data: bytes) -> list[Case]:
    fields = []  # (start, length-varint start, payload start, end) of top-level length-delimited fields
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = pb_read_varint(data, pos)
        assert key & 7 == 2
        lpos = pos
        n, pos = pb_read_varint(data, pos)
        fields.append((start, lpos, pos, pos + n))
        pos += n
    pick = fields[:2] + fields[-2:]
    cases: list[Case] = []
    for start, lpos, payload, end in pick:
        for b in (start + 1, lpos + 1, payload + 1, end - 1):
            cases.append((f"truncated at {b}", data[:b], None, True))
        for value in (1 << 62, len(data)):
            v, enc = value, bytearray()
            while True:
                enc.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
                v >>= 7
                if not v:
                    break
            cases.append((f"field at {start} length {value}", data[:lpos] + bytes(enc) + data[payload:], None, True))
    rng = random.Random(3)
    for _ in range(3):
        b = bytearray(data)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        cases.append(("random bit flip", bytes(b), None, False))
    return cases


def _json_cases(data: bytes) -> list[Case]:
    i = data.index(b'"merges"')
    return [(f"truncated at {b}", data[:b], None, True) for b in (1, 100, len(data) // 2)] + [
        ("deeply nested", data[:i] + b'"merges":' + b"[" * 100_000 + data[i + 9:], None, True)]


# ---------------------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", _ids(_files()))
def test_corrupted_shared_vocab(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes()
    big = len(data) > 2 * MB
    if path.suffix == ".gguf":
        cases = _gguf_cases(data, big)
    elif path.suffix == ".bin":
        cases = _llama2c_cases(data)
    elif path.suffix == ".model":
        cases = _proto_cases(data)
    else:
        cases = _json_cases(data)
    _warm(data, tmp_path)
    outcomes: dict[str, int] = {}
    for what, corrupt, strict, must_fail in cases:
        outcome = check_case(corrupt, tmp_path, f"{path.name}: {what}", strict)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if must_fail:
            assert outcome != "ok", f"{path.name}: {what} loaded"
    assert outcomes.get("FormatError", 0) > len(cases) // 2, outcomes


def test_fuzz_seeds_regression(tmp_path: Path) -> None:
    """Every input the fuzzer kept loads and works, or fails as documented, within the bounds."""
    seeds = sorted(SEEDS.iterdir())
    assert len(seeds) >= 10, "tests/fuzz_seeds/ should hold the fuzzer's regression inputs"
    for p in seeds:
        _warm(p.read_bytes(), tmp_path)
    outcomes: dict[str, int] = {}
    for p in seeds:
        data = p.read_bytes()
        outcome = check_case(data, tmp_path, p.name, strict_bytes=memory_bound(len(data)) // 2)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("ok") and outcomes.get("FormatError"), outcomes


def test_huge_claims_fail_at_once(tmp_path: Path) -> None:
    """A GGUF claiming 2**60 entries (or strings) fails before allocating: tiny peak, no time."""
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    for what, body in (("2**60 strings", struct.pack("<IIQ", 9, 8, 1 << 60)),
                       ("2**60 uint64", struct.pack("<IIQ", 9, 10, 1 << 60)),
                       ("2**63 arrays", struct.pack("<IIQ", 9, 9, 1 << 63)),
                       ("a 2**60-byte string", struct.pack("<IQ", 8, 1 << 60)),
                       ("10**6 strings in 40 bytes", struct.pack("<IIQ", 9, 8, 10**6) + b"\0" * 40)):
        assert check_case(head + body, tmp_path, what, strict_bytes=256 * 1024) == "FormatError"
    for what, data in (("2**60 key/values", b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 60)),
                       ("2**60 tensors", b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0)),
                       ("zero-length", b""), ("magic only", b"GGUF"),
                       ("llama2.c 2**31 - 1 max length", struct.pack("<ifi", (1 << 31) - 1, 0.0, 5) + b"hello"),
                       ("llama2.c token of 2**31 - 1 bytes", struct.pack("<ifi", 16, 0.0, (1 << 31) - 1) + b"x")):
        assert check_case(data, tmp_path, what, strict_bytes=256 * 1024) == "FormatError"


def test_tensor_table_checked(tmp_path: Path) -> None:
    """read_gguf(tensors=True): counts and names checked against the file, duplicates refused."""
    from minillama.gguffile import read_gguf

    data = b"GGUF" + struct.pack("<IQQ", 3, 2, 0)
    one = struct.pack("<Q", 1) + b"t" + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 0)
    p = tmp_path / "t.gguf"
    p.write_bytes(data + one + one)
    with pytest.raises(FormatError, match="duplicate tensor name 't'"):
        read_gguf(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0) + one)
    with pytest.raises(FormatError, match="tensor infos"):
        read_gguf(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 99)
                  + bytes(64))
    with pytest.raises(FormatError, match="dimensions"):
        read_gguf(p)


def test_duplicate_key_and_big_endian(tmp_path: Path) -> None:
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<II", 4, 7)
    p = tmp_path / "d.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + kv)
    with pytest.raises(FormatError, match="duplicate metadata key 'k'"):
        Tokenizer.from_file(p)
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(UnsupportedError, match="big-endian"):
        Tokenizer.from_file(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 7, 0, 0))
    with pytest.raises(FormatError, match="GGUF version 7, expected 2 or 3"):
        Tokenizer.from_file(p)


# ---------------------------------------------------------------------------------------------------------
# odd but valid vocabs
# ---------------------------------------------------------------------------------------------------------

def _spm(tokens: list[str], **extra) -> dict:
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens}
    md.update(extra)
    return md


BYTES = [f"<0x{b:02X}>" for b in range(256)]


def test_odd_vocabs_load_as_llamacpp_does() -> None:
    # empty tokens are named after their id
    v = Vocab.from_metadata(_spm(["<unk>", "<s>", "</s>", "", "a", ""]))
    assert v.tokens[3] == "[EMPTY_3]" and v.tokens[5] == "[EMPTY_5]"
    # no scores: zeros; no token types: all normal; special ids outside the vocab: ignored
    tok = Tokenizer(Vocab.from_metadata(_spm(["<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a"] + BYTES,
                                             **{"tokenizer.ggml.eos_token_id": 10**6})))
    assert tok.eos_id == 2 and tok.encode("a ä", add_special=False)
    # merges naming tokens that do not exist never apply
    bpe = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
           "tokenizer.ggml.merges": ["x y", "a b", "ab zz", "nospace", " a"], "tokenizer.ggml.bos_token_id": 0}
    tok = Tokenizer(Vocab.from_metadata(bpe))
    assert tok.encode("abc", add_special=False) == [2]  # 'c' has no token: dropped, as llama.cpp does
    # longer score/type arrays are cut to the token count
    v = Vocab.from_metadata(_spm(["<unk>", "<s>", "</s>", "a"], **{
        "tokenizer.ggml.scores": np.zeros(10, np.float32), "tokenizer.ggml.token_type": np.ones(10, np.int32)}))
    assert len(v.scores) == 4 and len(v.attrs) == 4


@pytest.mark.parametrize("md, message", [
    (_spm(["<unk>", "<s>", "</s>", "a", "a"]), "duplicate token"),
    (_spm(["<unk>", "<s>", "</s>", "a"], **{"tokenizer.ggml.scores": np.zeros(2, np.float32)}), "2 entries, expected 4"),
    (_spm(["<unk>", "<s>", "</s>", "a"], **{"tokenizer.ggml.token_type": np.ones(3, np.int32)}), "3 entries"),
    (_spm(["<unk>", "<s>", "</s>", "a"], **{"tokenizer.ggml.token_type": ["1", "2", "3", "4"]}), "numeric array"),
    (_spm(["<unk>", "<s>", "</s>", 5]), "an array holding int"),
    (_spm(np.arange(4)), "is a ndarray, expected an array of strings"),
    ({"tokenizer.ggml.model": "llama"}, "tokens is missing"),
    (_spm(["<unk>"]), "add_bos_token is true but the vocab has no bos"),
    (_spm(["<unk>", "<s>", "</s>"], **{"tokenizer.ggml.add_bos_token": "yes"}), "expected a bool"),
    (_spm(["<unk>", "<s>", "</s>"], **{"tokenizer.ggml.pre": 3}), "expected a string"),
    ({"tokenizer.ggml.model": 7, "tokenizer.ggml.tokens": ["a"]}, "expected e.g. 'llama'"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]}, "without tokenizer.ggml.merges"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": [1, 2]}, "merges"),
    ([("tokenizer.ggml.model", "llama")], "expected a dict"),
])
def test_odd_vocabs_that_fail(md, message) -> None:
    with pytest.raises(FormatError, match=message):
        Tokenizer(Vocab.from_metadata(md))


def test_vocab_without_needed_tokens_fails_clearly() -> None:
    """An SPM vocab without byte tokens meets a character no token covers: FormatError (llama.cpp aborts)."""
    tok = Tokenizer(Vocab.from_metadata(_spm(["<unk>", "<s>", "</s>", "\u2581", "a"])))
    assert tok.encode("a a", add_special=False) == [3, 4, 3, 4]
    with pytest.raises(FormatError, match="no byte token <0x62>"):
        tok.encode("b")
    ugm = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["\u2581", "a"],
           "tokenizer.ggml.scores": np.zeros(2, np.float32), "tokenizer.ggml.add_eos_token": False}
    tok = Tokenizer(Vocab.from_metadata(ugm))
    assert tok.encode("a", add_special=False) == [0, 1]
    with pytest.raises(FormatError, match="no unknown-token id"):
        tok.encode("b", add_special=False)
    ugm["tokenizer.ggml.precompiled_charsmap"] = np.frombuffer(struct.pack("<I", 8) + b"\xff" * 9, np.uint8)
    with pytest.raises(FormatError, match="precompiled charsmap"):
        Tokenizer(Vocab.from_metadata(ugm)).encode("a\udcff", add_special=False)


def test_odd_byte_tokens_render_as_llamacpp() -> None:
    """A BYTE token whose text is not <0xXX> renders as llama.cpp's strtol(text[3:5], 16) makes it, mod
    256 (found by the fuzzer: '<0x-C>' crashed decoding; llama.cpp renders it as 0xF4, checked with
    the oracle)."""
    texts = ["<0x-C>", "<1x41>", "<0x+2>", "<0x g>", "<0x0x>", "<0xFF>", "ab", "é<0x41>"]
    md = _spm(["<unk>", "<s>", "</s>"] + texts, **{"tokenizer.ggml.token_type": np.array([2, 3, 3] + [6] * 8)})
    tok = Tokenizer(Vocab.from_metadata(md))
    assert [tok.token_to_piece(i) for i in range(3, 11)] == [b"\xf4", b"\x41", b"\x02", b"\x00", b"\x00", b"\xff",
                                                             b"\x00", b"\x00"]


# --- a partly downloaded model --------------------------------------------------------------------

def _data_end(path: Path) -> int:
    """Where the last tensor's data ends, by gguf's own reader (llama.cpp's Python package): the size the file must
    have."""
    import gguf

    r = gguf.GGUFReader(str(path))
    return max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)


def _check_truncated_model(full: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str], backend: str) -> None:
    from minillama.backend import native_core
    from minillama.cli import main
    from minillama.model import Model

    if backend == "native":
        try:
            native_core("native")
        except UnsupportedError as e:
            pytest.skip(str(e))
    monkeypatch.setenv("MINILLAMA_BACKEND", backend)
    expected = _data_end(full)
    data = full.read_bytes()
    part = tmp_path / "part.gguf"
    for cut in (expected // 2, expected - 1):
        part.write_bytes(data[:cut])
        message = (f"the file is incomplete (a truncated download?): expected {expected:,} bytes (the data of its "
                   f"last tensor, ")
        with pytest.raises(FormatError) as e:
            Model.from_file(part)
        assert str(e.value).startswith(message) and str(e.value).endswith(f"ends there), found {cut:,} ({part})"), \
            str(e.value)
        assert main(["generate", "--model", str(part), "--max-tokens", "1", "Hi"]) == 2  # what generate/serve say
        err = capsys.readouterr().err
        assert err.startswith(f"minillama: error: {message}") and f"found {cut:,}" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("backend", ["pure", "native"])
def test_truncated_model_says_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], backend: str) -> None:
    """generate said only 'output.weight ... needs bytes 5953248..453021408 but the file has 199229440' of a partly
    downloaded GGUF: now that the file is incomplete, its size and the size it should have."""
    from support.tiny_llama import write_model

    _check_truncated_model(write_model(tmp_path / "full.gguf", blocks=2), tmp_path, monkeypatch, capsys, backend)


@pytest.mark.parametrize("backend", ["pure", "native"])
def test_truncated_real_model_says_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], backend: str) -> None:
    """The same on a real quantized model (MINILLAMA_TEST_GGUF), cut as a download stopped half way."""
    from support.paths import real_gguf

    _check_truncated_model(real_gguf(), tmp_path, monkeypatch, capsys, backend)
