"""Fuzz the GGUF and llama2.c tokenizer.bin readers (and everything a loaded vocab reaches) for a fixed
number of inputs; print a summary. A benchmark-style script, not a test:

    python tools/fuzz/fuzz_readers.py [--runs 20000] [--engine auto|atheris|hypothesis] [--seed 1]
                                      [--save-seeds tests/fuzz_seeds] [--write-corpus DIR]

Every input is written to a file and opened with Tokenizer.from_file (which sniffs GGUF, tokenizer.bin,
SentencePiece and JSON by content); a GGUF also gets its tensor table read. A tokenizer that loads
then encodes a few hostile texts (NUL, lone surrogates, raw bytes, special-token texts, a long word)
with and without special tokens, decodes the ids, stream-decodes them, and renders pieces.

The only outcomes allowed are success and the documented errors: minillama.errors.MinillamaError
(FormatError, UnsupportedError, ...). Anything else -- an IndexError, a KeyError, a RecursionError,
a MemoryError, an input taking more than --slow seconds -- is a finding: it is printed with its
traceback's last frames and the input is written to --crash-dir.

Engines: atheris (coverage-guided libFuzzer, `pip install atheris`) when it imports, else hypothesis
over bytes: a seed file plus a list of structured mutations (bit flips, byte and integer-field
overwrites with boundary values, truncations, deletions, duplications), so every failure shrinks
to a small, readable example.

The seeds are small files made here (SPM, BPE, WordPiece, Unigram with a hand-built charsmap, a GGUF
with tensors, a llama2.c tokenizer.bin). "Interesting" inputs -- the first input of each distinct
outcome (error class and the line that raised it, or success per model type) -- are kept; with
--save-seeds they are written as regression inputs (tests/tokenizer/test_vocab_bad_files.py runs them all).

What it found (all fixed; the inputs are in tests/fuzz_seeds/): an SPM vocab without a byte token for
a byte of the text raised KeyError (now FormatError, where llama.cpp aborts); a broken precompiled
charsmap raised ValueError from the XCDA walk (now FormatError naming the key); a BYTE token whose
text is not <0xXX> ('<0x-C>') crashed building the piece table (now rendered as llama.cpp's strtol
does); and text with lone surrogates raised UnicodeEncodeError (now the documented policy).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Texts every loaded tokenizer must encode without an undocumented error.
TEXTS = (
    "Hello world! It's 2024.",
    " leading and  double spaces\tand tabs\n\nnewlines ",
    "héllo wörld Ａｈ ｈｉ 中文 😀 \u2581",
    "\x00NUL\x00 and \x7f DEL",
    "lone \ud800 surrogate, raw bytes \udcc3\udca9 \udcff\udcc3a \udce2\udc82",
    "<s></s><unk><|endoftext|>[CLS][SEP]<pad>",
    "x" * 300,
    "",
)


# ---------------------------------------------------------------------------------------------------------
# seed files
# ---------------------------------------------------------------------------------------------------------

def build_charsmap(mapping: dict[str, str]) -> bytes:
    """A precompiled charsmap (SentencePiece's XOR-compressed double array over UTF-8 bytes, a uint32
    size header, the units, then NUL-terminated replacements) for a small key -> replacement map."""
    trie: dict = {}
    repl = bytearray()
    for key, value in mapping.items():
        node = trie
        for c in key.encode():
            node = node.setdefault(c, {})
        node[-1] = len(repl)
        repl += value.encode() + b"\0"
    units: dict[int, int] = {}

    def place(node: dict) -> int:
        """An index b for node's children (at b ^ label) and value (at b), all free; fills them in."""
        labels = [c for c in node if c >= 0]
        b = 1
        while any((b ^ c) in units for c in labels) or (-1 in node and b in units) or b == 0:
            b += 1
        if -1 in node:
            units[b] = 0x80000000 | node[-1]
        for c in labels:
            units[b ^ c] = 0  # reserve
        for c in labels:  # a unit holds its children's base XOR its own index
            child = node[c]
            leaf = 0x100 if -1 in child else 0
            cb = place(child)
            units[b ^ c] = (((b ^ c) ^ cb) << 10) | leaf | c
        return b

    units[0] = 0
    units[0] = place(trie) << 10
    # every index a walk can reach (any base XOR any byte) must exist, as llama.cpp checks
    arr = np.zeros((max(units) | 0xFF) + 1, "<u4")
    for i, u in units.items():
        arr[i] = u
    return struct.pack("<I", arr.nbytes) + arr.tobytes() + bytes(repl)


