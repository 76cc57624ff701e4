"""The SentencePiece .model reader: its protobuf fields against sentencepiece's, hand-made and hostile protobufs,
and a tiny SentencePiece BPE model, trained here and converted to GGUF the way llama.cpp's convert_hf_to_gguf does
for SPM vocabs: minillama must tokenize and detokenize exactly like sentencepiece (expected values come from
sentencepiece; llama.cpp itself is consulted too when the oracle is installed).

Where sentencepiece and llama.cpp semantics can differ, the model is trained so that they agree:
* normalization: llama.cpp applies no normalizer for SPM ("llama") vocabs, so the model uses the "identity" rule and
  remove_extra_whitespaces=False (sentencepiece's default nmt_nfkc rule would NFKC-fold text and collapse runs of
  spaces, which llama.cpp never does);
* add_dummy_prefix=True in sentencepiece <-> tokenizer.ggml.add_space_prefix=True in the GGUF;
* byte_fallback=True: characters outside the model become <0xNN> byte pieces in both.
* decoding <unk> differs (sentencepiece prints " \u2047 ", llama.cpp the piece text or nothing), but with byte fallback
  encode never yields <unk>, and decode is only compared on ids that sentencepiece's encode produced.
With that set-up no disagreement between sentencepiece and llama.cpp was found (thousands of random strings mixing
ASCII, accents, CJK, emoji, NBSP, U+2581, tabs, newlines, "<s>"-like text), so every string below is compared.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.fixtures import SAMPLE_STRINGS, sentencepiece_token_type, training_lines
from support.oracle import get_oracle
from support.paths import load_file, release_tokenizers, require_shared
from support.protobuf import pb_field, sp_piece, tiny_sp_model
from support.report import assert_all_equal, fail_if_any, mismatch_report, piece_mismatches

from minillama.cli import main as cli_main
from minillama.errors import FormatError, UnsupportedError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer.formats import read_metadata, read_sentencepiece
from minillama.tokenizer.formats.sentencepiece import parse_model_proto

spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")
K = gguf.Keys.Tokenizer

VOCAB_SIZE = 500

# Strings to compare: English like the training text, whitespace runs, leading/trailing spaces, newlines and tabs,
# and text the model never saw (CJK, Cyrillic, Greek, Arabic, emoji with ZWJ, combining marks) -> byte fallback.
STRINGS = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "Hello world",
    " Hello world",
    "  Hello world",
    "Hello world ",
    "Hello world  ",
    "Hello  world",
    "Hello     world",
    "Hello\nworld",
    "Hello\n\n\nworld\n",
    "Hello\tworld\t\t!",
    "\r\nWindows line\r\nendings\r\n",
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, but we'll see. They're sure it'll rain; you'd better take an umbrella!",
    "In 1984, the price was $3.50 per pound; by 2024 it had risen to $12.99 (an increase of 271%).",
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków, Ångström, crème brûlée.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "    indented\n        more indented\n",
    "Punctuation!!! Really??? Yes... no -- maybe; (perhaps) [certainly] {never}",
    "12345678901234567890 3.14159 -0.5e-10",
    "UPPER CASE WORDS AND lower case words",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "日本語のテキストです。",
    "中文 and English mixed 混合",
    "Привет, мир! Как дела?",
    "Ωμέγα και άλφα",
    "مرحبا بالعالم",
    "emoji 🦙🚀 and 😶‍🌫️ and flags 🇺🇸🇯🇵",
    "combining: e\u0301 a\u0308 n\u0303 (decomposed)",
    "zero\u200bwidth space and non\u00a0breaking space",
    "ideographic\u3000space",
    "the block char \u2581 itself \u2581\u2581",
    "<s> literal control text </s> <unk>",
    "<0x41> looks like a byte piece",
    "a",
    "é",
    "🦙",
    "x" * 200,
    " ".join(["word"] * 50),
    "mixed\u00a0\u2003spaces\u2009everywhere",
]


def _fuzz_strings(n: int = 400, seed: int = 7) -> list[str]:
    """Deterministic random strings over a mix of seen and unseen characters and whitespace."""
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ  0123456789.,;!?'\"\n\t-") + list("éüçñ中文🦙\u00a0\u2581<>/s") + [
        "the ", " and ", "  ", "\n\n", "<s>", "</s>", "<unk>", "ing", " sea shells", "'ll", "\r\n",
    ]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


FUZZ = _fuzz_strings()


def _train(tmp_dir) -> spm.SentencePieceProcessor:
    prefix = str(tmp_dir / "spm-bpe")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def _write_gguf(sp: spm.SentencePieceProcessor, path) -> None:
    """Like convert_hf_to_gguf's SPM vocab (LlamaModel._create_vocab_sentencepiece)."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        types.append(sentencepiece_token_type(sp, i))

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)  # minimal architecture keys, so that llama.cpp (the oracle) loads the file too
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm_bpe")
    sp = _train(d)
    assert sp.get_piece_size() == VOCAB_SIZE
    path = d / "spm-bpe.gguf"
    _write_gguf(sp, path)
    yield sp, path
    release_tokenizers()


