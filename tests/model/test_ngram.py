"""The n-gram placeholder model: counts and Witten-Bell back-off checked against values computed by hand,
training through a tokenizer, and the .npz file format (round trip, every corrupt case a FormatError)."""

from __future__ import annotations

import io
import json
import zipfile
from collections import Counter
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pytest

from minillama.errors import FormatError, MinillamaError
from minillama.generate import LanguageModel, generate
from minillama.ngram import NGramModel, default_corpus_path, paragraphs
from minillama.tokenizer import Tokenizer, default_vocab_path

# A toy corpus over a vocab of 5 ids (4 never occurs), order 3:
#   [0, 1, 2, 0, 1, 3] and [0, 1, 2]
# unigram counts        0:3  1:3  2:2  3:1          N = 9
# after (0,)            1:3
# after (1,)            2:2  3:1                    c = 3, T = 2
# after (2,)            0:1
# after (0, 1)          2:2  3:1                    c = 3, T = 2
# after (1, 2)          0:1
# after (2, 0)          1:1
UNIGRAM = [F(3, 9), F(3, 9), F(2, 9), F(1, 9), F(0)]
# P(w | 1) = (c(1, w) + 2 P(w)) / 5
AFTER_1 = [F(2, 15), F(2, 15), F(22, 45), F(11, 45), F(0)]
# P(w | 0 1) = (c(0 1, w) + 2 P(w | 1)) / 5
AFTER_0_1 = [F(4, 75), F(4, 75), F(134, 225), F(67, 225), F(0)]


@pytest.fixture
def toy() -> NGramModel:
    lm = NGramModel(order=3, n_vocab=5)
    lm.add_sequence([0, 1, 2, 0, 1, 3])
    lm.add_sequence([0, 1, 2])
    return lm


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(default_vocab_path())


@pytest.fixture(scope="module")
def corpus_lm(tok: Tokenizer) -> NGramModel:
    return NGramModel.train_files(tok, [default_corpus_path()], order=3)


def _floats(fracs: list[F]) -> list[float]:
    return [float(f) for f in fracs]


def test_toy_counts(toy: NGramModel) -> None:
    assert toy.n_tokens == 9 and toy.n_sequences == 2
    assert [toy.count((), w) for w in range(5)] == [3, 3, 2, 1, 0]
    assert toy.count((0,), 1) == 3 and toy.count((0,), 2) == 0
    assert (toy.count((1,), 2), toy.count((1,), 3)) == (2, 1)
    assert toy.count((2,), 0) == 1
    assert (toy.count((0, 1), 2), toy.count((0, 1), 3)) == (2, 1)
    assert toy.count((1, 2), 0) == 1 and toy.count((2, 0), 1) == 1
    assert toy.count((1, 0), 1) == 0  # never seen: (1, 0) does not occur
    assert (toy.context_total((1,)), toy.context_types((1,))) == (3, 2)
    assert (toy.context_total((0, 1)), toy.context_types((0, 1))) == (3, 2)
    with pytest.raises(ValueError, match="at most 2"):
        toy.count((0, 1, 2), 3)


def test_toy_witten_bell(toy: NGramModel) -> None:
    assert toy.probabilities([]) == pytest.approx(_floats(UNIGRAM))
    assert toy.probabilities([1]) == pytest.approx(_floats(AFTER_1))
    assert toy.probabilities([2, 2, 0, 1]) == pytest.approx(_floats(AFTER_0_1))  # only the last 2 ids count
    # after (2, 0): c = 1, T = 1; P(w | 0) = (c(0, w) + 1 * P(w)) / 4 -> (1 + ...)/2 at the top
    after_0 = [(F(3) * (w == 1) + UNIGRAM[w]) / 4 for w in range(5)]
    assert toy.probabilities([2, 0]) == pytest.approx(_floats([(F(w == 1) + after_0[w]) / 2 for w in range(5)]))


def test_toy_back_off(toy: NGramModel) -> None:
    # (4, 1) was never seen: the bigram level after (1,) is used as is
    assert toy.probabilities([4, 1]) == pytest.approx(_floats(AFTER_1))
    # (3,) was never seen as a context: unigram frequencies
    assert toy.probabilities([3]) == pytest.approx(_floats(UNIGRAM))
    assert toy.probabilities([2, 3]) == pytest.approx(_floats(UNIGRAM))
    for ctx in ([], [0], [1], [0, 1], [4, 4], [2, 0]):
        assert toy.probabilities(ctx).sum() == pytest.approx(1.0)
        assert toy.probabilities(ctx)[4] == 0.0  # never seen in training: never produced


