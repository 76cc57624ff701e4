"""Small tokenizers the tests build themselves (no shared/ needed): training text, a Hugging Face byte-level
BPE, and GGUF files written with minillama's own writer (minillama.gguffile.write_vocab_gguf); SentencePiece
models converted as llama.cpp's converter (write_t5_gguf) and as transformers' T5Converter (unigram_json) do."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

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


def write_vocab(path: str | os.PathLike[str], metadata: dict[str, Any]) -> None:
    """The one GGUF fixture builder: metadata (GGUF keys -> values, tokenizer.ggml.model and .tokens at least)
    written as a vocab-only GGUF by minillama's own writer, with the value types llama.cpp's loader checks."""
    from minillama.gguffile import write_vocab_gguf

    write_vocab_gguf(metadata, path)


def write_gpt2_gguf(path: Path, hf_tokenizer, *, pre: str = "gpt-2") -> None:
    """Write a byte-level BPE Hugging Face tokenizer as GGUF, like llama.cpp's convert_hf_to_gguf (gpt2 model),
    with the minimal architecture keys llama.cpp itself (the oracle) needs to load the vocab-only file too."""
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
    eot = vocab["<|endoftext|>"]
    K = gguf.Keys.Tokenizer
    write_vocab(path, {
        "general.architecture": "gpt2", "gpt2.block_count": 1, "gpt2.context_length": 64,
        "gpt2.embedding_length": 8, "gpt2.feed_forward_length": 8, "gpt2.attention.head_count": 1,
        "gpt2.attention.layer_norm_epsilon": 1e-5,
        K.MODEL: "gpt2", K.PRE: pre, K.LIST: tokens, K.TOKEN_TYPE: types, K.MERGES: merges,
        K.BOS_ID: eot, K.EOS_ID: eot, K.ADD_BOS: False,
    })


#: The tokens of a minimal Unigram (t5) vocab: (text, score, gguf.TokenType): <unk>, </s>, U+2581, a, b.
BASE_TOKENS = [("<unk>", 0.0, 2), ("</s>", 0.0, 3), ("\u2581", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1)]


def t5_gguf(path: str | os.PathLike[str], tokens: list[tuple[str, float, int]]) -> None:
    """A Unigram (t5) vocab-only GGUF of (text, score, token type) tokens: unk 0, eos 1, no space prefix."""
    write_vocab(path, {
        "general.architecture": "t5", "tokenizer.ggml.model": "t5", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [t for t, _, _ in tokens], "tokenizer.ggml.scores": [s for _, s, _ in tokens],
        "tokenizer.ggml.token_type": [k for _, _, k in tokens], "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.add_space_prefix": False,
    })


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


# Texts for comparing tokenizers: English like the training text, numbers, accents, CJK, emoji, special-looking
# text, U+2581 itself.
SAMPLE_STRINGS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "she sells sea shells by the sea shore",
    "I've been told he's there, but we'll see.", "In 1984, the price was $3.50 per pound.",
    "Café, naïve, façade, résumé, jalapeño, Zürich", "def main(): return 0", "Once upon a time",
    "numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000", "x", "é", "日本語", "emoji 🦙🚀", "<s> and </s> are text here",
    "supercalifragilisticexpialidocious", "the block char \u2581 itself",
] + [line for line in training_lines(seed=99, n_sentences=60)[-60:]]


def hf_bert_from_gguf(tok):
    """An HF BERT (BertNormalizer, BertPreTokenizer, WordPiece) with the GGUF's vocab, its U+2581 phantom
    prefixes turned back into the '##' continuation marks llama.cpp's converter took off."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer as HF
    from tokenizers import models, normalizers, pre_tokenizers, processors

    from minillama.tokenizer import Attr
    from minillama.tokenizer.text import SPACE

    v = tok.vocab
    special = int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)
    vocab = {}
    for i, t in enumerate(v.tokens):
        vocab[t if v.attrs[i] & special else t[1:] if t.startswith(SPACE) else "##" + t] = i
    hf = HF(models.WordPiece(vocab, unk_token="[UNK]"))
    hf.add_special_tokens([v.tokens[i] for i in range(v.n_vocab) if v.attrs[i] & int(Attr.CONTROL)])
    hf.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return hf


