"""The command line as a new user and an attacker meet it (one test per finding of the usability trial), the help
of every command, a table of bad inputs that must never print a traceback, and docs/cli.md's command block == --help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as V
from gguf import GGUFWriter
from support import REPO

from minillama.errors import ArgumentError, ArgumentTypeError, MinillamaError
from minillama.tokenizer import Tokenizer, default_vocab_path

sys.path.insert(0, str(REPO / "scripts"))
from readme_usage import USAGE_PAGE, readme_block, usage_lines  # noqa: E402

TEXT = "naïve 日本語 🦙"


def cli(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONIOENCODING="utf-8", NO_COLOR="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "minillama", *args], input=stdin, capture_output=True, env=full_env,
                          timeout=timeout, cwd=str(REPO))


def error_line(p: subprocess.CompletedProcess) -> str:
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, (p.returncode, err[-500:])
    assert "Traceback" not in err, err[-1500:]
    return err


# --- 1. piped tokenize keeps token boundaries; --json, --show table, -f, --escape --------------------------------

def test_piped_pieces_are_one_per_token() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    ids = tok.encode(TEXT)
    out = cli("tokenize", TEXT).stdout.decode().splitlines()
    pieces = json.loads(out[0])
    assert len(pieces) == len(ids) and json.loads(out[1]) == ids and out[2] == f"{len(ids)} tokens"


def test_tokenize_json_and_table() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    ids = tok.encode(TEXT)
    obj = json.loads(cli("tokenize", "--json", TEXT).stdout)
    assert obj["ids"] == ids and obj["count"] == len(ids) and len(obj["pieces"]) == len(ids)
    assert b"".join(bytes.fromhex(h) for h in obj["piece_bytes"]) == tok.decode_bytes(ids)
    lines = cli("tokenize", "--show", "table", "a\nb").stdout.decode().splitlines()
    table = [line.split("\t") for line in lines]
    assert [int(i) for i, _ in table] == tok.encode("a\nb") and ["\\n"] in [[p] for _, p in table]
    assert cli("tokenize", "--ids", TEXT).stdout.decode().strip() == str(ids)


def test_tokenize_file_stdin_raw_bytes_and_escapes(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    data = "ok \xff\xfe bad\n".encode("latin-1")
    f = tmp_path / "raw.txt"
    f.write_bytes(data)
    expected = tok.encode(data.decode("utf-8", "surrogateescape"))  # the API's raw-byte policy (= llama.cpp)
    assert json.loads(cli("tokenize", "--json", "-f", str(f)).stdout)["ids"] == expected
    assert json.loads(cli("tokenize", "--json", "-", stdin=data).stdout)["ids"] == expected
    escaped = json.loads(cli("tokenize", "--json", "--escape", "a\\nb\\t\\x41").stdout)["ids"]
    assert escaped == tok.encode("a\nb\tA")
    assert "expected TEXT, '-' (standard input) or -f FILE, found none" in error_line(cli("tokenize"))


def test_decode_command_round_trips() -> None:
    tok = Tokenizer.from_file(default_vocab_path())
    ids = tok.encode(TEXT)
    assert cli("decode", *map(str, ids)).stdout == tok.decode_bytes(ids, unparse_special=True)
    assert cli("decode", stdin=str(ids).encode()).stdout == tok.decode_bytes(ids, unparse_special=True)
    assert "expected token ids" in error_line(cli("decode", "1", "two"))
    assert "token id 1000 is out of range for a vocab of 1000 tokens" in error_line(cli("decode", str(tok.n_vocab)))


# --- 2. errors of the API are MinillamaErrors ----------------------------------------------------------------------

def test_api_errors_are_minillama_errors() -> None:
    from minillama.embedding import Embedding
    from minillama.generate import Sampler

    emb = Embedding.random(n_vocab=10, n_embd=4, seed=0)
    with pytest.raises(ArgumentError, match="out of range"):
        emb.lookup([10])
    with pytest.raises(ArgumentTypeError, match="integers"):
        emb.lookup([1.5])
    with pytest.raises(ArgumentError):
        Embedding.random(n_vocab=0, n_embd=4)
    for kwargs, expect in (({"temperature": -1}, "expected temperature >= 0"), ({"top_p": 2}, "expected top_p in"),
                           ({"top_k": -1}, "expected top_k >= 0")):
        with pytest.raises(ArgumentError, match=re.escape(expect)):
            Sampler(**kwargs)
    assert issubclass(ArgumentError, MinillamaError)


# --- 3. config.json padding is said ----------------------------------------------------------------------------------

def test_config_json_padding_is_shown(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, "added_tokens": []}))
    (tmp_path / "config.json").write_text('{"vocab_size": 10}')
    out = cli("inspect", str(tmp_path / "tokenizer.json")).stdout.decode()
    assert "7 [PAD] tokens added to reach vocab_size of the config.json" in out


# --- 4. inspect --key prints a whole value ----------------------------------------------------------------------------

def _gguf_with_template(path: Path, template: str) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_key_value("tokenizer.ggml.model", "gpt2", V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", ["a", "b", "ab", "<s>"], V.ARRAY, V.STRING)
    w.add_key_value("tokenizer.ggml.token_type", [1, 1, 1, 3], V.ARRAY, V.INT32)
    w.add_key_value("tokenizer.ggml.merges", ["a b"], V.ARRAY, V.STRING)
    w.add_key_value("tokenizer.chat_template", template, V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def test_inspect_key_prints_whole_values(tmp_path: Path) -> None:
    template = "{% for m in messages %}" + "x" * 500 + "{{ m['content'] }}\n{% endfor %}"
    path = tmp_path / "t.gguf"
    _gguf_with_template(path, template)
    assert cli("inspect", "--key", "tokenizer.chat_template", str(path)).stdout.decode() == template + "\n"
    assert json.loads(cli("inspect", "--json", "--key", "tokenizer.chat_template", str(path)).stdout)["value"] == template
    assert cli("inspect", "--key", "tokenizer.ggml.tokens", str(path)).stdout.decode().splitlines() == \
        ["a", "b", "ab", "<s>"]
    assert "did you mean tokenizer.chat_template" in error_line(cli("inspect", "--key", "tokenizer.chat_templat",
                                                                    str(path)))


# --- 5. file errors name the path as typed, with a hint --------------------------------------------------------------

def test_file_errors(tmp_path: Path) -> None:
    err = error_line(cli("tokenize", "--model", "x.gguf", "hi"))
    assert "cannot read 'x.gguf': expected a model file, found no such file" in err and "Errno" not in err
    (tmp_path / "adir").mkdir()
    err = error_line(cli("convert", default_vocab_path(), str(tmp_path / "adir")))
    assert f"cannot write '{tmp_path / 'adir'}'" in err and "found a directory" in err and ".tmp" not in err
    err = error_line(cli("train", "--vocab-size", "300", "--out", str(tmp_path / "v.gguf"), str(tmp_path / "adir")))
    assert "found a directory" in err
    st = tmp_path / "model.safetensors"
    st.write_bytes(b"\x40" + b"\x00" * 7 + b'{"__metadata__": {}}')
    assert "safetensors" in error_line(cli("tokenize", "--model", str(st), "hi"))
    cfg = tmp_path / "config.json"
    cfg.write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000}')
    assert "a transformers config.json" in error_line(cli("tokenize", "--model", str(cfg), "hi"))


# --- 6. one way to report invalid UTF-8 ------------------------------------------------------------------------------

def test_invalid_utf8_reported_one_way(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe bad\n")
    for args in (["train", "--vocab-size", "300", "--out", str(tmp_path / "v.gguf")], ["ngram", "train", "--out",
                 str(tmp_path / "m.npz")], ["bench"]):
        err = error_line(cli(*args, str(bad)))
        assert f"expected UTF-8 text, found byte 0xff that is not (invalid start byte) ({bad}, offset 3)" in err, args


# --- 7. flag messages use flag names; silent cases warn ---------------------------------------------------------------

def test_flag_messages_and_warnings(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the llama eats grass\n" * 3)
    assert "expected --top-p in (0, 1]" in error_line(cli("chat", "--top-p", "2", stdin=b""))
    assert "expected --vocab-size of at least 257" in error_line(
        cli("train", "--vocab-size", "0", "--out", str(tmp_path / "v.gguf"), str(text)))
    assert "expected --min-frequency of at least 1" in error_line(
        cli("train", "--vocab-size", "300", "--min-frequency", "0", "--out", str(tmp_path / "v.gguf"), str(text)))
    assert "expected --repeat of at least 1" in error_line(cli("bench", "--repeat", "0"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    p = cli("train", "--vocab-size", "50000", "--kind", "spm", "--pre", "llama3", "--out", str(tmp_path / "v.gguf"),
            str(text), str(empty))
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert f"warning: {empty} is empty" in err
    assert "warning: --pre llama3 is not used by --kind spm" in err
    assert re.search(r"warning: stopped at [\d,]+ tokens, short of --vocab-size 50,000", err)


# --- 8. argparse: the subcommand's own usage, did you mean ------------------------------------------------------------

def test_usage_errors_name_the_subcommand() -> None:
    err = error_line(cli("tokenize", "--bogus", "hi"))
    assert "usage: minillama tokenize" in err and "unrecognized arguments: --bogus" in err
    assert "did you mean 'tokenize'?" in error_line(cli("tokenze", "hi"))


# --- 10. colours, newline blocks, the reply cut marker, wording -------------------------------------------------------

def test_terminal_details(monkeypatch: pytest.MonkeyPatch) -> None:
    from minillama.cli import NEWLINE_MARK, colorize, plural, use_color

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert use_color(Tty())
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color(Tty())
    assert NEWLINE_MARK in colorize(["a", "\n", "b"])
    assert (plural(1, "file"), plural(2, "file"), plural(1000, "turn")) == ("1 file", "2 files", "1,000 turns")


def test_reply_cut_by_max_tokens_says_so() -> None:
    out = cli("chat", "--seed", "1", "--max-tokens", "3", "--ignore-eos", stdin=b"hello\n").stdout.decode()
    assert "[cut at --max-tokens 3]" in out


# --- every command's help; docs/cli.md's command block is --help ---------------------------------------------------------

COMMANDS = [["tokenize"], ["decode"], ["convert"], ["inspect"], ["chat"], ["ngram", "train"], ["generate"], ["bench"],
            ["train"], ["dataset"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_of_every_command(command: list[str]) -> None:
    p = cli(*command, "--help")
    out = p.stdout.decode()
    assert p.returncode == 0 and out.startswith(f"usage: minillama {' '.join(command)}")
    assert len(out.splitlines()) > 3


def test_readme_command_block_matches_help() -> None:
    block = readme_block(USAGE_PAGE.read_text(encoding="utf-8"))
    joined = re.sub(r"\n\s+", " ", block)  # continuation lines
    readme = [re.sub(r"\s+", " ", line).strip() for line in joined.splitlines() if line.strip()]
    assert readme == usage_lines()


# --- a table of bad inputs: a one-line error (exit 2), never a traceback ----------------------------------------------

def _bad_inputs(tmp: Path) -> dict[str, str]:
    (tmp / "dir").mkdir(exist_ok=True)
    (tmp / "empty").write_bytes(b"")
    (tmp / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp / "wrong.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    return {"missing": str(tmp / "missing"), "dir": str(tmp / "dir"), "empty": str(tmp / "empty"),
            "devnull": os.devnull, "binary": str(tmp / "binary"), "latin1": str(tmp / "latin1.txt"),
            "wrong": str(tmp / "wrong.gguf")}


MODEL_COMMANDS = [["tokenize", "--model", "{}", "hi"], ["decode", "--model", "{}", "1"], ["inspect", "{}"],
                  ["convert", "{}", "{out}"], ["bench", "--model", "{}"], ["chat", "--model", "{}"],
                  ["generate", "--model", "{}", "hi"], ["dataset", "--model", "{}", "--out", "{out}", "README.md"]]
FILE_COMMANDS = [["tokenize", "-f", "{}"], ["bench", "{}"], ["ngram", "train", "--out", "{out}", "{}"],
                 ["dataset", "--model", "README.md", "--out", "{out}", "--no-progress", "{}"],
                 ["train", "--vocab-size", "300", "--out", "{out}", "{}"]]
NUMBER_FLAGS = [["chat", "--max-tokens", "{n}"], ["generate", "--model", "{file}", "--max-tokens", "{n}", "hi"],
                ["chat", "--threads", "{n}"], ["generate", "--model", "{file}", "-t", "{n}", "hi"],
                ["chat", "--order", "{n}"], ["chat", "--top-k", "{n}"],
                ["bench", "--repeat", "{n}"], ["ngram", "train", "--order", "{n}", "--out", "{out}", "{file}"],
                ["train", "--vocab-size", "{n}", "--out", "{out}", "{file}"],
                ["train", "--vocab-size", "300", "--min-frequency", "{n}", "--out", "{out}", "{file}"],
                ["train", "--vocab-size", "300", "--character-coverage", "{n}", "--out", "{out}", "{file}"]]


@pytest.mark.parametrize("kind", ["missing", "dir", "empty", "devnull", "binary", "latin1", "wrong"])
def test_bad_files_never_traceback(tmp_path: Path, kind: str) -> None:
    path = _bad_inputs(tmp_path)[kind]
    out = str(tmp_path / "out.bin")
    for args in MODEL_COMMANDS + (FILE_COMMANDS if kind not in ("empty",) else []):
        p = cli(*[a.format(path, out=out) for a in args], stdin=b"")
        err = p.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, (args, err[-1500:])
        if p.returncode == 0:  # e.g. tokenize -f on binary bytes: raw bytes are valid input
            assert args[:2] == ["tokenize", "-f"], (args, kind)
            continue
        assert p.returncode == 2, (args, p.returncode, err[-300:])
        assert err.startswith("minillama: error:") and err.count("\n") == 1, (args, err)


@pytest.mark.parametrize("n", ["0", "-1"])
def test_bad_numbers_never_traceback(tmp_path: Path, n: str) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    for args in NUMBER_FLAGS:
        p = cli(*[a.format(n=n, out=str(tmp_path / "o.bin"), file=str(text)) for a in args], stdin=b"")
        err = p.stderr.decode()
        assert "Traceback" not in err, (args, err[-1500:])
        if args[:3] == ["chat", "--top-k", "{n}"] and n == "0":  # --top-k 0 means "keep all": valid
            continue
        assert p.returncode == 2 and err.startswith("minillama: error:"), (args, err)


# --- llama.cpp's -m, -p, -n (and -sys), and a banner that says what runs -----------------------------

def _tiny_model_with_default_vocab(path: Path) -> Path:
    """A tiny llama (support.tiny_llama's shapes, random weights) that speaks the packaged 1,000-token vocab, so that
    generate and chat can run it on any text."""
    from support.tiny_llama import write_model

    return write_model(path, {"context_length": (64, V.UINT32)}, default_vocab=True)


def _generated(err: str) -> tuple[int, int, str]:
    """(prompt tokens, generated tokens, stop reason) from generate -v's last line."""
    m = re.search(r"(\d+) prompt tokens, (\d+) generated, stopped by (\w+)", err)
    assert m, err
    return int(m.group(1)), int(m.group(2)), m.group(3)


def test_generate_takes_llamacpp_m_p_n(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`minillama generate -m MODEL -p PROMPT -n N` as llama.cpp's llama-completion takes them (common/arg.cpp: -m
    --model, -p --prompt, -n --predict --n-predict, -1 "infinity" and -2 "until context filled"), and -f FILE."""
    from minillama.cli import main

    model = str(_tiny_model_with_default_vocab(tmp_path / "tiny.gguf"))
    greedy = ["--temperature", "0", "--ignore-eos", "-v"]
    assert main(["generate", "--model", model, "--max-tokens", "4", *greedy, "Hello there"]) == 0
    long_form = capsys.readouterr()
    assert _generated(long_form.err)[1:] == (4, "max_tokens")
    assert main(["generate", "-m", model, "-p", "Hello there", "-n", "4", *greedy]) == 0
    short = capsys.readouterr()
    assert short.out == long_form.out and _generated(short.err) == _generated(long_form.err)
    (tmp_path / "prompt.txt").write_text("Hello there", encoding="utf-8")
    assert main(["generate", "-m", model, "-f", str(tmp_path / "prompt.txt"), "--n-predict", "4", *greedy]) == 0
    assert capsys.readouterr().out == long_form.out
    for n in ("-1", "-2"):  # no limit: on to the end of the 64-token context
        assert main(["generate", "-m", model, "-p", "Hello there", "-n", n, *greedy]) == 0
        prompt, generated, why = _generated(capsys.readouterr().err)
        assert (prompt + generated, why) == (64, "context")
    assert main(["generate", "-m", model, "-n", "-3", "-p", "Hi"]) == 2
    assert ("expected --max-tokens (-n) of at least 1 (or -1 or -2: until end of generation or a full context), "
            "found -3") in capsys.readouterr().err
    assert main(["generate", "-m", model, "-p", "Hi", "Hello"]) == 2
    assert "expected one prompt (PROMPT, -p PROMPT or -f FILE), found PROMPT and -p" in capsys.readouterr().err
    assert main(["generate", "-m", model]) == 2
    assert "expected a prompt: PROMPT, -p PROMPT, -f FILE or '-' (standard input), found none" in \
        capsys.readouterr().err


def test_chat_takes_llamacpp_m_n_sys_and_banner_says_what_runs(tmp_path: Path) -> None:
    """chat -m MODEL -n N -sys TEXT (llama-cli's flags); the banner said 'forward pass in numpy' on the C core too."""
    from minillama.backend import backend_choice, native_core

    model = str(_tiny_model_with_default_vocab(tmp_path / "tiny.gguf"))
    p = cli("chat", "-m", model, "-n", "3", "-sys", "Be brief.", "--ignore-eos", "--seed", "1", stdin=b"hello\n")
    out = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()[-1500:]
    assert "[cut at --max-tokens 3]" in out and "numpy (1 layers" not in out
    where = "in C (minillama's native core" if native_core(backend_choice()) is not None else \
        "in Python with numpy (the pure backend"
    assert f"model: llama forward pass {where}; 1 layers, 32 wide), loaded in " in out, out
    gguf_path = os.environ.get("MINILLAMA_TEST_GGUF")
    if gguf_path and os.path.isfile(gguf_path):
        p = cli("chat", "-m", gguf_path, "-n", "1", stdin=b"hi\n", timeout=300)
        assert f"model: llama forward pass {where}; 30 layers, 576 wide), loaded in " in p.stdout.decode()


def test_generate_takes_the_servers_controls(capsys: pytest.CaptureFixture[str]) -> None:
    """`minillama generate` takes every control the server has, in llama.cpp's llama-cli spellings (common/arg.cpp:
    --temp, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty, -s, -l
    TOKEN_ID(+/-)BIAS, -r/--reverse-prompt): at a fixed seed it writes what the API writes with the same settings,
    and a stop string ends the text before it."""
    from support.paths import real_gguf

    from minillama.api import Llama
    from minillama.cli import main

    path = str(real_gguf())
    prompt = "Once upon a time, in a small village,"
    llm = Llama(path)
    comma = llm.tokenize(",", add_special=False)[0]
    settings = {"temperature": 0.7, "top_k": 30, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1,
                "repeat_last_n": 32, "presence_penalty": 0.2, "frequency_penalty": 0.1, "seed": 3,
                "logit_bias": {comma: -2.5}}
    flags = ["--temp", "0.7", "--top-k", "30", "--top-p", "0.9", "--min-p", "0.1", "--repeat-penalty", "1.1",
             "--repeat-last-n", "32", "--presence-penalty", "0.2", "--frequency-penalty", "0.1", "-s", "3",
             "-l", f"{comma}-2.5"]
    free = llm.create_completion(prompt, max_tokens=24, **settings)["choices"][0]["text"]
    assert main(["generate", "-m", path, "-p", prompt, "-n", "24", *flags]) == 0
    line = "" if free.endswith("\n") else "\n"  # the CLI ends the line a continuation leaves open
    assert capsys.readouterr().out == free + line
    stop = free.split()[3]  # a word from the middle of the free text
    cut = llm.create_completion(prompt, max_tokens=24, stop=[stop], **settings)["choices"][0]
    assert cut["finish_reason"] == "stop" and free.startswith(cut["text"] + stop) and stop not in cut["text"]
    assert main(["generate", "-m", path, "-p", prompt, "-n", "24", *flags, "--stop", "\x00never", "-r", stop]) == 0
    assert capsys.readouterr().out == cut["text"] + ("" if cut["text"].endswith("\n") else "\n")


@pytest.mark.parametrize(("flags", "message"), [
    (["--min-p", "2"], "expected --min-p in [0, 1] (0 keeps all), a finite number, found 2.0"),
    (["--repeat-penalty", "0"], "expected --repeat-penalty > 0 (1 is off), a finite number, found 0.0"),
    (["--repeat-last-n", "-2"], "expected --repeat-last-n from 0 to 2,147,483,647 (or -1 for the whole context), "
                                "found -2"),
    (["--presence-penalty", "nan"], "expected --presence-penalty (0 is off), a finite number, found nan"),
    (["-l", "15043*1"], "expected --logit-bias as TOKEN_ID(+/-)BIAS (e.g. 15043+1 or 15043-inf), found '15043*1'"),
    (["-l", "15043+inf"], "expected --logit-bias entries id >= 0 -> a finite number (-inf bans), found 15043: inf"),
    (["-j", "{oops"], "expected --json-schema as a JSON schema, found text that does not parse"),
])
def test_generate_and_chat_name_the_bad_control(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                flags: list[str], message: str) -> None:
    """A bad sampling flag is refused before anything loads, the message naming the flag, what it expects and what
    it found (the settings are checked once, by SamplingParams)."""
    from minillama.cli import main

    for command in (["generate", "-m", str(tmp_path / "absent.gguf"), "-p", "Hi"], ["chat"]):
        assert main([*command, *flags]) == 2
        assert message in capsys.readouterr().err
