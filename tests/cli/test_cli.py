"""The command line tool, run as `python -m minillama` in a subprocess.

Expected ids for real vocabs come from llama.cpp (shared/conformance); for the packaged default vocab the ids are
checked for consistency (they decode back to the text, the count line matches), not against minillama itself.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
from support import REPO
from support.paths import vocab_path
from support.reference import read_conformance

from minillama.tokenizer import Tokenizer, default_vocab_path

COUNT_LINE = re.compile(r"^\s*(?:total number of tokens:\s*)?(\d+)\s+tokens?\s*$|^\s*tokens?:\s*(\d+)\s*$", re.I)


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONIOENCODING"] = "utf-8"
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "minillama", *args],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=str(REPO),
        timeout=120,
    )


def _ids_lines(out: str) -> list[list[int]]:
    """Every output line that is a list of ints."""
    found = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            try:
                v = ast.literal_eval(line)
            except (ValueError, SyntaxError):
                continue
            if isinstance(v, list) and all(isinstance(i, int) for i in v):
                found.append(v)
    return found


def _count_lines(out: str) -> list[int]:
    counts = []
    for line in out.splitlines():
        m = COUNT_LINE.match(line)
        if m:
            counts.append(int(m.group(1) or m.group(2)))
    return counts


def _ok(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstderr:\n{err}"
    assert "Traceback" not in err, err
    return proc.stdout.decode("utf-8")


def test_tokenize_default_vocab():
    out = _ok(run_cli("tokenize", "Hello world"))
    counts = _count_lines(out)
    assert len(counts) == 1, f"expected one token count line in:\n{out}"
    ids_lines = _ids_lines(out)
    assert len(ids_lines) == 1, f"expected one list of ids in:\n{out}"
    ids = ids_lines[0]
    assert counts[0] == len(ids) > 0
    tok = Tokenizer.from_file(default_vocab_path())
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids, remove_special=True) == "Hello world"


def test_tokenize_ids_only():
    out = _ok(run_cli("tokenize", "--ids", "Hello world"))
    ids_lines = _ids_lines(out)
    assert len(ids_lines) == 1, out
    assert len([line for line in out.splitlines() if line.strip()]) == 1, f"--ids should print only the list:\n{out}"
    ids = ids_lines[0]
    tok = Tokenizer.from_file(default_vocab_path())
    assert tok.decode(ids, remove_special=True) == "Hello world"
    # the same ids as the full output, whose count line matches
    full = _ok(run_cli("tokenize", "Hello world"))
    assert _ids_lines(full) == [ids]
    assert _count_lines(full) == [len(ids)]


def test_tokenize_stdin():
    text = "line one\nline two, with  spaces\n"
    out = _ok(run_cli("tokenize", "--ids", "--no-bos", "-", stdin=text.encode("utf-8")))
    (ids,) = _ids_lines(out)
    tok = Tokenizer.from_file(default_vocab_path())
    assert tok.decode(ids) == text


def _cli_text(rows) -> dict:
    """A conformance row whose text survives argv (no NUL, not option-like), with some non-ASCII, and no special
    token text in it (llama.cpp's ids_special is then ids, or BOS + ids), so that it also gives llama.cpp's answer
    for the CLI's default flags (add_special=True, parse_special=False)."""
    for r in rows:
        t, ids, ids_special = r["text"], r["ids"], r["ids_special"]
        if not (20 <= len(t) <= 400 and "\x00" not in t and not t.startswith("-") and not t.isascii()):
            continue
        if ids_special == ids or ids_special[1:] == ids:
            return r
    pytest.skip("no suitable conformance text")


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-spm", "ggml-vocab-gpt-2"])
def test_tokenize_model_matches_llamacpp(vocab):
    path = vocab_path(vocab)
    row = _cli_text(read_conformance(vocab))
    # --no-bos: llama_tokenize(text, add_special=False, parse_special=False)
    out = _ok(run_cli("tokenize", "--model", str(path), "--ids", "--no-bos", row["text"]))
    assert _ids_lines(out) == [row["ids"]], f"text={row['text']!r}"
    # --parse-special (BOS added by default): llama_tokenize(text, add_special=True, parse_special=True)
    out = _ok(run_cli("tokenize", "--model", str(path), "--ids", "--parse-special", row["text"]))
    assert _ids_lines(out) == [row["ids_special"]], f"text={row['text']!r}"
    # default flags (add_special=True, parse_special=False): the same as ids_special for this text (see _cli_text)
    out = _ok(run_cli("tokenize", "--model", str(path), "--ids", row["text"]))
    assert _ids_lines(out) == [row["ids_special"]], f"text={row['text']!r}"


def test_tokenize_llama2c_model():
    path = vocab_path("llama2c-tokenizer.bin")
    out = _ok(run_cli("tokenize", "--model", str(path), "Hello world"))
    # llama.cpp, llama-spm vocab (the same as llama2.c's): BOS + "Hello world"
    assert _ids_lines(out) == [[1, 15043, 3186]]
    assert _count_lines(out) == [3]


def _assert_clean_error(proc: subprocess.CompletedProcess, mention: str | None = None) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, f"exit {proc.returncode}, stderr:\n{err}"
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{err}"
    if mention is not None:
        assert mention in lines[0], lines[0]
    return lines[0]


def test_missing_model_file(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    proc = run_cli("tokenize", "--model", str(missing), "Hello")
    _assert_clean_error(proc, mention="no-such-model.gguf")
    assert proc.stdout == b""


def test_model_not_a_tokenizer(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x13\x37" * 1000)
    proc = run_cli("tokenize", "--model", str(junk), "Hello")
    _assert_clean_error(proc)
    assert proc.stdout == b""


def test_plain_output_shows_piece_boundaries() -> None:
    """Without a terminal the pieces come as a JSON list: their concatenation is the text, one per token
    (for text whose characters each fit in one token), and the ids are the tokenizer's."""
    import json

    from minillama.tokenizer import Tokenizer, default_vocab_path

    text = "Hello, llamas!\nTokenizers"
    proc = subprocess.run([sys.executable, "-m", "minillama", "tokenize", "--no-bos", text], capture_output=True,
                          check=True)
    first = proc.stdout.decode("utf-8").splitlines()[0]
    pieces = json.loads(first)
    ids = Tokenizer.from_file(default_vocab_path()).encode(text, add_special=False)
    assert "".join(pieces) == text
    assert len(pieces) == len(ids) and pieces == [Tokenizer.from_file(default_vocab_path()).decode([i]) for i in ids]
