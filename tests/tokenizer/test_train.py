"""minillama.tokenizer.train: BPE training (byte-level and SPM-style), written as GGUF / llama2.c tokenizer.bin.

What is checked: the incremental learner against a from-scratch reference (recount every pair at every step);
merges against Hugging Face's BpeTrainer; llama.cpp (the oracle) against minillama on the written GGUF; the
round trip decode(encode(s)) == s; byte-for-byte determinism; streaming input counting the same words as reading
whole; the command line (including Ctrl-C writing nothing).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from support.fixtures import TRAINING_PARAGRAPHS, training_lines
from support.oracle import get_oracle
from support.paths import SHARED, require_shared
from support.reference import LLAMACPP_TEST_SEP

from minillama import cli
from minillama.errors import MinillamaError
from minillama.tokenizer import Tokenizer
from minillama.tokenizer import train as T
from minillama.tokenizer.pretokenize import PreTokenizer
from minillama.tokenizer.tables import PATTERNS, PRE_TOKENIZERS
from minillama.tokenizer.train import train_bpe

# Strings that are hard to tokenize: every whitespace kind, contractions, digits, code, CJK, emoji, marks, bytes
# that need fallback, special-token text.
TRICKY = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \n \n", "a", "Hello world", " Hello  world ", "Hello world\n",
    "It's 'quoted' and they're I'll we'd", "1234567890 3.14159 -42 1e10 0x1F", "déjà vu, naïve café",
    "def f(x):\n    return x * 2\n\n\tpass\r\n", "日本語のテキストです。吾輩は猫である。", "Привет, мир!",
    "emoji 🐉😂 1️⃣ 👨\u200d👩\u200d👧\u200d👦 flags 🏳️\u200d🌈", "e\u0301 a\u0308 combining", "\u3000\u2028\u00a0 odd spaces",
    "<|endoftext|> <s> </s> <unk> special text", "trailing spaces   ", "   leading spaces", "a\u200bb zero width",
    "\x00\x01\x7f control chars", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 astral 𠀋", "ẞ ß ǅ ǈ title/upper", "?!.,;: punctuation only!!!",
]


def _chunks() -> list[str]:
    """Text the test writes: the helpers.py paragraphs, generated sentences and the tricky strings."""
    return ["\n".join(training_lines()), "\n".join(TRAINING_PARAGRAPHS), "\n".join(TRICKY)]


def _pieces(tok: Tokenizer, ids: list[int]) -> bytes:
    return b"".join(tok.token_to_piece(i) for i in ids)


# ---------------------------------------------------------------------------------------------
# The learner against a from-scratch reference


def _reference(words: list[str], counts: list[int], n_vocab: int, min_frequency: int) -> tuple[list[str], list]:
    """Recount all pairs every step; merge the (count desc, left id, right id) best pair left to right."""
    tokens = sorted(set("".join(words)))
    index = {t: i for i, t in enumerate(tokens)}
    segs = [[index[ch] for ch in w] for w in words]
    merges = []
    while len(tokens) < n_vocab:
        pc: Counter[tuple[int, int]] = Counter()
        for s, c in zip(segs, counts):
            for p in zip(s, s[1:]):
                pc[p] += c
        if not pc:
            break
        best = min(pc, key=lambda p: (-pc[p], p))
        if pc[best] < max(1, min_frequency):
            break
        a, b = best
        text = tokens[a] + tokens[b]
        x = index.get(text)
        if x is None:
            x = index[text] = len(tokens)
            tokens.append(text)
        merges.append(best)
        for s in segs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i:i + 2] = [x]
                i += 1
    return tokens, merges


@pytest.mark.parametrize("seed", range(12))
def test_learner_matches_reference(seed):
    """Small alphabets and repeats ('aaaa', 'abab') exercise overlapping pairs and merges reusing a token."""
    rng = random.Random(seed)
    alphabet = "ab" if seed % 3 == 0 else "abc" if seed % 3 == 1 else "abcdefg"
    words = list({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(60)})
    counts = [rng.choice([1, 1, 2, 3, 7]) for _ in words]
    n_vocab = len(set("".join(words))) + rng.randint(5, 60)
    min_frequency = rng.choice([0, 1, 2, 3])
    want_tokens, want = _reference(words, counts, n_vocab, min_frequency)
    tokens = sorted(set("".join(words)))
    index = {t: i for i, t in enumerate(tokens)}
    syms = [[*map(index.__getitem__, w), -1] for w in words]
    got = T.learn_merges(syms, counts, tokens, index, n_vocab, min_frequency, progress=False)
    assert got == want
    assert tokens == want_tokens


# ---------------------------------------------------------------------------------------------
# Written files: llama.cpp agrees, the round trip, determinism


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Byte-level (llama3, qwen2) and SPM-style vocabs trained on text this test writes."""
    out = tmp_path_factory.mktemp("train")
    paths = {}
    for name, kind, pre in (("bl-llama3", "bytelevel", "llama3"), ("bl-qwen2", "bytelevel", "qwen2"),
                            ("spm", "spm", "llama3")):
        tv = T.train_bpe(_chunks(), 700, kind=kind, pre=pre, progress=False)
        paths[name] = out / f"{name}.gguf"
        tv.write_gguf(paths[name])
        if kind == "spm":
            paths["spm.bin"] = out / "spm.bin"
            tv.write_llama2c(paths["spm.bin"])
    return paths