@pytest.fixture(scope="module")
def sp(built):
    return built[0]


@pytest.fixture(scope="module")
def tok(built):
    return load_file(built[1])


def _report(what, bad, total, ref="sentencepiece"):
    return mismatch_report(what, bad, total, ref)


def test_metadata(sp, tok):
    assert tok.n_vocab == sp.get_piece_size()
    assert tok.model == "spm"
    assert tok.bos_id == sp.bos_id()
    assert tok.eos_id == sp.eos_id()
    assert tok.is_eog(sp.eos_id())
    assert not tok.is_eog(sp.bos_id())


def test_byte_fallback_is_exercised(sp):
    """Guard for the test data itself: some strings must need byte pieces, or byte fallback goes untested."""
    assert any(sp.is_byte(i) for s in STRINGS for i in sp.encode(s))


@pytest.mark.parametrize("strings", [STRINGS, FUZZ], ids=["handpicked", "fuzz"])
def test_encode_matches_sentencepiece(sp, tok, strings):
    assert_all_equal("encode(add_special=False)", strings, lambda s: tok.encode(s, add_special=False), sp.encode,
                     "sentencepiece")


def test_encode_add_special_matches_sentencepiece(sp, tok):
    """add_special=True prepends BOS (add_bos_token=True), as sentencepiece's add_bos=True does."""
    assert_all_equal("encode(add_special=True)", STRINGS, lambda s: tok.encode(s, add_special=True),
                     lambda s: sp.encode(s, add_bos=True), "sentencepiece")


@pytest.mark.parametrize("strings", [STRINGS, FUZZ], ids=["handpicked", "fuzz"])
def test_decode_matches_sentencepiece(sp, tok, strings):
    """decode(ids) == sp.decode(ids) for sentencepiece's own (valid) id sequences; decode_bytes is its UTF-8."""
    bad = []
    for s in strings:
        ids = sp.encode(s)
        want = sp.decode(ids)
        got = tok.decode(ids)
        if got != want:
            bad.append((s, got, want))
        elif tok.decode_bytes(ids) != want.encode("utf-8"):
            bad.append((s, tok.decode_bytes(ids), want.encode("utf-8")))
    fail_if_any(bad, _report("decode", bad, len(strings)))


def test_token_to_piece(sp, tok):
    """Normal pieces render with U+2581 as a space; byte pieces render as their single byte."""
    for i in range(sp.get_piece_size()):
        piece = tok.token_to_piece(i)
        assert isinstance(piece, bytes)
        if sp.is_byte(i):
            assert piece == bytes([int(sp.id_to_piece(i)[3:5], 16)]), (i, piece)
        elif not (sp.is_control(i) or sp.is_unknown(i)):
            assert piece == sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"), (i, piece)


def test_matches_llamacpp_oracle(built, tok):
    """llama.cpp on the same GGUF (skips without the oracle): encode with both add_special values, decode, pieces."""
    sp, path = built
    o = get_oracle(path)
    bad = []
    for s in STRINGS + FUZZ:
        for add_special in (False, True):
            got = tok.encode(s, add_special=add_special)
            want = o.tokenize(s, add_special, False)
            if got != want:
                bad.append((s, f"encode(add_special={add_special}) {got}", want))
        ids = sp.encode(s)
        got_b, want_b = tok.decode_bytes(ids), o.detokenize(ids)
        if got_b != want_b:
            bad.append((s, f"decode_bytes {got_b!r}", want_b))
    bad += piece_mismatches(tok, o)
    fail_if_any(bad, _report("encode/decode/token_to_piece", bad, 3 * len(STRINGS + FUZZ), ref="llama.cpp"))


