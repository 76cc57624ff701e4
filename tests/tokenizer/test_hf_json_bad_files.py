"""Hostile tokenizer.json folders: huge integer literals, lone surrogates, a config.json vocab_size that would pad
millions of tokens. Each is a FormatError at load, never a ValueError, UnicodeEncodeError later, or gigabytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.limits import run_limited

from minillama.errors import FormatError
from minillama.tokenizer import Tokenizer

# Bounds wall time or memory: under xdist, one worker runs these files one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("bounds")


def _folder(tmp_path: Path, vocab_extra: str = "", config: str | None = None, tok_config: str | None = None) -> Path:
    vocab = {"a": 0, "b": 1, "ab": 2}
    text = json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
                       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                       "added_tokens": []})
    if vocab_extra:
        text = text.replace('"ab": 2', '"ab": 2, ' + vocab_extra)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    if config is not None:
        (tmp_path / "config.json").write_text(config, encoding="utf-8")
    if tok_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(tok_config, encoding="utf-8")
    return tmp_path / "tokenizer.json"


def test_plain_folder_loads(tmp_path: Path) -> None:
    assert Tokenizer.from_file(_folder(tmp_path)).n_vocab == 3


@pytest.mark.parametrize("where", ["vocab", "tokenizer_config", "config"])
def test_integer_of_5000_digits(tmp_path: Path, where: str) -> None:
    big = "9" * 5000
    path = _folder(tmp_path, vocab_extra=f'"c": {big}' if where == "vocab" else "",
                   config=f'{{"vocab_size": {big}}}' if where == "config" else None,
                   tok_config=f'{{"model_max_length": {big}}}' if where == "tokenizer_config" else None)
    with pytest.raises(FormatError, match="expected ids and counts of a few digits"):
        Tokenizer.from_file(path)


def test_lone_surrogate_in_vocab_key(tmp_path: Path) -> None:
    path = _folder(tmp_path, vocab_extra='"x\\ud800": 3')
    with pytest.raises(FormatError, match="lone surrogate U\\+D800"):
        Tokenizer.from_file(path)


def test_vocab_size_bomb_in_config_json(tmp_path: Path) -> None:
    path = _folder(tmp_path, config='{"vocab_size": 16777216}')
    assert path.stat().st_size + (tmp_path / "config.json").stat().st_size < 400
    p = run_limited("""
from minillama.errors import FormatError
from minillama.tokenizer import Tokenizer
try:
    Tokenizer.from_file(sys.argv[1])
except FormatError as e:
    print("FormatError:", e)
""", mem_mb=1024, timeout=30, args=[str(path)])
    out = p.stdout.decode()
    assert p.returncode == 0 and "FormatError:" in out, p.stderr.decode()[-500:]
    assert "vocab_size 16777216, which would add 16777213 [PAD] tokens" in out


def test_small_padding_still_follows_llamacpps_converter(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(_folder(tmp_path, config='{"vocab_size": 8}'))
    assert tok.n_vocab == 8 and tok.vocab.tokens[7] == "[PAD7]"