def _texts() -> list[str]:
    texts = TRICKY + TRAINING_PARAGRAPHS + training_lines()[-40:]
    if SHARED is not None and (SHARED / "conformance" / "cases.txt").exists():
        with open(SHARED / "conformance" / "cases.txt", encoding="utf-8", newline="") as f:
            texts += f.read().split(LLAMACPP_TEST_SEP)
    return texts


@pytest.mark.parametrize("name", ["bl-llama3", "bl-qwen2", "spm"])
def test_llamacpp_agrees(written, name):
    """llama.cpp loads the written GGUF and gives minillama's ids (both add/parse_special settings) and bytes."""
    path = written[name]
    oracle = get_oracle(path)
    tok = Tokenizer.from_file(path)
    assert oracle.n_vocab == tok.n_vocab
    bad = []
    for s in _texts():
        for special in (False, True):
            ids = tok.encode(s, add_special=special, parse_special=special)
            if oracle.tokenize(s, special, special) != ids:
                bad.append((s, special))
        ids = tok.encode(s, add_special=False)
        if oracle.detokenize(ids) != tok.decode_bytes(ids):
            bad.append((s, "detokenize"))
    assert not bad, f"{name}: llama.cpp differs on {len(bad)} cases, e.g. {bad[:3]}"


@pytest.mark.parametrize("name", ["bl-llama3", "bl-qwen2", "spm", "spm.bin"])
def test_round_trip(written, name):
    """decode(encode(s)) == s; see minillama.tokenizer.train's docstring for the two llama.cpp exceptions it names."""
    tok = Tokenizer.from_file(written[name])
    bad = []
    for s in _texts():
        ids = tok.encode(s, add_special=False)
        assert _pieces(tok, ids) == s.encode("utf-8") or name.startswith("spm"), s  # pieces always join back
        if name.startswith("spm") and "\u2581" in s:
            continue  # llama.cpp decodes U+2581 as a space
        if name == "bl-llama3" and tok.vocab.clean_spaces:
            want = s
            for rx, repl in ((" ?", "?"), (" !", "!"), (" .", "."), (" ,", ","), (" ' ", "'"), (" 's", "'s"),
                             (" 'm", "'m"), (" 're", "'re"), (" 've", "'ve")):
                want = want.replace(rx, repl)
            if tok.decode(ids) != want and tok.decode(ids) != s:
                bad.append(s)
            continue
        if tok.decode(ids) != s:
            bad.append(s)
    assert not bad, f"{name}: {len(bad)} texts do not round-trip, e.g. {bad[:3]}"


def test_round_trip_every_pre_name():
    """Each byte-level pre-tokenizer llama.cpp knows trains a vocab that tokenizes and round-trips."""
    text = "\n".join(TRICKY[:20]) * 3
    done = 0
    for pre, spec in PRE_TOKENIZERS.items():
        if not spec.byte_encode or spec.escape_whitespaces:
            with pytest.raises(MinillamaError, match="byte-level"):
                T.train_bpe([text], 300, pre=pre, progress=False)
            continue
        tok = T.train_bpe([text], 300, pre=pre, progress=False).tokenizer()
        for s in TRICKY:
            assert _pieces(tok, tok.encode(s, add_special=False)) == s.encode("utf-8"), (pre, s)
        done += 1
    assert done > 50


