"""`minillama inspect`: the report is checked against gguf.GGUFReader's view of the same file and against values the
tests wrote themselves (GGUFWriter), never against minillama's own reading of the file.

The real model is found through MINILLAMA_TEST_GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf); those tests skip when it
is unset or missing.  Nothing here downloads anything.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from support.paths import SHARED, load_file, require_shared, vocab_path

from minillama import cli
from minillama.inspection import ARRAY_HEAD, STRING_HEAD, inspect_file, render_json, render_text, tensor_size

# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    rc = cli.main(["inspect", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def reader_metadata(reader: gguf.GGUFReader) -> dict[str, gguf.ReaderField]:
    """The reader's key/value fields without its GGUF.* header pseudo-fields."""
    return {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def reader_scalar(field: gguf.ReaderField) -> Any:
    """A scalar or string field's value as GGUFReader decodes it."""
    return field.contents()


def reader_array_head(field: gguf.ReaderField, n: int) -> list[Any]:
    """The first n items of an array field, read straight from the reader's parts."""
    items = []
    for idx in field.data[:n]:
        part = field.parts[idx]
        if field.types[-1] == gguf.GGUFValueType.STRING:
            items.append(bytes(part).decode("utf-8", "surrogateescape"))
        else:
            items.append(part.tolist()[0])
    return items


def check_against_reader(report: dict[str, Any], path: Path, reader: gguf.GGUFReader | None = None) -> None:
    """Tensor table, metadata keys, types, lengths and scalar values agree with gguf.GGUFReader."""
    if reader is None:
        reader = gguf.GGUFReader(str(path))
    fields = reader_metadata(reader)
    assert report["format"] == "gguf"
    assert report["version"] == int(reader.fields["GGUF.version"].contents())
    assert report["file_size"] == os.path.getsize(path)

    entries = report["metadata"]
    assert [e["key"] for e in entries] == list(fields)
    for e in entries:
        field = fields[e["key"]]
        assert e["type"] == field.types[0].name.lower(), e["key"]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert e["item_type"] == field.types[-1].name.lower(), e["key"]
            assert e["length"] == len(field.data), e["key"]
            head = reader_array_head(field, ARRAY_HEAD)
            assert e["truncated"] == (len(field.data) > ARRAY_HEAD)
            if field.types[-1] == gguf.GGUFValueType.STRING:
                assert e["value"] == [s[:64] for s in head], e["key"]
            elif field.types[-1] == gguf.GGUFValueType.FLOAT32:
                assert np.array_equal(np.float32(e["value"]), np.float32(head)), e["key"]
            else:
                assert e["value"] == head, e["key"]
        elif field.types[0] == gguf.GGUFValueType.STRING:
            text = bytes(field.parts[-1]).decode("utf-8", "surrogateescape")
            assert e["length"] == len(text)
            assert e["value"] == text[:STRING_HEAD], e["key"]
            assert e["truncated"] == (len(text) > STRING_HEAD)
        elif field.types[0] == gguf.GGUFValueType.FLOAT32:
            assert np.float32(e["value"]) == np.float32(reader_scalar(field)), e["key"]  # exact, not rounded
        else:
            assert e["value"] == reader_scalar(field), e["key"]

    tensors = report["tensors"]
    assert [t["name"] for t in tensors] == [t.name for t in reader.tensors]
    for t, rt in zip(tensors, reader.tensors):
        assert t["type"] == rt.tensor_type.name, t["name"]
        assert t["type_id"] == int(rt.tensor_type)
        assert t["shape"] == [int(d) for d in rt.shape], t["name"]  # both in GGUF (ne) order
        assert t["n_elements"] == int(rt.n_elements), t["name"]
        assert t["n_bytes"] == int(rt.n_bytes), t["name"]
        assert t["offset"] == int(rt.data_offset), t["name"]
    totals = report["totals"]
    assert totals["tensors"] == len(reader.tensors) == int(reader.fields["GGUF.tensor_count"].contents())
    assert totals["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    assert totals["bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert len(entries) == int(reader.fields["GGUF.kv_count"].contents())


def check_tokenizer(summary: dict[str, Any], path: Path) -> None:
    """The tokenizer summary agrees with the loaded minillama Tokenizer (ids, pieces, flags, sizes)."""
    tok = load_file(path)
    v = tok.vocab
    assert summary["error"] is None
    assert summary["type"] == tok.kind
    assert summary["vocab_size"] == tok.n_vocab
    assert summary["merges"] == len(v.merges)
    expected_special = {k: i for k, i in v.special.items() if i is not None}
    assert {k: s["id"] for k, s in summary["special"].items()} == expected_special
    for name, s in summary["special"].items():
        assert s["piece"].encode("utf-8", "surrogateescape") == tok.token_to_piece(s["id"]), name
    assert summary["eog"] == sorted(v.eog_ids)
    assert summary["flags"]["add_bos"] == v.add_bos
    assert summary["flags"]["add_eos"] == v.add_eos
    assert summary["flags"]["add_space_prefix"] == v.add_space_prefix


def check_json(out: str, report: dict[str, Any]) -> dict[str, Any]:
    """--json output parses, has no escape sequences and holds the same numbers as the report."""
    assert "\x1b" not in out
    data = json.loads(out)
    assert data["totals"] == report["totals"]
    assert data["version"] == report["version"] and data["file_size"] == report["file_size"]
    assert [(t["name"], t["type"], t["shape"], t["n_bytes"]) for t in data["tensors"] or []] == \
        [(t["name"], t["type"], t["shape"], t["n_bytes"]) for t in report["tensors"] or []]
    assert [(e["key"], e.get("length")) for e in data["metadata"] or []] == \
        [(e["key"], e.get("length")) for e in report["metadata"] or []]
    return data


# ---------------------------------------------------------------------------------------------------------------------
# a GGUF written by the test
# ---------------------------------------------------------------------------------------------------------------------

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
WORDS = ["\u2581the", "\u2581a", "h", "e", "l", "o", "\u2581", "\u2581hello", "<|im_end|>", "tab\there"]
TOKENS = ["<unk>", "<s>", "</s>", *BYTE_TOKENS, *WORDS]
TYPES = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
         + [gguf.TokenType.NORMAL] * 8 + [gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED])
CHAT_TEMPLATE = "{% for message in messages %}\n" + "{{ message['content'] }}" * 40 + "\n{% endfor %}"

# name -> (numpy-order shape of the values, ggml type); quantized tensors are written as raw blocks.
TENSORS: dict[str, tuple[tuple[int, ...], gguf.GGMLQuantizationType]] = {
    "token_embd.weight": ((len(TOKENS), 64), gguf.GGMLQuantizationType.Q8_0),
    "blk.0.attn_q.weight": ((2, 256), gguf.GGMLQuantizationType.Q4_K),
    "blk.0.ffn_up.weight": ((3, 32), gguf.GGMLQuantizationType.Q4_1),
    "blk.0.attn_norm.weight": ((64,), gguf.GGMLQuantizationType.F32),
    "output.weight": ((4, 8), gguf.GGMLQuantizationType.F16),
    "rope_freqs": ((2, 3, 4), gguf.GGMLQuantizationType.F32),
    "positions": ((5,), gguf.GGMLQuantizationType.I32),
}


def expected_bytes(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> int:
    """Data size by hand: elements / block size * block bytes."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def write_model(path: Path, *, tokenizer_model: str | None = "llama", with_tensors: bool = True) -> None:
    """A small GGUF with metadata of many value types, an SPM tokenizer and tensors of several types."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test model")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint8("test.u8", 7)
    w.add_int16("test.i16", -300)
    w.add_uint64("test.u64", 2**40 + 3)
    w.add_int64("test.i64", -(2**40))
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.flag", True)
    w.add_string("test.multiline", "line one\nline two\x1b[31m")
    w.add_array("test.ints", list(range(100)))
    w.add_array("test.floats", [0.5, 1.25, -2.0])
    if tokenizer_model is not None:
        w.add_tokenizer_model(tokenizer_model)
        w.add_token_list(TOKENS)
        w.add_token_scores([float(-i) for i in range(len(TOKENS))])
        w.add_token_types([int(t) for t in TYPES])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(True)
        w.add_chat_template(CHAT_TEMPLATE)
    if with_tensors:
        rng = np.random.default_rng(0)
        for name, (shape, qtype) in TENSORS.items():
            if qtype == gguf.GGMLQuantizationType.F32:
                w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
            elif qtype == gguf.GGMLQuantizationType.F16:
                w.add_tensor(name, rng.standard_normal(shape).astype(np.float16))
            elif qtype == gguf.GGMLQuantizationType.I32:
                w.add_tensor(name, np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape))
            else:
                byte_shape = (*shape[:-1], expected_bytes(shape[-1:], qtype))
                w.add_tensor(name, rng.integers(0, 256, byte_shape, dtype=np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The written GGUF."""
    path = tmp_path_factory.mktemp("inspect") / "tiny.gguf"
    write_model(path)
    return path


def test_written_gguf_matches_reader(model: Path) -> None:
    report = inspect_file(model)
    check_against_reader(report, model)
    assert report["architecture"] == "llama"
    assert report["name"] == "tiny test model"
    assert report["file_type"] == "MOSTLY_Q8_0"
    assert report["warnings"] == []


def test_written_gguf_tensor_table(model: Path) -> None:
    report = inspect_file(model)
    by_name = {t["name"]: t for t in report["tensors"]}
    assert list(by_name) == list(TENSORS)
    for name, (shape, qtype) in TENSORS.items():
        t = by_name[name]
        assert t["type"] == qtype.name
        assert t["shape"] == list(reversed(shape))  # GGUF stores ne: fastest-varying dimension first
        assert t["n_elements"] == int(np.prod(shape))
        assert t["n_bytes"] == expected_bytes(shape, qtype)
    assert report["totals"] == {
        "tensors": len(TENSORS),
        "parameters": sum(int(np.prod(s)) for s, _ in TENSORS.values()),
        "bytes": sum(expected_bytes(s, q) for s, q in TENSORS.values()),
        "types": {"Q8_0": 1, "Q4_K": 1, "Q4_1": 1, "F32": 2, "F16": 1, "I32": 1},
    }
    # the data section ends where the file does (after alignment padding)
    last = max(report["tensors"], key=lambda t: t["offset"])
    assert last["offset"] + last["n_bytes"] <= report["file_size"] < last["offset"] + last["n_bytes"] + 32


def test_written_gguf_metadata_values(model: Path) -> None:
    entries = {e["key"]: e for e in inspect_file(model)["metadata"]}
    assert entries["test.u8"] == {"key": "test.u8", "type": "uint8", "value": 7, "truncated": False}
    assert entries["test.i16"]["value"] == -300
    assert entries["test.u64"]["value"] == 2**40 + 3 and entries["test.u64"]["type"] == "uint64"
    assert entries["test.i64"]["value"] == -(2**40)
    assert entries["test.f64"]["value"] == 0.1 and entries["test.f64"]["type"] == "float64"
    assert entries["test.flag"]["value"] is True
    # float32 values are given by their shortest float32 repr: 1e-05, not 9.999999747378752e-06
    assert entries["llama.attention.layer_norm_rms_epsilon"]["value"] == 1e-05
    ints = entries["test.ints"]
    assert (ints["type"], ints["item_type"], ints["length"]) == ("array", "int32", 100)
    assert ints["value"] == list(range(ARRAY_HEAD)) and ints["truncated"] is True
    assert entries["test.floats"]["value"] == [0.5, 1.25, -2.0] and entries["test.floats"]["truncated"] is False
    tokens = entries["tokenizer.ggml.tokens"]
    assert (tokens["item_type"], tokens["length"], tokens["value"]) == ("string", len(TOKENS), TOKENS[:ARRAY_HEAD])
    tmpl = entries["tokenizer.chat_template"]
    assert tmpl["length"] == len(CHAT_TEMPLATE) > STRING_HEAD
    assert tmpl["value"] == CHAT_TEMPLATE[:STRING_HEAD] and tmpl["truncated"] is True


def test_written_gguf_tokenizer(model: Path) -> None:
    tok = inspect_file(model)["tokenizer"]
    check_tokenizer(tok, model)
    assert tok["model"] == "llama" and tok["type"] == "spm" and tok["vocab_size"] == len(TOKENS)
    assert tok["special"]["bos"] == {"id": 1, "piece": "<s>"}
    assert tok["special"]["eos"] == {"id": 2, "piece": "</s>"}
    assert tok["special"]["unk"] == {"id": 0, "piece": "<unk>"}
    assert tok["special"]["eot"] == {"id": TOKENS.index("<|im_end|>"), "piece": "<|im_end|>"}  # found by text
    assert tok["flags"]["add_bos"] is True and tok["flags"]["add_eos"] is False
    assert tok["flags"]["add_space_prefix"] is True
    assert tok["token_types"] == {"NORMAL": 8, "UNKNOWN": 1, "CONTROL": 3, "USER_DEFINED": 1, "BYTE": 256}


def test_text_output(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(model))
    assert (rc, err) == (0, "")
    assert "\x1b" not in out  # captured output is not a terminal: no colour
    assert "GGUF v3" in out and "tiny test model" in out
    lines = out.splitlines()
    # every metadata key on its own line, with its short type
    for key, short in [("test.u64", "u64"), ("test.ints", "[i32]"), ("tokenizer.ggml.tokens", "[str]")]:
        assert any(line.split()[:2] == [key, short] for line in lines), key
    assert any("100 items: [0, 1, 2" in line and line.rstrip().endswith("...]") for line in lines)
    tmpl = next(line for line in lines if line.split()[:1] == ["tokenizer.chat_template"])
    assert f"({len(CHAT_TEMPLATE):,} chars)" in tmpl and "\\n" in tmpl  # shortened, newline escaped
    multiline = next(line for line in lines if line.split()[:1] == ["test.multiline"])
    assert '"line one\\nline two\\x1b[31m"' in multiline  # control characters never reach the terminal raw
    assert any(re.search(r'\bbos +1 +"<s>"$', line) for line in lines)
    assert any("token types" in line and "BYTE 256" in line for line in lines)
    for name, (shape, qtype) in TENSORS.items():
        row = next(line for line in lines if line.split()[:1] == [name])
        assert row.split()[1] == qtype.name
        assert " x ".join(str(d) for d in reversed(shape)) in row
        assert row.split()[-1] == f"{expected_bytes(shape, qtype):,}"
    assert f"{len(TENSORS)} tensors" in out


def test_text_colour_only_when_asked(model: Path) -> None:
    report = inspect_file(model)
    assert "\x1b[" in render_text(report, color=True)
    plain = render_text(report, color=False)
    assert "\x1b" not in plain
    assert "\x1b" not in render_json(report).replace("\\u001b", "")


def test_json_output(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(model), "--json")
    assert (rc, err) == (0, "")
    data = check_json(out, inspect_file(model))
    check_against_reader(data, model)
    assert data["tokenizer"]["special"]["bos"] == {"id": 1, "piece": "<s>"}
    assert data["totals"]["bytes"] == sum(expected_bytes(s, q) for s, q in TENSORS.values())


def test_truncated_tensor_data_is_not_read(model: Path, tmp_path: Path) -> None:
    """Cutting off most of the tensor data changes nothing but a warning: inspect reads metadata only."""
    full = inspect_file(model)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[:full["data_offset"] + 100])
    report = inspect_file(cut)
    assert report["tensors"] == full["tensors"] and report["totals"] == full["totals"]
    assert len(report["warnings"]) == 1 and "truncated" in report["warnings"][0]


def test_gguf_without_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "weights.gguf"
    write_model(path, tokenizer_model=None)
    report = inspect_file(path)
    check_against_reader(report, path)
    assert report["tokenizer"] is None
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and "\ntokenizer\n" not in out and "tensors (7)" in out


def test_vocab_only_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "vocab.gguf"
    write_model(path, with_tensors=False)
    report = inspect_file(path)
    check_against_reader(report, path)
    assert report["tensors"] == [] and report["totals"]["tensors"] == 0
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and "vocab-only" in out


def test_unsupported_tokenizer_still_inspected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer minillama cannot load is reported as the file states it, with the reason."""
    path = tmp_path / "rwkv.gguf"
    write_model(path, tokenizer_model="rwkv")
    tok = inspect_file(path)["tokenizer"]
    assert tok["model"] == "rwkv" and tok["type"] is None and "rwkv" in tok["error"]
    assert tok["vocab_size"] == len(TOKENS)
    assert tok["special"]["bos"] == {"id": 1, "piece": "<s>"}
    assert tok["token_types"]["BYTE"] == 256
    rc, out, err = run(capsys, str(path))
    assert (rc, err) == (0, "") and "error" in out


def test_invalid_utf8_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A token that is not valid UTF-8 is shown with \\x escapes in text and JSON, and nothing crashes."""
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>", b"ab\xffcd"])
    w.add_token_types([2, 3, 3, 1])
    w.add_bos_token_id(3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and '"ab\\xffcd"' in out
    rc, out, _ = run(capsys, str(path), "--json")
    data = json.loads(out)
    tokens = next(e for e in data["metadata"] if e["key"] == "tokenizer.ggml.tokens")
    assert tokens["value"][3] == "ab\\xffcd"
    assert data["tokenizer"]["special"]["bos"] == {"id": 3, "piece": "ab\\xffcd"}


def test_tensor_size_helper() -> None:
    assert tensor_size((576, 49152), int(gguf.GGMLQuantizationType.Q8_0)) == 576 * 49152 // 32 * 34
    assert tensor_size((4,), int(gguf.GGMLQuantizationType.F32)) == 16
    assert tensor_size((4,), 9999) is None


# ---------------------------------------------------------------------------------------------------------------------
# errors go through the CLI's error path
# ---------------------------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(tmp_path / "nope.gguf"))
    assert (rc, out) == (2, "")
    assert err.startswith("minillama: error: ") and err.count("\n") == 1 and "nope.gguf" in err


@pytest.mark.parametrize("content", [b"hello, this is not a model\n", b"", b"GGUF\x07\x00\x00\x00"],
                         ids=["text", "empty", "bad-version"])
def test_not_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    rc, out, err = run(capsys, str(path), "--json")
    assert (rc, out) == (2, "")
    assert err.startswith("minillama: error: ") and err.count("\n") == 1


def test_truncated_metadata(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[:300])
    rc, _, err = run(capsys, str(cut))
    assert rc == 2 and err.startswith("minillama: error: ") and "truncated" in err


def test_help_lists_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "inspect" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------------
# shared vocabs (skipped without ../shared)
# ---------------------------------------------------------------------------------------------------------------------

SHARED_GGUFS = sorted(p.name for p in (SHARED / "vocab").glob("*.gguf")) if SHARED else []
# GGUFReader takes seconds on a big vocab: compare with it on one small vocab of each model type.
READER_CHECKED = ("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-bert-bge.gguf")


@pytest.mark.parametrize("name", SHARED_GGUFS or ["ggml-vocab-llama-spm.gguf"])
def test_shared_gguf(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = vocab_path(name)
    report = inspect_file(path)
    if name in READER_CHECKED:
        check_against_reader(report, path)
    keys = [e["key"] for e in report["metadata"]]
    assert keys[0] == "general.architecture" and "tokenizer.ggml.tokens" in keys
    check_tokenizer(report["tokenizer"], path)
    rc, out, _ = run(capsys, str(path), "--json")
    assert rc == 0
    check_json(out, report)


@pytest.mark.parametrize("name, fmt", [("llama2c-tokenizer.bin", "llama2.c"),
                                       ("llama2-tokenizer.model", "sentencepiece"),
                                       ("spm-unigram8k.model", "sentencepiece"),
                                       ("llama-3.2-tokenizer.json", "tokenizer.json")])
def test_shared_tokenizer_files(name: str, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Tokenizer-only files: format and tokenizer summary, no metadata or tensor table."""
    path = require_shared("vocab", name)
    report = inspect_file(path)
    assert report["format"] == fmt and report["version"] is None
    assert report["metadata"] is None and report["tensors"] is None and report["totals"] is None
    check_tokenizer(report["tokenizer"], path)
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and "tokenizer" in out and "tensors" not in out
    assert f"{report['tokenizer']['vocab_size']:,} tokens" in out
    rc, out, _ = run(capsys, str(path), "--json")
    assert rc == 0 and json.loads(out)["tokenizer"] == json.loads(render_json(report))["tokenizer"]


# ---------------------------------------------------------------------------------------------------------------------
# a real model (MINILLAMA_TEST_GGUF, e.g. SmolLM2-135M-Instruct.Q4_1.gguf)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_model() -> Path:
    """The GGUF named by MINILLAMA_TEST_GGUF (skips when unset or missing)."""
    env = os.environ.get("MINILLAMA_TEST_GGUF")
    if not env:
        pytest.skip("MINILLAMA_TEST_GGUF is not set (point it at a real model GGUF, e.g. "
                    "SmolLM2-135M-Instruct.Q4_1.gguf, to run the real-model inspect tests)")
    path = Path(env).expanduser()
    if not path.is_file():
        pytest.skip(f"MINILLAMA_TEST_GGUF={env} does not exist")
    return path


@pytest.fixture(scope="module")
def real_reader(real_model: Path) -> gguf.GGUFReader:
    """gguf.GGUFReader on the real model (takes a few seconds: shared by the tests)."""
    return gguf.GGUFReader(str(real_model))


def test_real_model_matches_reader(real_model: Path, real_reader: gguf.GGUFReader) -> None:
    report = inspect_file(real_model)
    check_against_reader(report, real_model, real_reader)
    assert report["warnings"] == []
    assert report["tensors"], "expected a model with tensors"
    if report["tokenizer"] is not None:
        check_tokenizer(report["tokenizer"], real_model)


def test_real_model_json(real_model: Path, real_reader: gguf.GGUFReader, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(real_model), "--json")
    assert (rc, err) == (0, "")
    data = check_json(out, inspect_file(real_model))
    check_against_reader(data, real_model, real_reader)


def test_real_model_is_fast(real_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only metadata is read: the whole command (text and JSON) takes well under a second."""
    run(capsys, str(real_model))  # imports and a warm page cache for the metadata part
    for args in ([], ["--json"]):
        start = time.perf_counter()
        rc, out, _ = run(capsys, str(real_model), *args)
        elapsed = time.perf_counter() - start
        assert rc == 0 and out
        assert elapsed < 1.0, f"inspect {' '.join(args)} took {elapsed:.2f} s on {real_model}"


def test_terminal_escapes_in_names_never_reach_the_terminal(tmp_path) -> None:
    """general.name / general.architecture / tokenizer.ggml.pre holding ESC, BEL, OSC, CSI (C1) and U+202E are
    printed escaped by `inspect` and `inspect --json` (the JSON still reads back as the original text)."""
    import json as _json
    import os as _os
    import subprocess as _sp
    import sys as _sys

    from gguf import GGUFValueType as V
    from gguf import GGUFWriter

    evil = "evil\x1b]0;pwned\x07\x1b[31m\x9b2J\u202eabc"
    path = tmp_path / "evil.gguf"
    w = GGUFWriter(str(path), evil)
    w.add_key_value("general.name", evil, V.STRING)
    w.add_key_value("tokenizer.ggml.model", "gpt2", V.STRING)
    w.add_key_value("tokenizer.ggml.pre", evil, V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", ["a", "b"], V.ARRAY, V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    from support import REPO

    env = dict(_os.environ, PYTHONPATH=str(REPO), NO_COLOR="1", PYTHONIOENCODING="utf-8")
    for args in ([], ["--json"]):
        p = _sp.run([_sys.executable, "-m", "minillama", "inspect", *args, str(path)], capture_output=True,
                    env=env, timeout=60)
        out = p.stdout.decode("utf-8") + p.stderr.decode("utf-8")
        for bad in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert bad not in out, (args, bad)
        if args:
            report = _json.loads(p.stdout)
            assert report["name"] == evil and report["architecture"] == evil
        else:
            assert "\\x1b" in out and "\\u202e" in out


@pytest.mark.parametrize("charsmap, message", [
    (b"\x08\x00", "precompiled charsmap too small for its xcda size header"),
    (b"\x08\x00\x00\x00" + b"\x00" * 8, "precompiled charsmap: xcda size 8 does not fit in 12 bytes"),
    ([1, 2, 3], "precompiled charsmap is an array of int32, expected an int8/uint8 array"),
])
def test_bad_unigram_charsmap_fails_at_load(tmp_path: Path, charsmap: bytes | list[int], message: str) -> None:
    """A Unigram charsmap that is not one fails when the vocab loads, so `minillama inspect` reports it."""
    from minillama.errors import FormatError
    from minillama.tokenizer.formats import read_metadata
    from minillama.tokenizer.vocab import Vocab

    path = tmp_path / "t5.gguf"
    w = gguf.GGUFWriter(str(path), "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list([b"<pad>", b"</s>", b"<unk>", b"\xe2\x96\x81a"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    w.add_token_types([3, 3, 2, 1])
    if isinstance(charsmap, bytes):
        w.add_precompiled_charsmap(charsmap)
    else:
        w.add_array("tokenizer.ggml.precompiled_charsmap", charsmap)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FormatError, match=re.escape(message)):
        Vocab.from_metadata(read_metadata(str(path)), str(path))
    tok = inspect_file(path)["tokenizer"]
    assert tok["model"] == "t5" and tok["type"] is None and message in tok["error"]


# ---------------------------------------------------------------------------------------------------------------------
# hyper-parameters of mixture-of-experts, sliding-window and hybrid architectures, and the newer quant types
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory):
    """synthetic(arch): the small model tools/make_synthetic_arch.py writes for arch (through its command line)."""
    import subprocess
    import sys

    from support import REPO

    root, made = tmp_path_factory.mktemp("inspect_archs"), {}

    def make(arch: str) -> Path:
        if arch not in made:
            out = root / f"{arch}.gguf"
            subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_arch.py"), arch, str(out)],
                           check=True, capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
            made[arch] = out
        return made[arch]

    return make


def _reader_value(fields: dict[str, gguf.ReaderField], key: str) -> Any:
    """A key's value as gguf-py reads it (arrays as lists), or None when the file has no such key."""
    f = fields.get(key)
    if f is None:
        return None
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    v = f.contents()
    return float(str(np.float32(v))) if f.types[0] == gguf.GGUFValueType.FLOAT32 else v


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "qwen35", "deepseek2"])
def test_architecture_hyper_parameters(arch: str, synthetic, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect shows the experts (count, used, shared, groups; each expert tensor with its types and layers), the
    sliding window and the layers it applies to, rope scaling (YaRN) and a hybrid's DeltaNet sizes, as the file's
    own metadata says them (read here by gguf-py); layer lists follow llama.cpp's rules (openai-moe.cpp's swa
    pattern 2, qwen35.cpp's full_attention_interval)."""
    path = synthetic(arch)
    reader = gguf.GGUFReader(str(path))
    fields = reader_metadata(reader)
    hp = inspect_file(path)["hparams"]
    n_layer = _reader_value(fields, f"{arch}.block_count")
    assert hp["model"]["block_count"] == n_layer
    assert hp["model"]["head_count"] == _reader_value(fields, f"{arch}.attention.head_count")

    # experts: every key the file has, and every expert tensor with the types gguf-py reads
    expert_keys = {"count": "expert_count", "used": "expert_used_count", "shared": "expert_shared_count",
                   "groups": "expert_group_count", "groups_used": "expert_group_used_count"}
    want = {k: _reader_value(fields, f"{arch}.{key}") for k, key in expert_keys.items()}
    want = {k: v for k, v in want.items() if v is not None}
    exps: dict[str, dict[str, Any]] = {}
    for t in reader.tensors:
        m = re.fullmatch(r"blk\.\d+\.(ffn_\w+_(?:exps|shexp)\.weight)", t.name)
        if m:
            e = exps.setdefault(m.group(1), {"types": set(), "layers": 0})
            e["types"].add(t.tensor_type.name)
            e["layers"] += 1
    if arch == "qwen35":
        assert not want and not exps and hp["experts"] is None
    else:
        assert want["count"] > want["used"] > 0 and exps
        assert {k: hp["experts"][k] for k in want} == want
        got = {t["name"]: {"types": set(t["types"]), "layers": t["layers"]} for t in hp["experts"]["tensors"]}
        assert {k: got[k] for k in exps} == exps
    if arch == "gpt-oss":
        assert exps["ffn_gate_exps.weight"]["types"] == {"MXFP4"}
    if arch == "deepseek2":
        assert want["shared"] > 0 and want["groups"] > 1

    # sliding window (gpt-oss: llama.cpp's pattern 2, every even layer)
    window = _reader_value(fields, f"{arch}.attention.sliding_window")
    if window is None:
        assert hp["sliding_window"] is None
    else:
        assert hp["sliding_window"]["size"] == window
        assert hp["sliding_window"]["layers"] == [il for il in range(n_layer) if il % 2 == 0]

    # rope scaling
    for k, key in (("scaling_type", "rope.scaling.type"), ("scaling_factor", "rope.scaling.factor"),
                   ("original_context_length", "rope.scaling.original_context_length")):
        assert hp["rope"].get(k) == _reader_value(fields, f"{arch}.{key}"), k
    if arch == "gpt-oss":
        assert hp["rope"]["scaling_type"] == "yarn"

    # gated DeltaNet sizes and which layers are DeltaNet ones
    ssm = {k: _reader_value(fields, f"{arch}.ssm.{k}")
           for k in ("conv_kernel", "state_size", "inner_size", "group_count", "time_step_rank")}
    if arch == "qwen35":
        interval = _reader_value(fields, f"{arch}.full_attention_interval")
        assert None not in ssm.values() and interval
        assert {k: hp["deltanet"][k] for k in ssm} == ssm
        assert hp["deltanet"]["layers"] == [il for il in range(n_layer) if (il + 1) % interval != 0]
    else:
        assert hp["deltanet"] is None

    rc, out, _ = run(capsys, str(path))
    assert rc == 0
    section = out.split("\nhyper-parameters (")[1].split("\n\n")[0]
    if exps:
        assert f"count {want['count']}, used {want['used']}" in section
        for name, e in exps.items():
            assert re.search(rf"{re.escape(name)} {'/'.join(sorted(e['types']))} .*\({e['layers']} layers\)", section)
    if arch == "gpt-oss":
        assert f"sliding window {window} tokens, layers 0 (1 of {n_layer} layers)" in section
        assert "scaling type yarn" in section
    if arch == "qwen35":
        assert f"conv kernel {ssm['conv_kernel']}, state size {ssm['state_size']}" in section
    data = json.loads(run(capsys, "--json", str(path))[1])
    assert data["hparams"] == json.loads(json.dumps(hp))


# The newer quant types, named as ggml names them (gguf-py), with and without a kernel in minillama.
NEW_TYPES = ("MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def test_new_quant_types_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tensors of MXFP4, IQ4_NL, IQ4_XS and the IQ2/IQ3/IQ1 family are listed by name with their sizes, and the
    file type by its name, as gguf-py reads them."""
    path = tmp_path / "quants.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    for name in NEW_TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.zeros((2, 256 // block * size), np.uint8)
        w.add_tensor(f"t.{name}", raw, raw_dtype=qtype)  # the bytes of 2 rows of 256 values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(str(path))
    report = inspect_file(path)
    assert report["file_type"] == "MOSTLY_MXFP4_MOE"
    assert [(t["name"], t["type"], t["n_bytes"]) for t in report["tensors"]] == \
        [(t.name, t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors]
    assert [t["type"] for t in report["tensors"]] == list(NEW_TYPES)
    rc, out, _ = run(capsys, str(path))
    assert rc == 0
    for name in NEW_TYPES:
        assert re.search(rf"t\.{name}\s+{name}\s+256 x 2", out), name
