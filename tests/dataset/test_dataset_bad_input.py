"""minillama.dataset against hostile input and a hostile environment.

A long document's ids are Tokenizer.encode's (itself llama.cpp-exact by the conformance tests); one over the
size cap is a skippable bad record that costs no memory in proportion to it; workers never outlive the main
process (kill -9) and SIGTERM stops a run as Ctrl-C does; deep JSON nesting, a BOM, a corrupt Parquet page and a
damaged index.json are MinillamaErrors or handled, never tracebacks. Processes are real subprocesses; worker
pids come from /proc.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import REPO
from support.paths import require_shared, vocab_path

from minillama import dataset
from minillama.cli import main
from minillama.errors import MinillamaError
from minillama.tokenizer import Tokenizer

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# Worker processes: the pure backend's (the native one's workers are threads of the run's own process)
PROCESSES = {**ENV, "MINILLAMA_BACKEND": "pure"}


def _descendants(pid: int) -> list[int]:
    """Live (not zombie) descendants of pid, from /proc/PID/task/*/children."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{t}/children").read_text().split()
        except OSError:
            continue
        for c in map(int, children):
            out += [c, *_descendants(c)]
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _big_text(tmp_path: Path, copies: int) -> Path:
    src = tmp_path / "big.txt"
    src.write_bytes(require_shared("corpus", "diverse.txt").read_bytes() * copies)
    return src


def _start(tmp_path: Path, src: Path, out: Path, env: dict[str, str] = PROCESSES) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "minillama", "dataset", "--model", str(vocab_path("ggml-vocab-llama-bpe")),
           "--workers", "2", "--shard-tokens", "20000", "--no-progress", "--out", str(out), str(src)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _workers_of(proc: subprocess.Popen, n: int = 2) -> list[int]:
    deadline = time.monotonic() + 60
    while len(kids := _descendants(proc.pid)) < n:
        assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.02)
    return kids


# --- item 7: orphaned workers ----------------------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds worker pids in /proc")
def test_kill9_of_the_main_process_leaves_no_live_worker(tmp_path):
    proc = _start(tmp_path, _big_text(tmp_path, 3), tmp_path / "out")
    kids = _workers_of(proc)
    time.sleep(0.5)  # the workers are encoding
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while [k for k in kids if _alive(k)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [k for k in kids if _alive(k)], "workers outlived the main process by 5 s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds worker pids in /proc")
@pytest.mark.parametrize("workers", ["processes", "threads"])
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path, workers):
    """Worker processes (the pure backend) are ended; worker threads (the native backend's, where the core is
    built) end with the batch they encode."""
    out = tmp_path / "out"
    proc = _start(tmp_path, _big_text(tmp_path, 3), out, PROCESSES if workers == "processes" else ENV)
    kids = _workers_of(proc) if workers == "processes" else []
    deadline = time.monotonic() + 120
    while not (out / "shard-00000.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # Ctrl-C's exit status, after its message
    assert "interrupted; finished shards are kept" in err and "Traceback" not in err
    assert not [k for k in kids if _alive(k)]
    names = os.listdir(out)
    assert "shard-00000.json" in names and not [n for n in names if n.endswith(".tmp")]


# --- item 6: long documents ------------------------------------------------------------------------------------------

MEASURE = r"""
import json, resource, sys
from minillama import dataset
from minillama.cli import main
model, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
from minillama.tokenizer import Tokenizer
Tokenizer.from_file(model).encode("warm up")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
index = dataset.prepare(model, out, files, workers=2, skip_bad=True, progress=False)
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"growth_kib": peak - base, "bad": index["bad_records"], "docs": index["docs"]}))
"""


def test_long_documents_equal_encode_and_a_huge_one_is_a_bad_record_in_flat_memory(tmp_path):
    model = str(vocab_path("ggml-vocab-llama-bpe"))
    diverse = require_shared("corpus", "diverse.txt").read_text(encoding="utf-8")
    long_doc = diverse[:3_000_000]  # three of the tokenizer's 1 Mi-character pieces
    huge = ("word " * 5_000_000).strip()  # 25 MB with no newline: no cut anywhere, over the 16 MiB cap
    f = tmp_path / "docs.jsonl"
    with open(f, "w", encoding="utf-8") as fh:
        for text in ("short one", long_doc, huge, "after it"):
            fh.write(json.dumps({"text": text}) + "\n")
    res = subprocess.run([sys.executable, "-c", MEASURE, model, str(tmp_path / "out"), str(f)], env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert (got["docs"], got["bad"]) == (3, 1)
    # Flat: the 25 MB line is read past, never held or encoded (encoding it took ~550 MB in a worker).
    assert got["growth_kib"] < 200 * 1024, got
    tok = Tokenizer.from_file(model)
    ds = dataset.open(tmp_path / "out")
    assert ds.document(1).tolist() == tok.encode(long_doc) + [tok.eos_id]
    assert ds.document(2).tolist() == tok.encode("after it") + [tok.eos_id]
    with pytest.raises(dataset.BadRecordError, match=r"docs\.jsonl, line 3: expected a document of at most "
                       r"16,777,216 bytes \(max_doc_bytes, --max-doc-mib\), found a longer one"):
        dataset.prepare(model, tmp_path / "strict", [f], workers=1)


def test_the_size_cap_holds_in_every_reader(tmp_path):
    model = str(vocab_path("ggml-vocab-llama-spm"))
    tok = Tokenizer.from_file(model)
    t = tmp_path / "t.txt"
    t.write_text("keep me\n\n" + "x" * 3000 + "\n\nand me\n", encoding="utf-8")
    for docs in ("paragraph", "line"):
        index = dataset.prepare(model, tmp_path / docs, [t], workers=1, docs=docs, skip_bad=True, max_doc_bytes=1000)
        assert (index["docs"], index["bad_records"]) == (2, 1), docs
        assert "t.txt, line 3: expected a document of at most 1,000 bytes" in index["bad_examples"][0]
        assert dataset.open(tmp_path / docs).document(1).tolist() == tok.encode("and me") + [tok.eos_id]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "é" * 600, "b"]}), tmp_path / "p.parquet")  # 1,200 bytes, 600 chars
    index = dataset.prepare(model, tmp_path / "pq", [tmp_path / "p.parquet"], workers=1, skip_bad=True,
                            max_doc_bytes=1000)
    assert (index["docs"], index["bad_records"]) == (2, 1) and "row 1" in index["bad_examples"][0]


def test_cli_max_doc_mib_sets_the_size_cap(tmp_path, capsys, monkeypatch):
    """--max-doc-mib N caps documents at N MiB (N x 1,048,576 bytes, rounded down): 0.001 is 1,048 bytes. A line of
    1,049 bytes (525 characters: bytes count) stops the run naming it, --skip-bad skips it, a raised cap encodes it
    as Tokenizer.encode does; a line of exactly the cap is a document."""
    model = str(vocab_path("ggml-vocab-llama-spm"))
    tok = Tokenizer.from_file(model)
    at_cap, over = "é" * 524, "é" * 524 + "x"
    assert (len(at_cap.encode()), len(over.encode())) == (1048, 1049)
    monkeypatch.chdir(tmp_path)
    Path("t.txt").write_text("\n".join(["keep me", at_cap, over, "and me"]) + "\n", encoding="utf-8")
    run = ["dataset", "--model", model, "--workers", "1", "--docs", "line", "--no-progress", "--max-doc-mib"]

    assert main([*run, "0.001", "--out", "strict", "t.txt"]) == 2
    assert capsys.readouterr().err == ("minillama: error: t.txt, line 3: expected a document of at most 1,048 bytes "
                                       "(max_doc_bytes, --max-doc-mib), found a longer one\n")
    assert main([*run, "0.001", "--skip-bad", "--out", "skip", "t.txt"]) == 0
    assert "3 documents, 1 bad records skipped" in capsys.readouterr().out
    docs = ["keep me", at_cap, "and me"]
    ds = dataset.open("skip")
    assert [ds.document(i).tolist() for i in range(3)] == [tok.encode(d) + [tok.eos_id] for d in docs]
    assert "t.txt, line 3" in json.loads(Path("skip/index.json").read_text())["bad_examples"][0]

    assert main([*run, "0.002", "--out", "raised", "t.txt"]) == 0  # 2,097 bytes
    docs.insert(2, over)
    ds = dataset.open("raised")
    assert [ds.document(i).tolist() for i in range(4)] == [tok.encode(d) + [tok.eos_id] for d in docs]
    for bad in ("0", "-1", "nan", "inf", "2000000"):
        assert main([*run, bad, "--out", "never", "t.txt"]) == 2
        assert capsys.readouterr().err == ("minillama: error: expected --max-doc-mib from 0.000001 (a byte) to "
                                           f"1,048,576 (1 TiB), found {float(bad):g}\n")
    assert not os.path.exists("never")


def test_prepare_refuses_a_cap_readline_cannot_take(tmp_path):
    """max_doc_bytes beyond 1 TiB is a MinillamaError (2**63 made the line reader's readline raise OverflowError)."""
    t = tmp_path / "t.txt"
    t.write_text("a\n", encoding="utf-8")
    with pytest.raises(MinillamaError, match=r"max_doc_bytes must be a whole number from 1 to 1,099,511,627,776 "
                       r"\(1 TiB\), got 9223372036854775808"):
        dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path / "o", [t], docs="line", max_doc_bytes=2**63)
    assert not (tmp_path / "o").exists()


# --- item 8: readers -------------------------------------------------------------------------------------------------

def test_deeply_nested_jsonl_is_a_bad_record(tmp_path):
    model = str(vocab_path("ggml-vocab-llama-spm"))
    f = tmp_path / "deep.jsonl"
    f.write_text('{"text": "one"}\n' + "[" * 200_000 + "]" * 200_000 + '\n{"text": "two"}\n', encoding="utf-8")
    index = dataset.prepare(model, tmp_path / "skip", [f], workers=1, skip_bad=True)
    assert (index["docs"], index["bad_records"]) == (2, 1)
    with pytest.raises(dataset.BadRecordError, match=r"deep\.jsonl, line 2: expected a JSON object, found one "
                       "nested too deeply"):
        dataset.prepare(model, tmp_path / "strict", [f], workers=1)


def test_a_utf8_bom_does_not_cost_the_first_document(tmp_path):
    model = str(vocab_path("ggml-vocab-llama-spm"))
    tok = Tokenizer.from_file(model)
    bom = "\ufeff".encode()
    j = tmp_path / "bom.jsonl"
    j.write_bytes(bom + b'{"text": "first"}\n{"text": "second"}\n')
    t = tmp_path / "bom.txt"
    t.write_bytes(bom + b"first\n\nsecond\n")
    for f, docs in ((j, "paragraph"), (t, "paragraph"), (t, "line")):
        out = tmp_path / f"{f.suffix[1:]}-{docs}"
        index = dataset.prepare(model, out, [f], workers=1, docs=docs, skip_bad=True)
        assert (index["docs"], index["bad_records"]) == (2, 0), (f, docs)
        assert dataset.open(out).document(0).tolist() == tok.encode("first") + [tok.eos_id], (f, docs)


def test_a_corrupt_parquet_page_names_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(20000)]}), tmp_path / "c.parquet",
                   row_group_size=5000)
    data = bytearray((tmp_path / "c.parquet").read_bytes())
    mid = len(data) // 2
    data[mid:mid + 2000] = bytes(b ^ 0x5A for b in data[mid:mid + 2000])  # inside the pages, not the footer
    (tmp_path / "bad.parquet").write_bytes(bytes(data))
    with pytest.raises(MinillamaError, match=r"bad\.parquet: expected Parquet pages pyarrow can read, found a "
                       r"damaged one at or after row \d+"):
        dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path / "out", [tmp_path / "bad.parquet"],
                        workers=1)


# --- item 8: dataset.open of a damaged directory ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prepared")
    f = d / "in.txt"
    f.write_text("one two three\n\nfour five\n\nsix\n", encoding="utf-8")
    dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), d / "out", [f], workers=1, shard_tokens=4)
    return d / "out"


def _damaged(prepared: Path, tmp_path: Path, change) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    for n in os.listdir(prepared):
        (out / n).write_bytes((prepared / n).read_bytes())
    index = json.loads((out / "index.json").read_text())
    text = change(index, out)
    (out / "index.json").write_text(text if isinstance(text, str) else json.dumps(index))
    return out


DAMAGE = {
    "no dtype": (lambda ix, d: ix.pop("dtype") and None, r"expected 'dtype' to be one of uint16, uint32, found None"),
    "shards not a list": (lambda ix, d: ix.update(shards=7), r"expected 'shards' to be a list, found int"),
    "tokens a string": (lambda ix, d: ix["shards"][0].update(tokens="4"), r"shard 0: expected 'tokens' to be a whole"),
    "docs 10**30": (lambda ix, d: ix.update(docs=10**30), r"expected 'docs' to be a whole number from 0 to 2\*\*62"),
    "docs off by one": (lambda ix, d: ix.update(docs=ix["docs"] + 1), r"expected 'docs' to be \d+ \(the shards' sum\)"),
    "shard outside": (lambda ix, d: ix["shards"][0].update(file="../../etc/passwd"),
                      r"shard 0: expected a file name like shard-00000\.bin inside the directory, found '\.\./"),
    "shard missing": (lambda ix, d: os.remove(d / "shard-00001.bin"), r"shard-00001\.bin: expected a shard of \d+ ids, "
                      "found no such file"),
    "no offsets": (lambda ix, d: os.remove(d / "doc_offsets.npy"), r"doc_offsets\.npy: expected the document "
                   "offsets of the data set, found no such file"),
    "offsets short": (lambda ix, d: np.save(d / "doc_offsets.npy", np.zeros(2, "<i8")), r"expected \d+ int64 offsets"),
    "deep nesting": (lambda ix, d: "[" * 100_000 + "]" * 100_000, r"index\.json: expected the index of a data set, "
                     "found nesting too deep"),
    "shard entry a list": (lambda ix, d: ix["shards"].__setitem__(0, []), r"shard 0: expected an object, found list"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_open_refuses_a_damaged_directory_by_name(prepared, tmp_path, case):
    change, message = DAMAGE[case]
    assert len(json.loads((prepared / "index.json").read_text())["shards"]) >= 2
    out = _damaged(prepared, tmp_path, change)
    with pytest.raises(MinillamaError, match=message) as info:
        dataset.open(out)
    assert str(out) in str(info.value)


def test_open_of_an_intact_directory_still_works(prepared):
    ds = dataset.open(prepared)
    assert ds.n_docs == 3 and ds.doc_offsets[-1] == ds.n_tokens


# --- item 15: the progress bar ---------------------------------------------------------------------------------------

def test_the_progress_bar_shows_percent_of_the_input(tmp_path, capsys):
    f = tmp_path / "in.txt"
    f.write_text("\n\n".join(f"paragraph number {i}" for i in range(200)) + "\n", encoding="utf-8")
    dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path / "out", [f], workers=1, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"dataset: +\d+%\|.*/4\.29k", err), err  # a total (the input's 4,290 bytes): percent and ETA