def test_deterministic(tmp_path):
    """The same input and settings give the same files byte for byte (GGUF and tokenizer.bin)."""
    for kind in ("bytelevel", "spm"):
        blobs = []
        for run in range(2):
            tv = T.train_bpe(_chunks(), 600, kind=kind, progress=False)
            p = tmp_path / f"{kind}{run}.gguf"
            tv.write_gguf(p)
            blobs.append(p.read_bytes() + (tv.llama2c_bytes() if kind == "spm" else b""))
        assert blobs[0] == blobs[1]


def test_llama2c_bin_matches_gguf(written):
    """tokenizer.bin reads back as the same vocab (tokens, scores, types) and encodes like the GGUF."""
    a, b = Tokenizer.from_file(written["spm"]), Tokenizer.from_file(written["spm.bin"])
    assert a.vocab.tokens == b.vocab.tokens
    assert a.vocab.scores.tolist() == b.vocab.scores.tolist()
    assert a.vocab.attrs == b.vocab.attrs
    for s in _texts()[:200]:
        assert a.encode(s, True, True) == b.encode(s, True, True)


def test_spm_layout():
    """llama2's layout: <unk> <s> </s>, 256 <0xXX> byte tokens, merges by descending score, then characters."""
    tv = T.train_bpe(_chunks(), 600, kind="spm", special_tokens=["<pad>"], progress=False)
    assert tv.tokens[:4] == ["<unk>", "<s>", "</s>", "<pad>"]
    assert tv.tokens[4:260] == [f"<0x{b:02X}>" for b in range(256)]
    md = tv.metadata()
    assert md["tokenizer.ggml.model"] == "llama" and md["tokenizer.ggml.add_space_prefix"] is True
    scores = tv.scores[260:]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    merged = [t for t in tv.tokens[260:] if len(t) > 1]
    assert merged == tv.tokens[260:260 + len(merged)]  # merged tokens first, single characters after
    assert "\u2581" in tv.tokens
    tok = tv.tokenizer()
    assert tok.encode("the", add_special=True)[0] == 1
    assert tok.encode("<pad>", add_special=False, parse_special=True) == [3]