def test_empty_model_is_uniform() -> None:
    lm = NGramModel(order=2, n_vocab=4)
    assert lm.probabilities([1]) == pytest.approx([0.25] * 4)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        NGramModel(order=0, n_vocab=5)
    with pytest.raises(ValueError):
        NGramModel(order=2, n_vocab=0)
    with pytest.raises(ValueError, match="out of range"):
        NGramModel(order=2, n_vocab=5).add_sequence([0, 5])


def test_order_one_is_unigram(toy: NGramModel) -> None:
    lm = NGramModel(order=1, n_vocab=5)
    lm.add_sequence([0, 1, 2, 0, 1, 3])
    lm.add_sequence([0, 1, 2])
    assert lm.probabilities([0, 1]) == pytest.approx(_floats(UNIGRAM))


def test_context_only_prefix() -> None:
    lm = NGramModel(order=2, n_vocab=4)
    lm.add_sequence([3, 0, 1], context_only=1)  # 3 plays bos: context, never predicted
    assert lm.count((), 3) == 0 and lm.count((3,), 0) == 1 and lm.n_tokens == 2


def test_train_through_tokenizer(tok: Tokenizer) -> None:
    texts = ["The herd walked on.", "A llama and an alpaca."]
    lm = NGramModel.train(tok, texts, order=2)
    end = tok.eos_id
    assert end is not None and not tok.add_bos  # the default vocab: no bos, eos appended to each document
    seqs = [tok.encode(t, add_special=True) + [end] for t in texts]
    assert lm.n_tokens == sum(len(s) for s in seqs) and lm.n_sequences == 2
    first, second = seqs
    assert lm.count((), end) == 2
    assert lm.count((first[-2],), end) == 2  # both documents end with '.', then the end id
    assert lm.count((first[-1],), second[0]) == 0  # documents are never joined
    pairs = Counter((a, b) for s in seqs for a, b in zip(s, s[1:]))
    assert all(lm.count((a,), b) == n for (a, b), n in pairs.items())
    assert sum(lm.context_total((a,)) for a in {a for a, _ in pairs}) == sum(pairs.values())
    assert lm.tokenizer_info["n_vocab"] == tok.n_vocab


def test_paragraphs() -> None:
    assert paragraphs("a\nb\n\n\nc\n  \n d\n") == ["a\nb", "c", " d"]
    assert paragraphs("\n\n") == []


def test_train_files_not_utf8(tmp_path: Path, tok: Tokenizer) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(MinillamaError, match="expected UTF-8 text, found byte 0xe9"):
        NGramModel.train_files(tok, [bad])


def test_is_a_language_model(corpus_lm: NGramModel) -> None:
    assert isinstance(corpus_lm, LanguageModel)


def test_save_load_round_trip(tmp_path: Path, tok: Tokenizer, corpus_lm: NGramModel) -> None:
    path = tmp_path / "corpus.ngram"  # no .npz suffix: the exact path is used
    corpus_lm.save(path)
    assert path.exists() and not (tmp_path / "corpus.ngram.npz").exists()
    back = NGramModel.load(path, tok)
    assert (back.order, back.n_vocab, back.n_tokens, back.n_sequences) == (
        corpus_lm.order, corpus_lm.n_vocab, corpus_lm.n_tokens, corpus_lm.n_sequences)
    assert back.tokenizer_info == corpus_lm.tokenizer_info
    ids = tok.encode(Path(default_corpus_path()).read_text(encoding="utf-8")[:3000])
    for i in range(0, len(ids), 7):
        ctx = ids[:i]
        assert np.array_equal(back.probabilities(ctx), corpus_lm.probabilities(ctx))
    runs = [generate(m, tok, "The tokenizer", 60, temperature=1.0, seed=11) for m in (corpus_lm, back)]
    texts = ["".join(r) for r in runs]
    assert texts[0] == texts[1] and runs[0].ids == runs[1].ids


def test_toy_round_trip(tmp_path: Path, toy: NGramModel) -> None:
    toy.save(tmp_path / "toy.npz")
    back = NGramModel.load(tmp_path / "toy.npz")
    assert back.probabilities([0, 1]) == pytest.approx(_floats(AFTER_0_1))
    assert back.count((2, 0), 1) == 1


def test_other_vocab_size_refused(tmp_path: Path, toy: NGramModel, tok: Tokenizer) -> None:
    toy.save(tmp_path / "toy.npz")
    with pytest.raises(ValueError, match="vocab of 5 tokens") as info:
        NGramModel.load(tmp_path / "toy.npz", tok)
    assert not isinstance(info.value, FormatError)
    with pytest.raises(ValueError, match="vocab of 5 tokens"):
        toy.add_text(tok, "hello")


# --- corrupt files ---------------------------------------------------------------------------