# ---------------------------------------------------------------------------------------------------------------------
# the protobuf reader on models trained here (no shared/ needed)
# ---------------------------------------------------------------------------------------------------------------------

def _train_sp(tmp_path, model_type: str, **extra):
    spm = pytest.importorskip("sentencepiece")
    path = tmp_path / f"sp-{model_type}.model"
    with open(path, "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(training_lines()), model_writer=f, model_type=model_type, vocab_size=400,
            character_coverage=1.0, num_threads=1, minloglevel=2, **extra)
    return spm.SentencePieceProcessor(model_file=str(path)), path


@pytest.fixture(scope="module")
def sp_bpe(tmp_path_factory):
    sp, path = _train_sp(tmp_path_factory.mktemp("sp_bpe"), "bpe", byte_fallback=True, pad_id=3,
                         normalization_rule_name="identity", remove_extra_whitespaces=False)
    yield sp, path
    release_tokenizers()


@pytest.fixture(scope="module")
def sp_unigram(tmp_path_factory):
    sp, path = _train_sp(tmp_path_factory.mktemp("sp_uni"), "unigram", control_symbols=["<ctl>"])
    yield sp, path
    release_tokenizers()


@pytest.mark.parametrize("which", ["sp_bpe", "sp_unigram"])
def test_protobuf_fields_match_sentencepiece(which, request):
    """Every piece, score and type, and the trainer/normalizer fields, as sentencepiece reports them."""
    sp, path = request.getfixturevalue(which)
    m = parse_model_proto(path.read_bytes(), str(path))
    n = sp.get_piece_size()
    assert m.pieces == [sp.id_to_piece(i) for i in range(n)]
    assert np.array_equal(np.asarray(m.scores, np.float32), np.asarray([sp.get_score(i) for i in range(n)], np.float32))
    for i, t in enumerate(m.types):
        assert (t == 2) == sp.is_unknown(i) and (t == 3) == sp.is_control(i) and (t == 6) == sp.is_byte(i), i
    assert (m.trainer.unk_id, m.trainer.bos_id, m.trainer.eos_id, m.trainer.pad_id) == \
        (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id())
    assert m.trainer.model_type == (2 if which == "sp_bpe" else 1)
    assert m.normalizer.remove_extra_whitespaces == (which == "sp_unigram")
    assert bool(m.normalizer.precompiled_charsmap) == (which == "sp_unigram")  # nmt_nfkc has one, identity none
    md = read_sentencepiece(path)
    assert md[K.MODEL] == ("llama" if which == "sp_bpe" else "t5")
    assert md.get(K.PAD_ID) == (3 if which == "sp_bpe" else None)  # pad_id -1 (a 10-byte varint) is left out


@pytest.mark.parametrize("which", ["sp_bpe", "sp_unigram"])
def test_trained_model_tokenizes_like_sentencepiece(which, request):
    """minillama on the .model == sentencepiece on the same strings, with and without bos/eos."""
    sp, path = request.getfixturevalue(which)
    tok = load_file(path)
    assert tok.model == ("spm" if which == "sp_bpe" else "ugm")
    bad = []
    for s in SAMPLE_STRINGS:
        if tok.encode(s, add_special=False) != sp.encode(s):
            bad.append((s, tok.encode(s, add_special=False), sp.encode(s)))
        want = sp.encode(s, add_bos=True) if which == "sp_bpe" else sp.encode(s, add_eos=True)
        if tok.encode(s, add_special=True) != want:
            bad.append((s, tok.encode(s, add_special=True), want))
        ids = sp.encode(s)
        if which == "sp_bpe" and tok.decode(ids) != sp.decode(ids):
            bad.append((s, tok.decode(ids), sp.decode(ids)))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


