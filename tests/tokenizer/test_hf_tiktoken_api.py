"""The API users of Hugging Face tokenizers, tiktoken and transformers reach for, checked against those peers.

* encode_with_offsets: Hugging Face tokenizers' Encoding.offsets on llama3 (llama-3.2-tokenizer.json against
  ggml-vocab-llama-bpe.gguf) and on bert-bge (an HF BertWordPiece built from the GGUF's own vocab), on every
  conformance text where both give the same ids; as properties on every shared vocab.
* allowed_special / disallowed_special: tiktoken itself, on a tiktoken Encoding built from llama3's vocab.
* token_to_id / id_to_token / get_vocab: HF tokenizers on llama3.
* encode_batch(return_array=True, ...): HF tokenizers' enable_padding / enable_truncation on bert-bge.
* token healing (encode_for_completion, generate(heal=True)): a prompt ending in a partial word gives the ids
  of the full word.
* warnings: each of our categories, on the input that should raise it and not on the input that should not.
"""

from __future__ import annotations

import json
import random
import unicodedata
import warnings

import numpy as np
import pytest
from support.fixtures import hf_bert_from_gguf
from support.paths import SHARED, load, params_or_skip, require_shared, vocab_path
from support.reference import read_conformance

from minillama.errors import (
    ArgumentError,
    DoubleBosWarning,
    IgnoredNormalizerWarning,
    MinillamaError,
    MinillamaWarning,
    MissingPreTokenizerWarning,
)
from minillama.generate import Sampler, generate
from minillama.tokenizer import Tokenizer, default_vocab_path
from minillama.tokenizer.vocab import Attr

SPACE = "\u2581"


def _hf_llama3():
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer as HF

    return HF.from_file(str(require_shared("vocab", "llama-3.2-tokenizer.json")))


def _compare_offsets(tok: Tokenizer, hf, texts: list[str], add_special: bool) -> tuple[int, list]:
    agree, bad = 0, []
    for t in texts:
        e = hf.encode(t, add_special_tokens=add_special)
        ids, offs = tok.encode_with_offsets(t, add_special=add_special)
        if e.ids != ids:
            continue
        agree += 1
        if [tuple(o) for o in e.offsets] != offs:
            bad.append((t[:60], [(tuple(a), b) for a, b in zip(e.offsets, offs) if tuple(a) != b][:3]))
    return agree, bad


def test_offsets_llama3_match_hf():
    hf = _hf_llama3()
    tok = load("ggml-vocab-llama-bpe")
    texts = [r["text"] for r in read_conformance("ggml-vocab-llama-bpe")]
    agree, bad = _compare_offsets(tok, hf, texts, add_special=False)
    # HF matches added tokens (<|eot_id|>...) written in text, llama.cpp without parse_special does not
    assert agree >= 0.75 * len(texts), f"HF and llama.cpp ids agree on only {agree}/{len(texts)} texts"
    assert not bad, f"offsets differ from HF on {len(bad)} texts, e.g. {bad[:3]}"


def test_offsets_bert_bge_match_hf():
    tok = load("ggml-vocab-bert-bge")
    hf = hf_bert_from_gguf(tok)
    # HF keeps spacing and enclosing marks (Mc, Me) that llama.cpp drops: its spans then reach over them
    texts = [r["text"] for r in read_conformance("ggml-vocab-bert-bge")
             if not any(unicodedata.category(c) in ("Mc", "Me") for c in r["text"])]
    agree, bad = _compare_offsets(tok, hf, texts, add_special=True)
    # HF's BertNormalizer differs from llama.cpp's on marks, Hangul, whitespace classes (see test_wpm.py)
    assert agree >= 0.6 * len(texts), f"HF and llama.cpp ids agree on only {agree}/{len(texts)} texts"
    assert not bad, f"offsets differ from HF on {len(bad)} of {agree} texts, e.g. {bad[:3]}"


def _vocab_names() -> list[str]:
    if SHARED is None:
        return []
    return sorted(p.stem for p in (SHARED / "conformance").glob("*.jsonl"))


def check_offset_properties(tok: Tokenizer, text: str, parse_special: bool) -> None:
    ids, offs = tok.encode_with_offsets(text, parse_special=parse_special)
    assert ids == tok.encode(text, parse_special=parse_special), text
    assert len(offs) == len(ids)
    prev = (0, 0)
    for (s, e), i in zip(offs, ids):
        assert 0 <= s <= e <= len(text), (text, s, e)
        if (s, e) == (0, 0):  # an added bos/eos
            continue
        # in order; overlapping only in the one character whose bytes the two tokens split between them
        assert s >= prev[0] and e >= prev[1], (text, prev, (s, e), tok.id_to_token(i))
        assert s >= prev[1] - 1, (text, prev, (s, e), tok.id_to_token(i))
        if s == prev[1] - 1 and (s, e) != prev:
            assert len(text[s].encode()) > 1, (text, prev, (s, e))
        prev = (s, e)