def _gguf(md: dict, path: Path, tensors: dict[str, np.ndarray] | None = None) -> bytes:
    import gguf

    from minillama.gguffile.writer import write_vocab_gguf

    if not tensors:
        write_vocab_gguf(md, path)
        return path.read_bytes()
    w = gguf.GGUFWriter(str(path), md.get("general.architecture", "llama"))
    for key, value in md.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_array(key, np.asarray(value).tolist())
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


_WORDS = ("the", "he", "ll", "llo", "hello", "wor", "world", "it", "'s", "20", "24", "an", "and", "in", "ing")


def seed_files() -> dict[str, bytes]:
    """Small, valid tokenizer files of every kind the readers take (deterministic)."""
    from gguf import Keys, TokenType

    K = Keys.Tokenizer
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        # SPM: <unk> <s> </s>, 256 byte tokens, letters and a few words with U+2581
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
        normal = ["\u2581"] + [chr(c) for c in range(97, 123)] + ["\u2581" + w for w in _WORDS] + list(_WORDS[1:])
        normal = list(dict.fromkeys(normal))
        toks += normal
        types += [TokenType.NORMAL] * len(normal)
        scores = [0.0] * 259 + [-float(i) for i in range(len(normal))]
        out["spm.gguf"] = _gguf({"general.architecture": "llama", K.MODEL: "llama", K.LIST: toks,
                                 K.SCORES: np.asarray(scores, np.float32), K.TOKEN_TYPE: np.asarray(types, np.int32),
                                 K.BOS_ID: 1, K.EOS_ID: 2, K.UNK_ID: 0}, t / "spm.gguf")
        # byte-level BPE (gpt-2 pre-tokenizer): the 256 byte-level characters, merges, <|endoftext|>
        from minillama.tokenizer.unicode import BYTE_TO_CHAR

        toks = list(BYTE_TO_CHAR)
        merges = []
        for a, b in (("\u0120", "t"), ("h", "e"), ("l", "l"), ("\u0120t", "he"), ("ll", "o"), ("he", "llo"),
                     ("\u0120", "w"), ("o", "r"), ("\u0120w", "or"), ("l", "d"), ("\u0120wor", "ld"), ("2", "0")):
            merges.append(f"{a} {b}")
            toks.append(a + b)
        toks.append("<|endoftext|>")
        types = [TokenType.NORMAL] * (len(toks) - 1) + [TokenType.CONTROL]
        out["bpe.gguf"] = _gguf({"general.architecture": "gpt2", K.MODEL: "gpt2", K.PRE: "gpt-2", K.LIST: toks,
                                 K.TOKEN_TYPE: np.asarray(types, np.int32), K.MERGES: merges,
                                 K.BOS_ID: len(toks) - 1, K.EOS_ID: len(toks) - 1}, t / "bpe.gguf")
        # the same with llama.cpp's llama3 pre-tokenizer (ignore_merges, add_bos)
        out["bpe-llama3.gguf"] = _gguf({"general.architecture": "llama", K.MODEL: "gpt2", K.PRE: "llama-bpe",
                                        K.LIST: toks, K.TOKEN_TYPE: np.asarray(types, np.int32), K.MERGES: merges,
                                        K.BOS_ID: len(toks) - 1, K.EOS_ID: len(toks) - 1}, t / "bpe3.gguf")
        # WordPiece: [PAD] [UNK] [CLS] [SEP] [MASK], word-initial tokens with U+2581, continuations bare
        toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["\u2581" + w for w in _WORDS] + \
               ["\u2581" + chr(c) for c in range(97, 123)] + [chr(c) for c in range(97, 123)] + ["\u2581!", "\u2581."]
        toks = list(dict.fromkeys(toks))
        types = [TokenType.CONTROL, TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL] + \
            [TokenType.NORMAL] * (len(toks) - 5)
        out["wpm.gguf"] = _gguf({"general.architecture": "bert", K.MODEL: "bert", K.PRE: "default", K.LIST: toks,
                                 K.TOKEN_TYPE: np.asarray(types, np.int32), K.BOS_ID: 2, K.SEP_ID: 3, K.UNK_ID: 1,
                                 K.PAD_ID: 0, K.MASK_ID: 4}, t / "wpm.gguf")
        # Unigram with a charsmap (full-width letters, an ideographic space, a two-character key)
        toks = ["<pad>", "</s>", "<unk>", "\u2581"] + [chr(c) for c in range(97, 123)] + \
               ["\u2581" + w for w in _WORDS] + ["hi", "\u2581hi"]
        toks = list(dict.fromkeys(toks))
        types = [TokenType.CONTROL, TokenType.CONTROL, TokenType.UNKNOWN] + [TokenType.NORMAL] * (len(toks) - 3)
        scores = [0.0, 0.0, 0.0] + [-1.0 - i / 10 for i in range(len(toks) - 3)]
        cmap = build_charsmap({"\uff21": "A", "\uff41": "a", "\uff48\uff49": "hi", "\u3000": " ", "\u00e9": "e\u0301"})
        out["ugm.gguf"] = _gguf({"general.architecture": "t5", K.MODEL: "t5", K.PRE: "default", K.LIST: toks,
                                 K.SCORES: np.asarray(scores, np.float32), K.TOKEN_TYPE: np.asarray(types, np.int32),
                                 K.PRECOMPILED_CHARSMAP: np.frombuffer(cmap, np.uint8),
                                 K.ADD_PREFIX: True, K.REMOVE_EXTRA_WS: True,
                                 K.EOS_ID: 1, K.UNK_ID: 2, K.PAD_ID: 0}, t / "ugm.gguf")
        # a GGUF with a tensor table (read with tensors=True too)
        toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [2, 3, 3, 1, 1, 1, 1] + [6] * 256
        out["tensors.gguf"] = _gguf(
            {"general.architecture": "llama", K.MODEL: "llama", K.LIST: toks, K.TOKEN_TYPE: np.asarray(types, np.int32)},
            t / "tensors.gguf",
            tensors={"token_embd.weight": np.arange(32, dtype=np.float32).reshape(4, 8),
                     "output_norm.weight": np.ones(8, np.float16)})
    # llama2.c tokenizer.bin: int32 max_token_length, then (float32 score, int32 length, bytes) per token
    entries = [("<unk>", 0.0), ("\n<s>\n", 0.0), ("\n</s>\n", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    entries += [(" " + w, -float(i)) for i, w in enumerate(_WORDS)] + [(chr(c), -20.0) for c in range(97, 123)]
    body = b"".join(struct.pack("<fi", s, len(w.encode())) + w.encode() for w, s in entries)
    out["llama2c.bin"] = struct.pack("<i", max(len(w.encode()) for w, _ in entries)) + body
    return out


# ---------------------------------------------------------------------------------------------------------
# the target
# ---------------------------------------------------------------------------------------------------------

class Finding(Exception):
    """An outcome that is not success nor a documented error."""


def exercise(path: str) -> str:
    """Open path as a tokenizer and use it; return an outcome label, raise on an undocumented error."""
    from minillama.errors import MinillamaError
    from minillama.gguffile import is_gguf, read_gguf
    from minillama.tokenizer import Tokenizer

    try:
        with open(path, "rb") as f:
            head = f.read(8)
        if is_gguf(head):
            try:
                read_gguf(path, tensors=True)
            except MinillamaError:
                pass
        tok = Tokenizer.from_file(path)
    except MinillamaError as e:
        return f"load:{type(e).__name__}:{_where(e)}"
    n = tok.n_vocab
    for text in TEXTS:
        for add, parse in ((False, False), (True, True)):
            try:
                ids = tok.encode(text, add_special=add, parse_special=parse)
            except MinillamaError as e:
                return f"encode:{type(e).__name__}:{_where(e)}"
            if not all(type(i) is int and 0 <= i < n for i in ids):
                raise Finding(f"encode({text[:20]!r}) gave ids outside 0..{n - 1}: {ids[:20]}")
            text_out = tok.decode(ids)
            sd = tok.stream_decoder(skip_special=True)
            streamed = "".join(sd.push(i) for i in ids) + sd.flush()
            if streamed != text_out:
                raise Finding(f"stream decode {streamed[:40]!r} != decode {text_out[:40]!r}")
            tok.decode_bytes(ids, remove_special=True, unparse_special=True)
    for i in range(min(n, 300)):
        tok.token_to_piece(i)
        tok.token_to_piece(i, special=False)
    tok.decode(list(range(min(n, 300))))
    tok.is_eog(0)
    return f"ok:{tok.model}"


def _where(e: BaseException) -> str:
    """The file:line that raised e (the outcome's identity), and the error message's first words."""
    tb = traceback.extract_tb(e.__traceback__)
    frame = tb[-1] if tb else None
    loc = f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"
    return loc


class Fuzzer:
    """Runs inputs through a target (`exercise` unless told), counts outcomes, keeps interesting inputs and findings."""

    def __init__(self, crash_dir: Path, slow: float, target: Callable[[str], str] | None = None) -> None:
        self.target = target or exercise
        fd, self.path = tempfile.mkstemp(prefix="minillama-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.close(fd)
        self.crash_dir, self.slow = crash_dir, slow
        self.outcomes: Counter[str] = Counter()
        self.interesting: dict[str, bytes] = {}
        self.findings: dict[str, tuple[bytes, str]] = {}
        self.runs = 0
        self.max_time = 0.0
        self.total_time = 0.0

    def one(self, data: bytes) -> None:
        self.runs += 1
        with open(self.path, "wb") as f:
            f.write(data)
        t0 = time.perf_counter()
        try:
            outcome = self.target(self.path)
        except RecursionError:
            outcome = self._finding(data, "RecursionError")
        except Exception as e:  # noqa: BLE001 -- every undocumented exception is a finding
            frames = "".join(traceback.format_exception(e)[-4:])
            outcome = self._finding(data, f"{type(e).__name__} at {_where(e)}: {str(e)[:200]}\n{frames}")
        dt = time.perf_counter() - t0
        self.total_time += dt
        self.max_time = max(self.max_time, dt)
        if dt > self.slow:
            outcome = self._finding(data, f"slow: {dt:.2f} s (limit {self.slow} s)")
        self.outcomes[outcome] += 1
        if self.runs % 10000 == 0:
            print(f"... {self.runs} inputs, {len(self.outcomes)} outcomes, {len(self.findings)} findings",
                  file=sys.stderr, flush=True)
        if outcome not in self.interesting or len(data) < len(self.interesting[outcome]):
            self.interesting[outcome] = data

    def _finding(self, data: bytes, what: str) -> str:
        key = what.split("\n")[0]
        if key not in self.findings:
            self.findings[key] = (data, what)
            self.crash_dir.mkdir(parents=True, exist_ok=True)
            name = "crash-" + hashlib.sha1(data).hexdigest()[:16]
            (self.crash_dir / name).write_bytes(data)
            print(f"FINDING ({name}): {what}", file=sys.stderr, flush=True)
        return "FINDING:" + key

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------------------------------------

_BOUNDARY = (0, 1, 2, 3, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
             1 << 32, 1 << 40, 1 << 60, (1 << 63) - 1, (1 << 64) - 1)


def mutate(data: bytes, muts: list[tuple[int, int, int]]) -> bytes:
    """Apply structured mutations (kind, position, value) to data."""
    b = bytearray(data)
    for kind, pos, val in muts:
        if not b:
            break
        p = pos % len(b)
        if kind == 0:    # flip one bit
            b[p] ^= 1 << (val % 8)
        elif kind == 1:  # overwrite a byte
            b[p] = val % 256
        elif kind == 2:  # overwrite a little-endian u32 with a boundary value
            b[p:p + 4] = struct.pack("<I", _BOUNDARY[val % len(_BOUNDARY)] & 0xFFFFFFFF)
        elif kind == 3:  # overwrite a little-endian u64 with a boundary value
            b[p:p + 8] = struct.pack("<Q", _BOUNDARY[val % len(_BOUNDARY)])
        elif kind == 4:  # truncate
            del b[p:]
        elif kind == 5:  # delete a range
            del b[p:p + 1 + val % 64]
        elif kind == 6:  # duplicate a range
            b[p:p] = b[p:p + 1 + val % 64]
        elif kind == 7:  # small integer nudge of a u64 (a length or a count off by a little)
            if p + 8 <= len(b):
                v = struct.unpack_from("<Q", b, p)[0]
                struct.pack_into("<Q", b, p, (v + (val % 9) - 4) % (1 << 64))
    return bytes(b)


def run_hypothesis(fuzzer: Fuzzer, seeds: dict[str, bytes], runs: int, seed: int) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    names = sorted(seeds)
    mutation = st.tuples(st.integers(0, 7), st.integers(0, 1 << 20), st.integers(0, 1 << 16))

    @settings(max_examples=runs, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(names), muts=st.lists(mutation, min_size=1, max_size=3), raw=st.booleans(),
           blob=st.binary(max_size=64))
    def target(name: str, muts: list[tuple[int, int, int]], raw: bool, blob: bytes) -> None:
        data = seeds[name]
        if raw and blob:  # sometimes splice random bytes in
            p = muts[0][1] % len(data) if muts else 0
            data = data[:p] + blob + data[p + len(blob):]
        fuzzer.one(mutate(data, muts))

    for s in seeds.values():
        fuzzer.one(s)
    random.seed(seed)
    target()


def run_atheris(fuzzer: Fuzzer, seeds: dict[str, bytes], runs: int, seed: int, corpus: Path,
                finish: Callable[[], int]) -> None:
    """libFuzzer over the seeds; after `runs` inputs (beyond the seeds) finish() reports and the process
    exits with its status (libFuzzer's Fuzz() never returns)."""
    import atheris

    seed_dir = Path(tempfile.mkdtemp(prefix="minillama-fuzz-seeds-"))
    for name, data in seeds.items():
        (seed_dir / name).write_bytes(data)
    corpus.mkdir(parents=True, exist_ok=True)
    dict_path = seed_dir.parent / f"{seed_dir.name}.dict"
    words = [b"GGUF", b"tokenizer.ggml.model", b"tokenizer.ggml.tokens", b"tokenizer.ggml.merges",
             b"tokenizer.ggml.token_type", b"tokenizer.ggml.scores", b"tokenizer.ggml.pre", b"llama", b"gpt2",
             b"bert", b"t5", b"general.alignment", b"\x03\x00\x00\x00", b"\x09\x00\x00\x00\x08\x00\x00\x00",
             b"\xff\xff\xff\xff\xff\xff\xff\x0f", b"<0x41>", b"\xe2\x96\x81"]
    dict_path.write_text("".join('"' + "".join(f"\\x{c:02x}" for c in w) + '"\n' for w in words))
    total = runs + len(seeds)

    def target(data: bytes) -> None:
        fuzzer.one(data)
        if fuzzer.runs >= total:
            code = finish()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    fuzzer.crash_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.argv[0], f"-runs={total + 1000}", f"-seed={seed}", "-max_len=65536", f"-dict={dict_path}",
            f"-artifact_prefix={fuzzer.crash_dir}/", "-rss_limit_mb=4096", "-print_final_stats=0",
            "-verbosity=0", str(corpus), str(seed_dir)]
    atheris.Setup(args, target)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20000, help="inputs to try (default 20000)")
    ap.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slow", type=float, default=2.0, help="seconds after which an input counts as a finding")
    ap.add_argument("--crash-dir", type=Path, default=Path(tempfile.gettempdir()) / "minillama-fuzz-crashes")
    ap.add_argument("--write-corpus", type=Path, help="atheris: where libFuzzer keeps its corpus (default: a temp dir)")
    ap.add_argument("--save-seeds", type=Path, help="write the interesting inputs there (regression inputs)")
    ap.add_argument("--max-seed-size", type=int, default=16384, help="largest input --save-seeds keeps")
    args = ap.parse_args(argv)

    engine = args.engine
    if engine in ("auto", "atheris"):
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            if engine == "atheris":
                print("atheris is not installed (pip install atheris)", file=sys.stderr)
                return 2
            engine = "hypothesis"

    if engine == "atheris":
        import atheris

        with atheris.instrument_imports(include=["minillama"]):  # before anything imports minillama
            import minillama.gguffile  # noqa: F401
            import minillama.tokenizer  # noqa: F401
            import minillama.tokenizer.encoders  # noqa: F401
            import minillama.tokenizer.formats  # noqa: F401
    seeds = seed_files()
    fuzzer = Fuzzer(args.crash_dir, args.slow)
    t0 = time.perf_counter()

    def finish() -> int:
        fuzzer.close()
        return report(fuzzer, engine, time.perf_counter() - t0, args)

    if engine == "atheris":
        corpus = args.write_corpus or Path(tempfile.mkdtemp(prefix="minillama-fuzz-corpus-"))
        run_atheris(fuzzer, seeds, args.runs, args.seed, corpus, finish)
    run_hypothesis(fuzzer, seeds, args.runs, args.seed)
    return finish()


def report(fuzzer: Fuzzer, engine: str, wall: float, args: argparse.Namespace) -> int:
    """Print the summary, keep the interesting inputs; 1 when there were findings."""
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"engine {engine}: {fuzzer.runs} inputs in {wall:.1f} s ({fuzzer.runs / max(wall, 1e-9):.0f}/s), "
          f"slowest input {fuzzer.max_time * 1000:.0f} ms, peak RSS {peak_mb:.0f} MB")
    print(f"{len(fuzzer.outcomes)} distinct outcomes:")
    for outcome, count in sorted(fuzzer.outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {count:7d}  {outcome}")
    if args.save_seeds:
        args.save_seeds.mkdir(parents=True, exist_ok=True)
        kept = 0
        for outcome, data in sorted(fuzzer.interesting.items()):
            if len(data) > args.max_seed_size or outcome.startswith("FINDING"):
                continue
            slug = "-".join(part.replace(".py", "") for part in outcome.split(":"))  # e.g. load-FormatError-gguf-128
            slug = "".join(c if c.isalnum() else "-" for c in slug)
            name = f"{slug[:48]}-{hashlib.sha1(data).hexdigest()[:10]}.bin"
            (args.save_seeds / name).write_bytes(data)
            kept += 1
        print(f"kept {kept} interesting inputs in {args.save_seeds}")
    print(f"findings: {len(fuzzer.findings)}" + (f" (inputs in {args.crash_dir})" if fuzzer.findings else ""))
    for key in fuzzer.findings:
        print(f"  {key}")
    return 1 if fuzzer.findings else 0


if __name__ == "__main__":
    sys.exit(main())