def test_trained_model_converts(sp_bpe, tmp_path, capsys):
    """A trained .model through `minillama convert` still tokenizes like sentencepiece."""
    sp, path = sp_bpe
    out = tmp_path / "sp.gguf"
    assert cli_main(["convert", str(path), str(out)]) == 0
    tok = Tokenizer.from_file(out)
    assert [tok.encode(s, add_special=False) for s in SAMPLE_STRINGS] == [sp.encode(s) for s in SAMPLE_STRINGS]


# ---------------------------------------------------------------------------------------------------------------------
# hand-made protobuf: wire-format corner cases and hostile input
# ---------------------------------------------------------------------------------------------------------------------

def test_hand_made_protobuf(tmp_path):
    """Unknown fields of every wire type are skipped; defaults apply to absent fields; negative ids decode."""
    unknown = (pb_field(7, 0, 300) + pb_field(8, 1, b"\x00" * 8) + pb_field(9, 5, b"\x00" * 4) + pb_field(10, 2, b"xyz")
               + pb_field(4, 2, pb_field(1, 2, pb_field(1, 2, b"in") + pb_field(2, 2, b"out"))))  # self_test_data
    path = tmp_path / "tiny.model"
    path.write_bytes(tiny_sp_model(extra=unknown))
    md = read_metadata(path)
    assert md[K.LIST] == ["<unk>", "<s>", "</s>", "\u2581a", "a", "\u2581"]
    assert md[K.TOKEN_TYPE].tolist() == [2, 3, 3, 1, 1, 1]  # type absent -> NORMAL
    assert md[K.SCORES].tolist() == [0, 0, 0, -1, -2, -3]
    assert (md[K.MODEL], md[K.UNK_ID], md[K.BOS_ID], md[K.EOS_ID]) == ("llama", 0, 1, 2)  # proto2 defaults
    assert K.PAD_ID not in md
    tok = Tokenizer.from_file(path)
    assert tok.encode("a a", add_special=True) == [1, 3, 3]


def _hostile_models() -> dict[str, bytes]:
    good = tiny_sp_model()
    return {
        "truncated varint": good[:1] + b"\xff",
        "truncated piece": good[:9],
        "no trainer_spec": sp_piece("a", 0.0),
        "wrong wire type": pb_field(1, 0, 5) + good,
        "bad piece type": sp_piece("a", 0.0, 9) + good,
        "field number 0": b"\x0a\x03\x0a\x01a" + b"\x00\x00",
        "group wire type": good + b"\x0b",
        "overlong varint": b"\x0a" + b"\xff" * 11,
        "invalid UTF-8": pb_field(1, 2, pb_field(1, 2, b"\xff\xfe")) + good,
        "huge length": b"\x0a\xff\xff\xff\xff\x0f\x0a",
    }


@pytest.mark.parametrize("case", list(_hostile_models()))
def test_hostile_sentencepiece(case, tmp_path):
    """Garbage .model content -> FormatError that names the SentencePiece expectation and the file."""
    path = tmp_path / "bad.model"
    path.write_bytes(_hostile_models()[case])
    with pytest.raises(FormatError, match="expected a SentencePiece model") as e:
        read_sentencepiece(path)
    assert str(path) in str(e.value)


def test_truncated_real_model(tmp_path):
    """Every prefix of a real .model cut inside its pieces, trainer or normalizer spec fails with FormatError."""
    data = require_shared("vocab", "spm-unigram8k.model").read_bytes()
    rng = random.Random(5)
    for cut in [1, 2, 3, 5, 8, 100, 1000] + sorted(rng.sample(range(10, len(data) - 10), 20)):
        path = tmp_path / f"cut{cut}.model"
        path.write_bytes(data[:cut])
        with pytest.raises(FormatError, match="SentencePiece"):
            read_metadata(path)


def test_unsupported_sentencepiece_type(tmp_path):
    """WORD/CHAR models are valid files but not llama.cpp vocab types."""
    path = tmp_path / "word.model"
    path.write_bytes(tiny_sp_model(trainer=pb_field(3, 0, 3)))
    with pytest.raises(UnsupportedError, match="WORD"):
        read_metadata(path)