def test_bytelevel_layout():
    """Special tokens first (CONTROL), the 256 byte characters in code point order, merges as 'left right'."""
    tv = T.train_bpe(_chunks(), 500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"], progress=False)
    md = tv.metadata()
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "llama3"
    assert tv.tokens[:2] == ["<|begin_of_text|>", "<|end_of_text|>"]
    assert tv.tokens[2:258] == sorted(tv.tokens[2:258])
    assert md["tokenizer.ggml.bos_token_id"] == 0 and md["tokenizer.ggml.eos_token_id"] == 1
    assert len(tv.merges) == tv.n_vocab - 258
    tok = tv.tokenizer()
    assert tok.encode("hi", add_special=True)[0] == 0  # a dedicated bos is added
    assert tok.encode("x<|end_of_text|>", add_special=False, parse_special=True)[-1] == 1


def test_special_text_is_not_learned():
    """Special-token text in the input cuts it; no merge builds a special token or a <0xXX> byte token."""
    text = ("hello world<|endoftext|>" * 200) + ("<0x41> <s> " * 200)
    tv = T.train_bpe([text], 400, progress=False)
    assert not any("endoftext" in t for t in tv.tokens[1:])
    spm = T.train_bpe([text], 400, kind="spm", progress=False)
    assert len(set(spm.tokens)) == spm.n_vocab
    assert spm.tokens.count("<0x41>") == 1 and spm.tokens.count("<s>") == 1
    tok = spm.tokenizer()
    assert tok.decode(tok.encode("<0x41> <s>", add_special=False)) == "<0x41> <s>"


def test_min_frequency_and_vocab_size():
    tv = T.train_bpe(["ab ab cd"], 1000, min_frequency=2, progress=False)
    assert tv.n_vocab < 1000 and tv.merges
    assert T.train_bpe(["ab ab cd"], 1000, min_frequency=1, progress=False).n_vocab > tv.n_vocab
    with pytest.raises(MinillamaError, match="expected vocab_size of at least 257 .1 special and 256 byte tokens., found 100"):
        T.train_bpe(["x"], 100, progress=False)
    with pytest.raises(MinillamaError, match="unknown pre"):
        T.train_bpe(["x"], 1000, pre="nope", progress=False)
    with pytest.raises(MinillamaError, match="kind"):
        T.train_bpe(["x"], 1000, kind="unigram", progress=False)
    with pytest.raises(MinillamaError, match="no such file"):
        T.train_bpe(["missing-corpus.txt"], 1000, progress=False)
    with pytest.raises(MinillamaError, match="duplicate"):
        T.train_bpe(["x"], 1000, special_tokens=["a"], progress=False)
    with pytest.raises(MinillamaError, match="duplicate"):
        T.train_bpe(["x"], 1000, kind="spm", special_tokens=["<0x0A>"], progress=False)


# ---------------------------------------------------------------------------------------------
# Streaming input


def _ragged_text(rng: random.Random) -> str:
    parts = []
    for _ in range(3000):
        parts.append(rng.choice(TRICKY + TRAINING_PARAGRAPHS))
        parts.append(rng.choice(["\n", "\n\n", " ", "\r\n", "\n  ", ""]))
    return "".join(parts)


@pytest.mark.parametrize("kind", ["bytelevel", "spm"])
def test_streaming_counts_like_whole_text(tmp_path, monkeypatch, kind):
    """Read in small blocks, a file gives the word counts of splitting it whole, for every pattern set."""
    monkeypatch.setattr(T, "_BLOCK", 4096)
    monkeypatch.setattr(T, "_MARGIN", 512)
    text = _ragged_text(random.Random(7))
    path = tmp_path / "corpus.txt"
    path.write_bytes(text.encode("utf-8"))
    names = {spec.patterns: pre for pre, spec in PRE_TOKENIZERS.items() if spec.byte_encode
             and not spec.escape_whitespaces} if kind == "bytelevel" else {"spm": "llama3"}
    for patterns, pre in sorted(names.items()):
        got = T.count_words([path], kind, pre, special_tokens=[], progress=False)
        if kind == "spm":
            want = Counter(T._SPM_WORDS.findall(T._spm_prepare(text, True)))
        else:
            want = Counter(PreTokenizer(PATTERNS[patterns]).split(text))
        assert got == want, pre


def test_inputs_files_texts_and_streams(tmp_path):
    """A path, a list of paths, open text files and texts train the same vocab from the same text."""
    text = "\n".join(training_lines()[:200])
    p = tmp_path / "c.txt"
    p.write_text(text, encoding="utf-8", newline="")
    ref = T.train_bpe([text], 400, progress=False).merges
    assert T.train_bpe(p, 400, progress=False).merges == ref
    assert T.train_bpe(str(p), 400, progress=False).merges == ref
    with open(p, encoding="utf-8", newline="") as f:
        assert T.train_bpe([f], 400, progress=False).merges == ref


def test_bad_and_empty_input(tmp_path):
    """Invalid UTF-8 names the file and offset; an empty corpus gives the base vocab."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes("héllo".encode() + b"\xff")
    with pytest.raises(MinillamaError, match=r"UTF-8.*offset 6"):
        T.train_bpe(bad, 1000, progress=False)
    assert T.train_bpe([""], 1000, progress=False).n_vocab == 257
    spm = T.train_bpe([], 1000, kind="spm", progress=False)
    assert spm.n_vocab == 260 and spm.tokens[-1] == "\u2581"
    assert spm.tokenizer().decode(spm.tokenizer().encode("hi there", add_special=False)) == "hi there"


def test_progress_silent_when_not_a_tty(capsys):
    T.train_bpe(_chunks(), 400, progress=None)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# Hugging Face BpeTrainer and the shared corpus


@pytest.mark.parametrize("pre", ["llama3", "gpt-2"])
def test_merges_equal_hugging_face(pre):
    """Same documents, same special token, same min_frequency: the same merges in the same order, the same ids."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, pre_tokenizers, trainers

    docs = [d.replace("<|endoftext|>", "") for d in _chunks()]  # special text: see bench_train.py
    tv = T.train_bpe(docs, 900, pre=pre, progress=False)
    (patterns,) = PATTERNS[PRE_TOKENIZERS[pre].patterns]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(patterns + (r"|\s+" if pre == "gpt-2" else "")), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=900, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(hf.to_str())["model"]
    assert tv.merges == [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    assert tv.tokens == [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]


@pytest.mark.parametrize("kind", ["bytelevel", "spm"])
def test_botchan(tmp_path, kind):
    """botchan.txt: llama.cpp agrees with minillama on the written GGUF; its paragraphs round-trip."""
    corpus = require_shared("corpus", "botchan.txt")
    tv = T.train_bpe([corpus], 2000, kind=kind, pre="qwen2", progress=False)
    assert tv.n_vocab == 2000
    path = tmp_path / f"botchan-{kind}.gguf"
    tv.write_gguf(path)
    tok = Tokenizer.from_file(path)
    with open(corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    paragraphs = [p for p in text.split("\r\n\r\n") if p.strip()][:300]
    for s in paragraphs:
        assert tok.decode(tok.encode(s, add_special=False)) == s
    oracle = get_oracle(path)
    for s in paragraphs + TRICKY:
        assert oracle.tokenize(s, False, False) == tok.encode(s, add_special=False), s
        assert oracle.tokenize(s, True, True) == tok.encode(s, add_special=True, parse_special=True), s


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_train(tmp_path, capsys):
    src = tmp_path / "c.txt"
    src.write_text("\n".join(_chunks()), encoding="utf-8")
    out, binp = tmp_path / "t.gguf", tmp_path / "t.bin"
    assert cli.main(["train", "--vocab-size", "500", "--kind", "spm", "--llama2c", str(binp), "--out", str(out),
                     "--no-progress", str(src)]) == 0
    assert "spm BPE vocab of 500 tokens" in capsys.readouterr().out
    assert Tokenizer.from_file(out).n_vocab == Tokenizer.from_file(binp).n_vocab == 500
    assert cli.main(["train", "--vocab-size", "500", "--pre", "gpt-2", "--special", "<|endoftext|>",
                     "--out", str(out), str(src)]) == 0
    assert Tokenizer.from_file(out).pre == "gpt-2"
    assert cli.main(["train", "--vocab-size", "500", "--llama2c", str(binp), "--out", str(out), str(src)]) == 2
    assert cli.main(["train", "--vocab-size", "500", "--out", str(out), str(tmp_path / "nope.txt")]) == 2
    assert cli.main(["train", "--vocab-size", "500", "--pre", "gemma4", "--out", str(out), str(src)]) == 2
    assert "error" in capsys.readouterr().err


def test_cli_ctrl_c_writes_nothing(tmp_path, monkeypatch, capsys):
    """Ctrl-C during training (or writing) leaves no output file, not even a temporary one."""
    src = tmp_path / "c.txt"
    src.write_text("\n".join(_chunks()), encoding="utf-8")
    out = tmp_path / "t.gguf"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(T, "learn_merges", interrupted)
    assert cli.main(["train", "--vocab-size", "500", "--out", str(out), str(src)]) == 130
    assert "nothing written" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr("gguf.GGUFWriter.write_kv_data_to_file", interrupted)  # the writer imports it when it writes
    assert cli.main(["train", "--vocab-size", "500", "--out", str(out), str(src)]) == 130
    assert list(tmp_path.iterdir()) == [src]


def test_spm_training_on_text_with_nul(tmp_path: Path) -> None:
    tv = train_bpe(["hello\0world hello world\n" * 5], 300, kind="spm", min_frequency=1)
    tok = tv.tokenizer()
    assert tok.decode(tok.encode("hello\0world", add_special=False)) == "hello\0world"


def test_spm_training_with_tiny_character_coverage() -> None:
    tv = train_bpe(["日本語\n"], 300, kind="spm", character_coverage=0.1)
    tok = tv.tokenizer()
    assert tok.decode(tok.encode("日本語", add_special=False)) == "日本語"