def write_t5_gguf(sp, proto: bytes, path, added_tokens: dict[str, int] | None = None) -> None:
    """Like convert_hf_to_gguf.py's T5Model.set_vocab (sentencepiece model plus an optional added_tokens.json)."""
    import gguf

    from support.protobuf import normalizer_spec

    n = sp.get_piece_size() + len(added_tokens or {})
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    scores = [-10000.0] * n
    types = [int(gguf.TokenType.UNUSED)] * n
    for i in range(sp.get_piece_size()):
        tokens[i] = sp.id_to_piece(i).encode("utf-8")
        scores[i] = sp.get_score(i)
        types[i] = sentencepiece_token_type(sp, i)
    for text, i in (added_tokens or {}).items():
        tokens[i], scores[i], types[i] = text.encode("utf-8"), -1000.0, int(gguf.TokenType.USER_DEFINED)
    spec = normalizer_spec(proto)

    w = gguf.GGUFWriter(str(path), "t5")
    # the architecture keys llama.cpp needs to load a (vocab-only) t5 file, so that the oracle can read it too
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_layer_norm_eps(1e-6)
    w.add_relative_attn_buckets_count(32)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_decoder_start_token_id(0)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(spec["add_dummy_prefix"])
    w.add_remove_extra_whitespaces(spec["remove_extra_whitespaces"])
    if spec["precompiled_charsmap"]:
        w.add_precompiled_charsmap(spec["precompiled_charsmap"])
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    if sp.pad_id() >= 0:
        w.add_pad_token_id(sp.pad_id())
    w.add_add_bos_token(False)
    w.add_add_eos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def unigram_json(model_path: str):
    """A tokenizer.json for a SentencePiece Unigram model, built as transformers' T5Converter builds it."""
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("tokenizers")
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    from support.protobuf import normalizer_spec

    sp = spm.SentencePieceProcessor(model_file=model_path)
    with open(model_path, "rb") as f:
        spec = normalizer_spec(f.read())
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    hf = Tokenizer(models.Unigram(vocab, unk_id=sp.unk_id(), byte_fallback=False))
    hf.normalizer = normalizers.Sequence([normalizers.Precompiled(spec["precompiled_charsmap"]),
                                          normalizers.Strip(left=False, right=True),
                                          normalizers.Replace(Regex(" {2,}"), "\u2581")])
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    control = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
               if sentencepiece_token_type(sp, i) == 3]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    hf.post_processor = processors.TemplateProcessing(single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"],
                                                      special_tokens=[("</s>", sp.piece_to_id("</s>"))])
    return hf


def gemma4_vocab(tmp_path: Path, pre: str | None) -> str:
    """A small gemma4 vocab: control tokens, newline runs, `▁` words, merges over raw UTF-8 characters, and <0xXX>
    byte tokens for a few bytes only (the rest have none). add_bos is false in the file and the pre-tokenizer
    named is not gemma4's: llama.cpp overrides both for this model."""
    control = ["<pad>", "<eos>", "<bos>", "<unk>"]
    words = ["\n", "\n\n", "\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "bc", "\u2581abc", "é", "\u2581é"]
    byte_tokens = [f"<0x{b:02X}>" for b in (0x0A, 0x20, 0xC3, 0xA9, 0xE2, 0x82, 0xAC)]
    tokens = control + words + byte_tokens
    types = [3] * len(control) + [1] * len(words) + [6] * len(byte_tokens)
    merges = ["\u2581 a", "a b", "\u2581a b", "b c", "\u2581ab c", "\u2581 é"]
    md = {"general.architecture": "gemma4", "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
          "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": False}
    if pre is not None:
        md["tokenizer.ggml.pre"] = pre
    path = tmp_path / f"gemma4-{pre}.gguf"
    write_vocab(path, md)
    return str(path)