@pytest.mark.parametrize("name", params_or_skip(_vocab_names(), "conformance files"))
def test_offset_properties_every_vocab(name):
    tok = load(name)
    rows = read_conformance(name)
    rng = random.Random(7)
    texts = [r["text"] for r in rows[:: max(1, len(rows) // 120)]]
    texts += ["".join(rng.choice("ab c\u00e9\u65e5\U0001f999 \n<s>") for _ in range(rng.randint(0, 30)))
              for _ in range(40)]
    for t in texts:
        check_offset_properties(tok, t, parse_special=False)
        check_offset_properties(tok, t, parse_special=True)
    if tok.model == "bpe":  # byte-level: every character lies inside some span, in order
        for t in texts[:50]:
            ids, offs = tok.encode_with_offsets(t, add_special=False)
            if b"".join(map(tok.token_to_piece, ids)) != t.encode():
                continue  # falcon's pre-tokenizer drops \v: no token stands for it
            covered, end = [], 0
            for s, e in offs:
                covered.append(t[max(s, end):e])
                end = max(end, e)
            assert "".join(covered) == t


@pytest.mark.parametrize("name", ["ggml-vocab-llama-bpe", "ggml-vocab-llama-spm", "ggml-vocab-bert-bge",
                                  "ggml-vocab-unigram8k", "ggml-vocab-falcon"])
def test_offset_properties_any_text(name):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    tok = load(name)

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.text(max_size=40))
    def check(text):
        check_offset_properties(tok, text, parse_special=False)
        check_offset_properties(tok, text, parse_special=True)

    check()


def test_offsets_byte_tokens_share_their_character():
    tok = load("ggml-vocab-llama-spm")
    ids, offs = tok.encode_with_offsets("a \U0001f999", add_special=False)  # the emoji is 4 byte tokens
    assert [tok.id_to_token(i) for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    assert offs[-4:] == [(2, 3)] * 4
    assert offs[0] == (0, 1)


def test_offsets_refuse_lone_surrogates():
    tok = Tokenizer.from_file(default_vocab_path())
    with pytest.raises(ArgumentError, match="surrogates"):
        tok.encode_with_offsets("a\udcff")


# --- special-token control: tiktoken's model, checked against tiktoken -------------------------------------------

@pytest.fixture(scope="module")
def tiktoken_llama3():
    tiktoken = pytest.importorskip("tiktoken")
    from minillama.tokenizer.tables import LLAMA3_ORIGINAL as LLAMA3_REGEX
    from minillama.tokenizer.unicode import BYTELEVEL_TO_LATIN1

    path = require_shared("vocab", "llama-3.2-tokenizer.json")
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    ranks = {t.translate(BYTELEVEL_TO_LATIN1).encode("latin-1"): i for t, i in j["model"]["vocab"].items()}
    special = {a["content"]: a["id"] for a in j["added_tokens"]}
    enc = tiktoken.Encoding("llama3", pat_str=LLAMA3_REGEX, mergeable_ranks=ranks, special_tokens=special)
    return enc, load("ggml-vocab-llama-bpe")


SPECIAL_TEXTS = ["Hello <|eot_id|> world", "<|begin_of_text|>x<|eot_id|>y<|end_of_text|>",
                 "no special tokens here", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"]


@pytest.mark.parametrize("allowed, disallowed", [
    ("all", ()), (set(), ()), ({"<|eot_id|>"}, ()), ({"<|eot_id|>", "<|begin_of_text|>"}, ()),
    ({"<|eot_id|>"}, "all"), (set(), "all"), ("all", "all"), ({"<|eot_id|>"}, {"<|end_of_text|>"}),
])
def test_special_control_matches_tiktoken(tiktoken_llama3, allowed, disallowed):
    enc, tok = tiktoken_llama3
    for text in SPECIAL_TEXTS:
        try:
            want = enc.encode(text, allowed_special=allowed, disallowed_special=disallowed)
        except ValueError:
            with pytest.raises(ArgumentError, match="disallowed"):
                tok.encode(text, add_special=False, allowed_special=allowed, disallowed_special=disallowed)
            continue
        got = tok.encode(text, add_special=False, allowed_special=allowed, disallowed_special=disallowed)
        assert got == want, (text, allowed, disallowed)


def test_special_control_default_and_messages():
    tok = load("ggml-vocab-llama-bpe")
    text = "Hi <|eot_id|>"
    # no new argument: the behaviour of every existing call is unchanged (plain text unless parse_special)
    assert tok.encode(text) == tok.encode(text, True, False)
    assert tok.encode(text, parse_special=True)[-1] == tok.token_to_id("<|eot_id|>")
    # allowed_special alone disallows every other control token, as tiktoken does; the error names it and where
    with pytest.raises(ArgumentError, match=r"'<\|eot_id\|>' at character 3"):
        tok.encode(text, allowed_special={"<|begin_of_text|>"})
    with pytest.raises(ArgumentError, match="at character 3"):
        tok.encode(text, disallowed_special="all")
    with pytest.raises(ArgumentError, match="not a control token"):
        tok.encode(text, allowed_special={"hello"})
    with pytest.raises(ArgumentError, match="'all' or a collection"):
        tok.encode(text, allowed_special="al")
    # parse_special=True is allowed_special="all"
    assert tok.encode(text, parse_special=True, disallowed_special="all") == tok.encode(text, parse_special=True)
    # offsets take the same arguments
    ids, offs = tok.encode_with_offsets(text, add_special=False, allowed_special="all")
    assert ids[-1] == tok.token_to_id("<|eot_id|>") and offs[-1] == (3, 13)


# --- vocab accessors ----------------------------------------------------------------------------------------------

def test_vocab_accessors_match_hf():
    hf = _hf_llama3()
    tok = load("ggml-vocab-llama-bpe")
    assert tok.get_vocab() == hf.get_vocab(with_added_tokens=True)
    for i in (0, 1, 100, 12345, 128000, 128009, tok.n_vocab - 1):
        assert tok.id_to_token(i) == hf.id_to_token(i)
        assert tok.token_to_id(tok.id_to_token(i)) == hf.token_to_id(hf.id_to_token(i)) == i
    assert tok.token_to_id("no such token at all") is None is hf.token_to_id("no such token at all")
    with pytest.raises(ArgumentError):
        tok.id_to_token(tok.n_vocab)
    batch = [tok.encode(t) for t in SPECIAL_TEXTS]
    assert tok.decode_batch(batch) == [hf.decode(ids, skip_special_tokens=True) for ids in batch]
    assert tok.decode_batch(np.asarray([batch[0], batch[0]])) == [tok.decode(batch[0])] * 2


# --- arrays for embedding models ----------------------------------------------------------------------------------

BATCH = ["Hello world", "A longer sentence, with punctuation and numbers like 42.", "", "naïve café"]


@pytest.mark.parametrize("pad_to, truncate", [("longest", None), (24, None), ("longest", 8), (10, 10), (16, 6)])
def test_encode_batch_arrays_match_hf(pad_to, truncate):
    tok = load("ggml-vocab-bert-bge")
    hf = hf_bert_from_gguf(tok)
    pad = tok.vocab.special["pad"]
    hf.enable_padding(pad_id=pad, pad_token="[PAD]", length=None if pad_to == "longest" else pad_to)
    if truncate is not None:
        hf.enable_truncation(max_length=truncate)
    want = hf.encode_batch(BATCH)
    ids, mask = tok.encode_batch(BATCH, return_array=True, pad_to=pad_to, truncate=truncate, num_threads=1)
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    assert ids.tolist() == [e.ids for e in want]
    assert mask.tolist() == [e.attention_mask for e in want]


def test_encode_batch_defaults_unchanged_and_errors():
    tok = Tokenizer.from_file(default_vocab_path())  # a demo vocab without a pad token
    assert tok.encode_batch(BATCH) == [tok.encode(t) for t in BATCH]
    assert tok.encode_batch(BATCH, truncate=3) == [tok.encode(t)[:3] for t in BATCH]
    with pytest.raises(ArgumentError, match="no pad token.*pad_id"):
        tok.encode_batch(BATCH, return_array=True, pad_to="longest")
    ids, mask = tok.encode_batch(BATCH, return_array=True, pad_to="longest", pad_id=tok.eos_id)
    assert ids[2].tolist() == [tok.eos_id] * ids.shape[1] and mask[2].sum() == 0
    with pytest.raises(ArgumentError, match="pad_to='longest'"):
        tok.encode_batch(BATCH, return_array=True)
    with pytest.raises(ArgumentError, match="more than pad_to=2"):
        tok.encode_batch(BATCH, return_array=True, pad_to=2, pad_id=0)
    with pytest.raises(ArgumentError, match="return_array"):
        tok.encode_batch(BATCH, pad_to="longest", pad_id=0)
    ids, mask = tok.encode_batch(["same", "same"], return_array=True)
    assert ids.shape == (2, len(tok.encode("same"))) and mask.all()


# --- token healing --------------------------------------------------------------------------------------------------

class SpellOut:
    """A language model that knows the text it wants: it prefers the longest token spelling out what is missing."""

    def __init__(self, tok: Tokenizer, full: str) -> None:
        self.tok, self.full = tok, full.encode()

    def next_token(self, ids, sampler):
        ids = [i for i in ids if not self.tok.vocab.attrs[i] & int(Attr.CONTROL)]
        rest = self.full[len(self.tok.decode_bytes(ids)):]
        scores = np.array([len(p) if p and rest.startswith(p) else -np.inf for p in self.tok.pieces.pieces_plain])
        if not rest:
            scores[self.tok.eos_id] = 0.0
        return sampler.sample_logits(scores)


@pytest.mark.parametrize("path", [default_vocab_path(), "llama-spm", "llama-bpe"])
def test_healing_gives_the_ids_of_the_full_word(path):
    tok = Tokenizer.from_file(path) if path.endswith(".gguf") else load("ggml-vocab-" + path)
    full, prompt = "Tokenizers cut text into pieces", "Tokenizers cut text into pie"
    target = tok.encode(full, add_special=True, parse_special=True)
    ids, prefix = tok.encode_for_completion(prompt, parse_special=True)
    assert prefix == " pie" and target[:len(ids)] == ids
    plain = generate(SpellOut(tok, full), tok, prompt, 8, temperature=0)
    assert "".join(plain) == "ces"
    assert plain.prompt_ids + plain.ids != target  # without healing: " pie" + "ces", not " pieces"
    healed = generate(SpellOut(tok, full), tok, prompt, 8, temperature=0, heal=True)
    assert "".join(healed) == "ces" and healed.text == "ces"  # only the text after the prompt
    assert healed.prompt_ids + healed.ids == target


HEALING_PROMPTS = ["Tokenizers cut text into pie", "The quick bro", "hello world ", "x = foo(ba", "I'm", "123 45",
                   "caf", "New Yor", "a\n\nb", "print('hi'); pri", "Hello, w", "numbers 12345", "\u65e5\u672c\u8a9e"]


def test_healing_stable_ids_match_tiktoken(tiktoken_llama3):
    """encode_for_completion's ids are tiktoken's encode_with_unstable stable tokens (llama3's regex and ranks)."""
    enc, tok = tiktoken_llama3
    for text in HEALING_PROMPTS:
        stable, completions = enc.encode_with_unstable(text)
        ids, prefix = tok.encode_for_completion(text, add_special=False)
        assert ids == stable, (text, tok.decode(ids), enc.decode(stable))
        assert tok.decode(ids) + prefix == text
        assert any(enc.decode(c).startswith(prefix) for c in completions)


def test_encode_for_completion_edges():
    tok = load("ggml-vocab-llama-bpe")
    assert tok.encode_for_completion("a b ") == (tok.encode("a b"), " ")
    ids, prefix = tok.encode_for_completion("x<|eot_id|>", parse_special=True)
    assert prefix == "" and ids == tok.encode("x<|eot_id|>", parse_special=True)
    ids, prefix = tok.encode_for_completion("caf\u00e9")
    assert prefix == "caf\u00e9" and ids == [tok.bos_id]
    ugm = load("ggml-vocab-unigram8k")  # add_special appends eos: never in a completion prompt
    ids, prefix = ugm.encode_for_completion("Hello wor")
    assert prefix.strip() == "wor" and ugm.eos_id not in ids


def test_sampler_constraint():
    s = Sampler(temperature=0)
    s.constrain(np.array([False, True, True, False]), fallback=3)
    assert s.sample_logits([9.0, 1.0, 2.0, 8.0]) == 2
    assert s.sample_logits([5.0], ids=[0]) == 3  # no allowed candidate: the fallback
    s.constrain(None)
    assert s.sample_logits([9.0, 1.0, 2.0, 8.0]) == 0


# --- warnings -------------------------------------------------------------------------------------------------------

def test_warning_bpe_gguf_without_pre(tmp_path):
    from minillama.gguffile.writer import write_vocab_gguf
    from minillama.tokenizer.formats import read_metadata

    md = dict(read_metadata(default_vocab_path()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinillamaWarning)
        Tokenizer.from_file(default_vocab_path())  # it has tokenizer.ggml.pre: no warning
    del md["tokenizer.ggml.pre"]
    write_vocab_gguf(md, tmp_path / "nopre.gguf")
    with pytest.warns(MissingPreTokenizerWarning, match="tokenizer.ggml.pre.*'default'"):
        Tokenizer.from_file(tmp_path / "nopre.gguf")


def test_warning_double_bos():
    tok = load("ggml-vocab-llama-spm")
    with pytest.warns(DoubleBosWarning, match="'<s>'"):
        ids = tok.encode("<s>Hello", parse_special=True)
    assert ids[:2] == [tok.bos_id, tok.bos_id]  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinillamaWarning)
        tok.encode("<s>Hello", add_special=False, parse_special=True)
        tok.encode("Hello <s>", parse_special=True)


def test_warning_sentencepiece_normalizer_llamacpp_ignores(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    from support.fixtures import training_lines

    prefix = str(tmp_path / "bpe_nfkc")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_lines()), model_prefix=prefix, vocab_size=600, character_coverage=0.98,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="nmt_nfkc",
                                   minloglevel=2)
    with pytest.warns(IgnoredNormalizerWarning, match="nmt_nfkc"):
        tok = Tokenizer.from_file(prefix + ".model")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    text = "\uff34\uff48\uff45 fox"  # full-width letters: NFKC makes them ASCII, llama.cpp does not
    assert tok.encode(text, add_special=False) != sp.encode(text)  # the difference the warning announces
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinillamaWarning)
        Tokenizer.from_file(require_shared("vocab", "llama2-tokenizer.model"))  # identity: no warning


# --- the calls HF and tiktoken users reach for: tok(text), batch_decode, skip_special_tokens, ... -----------------

CALL_TEXTS = ["Hello world", "A longer sentence, with punctuation and numbers like 42.", "",
              "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"]


@pytest.fixture(scope="module")
def llama3_json():
    """(minillama, HF tokenizers) on llama-3.2-tokenizer.json, <|end_of_text|> as the pad token on both."""
    hf = _hf_llama3()
    tok = Tokenizer.from_file(require_shared("vocab", "llama-3.2-tokenizer.json"))
    assert tok.pad_id is None  # the file names no pad token
    tok.pad_id = tok.token_to_id("<|end_of_text|>")
    return tok, hf


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("max_length", [None, 6])
def test_call_matches_hf(llama3_json, side, max_length):
    """tok(texts, padding=True, padding_side=..., truncation=...) is HF tokenizers' encode_batch with
    enable_padding(direction=...) / enable_truncation (control tokens in the text matched, bos added)."""
    tok, hf = llama3_json
    hf.enable_padding(direction=side, pad_id=tok.pad_id, pad_token="<|end_of_text|>")
    if max_length is not None:
        hf.enable_truncation(max_length=max_length)
    else:
        hf.no_truncation()
    try:
        want = hf.encode_batch(CALL_TEXTS)
        got = tok(CALL_TEXTS, padding=True, padding_side=side, truncation=max_length is not None,
                  max_length=max_length)
        assert got.input_ids == [e.ids for e in want]
        assert got["attention_mask"] == [e.attention_mask for e in want]
        tok.padding_side = side  # transformers' attribute, the default of every call
        ids, mask = tok.encode_batch(CALL_TEXTS, parse_special=True, return_array=True, pad_to="longest",
                                     truncate=max_length, num_threads=1)
        assert ids.tolist() == [e.ids for e in want] and mask.tolist() == [e.attention_mask for e in want]
        arrays = tok(CALL_TEXTS, padding=True, return_tensors="np", truncation=max_length is not None,
                     max_length=max_length)
        assert arrays["input_ids"].dtype == np.int64 and arrays["input_ids"].tolist() == [e.ids for e in want]
    finally:
        tok.padding_side = "right"
        hf.no_padding()
        hf.no_truncation()
    for text in CALL_TEXTS:  # one text: lists, no padding
        e = hf.encode(text)
        assert tok(text) == {"input_ids": e.ids, "attention_mask": e.attention_mask}
        if max_length is not None:
            hf.enable_truncation(max_length=max_length)
            assert tok.encode(text, parse_special=True, truncation=True, max_length=max_length) == hf.encode(text).ids
            hf.no_truncation()


def test_call_and_truncation_errors():
    tok = Tokenizer.from_file(default_vocab_path())
    with pytest.raises(ArgumentError, match="needs max_length"):
        tok.encode("Hello", truncation=True)
    with pytest.raises(ArgumentError, match="pass truncation=True"):
        tok.encode("Hello", truncation=False, max_length=3)
    with pytest.raises(ArgumentError, match="no pad token"):
        tok(["Hello", "Hello, llamas!"], padding=True)
    with pytest.raises(ArgumentError, match="padding_side must be"):
        tok(["Hello"], padding_side="center")
    with pytest.raises(ArgumentError, match="padding=True"):
        tok(["Hello", "Hello, llamas!"], return_tensors="np")
    with pytest.raises(ArgumentError, match="out of range"):
        tok.pad_id = tok.n_vocab
    tok.pad_id = tok.eos_id
    assert tok(["Hello", "Hello, llamas!"], padding=True).input_ids[0][-1] == tok.eos_id


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens_matches_hf(llama3_json, skip):
    """One name, skip_special_tokens, with HF's meaning in decode, decode_batch, batch_decode and stream_decoder."""
    tok, hf = llama3_json
    batch = [hf.encode(t).ids for t in CALL_TEXTS]  # bos and control tokens
    want = hf.decode_batch(batch, skip_special_tokens=skip)
    assert tok.batch_decode(batch, skip_special_tokens=skip) == want
    assert tok.decode_batch(batch, skip_special_tokens=skip) == want
    assert [tok.decode(ids, skip_special_tokens=skip) for ids in batch] == want
    for ids, text in zip(batch, want):
        d = tok.stream_decoder(skip_special_tokens=skip)
        assert "".join(d.push(i) for i in ids) + d.flush() == text.removeprefix("<|begin_of_text|>" if skip else "")
    assert tok.batch_decode(batch) == hf.decode_batch(batch, skip_special_tokens=False)  # HF's default
    with pytest.raises(ArgumentError, match="not both"):
        tok.decode(batch[0], remove_special=True, skip_special_tokens=skip)
    with pytest.deprecated_call():
        tok.stream_decoder(skip_special=skip)


def test_token_accessors_match_hf(llama3_json):
    tok, hf = llama3_json
    ids = hf.encode(CALL_TEXTS[3]).ids
    assert tok.convert_ids_to_tokens(ids) == [hf.id_to_token(i) for i in ids]
    assert tok.convert_ids_to_tokens(ids[1]) == hf.id_to_token(ids[1])
    special = {i for i, a in hf.get_added_tokens_decoder().items() if a.special}
    assert tok.convert_ids_to_tokens(ids, skip_special_tokens=True) == [hf.id_to_token(i) for i in ids
                                                                         if i not in special]
    assert tok.get_vocab_size() == tok.get_vocab_size(with_added_tokens=True) == hf.get_vocab_size(True)
    bert = load("ggml-vocab-bert-bge")
    assert bert.pad_id == bert.token_to_id("[PAD]")
    phi3 = load("ggml-vocab-phi-3")
    assert phi3.chat_template == phi3.vocab.metadata["tokenizer.chat_template"]
    assert tok.chat_template is None


def test_chat_template_attribute_is_used():
    """tok.chat_template = ... (as transformers users set it) is what apply_chat_template renders."""
    tok = Tokenizer.from_file(default_vocab_path())
    tok.chat_template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[hi]"
    tok.chat_template = None
    with pytest.raises(MinillamaError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_tiktoken_calls_match_tiktoken(tiktoken_llama3):
    """encode_ordinary, decode_single_token_bytes (llama3) and eot_token (gpt-2) equal tiktoken's."""
    tiktoken = pytest.importorskip("tiktoken")
    from minillama.tokenizer.tables import GPT2

    enc, tok = tiktoken_llama3
    for text in SPECIAL_TEXTS:
        assert tok.encode_ordinary(text) == enc.encode_ordinary(text)
    for i in (0, 1, 220, 12345, 128000, 128009, 128255):
        assert tok.decode_single_token_bytes(i) == enc.decode_single_token_bytes(i)
    gpt2 = load("ggml-vocab-gpt-2")
    from minillama.tokenizer.unicode import BYTELEVEL_TO_LATIN1

    ranks = {t.translate(BYTELEVEL_TO_LATIN1).encode("latin-1"): i for i, t in enumerate(gpt2.vocab.tokens[:50256])}
    enc2 = tiktoken.Encoding("gpt2", pat_str=GPT2, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    assert gpt2.eot_token == enc2.eot_token == 50256
    assert gpt2.encode_ordinary("hi <|endoftext|>") == enc2.encode_ordinary("hi <|endoftext|>")


def test_hf_model_directory(tmp_path):
    """from_file and --model take a Hugging Face model directory (tokenizer.json, tokenizer_config.json and
    config.json in it, as from_pretrained takes one): HF tokenizers' ids, the config's chat template."""
    import os
    import subprocess
    import sys

    hf = _hf_llama3()
    model = tmp_path / "Llama-3.2-1B-Instruct"
    model.mkdir()
    os.symlink(require_shared("vocab", "llama-3.2-tokenizer.json"), model / "tokenizer.json")
    template = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<|begin_of_text|>",
                                                             "eos_token": "<|eot_id|>"}))
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256}))
    tok = Tokenizer.from_file(model)
    assert tok.encode("Hello world") == hf.encode("Hello world").ids
    assert tok.chat_template == template
    out = subprocess.run([sys.executable, "-m", "minillama.cli", "tokenize", "--model", str(model), "--ids",
                          "Hello world"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout) == hf.encode("Hello world").ids
    (tmp_path / "empty").mkdir()
    out = subprocess.run([sys.executable, "-m", "minillama.cli", "tokenize", "--model", str(tmp_path / "empty"),
                          "x"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("minillama: error:")
    assert f"cannot read {str(tmp_path / 'empty')!r}: expected a model file" in out.stderr
    assert "found a directory without a tokenizer.json" in out.stderr


# --- ignore_merges: llama.cpp's ids by default, HF tokenizers' on request ----------------------------------------

def test_ignore_merges_false_gives_hf_ids_default_gives_llamacpp():
    """llama-3.2-tokenizer.json says "ignore_merges": false; llama.cpp's llama-bpe takes a word that is a whole
    token as that token, so some paragraphs (Vietnamese mostly) differ from HF tokenizers. ignore_merges=False
    gives HF's ids on every paragraph of diverse.txt; the default stays llama.cpp's on conformance-diverse."""
    hf = _hf_llama3()
    path = require_shared("vocab", "llama-3.2-tokenizer.json")
    default, compat = Tokenizer.from_file(path), Tokenizer.from_file(path, ignore_merges=False)
    text = require_shared("corpus", "diverse.txt").read_text(encoding="utf-8")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    differ = []
    for p in paragraphs:
        want = hf.encode(p, add_special_tokens=False).ids
        assert compat.encode(p, add_special=False) == want, p[:80]
        if default.encode(p, add_special=False) != want:
            differ.append(p)
    assert differ and any("ệ" in p or "ư" in p for p in differ)  # the issue counted 350 of 16,114, Vietnamese mostly
    rows = read_conformance("ggml-vocab-llama-bpe", "conformance-diverse")
    assert all(default.encode(r["text"], add_special=False) == r["ids"] for r in rows)
    assert any(compat.encode(r["text"], add_special=False) != r["ids"] for r in rows)
    with pytest.raises(ArgumentError, match="BPE vocabs"):
        Tokenizer.from_file(vocab_path("ggml-vocab-llama-spm"), ignore_merges=False)


# --- the rest of transformers' and tiktoken's names ---------------------------------------------------------------

# multi-byte characters, an emoji whose four bytes are four tokens, CJK, a control token written in the text
HF_TEXTS = ["Hello world", "naïve café, 東京 and 🦙🦙!", "🦙", "  spaces\tand\nnewlines ", "",
            "<|start_header_id|>user<|end_header_id|>\n\nhi 👋🏽<|eot_id|>"]


@pytest.mark.parametrize("add", [True, False])
def test_encode_tokenize_and_token_ids_match_hf(llama3_json, add):
    """encode(text, add_special_tokens=...), tokenize, convert_tokens_to_ids and len(tok) as transformers has them
    over HF tokenizers: control tokens in the text matched, bos added only when asked."""
    tok, hf = llama3_json
    for text in HF_TEXTS:
        e = hf.encode(text, add_special_tokens=add)
        assert tok.encode(text, add_special_tokens=add) == e.ids, text
        assert tok.tokenize(text, add_special_tokens=add) == e.tokens, text
        assert tok.convert_tokens_to_ids(e.tokens) == e.ids
    e = hf.encode(HF_TEXTS[1], add_special_tokens=False)
    assert tok.tokenize(HF_TEXTS[1]) == e.tokens  # transformers' default: no bos
    assert tok.convert_tokens_to_ids(e.tokens[1]) == e.ids[1]
    assert tok.convert_tokens_to_ids("no such token") is None is hf.token_to_id("no such token")  # no unk token
    assert len(tok) == hf.get_vocab_size(with_added_tokens=True) == tok.max_token_value + 1
    with pytest.raises(ArgumentError, match="not both"):
        tok.encode("hi", add_special=False, add_special_tokens=True)


def test_vocab_size_and_unknown_tokens_match_hf_bert():
    """On a vocab without added tokens, vocab_size is HF's get_vocab_size(with_added_tokens=False); a text that is no
    token converts to the unknown id, as transformers converts it."""
    tok = load("ggml-vocab-bert-bge")
    hf = hf_bert_from_gguf(tok)
    assert tok.vocab_size == len(tok) == hf.get_vocab_size(with_added_tokens=False)
    # (the GGUF writes word-initial pieces as llama.cpp's converter does, "▁hello" for HF's "hello")
    assert tok.convert_tokens_to_ids(["[CLS]", "no-such-token"]) == [hf.token_to_id("[CLS]"), hf.token_to_id("[UNK]")]
    assert tok.unk_token == "[UNK]" and tok.sep_token == "[SEP]"


@pytest.mark.parametrize("name", ["ggml-vocab-llama-bpe", "ggml-vocab-llama-spm", "ggml-vocab-bert-bge",
                                  "ggml-vocab-phi-3"])
def test_special_token_names_match_the_file(name):
    """bos_token_id / eos_token_id / unk_token_id / sep_token_id / pad_token_id and their texts are the ids the GGUF
    names (read with gguf-py, llama.cpp's own reader) and those ids' token texts."""
    from gguf import GGUFReader

    r = GGUFReader(vocab_path(name))
    tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in r.fields["tokenizer.ggml.tokens"].data]
    tok = load(name)
    for role in ("bos", "eos", "unk", "sep", "pad", "mask"):
        field = r.fields.get(f"tokenizer.ggml.{'padding' if role == 'pad' else role}_token_id")
        if field is None:
            continue
        want = int(field.parts[field.data[0]][0])
        assert getattr(tok, f"{role}_token_id") == want, role
        assert getattr(tok, f"{role}_token") == tokens[want], role


def test_pad_token_is_settable_as_in_transformers():
    tok = Tokenizer.from_file(default_vocab_path())
    assert tok.pad_token is None and tok.pad_token_id is None
    tok.pad_token = tok.eos_token  # the transformers idiom
    assert tok.pad_token_id == tok.pad_id == tok.eos_token_id and tok.pad_token == tok.eos_token
    assert tok(["Hello", "Hello, llamas!"], padding=True).input_ids[0][-1] == tok.eos_token_id
    tok.pad_token_id = None
    assert tok.pad_token is None
    with pytest.raises(ArgumentError, match="got 'no such token'"):
        tok.pad_token = "no such token"
    with pytest.raises(ArgumentError, match="out of range"):
        tok.pad_token_id = len(tok)


def test_hf_model_directory_special_tokens(tmp_path):
    """The bos/eos texts a tokenizer_config.json declares are bos_token / eos_token, with HF tokenizers' ids."""
    import os

    hf = _hf_llama3()
    model = tmp_path / "model"
    model.mkdir()
    os.symlink(require_shared("vocab", "llama-3.2-tokenizer.json"), model / "tokenizer.json")
    (model / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                             "eos_token": "<|eot_id|>"}))
    tok = Tokenizer.from_file(model)
    assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.token_to_id("<|begin_of_text|>"), hf.token_to_id("<|eot_id|>"))


