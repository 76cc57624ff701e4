"""Shared helpers for the minillama test suite (the fixtures built on them are in conftest.py).

Reference data (real vocabs, llama.cpp's expected outputs, the llama.cpp oracle) lives in ``../shared`` beside the
repository, or wherever ``MINILLAMA_SHARED`` points.  Everything that needs it skips with a reason when it is absent,
so a fresh clone passes.  Expected token ids come only from llama.cpp (conformance files / oracle), sentencepiece or
Hugging Face tokenizers -- never from minillama itself.

Test modules import them with ``from helpers import ...`` (``tests/`` has no ``__init__.py``, so pytest puts it on
``sys.path``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Plain `pytest` (unlike `python -m pytest`) does not put the repository root on sys.path: make the checkout
# importable when minillama is not installed.
if importlib.util.find_spec("minillama") is None:
    sys.path.insert(0, str(REPO))

#: Separator of llama.cpp's ``*.gguf.inp`` files and of ``shared/conformance/cases.txt``.
LLAMACPP_TEST_SEP = "\n__ggml_vocab_test__\n"


# ---------------------------------------------------------------------------------------------------------------------
# shared/ location
# ---------------------------------------------------------------------------------------------------------------------

def _shared_candidate() -> Path:
    env = os.environ.get("MINILLAMA_SHARED")
    return Path(env).expanduser() if env else REPO.parent / "shared"


SHARED_CANDIDATE = _shared_candidate()
SHARED: Path | None = SHARED_CANDIDATE if SHARED_CANDIDATE.is_dir() else None
NO_SHARED_REASON = (
    f"shared reference data not found at {SHARED_CANDIDATE} "
    "(expected ../shared beside the repository; set MINILLAMA_SHARED=/path/to/shared to run these tests, "
    "see the README's quick start)"
)


def require_shared(*parts: str) -> Path:
    """Path inside shared/, or skip the calling test when shared/ (or that file) is absent."""
    if SHARED is None:
        pytest.skip(NO_SHARED_REASON)
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared reference file missing: {p}")
    return p


def vocab_path(name: str) -> Path:
    """shared/vocab/<name>; ``.gguf`` is appended when the name has no extension."""
    if not name.endswith((".gguf", ".bin")):
        name += ".gguf"
    return require_shared("vocab", name)


# ---------------------------------------------------------------------------------------------------------------------
# loading tokenizers (cached: every vocab is parsed once per test session)
# ---------------------------------------------------------------------------------------------------------------------

@functools.cache
def _load_path(path: str):
    from minillama.tokenizer import Tokenizer

    return Tokenizer.from_file(path)


def load(vocab_name: str):
    """minillama Tokenizer for shared/vocab/<vocab_name>, cached (skips when shared/ is absent)."""
    return _load_path(str(vocab_path(vocab_name)))


def load_file(path: str | os.PathLike):
    """minillama Tokenizer for an arbitrary file, cached by path."""
    return _load_path(str(path))


def release_tokenizers() -> None:
    """Forget every cached tokenizer (big vocabs take memory)."""
    _load_path.cache_clear()


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp reference data
# ---------------------------------------------------------------------------------------------------------------------

def conformance_vocabs() -> list[str]:
    """Names (file stems) of every shared/conformance/*.jsonl, or [] without shared/. For parametrization."""
    if SHARED is None:
        return []
    return sorted(p.stem for p in (SHARED / "conformance").glob("*.jsonl"))


@functools.cache
def _read_conformance(path: str) -> tuple[dict, ...]:
    with open(path, encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def read_conformance(vocab_name: str, directory: str = "conformance") -> tuple[dict, ...]:
    """Rows of shared/<directory>/<vocab_name>.jsonl: text, ids, ids_special, detok_hex (all from llama.cpp).
    directory: "conformance" (600 texts) or "conformance-diverse" (1,500 paragraphs of code, docs, 18 languages)."""
    return _read_conformance(str(require_shared(directory, vocab_name + ".jsonl")))


def split_llamacpp_inp(raw: str) -> list[str]:
    """Split a llama.cpp ``.inp`` file the way tests/test-tokenizer-0.cpp does.

    The file is the texts joined by the separator, and it ends with the separator; test-tokenizer-0 scans for
    separators from the start and stops at the end of the data, so the trailing separator does not start a further
    (empty) text.  Empty texts in the middle are real cases (the ids line is empty).
    """
    texts = raw.split(LLAMACPP_TEST_SEP)
    if raw.endswith(LLAMACPP_TEST_SEP):
        texts.pop()
    return texts


def read_llamacpp_inp_out(gguf: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs from <gguf>.inp / <gguf>.out (ids: add_special=False, parse_special=False)."""
    # newline="" keeps "\r" characters in the texts exactly as written (llama.cpp reads the file in binary).
    with open(str(gguf) + ".inp", encoding="utf-8", newline="") as f:
        texts = split_llamacpp_inp(f.read())
    with open(str(gguf) + ".out", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline (std::getline does not yield a further empty line)
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} inputs but {len(lines)} output lines"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


# ---------------------------------------------------------------------------------------------------------------------
# the llama.cpp oracle (shared/tools/llamacpp_oracle.py; needs xllamacpp + cffi)
# ---------------------------------------------------------------------------------------------------------------------

_EXTRA_CDEF = """
struct llama_vocab;
int32_t llama_vocab_bos(const struct llama_vocab * vocab);
int32_t llama_vocab_eos(const struct llama_vocab * vocab);
int32_t llama_vocab_eot(const struct llama_vocab * vocab);
bool llama_vocab_is_eog(const struct llama_vocab * vocab, int32_t token);
int llama_vocab_type(const struct llama_vocab * vocab);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, int32_t token, char * buf, int32_t length,
                             int32_t lstrip, bool special);
"""

#: llama.cpp's enum llama_vocab_type -> the names minillama uses for ``Tokenizer.model``.
LLAMA_VOCAB_TYPES = {1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv"}


@functools.lru_cache(maxsize=1)
def _oracle_module():
    """The oracle module, or a string saying why it is unavailable."""
    if SHARED is None:
        return NO_SHARED_REASON
    tools = SHARED / "tools"
    if not (tools / "llamacpp_oracle.py").exists():
        return f"llama.cpp oracle tool missing: {tools / 'llamacpp_oracle.py'}"
    try:
        importlib.import_module("xllamacpp")
        importlib.import_module("cffi")
    except ImportError as e:
        return f"llama.cpp oracle unavailable ({e}); pip install xllamacpp==2026.10.11549 cffi"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    try:
        return importlib.import_module("llamacpp_oracle")
    except Exception as e:  # a broken native library must not break collection
        return f"llama.cpp oracle failed to import: {e!r}"


def oracle_available() -> bool:
    return not isinstance(_oracle_module(), str)


class OracleHandle:
    """llama.cpp for one GGUF: the shared tool's Oracle plus a few more llama.h calls (special ids, pieces)."""

    def __init__(self, path: str):
        import cffi

        mod = _oracle_module()
        self.path = path
        self.oracle = mod.Oracle(path)
        self.n_vocab = self.oracle.n_vocab
        self._ffi = cffi.FFI()
        self._ffi.cdef(_EXTRA_CDEF)
        import xllamacpp

        self._lib = self._ffi.dlopen(os.path.join(os.path.dirname(xllamacpp.__file__), "xllamacpp.abi3.so"))
        # the tool's vocab pointer belongs to another FFI instance: pass it on by address
        addr = int(mod._ffi.cast("uintptr_t", self.oracle.vocab))
        self._vocab = self._ffi.cast("struct llama_vocab *", addr)

    def tokenize(self, text, add_special=False, parse_special=False) -> list[int]:
        return self.oracle.tokenize(text, add_special, parse_special)

    def detokenize(self, ids, remove_special=False, unparse_special=False) -> bytes:
        return self.oracle.detokenize(list(ids), remove_special, unparse_special)

    def piece(self, tok: int, special: bool = True) -> bytes:
        n = 256
        while True:
            buf = self._ffi.new(f"char[{n}]")
            k = self._lib.llama_token_to_piece(self._vocab, tok, buf, n, 0, special)
            if k >= 0:
                return bytes(self._ffi.buffer(buf, k))
            n = -k

    @staticmethod
    def _opt(tok: int) -> int | None:
        return None if tok < 0 else tok

    @property
    def bos_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_bos(self._vocab))

    @property
    def eos_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_eos(self._vocab))

    @property
    def eot_id(self) -> int | None:
        return self._opt(self._lib.llama_vocab_eot(self._vocab))

    @property
    def model(self) -> str | None:
        return LLAMA_VOCAB_TYPES.get(self._lib.llama_vocab_type(self._vocab))

    def is_eog(self, tok: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, tok))


@functools.cache
def _oracle_for(path: str) -> OracleHandle:
    return OracleHandle(path)


def get_oracle(path: str | os.PathLike) -> OracleHandle:
    """llama.cpp loaded on ``path`` (vocab only), cached; skips when the oracle is unavailable."""
    mod = _oracle_module()
    if isinstance(mod, str):
        pytest.skip(mod)
    return _oracle_for(str(path))


# ---------------------------------------------------------------------------------------------------------------------
# small tokenizers built by the tests themselves (no shared/ needed)
# ---------------------------------------------------------------------------------------------------------------------

#: Hand-written training text: English prose with contractions, numbers, punctuation, code, accents.
TRAINING_PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. It's a sentence that uses every letter of the alphabet.",
    "I've been told he's there, but we'll see. They're sure it'll rain; you'd better take an umbrella!",
    "In 1984, the price was $3.50 per pound; by 2024 it had risen to $12.99 (an increase of 271%).",
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków, Ångström, crème brûlée.",
    "She sells sea shells by the sea shore. The shells she sells are surely sea shells.",
    "def main():\n    print('hello, world')\n    return 0\n\nif __name__ == '__main__':\n    main()\n",
    "Once upon a time, in a small village by the mountains, there lived an old clockmaker and his cat.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 -42 +7 1e10 0x1F.",
    "Punctuation!!! Really??? Yes... no -- maybe; (perhaps) [certainly] {never} <sometimes> \"quoted\".",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Les élèves étudient à l'école.",
    "Email me at someone@example.com or visit https://example.org/path?query=1&lang=en#top.",
    "Tabs\tand  double  spaces   and\nnew lines\n\nand paragraphs.",
]

_WORDS = (
    "the of and to in is was he for it with as his on be at by had not are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like "
    "our over man me even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old year "
    "off come since against go came right used take café naïve über señor garçon élan déjà straße"
).split()


def training_lines(seed: int = 1234, n_sentences: int = 400) -> list[str]:
    """About 20 KB of deterministic, varied training text (one sentence or paragraph per item)."""
    import random

    rng = random.Random(seed)
    lines = TRAINING_PARAGRAPHS * 3
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        s = " ".join(words)
        s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ";"])
        if rng.random() < 0.3:
            s += " " + str(rng.randint(0, 99999))
        lines.append(s)
    return lines


def sentencepiece_token_type(sp, i: int) -> int:
    """The gguf token type llama.cpp's converter gives sentencepiece piece i (user-defined pieces stay NORMAL)."""
    import gguf

    if sp.is_unknown(i):
        return int(gguf.TokenType.UNKNOWN)
    if sp.is_control(i):
        return int(gguf.TokenType.CONTROL)
    if sp.is_unused(i):
        return int(gguf.TokenType.UNUSED)
    if sp.is_byte(i):
        return int(gguf.TokenType.BYTE)
    return int(gguf.TokenType.NORMAL)


def _add_dummy_hparams(w) -> None:
    """Minimal architecture keys so that llama.cpp itself (the oracle) can load the vocab-only file too."""
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)


def write_gpt2_gguf(path: Path, hf_tokenizer, *, pre: str = "gpt-2") -> None:
    """Write a byte-level BPE Hugging Face tokenizer as GGUF, like llama.cpp's convert_hf_to_gguf (gpt2 model)."""
    import gguf

    j = json.loads(hf_tokenizer.to_str())
    vocab: dict[str, int] = j["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    added = {a["content"]: a for a in j["added_tokens"]}
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id))), "HF vocab ids are not contiguous"
    tokens = [t for t, _ in by_id]
    types = [
        int(gguf.TokenType.CONTROL if added.get(t, {}).get("special") else gguf.TokenType.NORMAL) for t in tokens
    ]

    w = gguf.GGUFWriter(str(path), "gpt2")
    _add_dummy_hparams(w)
    w.add_layer_norm_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = vocab["<|endoftext|>"]
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def train_hf_bpe(vocab_size: int = 500):
    """A small byte-level BPE (GPT-2 style) trained with Hugging Face tokenizers on training_lines()."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    # add_prefix_space=False: GPT-2 (and llama.cpp's gpt2 model) does not prepend a space
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tk.train_from_iterator(training_lines(), trainer=trainer)
    return tk


class HFBpe:
    """A Hugging Face byte-level BPE and the GGUF written from it."""

    def __init__(self, hf, path: Path):
        self.hf = hf
        self.path = path
        self.eot_id = hf.token_to_id("<|endoftext|>")
        self.vocab_size = hf.get_vocab_size()


def fail_if_any(bad, message: str) -> None:
    """Fail with a readable report (not pytest's repr of the whole mismatch list) when ``bad`` is non-empty."""
    if bad:
        pytest.fail(message, pytrace=False)


def mismatch_report(what: str, bad: list, total: int, ref: str) -> str:
    """How many of total cases of `what` differ from ref, and the first five as (text, got, want)."""
    lines = [f"{what}: {len(bad)} of {total} differ from {ref}; first ones:"]
    for text, got, want in bad[:5]:
        lines.append(f"  text={str(text)[:120]!r}\n    got  {str(got)[:200]}\n    want {str(want)[:200]}")
    return "\n".join(lines)


def assert_all_equal(what: str, cases, got, want, ref: str, text=lambda case: case) -> None:
    """Fail with a mismatch_report unless got(case) == want(case) for every case."""
    bad = [(text(c), g, w) for c in cases if (g := got(c)) != (w := want(c))]
    fail_if_any(bad, mismatch_report(what, bad, len(cases), ref))


def piece_mismatches(tok, oracle) -> list[tuple]:
    """(token, what minillama gave, llama.cpp's) for every id and special flag where token_to_piece differs."""
    return [(f"<token {i}>", f"token_to_piece(special={special}) {got!r}", want)
            for i in range(oracle.n_vocab) for special in (True, False)
            if (got := tok.token_to_piece(i, special=special)) != (want := oracle.piece(i, special))]


def params_or_skip(names: list[str], what: str) -> list:
    """Parameters for a vocab-parametrized test; one skipped placeholder with a clear reason when there are none."""
    if names:
        return names
    reason = NO_SHARED_REASON if SHARED is None else f"no {what} found under {SHARED}"
    return [pytest.param(None, id="no-shared-data", marks=pytest.mark.skip(reason=reason))]


def real_gguf() -> Path:
    """The real model file MINILLAMA_TEST_GGUF names (CI: SmolLM2-135M-Instruct.Q4_1.gguf), or skip with the reason."""
    path = os.environ.get("MINILLAMA_TEST_GGUF")
    if not path:
        pytest.skip("MINILLAMA_TEST_GGUF is not set (point it at SmolLM2-135M-Instruct.Q4_1.gguf); tests never download")
    if not Path(path).is_file():
        pytest.skip(f"MINILLAMA_TEST_GGUF={path} does not exist")
    return Path(path)


# ---------------------------------------------------------------------------------------------------------------------
# hand-made SentencePiece protobufs, sample texts
# ---------------------------------------------------------------------------------------------------------------------

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


# Texts for comparing tokenizers: English like the training text, numbers, accents, CJK, emoji, special-looking
# text, U+2581 itself.
SAMPLE_STRINGS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "she sells sea shells by the sea shore",
    "I've been told he's there, but we'll see.", "In 1984, the price was $3.50 per pound.",
    "Café, naïve, façade, résumé, jalapeño, Zürich", "def main(): return 0", "Once upon a time",
    "numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000", "x", "é", "日本語", "emoji 🦙🚀", "<s> and </s> are text here",
    "supercalifragilisticexpialidocious", "the block char \u2581 itself",
] + [line for line in training_lines(seed=99, n_sentences=60)[-60:]]