def _members(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _write(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _with_meta(arrays: dict[str, np.ndarray], **changes: object) -> dict[str, np.ndarray]:
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(changes)
    return {**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}


@pytest.fixture
def good(tmp_path: Path, toy: NGramModel) -> dict[str, np.ndarray]:
    toy.save(tmp_path / "good.npz")
    return _members(tmp_path / "good.npz")


def _load_error(path: Path) -> str:
    with pytest.raises(FormatError) as info:
        NGramModel.load(path)
    return str(info.value)


def test_not_an_archive(tmp_path: Path) -> None:
    p = tmp_path / "text.npz"
    p.write_text("hello, world\n")
    msg = _load_error(p)
    assert "expected a .npz" in msg and "b'hell'" in msg and str(p) in msg
    p.write_bytes(b"")
    assert "found b''" in _load_error(p)
    np.save(tmp_path / "plain.npy", np.arange(3))
    assert "expected a .npz" in _load_error(tmp_path / "plain.npy")


def test_truncated_archive(tmp_path: Path, toy: NGramModel) -> None:
    toy.save(tmp_path / "toy.npz")
    data = (tmp_path / "toy.npz").read_bytes()
    for cut in (len(data) // 3, len(data) - 30):
        (tmp_path / "cut.npz").write_bytes(data[:cut])
        assert "n-gram file" in _load_error(tmp_path / "cut.npz")


def test_other_zip(tmp_path: Path) -> None:
    p = tmp_path / "other.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("readme.txt", "not numpy")
    _load_error(p)


def test_missing_meta_and_members(tmp_path: Path, good: dict[str, np.ndarray]) -> None:
    no_meta = {k: v for k, v in good.items() if k != "meta"}
    assert "'meta'" in _load_error(_write(tmp_path / "a.npz", no_meta))
    no_counts = {k: v for k, v in good.items() if k != "count2"}
    assert "'count2'" in _load_error(_write(tmp_path / "b.npz", no_counts))
    extra = {**good, "ctx9": np.zeros((1, 9), np.int32)}
    assert "unexpected members" in _load_error(_write(tmp_path / "c.npz", extra))


def test_bad_meta(tmp_path: Path, good: dict[str, np.ndarray]) -> None:
    msg = _load_error(_write(tmp_path / "a.npz", _with_meta(good, format="something-else")))
    assert "expected format 'minillama-ngram', found 'something-else'" in msg
    assert "expected version 1, found 99" in _load_error(_write(tmp_path / "b.npz", _with_meta(good, version=99)))
    assert "smoothing" in _load_error(_write(tmp_path / "c.npz", _with_meta(good, smoothing="kneser-ney")))
    assert "order" in _load_error(_write(tmp_path / "d.npz", _with_meta(good, order=0)))
    assert "n_vocab" in _load_error(_write(tmp_path / "e.npz", _with_meta(good, n_vocab="5")))
    assert "n_tokens" in _load_error(_write(tmp_path / "f.npz", _with_meta(good, n_tokens=10)))
    not_json = {**good, "meta": np.frombuffer(b"{not json", np.uint8)}
    assert "JSON" in _load_error(_write(tmp_path / "g.npz", not_json))
    as_text = {**good, "meta": np.array(["{}"])}
    assert "uint8" in _load_error(_write(tmp_path / "h.npz", as_text))


def test_bad_tables(tmp_path: Path, good: dict[str, np.ndarray]) -> None:
    big = good["next1"].copy()
    big[0] = 5
    assert "expected token ids in 0..4, found 5" in _load_error(_write(tmp_path / "a.npz", {**good, "next1": big}))
    neg = good["ctx2"].copy()
    neg[0, 0] = -1
    assert "found -1" in _load_error(_write(tmp_path / "b.npz", {**good, "ctx2": neg}))
    zero = good["count1"].copy()
    zero[0] = 0
    assert "counts >= 1" in _load_error(_write(tmp_path / "c.npz", {**good, "count1": zero}))
    off = good["off1"].copy()
    off[-1] += 1
    assert "'off1'" in _load_error(_write(tmp_path / "d.npz", {**good, "off1": off}))
    floats = good["count0"].astype(np.float64)
    assert "integer array" in _load_error(_write(tmp_path / "e.npz", {**good, "count0": floats}))
    wide = np.zeros((good["ctx1"].shape[0], 2), np.int32)
    assert "columns" in _load_error(_write(tmp_path / "f.npz", {**good, "ctx1": wide}))


def test_pickled_member_refused(tmp_path: Path, good: dict[str, np.ndarray]) -> None:
    """An object array (stored as a pickle) is never unpickled."""
    buf = io.BytesIO()
    np.savez(buf, **{**good, "next1": np.array([object()] * 3, dtype=object)})
    (tmp_path / "pickle.npz").write_bytes(buf.getvalue())
    _load_error(tmp_path / "pickle.npz")