@pytest.mark.parametrize("side", ["right", "left"])
def test_offsets_mapping_matches_hf(llama3_json, side):
    """tok(text, return_offsets_mapping=True)["offset_mapping"] is HF's Encoding.offsets: character spans, the
    same span for every byte token of one character (the emoji), (0, 0) for bos and padding; truncated too."""
    tok, hf = llama3_json
    for text in HF_TEXTS:
        e = hf.encode(text)
        assert tok(text, return_offsets_mapping=True)["offset_mapping"] == [tuple(o) for o in e.offsets], text
    assert len(hf.encode("🦙").ids) > 2  # one character, several tokens: the case worth checking
    hf.enable_padding(direction=side, pad_id=tok.pad_id, pad_token="<|end_of_text|>")
    hf.enable_truncation(max_length=7)
    try:
        want = hf.encode_batch(HF_TEXTS)
        got = tok(HF_TEXTS, padding=True, padding_side=side, truncation=True, max_length=7,
                  return_offsets_mapping=True)
        assert got.input_ids == [e.ids for e in want]
        assert got.offset_mapping == [[tuple(o) for o in e.offsets] for e in want]
        arrays = tok(HF_TEXTS, padding=True, padding_side=side, truncation=True, max_length=7,
                     return_offsets_mapping=True, return_tensors="np")
        assert arrays["offset_mapping"].shape == (len(HF_TEXTS), 7, 2)
        assert arrays["offset_mapping"].tolist() == [[list(o) for o in e.offsets] for e in want]
    finally:
        hf.no_padding()
        hf.no_truncation()


def test_tiktoken_batch_and_max_token_value_match_tiktoken(tiktoken_llama3):
    enc, tok = tiktoken_llama3
    assert tok.encode_ordinary_batch(SPECIAL_TEXTS + HF_TEXTS) == enc.encode_ordinary_batch(SPECIAL_TEXTS + HF_TEXTS)
    assert tok.encode_ordinary_batch(HF_TEXTS, num_threads=1) == enc.encode_ordinary_batch(HF_TEXTS, num_threads=1)
    assert tok.max_token_value == enc.max_token_value and tok.n_vocab == enc.n_vocab
