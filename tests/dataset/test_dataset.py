"""minillama.dataset: sharded token files, exact, identical across engines and worker counts, resumable.

Expected ids come from llama.cpp (shared/conformance-diverse: its ids for 1,500 paragraphs of diverse.txt) and,
for the paragraph-split text file, from Tokenizer.encode (itself checked against llama.cpp by the conformance
tests) on paragraphs cut by minillama.ngram.paragraphs, an independent implementation of the cut.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from support import REPO
from support.paths import load, require_shared, vocab_path
from support.reference import LLAMACPP_TEST_SEP

from minillama import dataset
from minillama.cli import main
from minillama.dataset.shards import file_sha256
from minillama.errors import MinillamaError
from minillama.ngram import paragraphs
from minillama.tokenizer import Tokenizer, default_vocab_path

N_DOCS = 300  # a subset keeps CI fast; tools/bench/bench_dataset.py runs the full corpus
VOCABS = {"llama-bpe": "uint32", "llama-spm": "uint16"}


def _paragraphs() -> list[str]:
    text = require_shared("corpus", "diverse.txt").read_text(encoding="utf-8")
    return paragraphs(text)[:N_DOCS]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """The first N_DOCS paragraphs of diverse.txt as a text file, and llama.cpp's cases as JSONL."""
    d = tmp_path_factory.mktemp("corpus")
    paras = _paragraphs()
    txt = d / "diverse.txt"
    txt.write_text("\n\n".join(paras) + "\n", encoding="utf-8")
    cases = require_shared("conformance-diverse", "cases.txt").read_text(encoding="utf-8").split(LLAMACPP_TEST_SEP)
    jsonl = d / "cases.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for text in cases[:N_DOCS]:
            f.write(json.dumps({"id": len(text), "text": text}) + "\n")
    return {"txt": str(txt), "paras": paras, "jsonl": str(jsonl)}


def _llamacpp_expected(vocab: str, tok: Tokenizer) -> list[int]:
    """[bos] + llama.cpp's ids + [eos] for each conformance-diverse case our reader keeps (non-blank)."""
    rows = [json.loads(line) for line in
            require_shared("conformance-diverse", f"ggml-vocab-{vocab}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert tok.add_bos and not tok.vocab.add_eos
    out: list[int] = []
    for r in rows[:N_DOCS]:
        if r["text"].strip():
            out += [tok.bos_id, *r["ids"], tok.eos_id]
    return out


def _files(d: str) -> dict[str, bytes]:
    return {name: Path(d, name).read_bytes() for name in sorted(os.listdir(d))}


# --- Tokenizer pickling ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-gpt-2",
                                  "ggml-vocab-bert-bge", "ggml-vocab-unigram8k", "llama2c-tokenizer.bin",
                                  "llama-3.2-tokenizer.json"])
def test_tokenizer_pickles_to_the_same_ids(name):
    path = require_shared("vocab", name) if "." in name else vocab_path(name)
    tok = Tokenizer.from_file(path)
    texts = require_shared("conformance", "cases.txt").read_text(encoding="utf-8").split(LLAMACPP_TEST_SEP)[:80]
    cold = pickle.dumps(tok)
    expected = [tok.encode(t) for t in texts]  # warms the word caches and the piece table
    tok.decode(expected[0])
    warm = pickle.dumps(tok)
    assert len(warm) == len(cold)  # caches are not shipped
    back = pickle.loads(warm)
    assert [back.encode(t) for t in texts] == expected
    assert back.decode(expected[1]) == tok.decode(expected[1])


def test_in_memory_tokenizer_pickles():
    from minillama.tokenizer.train import train_bpe

    corpus = REPO / "minillama" / "data" / "default-corpus.txt"
    tok = train_bpe([str(corpus)], 400, kind="bytelevel", pre="llama3").tokenizer()
    text = corpus.read_text(encoding="utf-8")[:3000]
    assert pickle.loads(pickle.dumps(tok)).encode(text) == tok.encode(text)


def test_cache_entries_taught_to_another_tokenizer_are_not_computed_again(monkeypatch):
    """take_cache_entries / add_cache_entries (how the local engine's workers share words): the taught tokenizer
    gives encode()'s ids and computes none of the taught words itself. This is the pure path's word cache; the
    native core keeps its cache in C and records no entries to share (take_cache_entries gives [])."""
    monkeypatch.setenv("MINILLAMA_BACKEND", "pure")
    tok = load("ggml-vocab-llama-bpe")
    texts = _paragraphs()[:60]
    first, second = Tokenizer.from_file(vocab_path("ggml-vocab-llama-bpe")), pickle.loads(pickle.dumps(tok))
    assert first.take_cache_entries() == [] and second.take_cache_entries() == []
    expected = [tok.encode(t) for t in texts]
    assert [first.encode(t) for t in texts] == expected
    learned = first.take_cache_entries()
    assert len(learned) > 500 and len({w for w, _ in learned}) == len(learned)
    assert first.take_cache_entries() == []  # taken once
    assert all(ids == tok.encode(w, add_special=False) for w, ids in learned[:200])
    second.add_cache_entries(learned)
    assert [second.encode(t) for t in texts] == expected
    assert second.take_cache_entries() == []  # every word came from first
    assert [second.encode(t) for t in _paragraphs()[60:70]] == [tok.encode(t) for t in _paragraphs()[60:70]]
    assert second.take_cache_entries()  # new words are recorded again


# --- exactness, local engine -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", list(VOCABS))
def test_paragraph_shards_equal_encode_plus_eos_for_1_and_2_workers(vocab, corpus, tmp_path, monkeypatch):
    from minillama.dataset import local

    monkeypatch.setattr(local, "BATCH_CHARS", 3000)  # many text chunks, many batches per worker
    tok = load(f"ggml-vocab-{vocab}")
    expected = []
    for p in corpus["paras"]:
        expected += tok.encode(p) + [tok.eos_id]
    outs = []
    # 2 workers: threads sharing the tokenizer where it encodes in the native core, and processes as always
    for workers, threads in ((1, True), (2, True), (2, False)):
        monkeypatch.setattr(local, "THREADS", threads)
        out = tmp_path / f"w{workers}{threads}"
        index = dataset.prepare(str(vocab_path(f"ggml-vocab-{vocab}")), out, [corpus["txt"]], workers=workers,
                                docs="paragraph", shard_tokens=4000)
        assert index["dtype"] == VOCABS[vocab] and index["docs"] == N_DOCS and len(index["shards"]) > 2
        ds = dataset.open(out)
        assert ds.shards[0].dtype == np.dtype(VOCABS[vocab]).newbyteorder("<")
        assert ds.tokens().tolist() == expected
        assert ds.document(7).tolist() == tok.encode(corpus["paras"][7]) + [tok.eos_id]
        assert ds.document(N_DOCS - 1).tolist() == tok.encode(corpus["paras"][-1]) + [tok.eos_id]
        outs.append(_files(out))
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("vocab", list(VOCABS))
def test_jsonl_shards_equal_llamacpp_ids(vocab, corpus, tmp_path):
    tok = load(f"ggml-vocab-{vocab}")
    index = dataset.prepare(str(vocab_path(f"ggml-vocab-{vocab}")), tmp_path, [corpus["jsonl"]], workers=2,
                            shard_tokens=5000)
    got = dataset.open(tmp_path).tokens()
    assert got.tolist() == _llamacpp_expected(vocab, tok)
    raw = b"".join(Path(tmp_path, s["file"]).read_bytes() for s in index["shards"])
    assert raw == np.array(got, dtype="<" + ("u4" if VOCABS[vocab] == "uint32" else "u2")).tobytes()


def test_separator_choices(corpus, tmp_path):
    tok = load("ggml-vocab-llama-spm")
    paras = corpus["paras"][:20]
    f = tmp_path / "few.txt"
    f.write_text("\n\n".join(paras), encoding="utf-8")
    for sep, ids in (("none", []), ("bos", [tok.bos_id]), ("13,2", [13, 2])):
        dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path / sep, [f], workers=1, separator=sep,
                        add_special=False)
        assert dataset.open(tmp_path / sep).tokens().tolist() == [i for p in paras for i in tok.encode(p, False) + ids]
    with pytest.raises(MinillamaError, match="outside the vocab"):
        dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path / "x", [f], separator="99999")


def test_reader_sample_and_offsets(corpus, tmp_path):
    dataset.prepare(str(vocab_path("ggml-vocab-llama-spm")), tmp_path, [corpus["txt"]], workers=1, shard_tokens=3000)
    ds = dataset.open(tmp_path)
    assert ds.doc_offsets[0] == 0 and ds.doc_offsets[-1] == ds.n_tokens and len(ds.doc_offsets) == ds.n_docs + 1
    assert np.all(np.diff(ds.doc_offsets) > 0)
    x, y = ds.sample(4, 64, rng=0)
    assert x.shape == y.shape == (4, 64) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])
    x2, _ = ds.sample(4, 64, rng=0)
    assert np.array_equal(x, x2)
    flat = ds.tokens()
    starts = [i for i in range(len(flat) - 64) if flat[i] == x[0, 0] and np.array_equal(flat[i:i + 64], x[0])]
    assert starts  # a window of the token stream
    with pytest.raises(MinillamaError, match="expected a prepared data set"):
        dataset.open(tmp_path / "nope")


# --- Parquet ---------------------------------------------------------------------------------------------------------

def test_parquet_equals_jsonl_and_names_a_missing_column(corpus, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow (the parquet/ray extras)")
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in Path(corpus["jsonl"]).read_text(encoding="utf-8").splitlines()]
    pq.write_table(pa.table({"body": texts}), tmp_path / "c.parquet", row_group_size=50)
    model = str(vocab_path("ggml-vocab-llama-spm"))
    dataset.prepare(model, tmp_path / "pq", [tmp_path / "c.parquet"], text_field="body", workers=2)
    dataset.prepare(model, tmp_path / "js", [corpus["jsonl"]], workers=2)
    assert Path(tmp_path, "pq", "shard-00000.bin").read_bytes() == Path(tmp_path, "js", "shard-00000.bin").read_bytes()
    with pytest.raises(MinillamaError, match=r"c\.parquet: expected a column 'text', found only 'body'"):
        dataset.prepare(model, tmp_path / "bad", [tmp_path / "c.parquet"])
    assert not (tmp_path / "bad").exists()
    pq.write_table(pa.table({"body": ["one", None, "three"]}), tmp_path / "n.parquet")
    with pytest.raises(MinillamaError, match=r"n\.parquet, row 1: column 'body' is null"):
        dataset.prepare(model, tmp_path / "bad", [tmp_path / "n.parquet"], text_field="body")


# --- bad input -------------------------------------------------------------------------------------------------------

def test_bad_records_are_named_and_nothing_half_written(tmp_path):
    model = str(vocab_path("ggml-vocab-llama-spm"))
    good = [{"text": f"document number {i}"} for i in range(6)]
    lines = [json.dumps(r) for r in good[:3]] + ['{"title": "no text"}'] + [json.dumps(r) for r in good[3:]]
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(MinillamaError, match=r"in\.jsonl, line 4: no field 'text' \(fields: 'title'\)"):
        dataset.prepare(model, out, [f], workers=1, shard_tokens=3)
    left = sorted(os.listdir(out))
    assert "index.json" not in left and not [n for n in left if n.endswith(".tmp")]
    assert left == [".lock", ".minillama-dataset", "shard-00000.bin", "shard-00000.docs.npy", "shard-00000.json",
                    "shard-00001.bin", "shard-00001.docs.npy", "shard-00001.json",
                    "shard-00002.bin", "shard-00002.docs.npy", "shard-00002.json"]  # the good data is kept

    index = dataset.prepare(model, out, [f], workers=2, shard_tokens=3, skip_bad=True)
    assert index["bad_records"] == 1 and "line 4" in index["bad_examples"][0] and index["docs"] == 6
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(json.dumps(r) for r in good) + "\n", encoding="utf-8")
    dataset.prepare(model, tmp_path / "clean", [clean], workers=1, shard_tokens=3)
    assert dataset.open(out).tokens().tolist() == dataset.open(tmp_path / "clean").tokens().tolist()

    t = tmp_path / "latin1.txt"
    t.write_bytes(b"fine\n\nalso fine\nthen caf\xe9\n")
    with pytest.raises(MinillamaError, match=r"latin1\.txt, line 4: expected UTF-8 text, found byte 0xe9"):
        dataset.prepare(model, tmp_path / "t", [t])
    index = dataset.prepare(model, tmp_path / "t", [t], skip_bad=True)
    assert index["docs"] == 1 and index["bad_records"] == 1
    assert main(["dataset", "--model", model, "--out", str(tmp_path / "cli"), str(f)]) == 2


def test_cli_writes_and_reports(tmp_path, capsys, corpus):
    out = tmp_path / "o"
    code = main(["dataset", "--model", str(vocab_path("ggml-vocab-llama-spm")), "--out", str(out), "--workers", "1",
                 "--docs", "line", "--no-progress", corpus["txt"]])
    assert code == 0
    lines = [ln for ln in Path(corpus["txt"]).read_text(encoding="utf-8").split("\n") if ln.strip()]
    assert f"{len(lines):,} documents" in capsys.readouterr().out
    assert dataset.open(out).n_docs == len(lines)


# --- resume after SIGKILL --------------------------------------------------------------------------------------------

def test_sigkill_then_rerun_equals_uninterrupted_run(tmp_path):
    text = require_shared("corpus", "diverse.txt").read_bytes()[:1_200_000]
    src = tmp_path / "in.txt"
    src.write_bytes(text[:text.rindex(b"\n\n")])
    model = str(vocab_path("ggml-vocab-llama-spm"))
    cmd = [sys.executable, "-m", "minillama", "dataset", "--model", model, "--workers", "2", "--shard-tokens",
           "20000", "--no-progress", str(src), "--out"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd + [str(tmp_path / "whole")], check=True, env=env, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd + [str(out)], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "shard-00002.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "index.json").exists()
    kept = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out) if n.endswith(".json")}
    subprocess.run(cmd + [str(out)], check=True, env=env, capture_output=True)
    assert all(os.stat(out / n).st_mtime_ns == t for n, t in kept.items())  # finished shards were kept
    assert _files(out) == _files(tmp_path / "whole")


# --- Ray -------------------------------------------------------------------------------------------------------------

# The Ray runs happen in a child process: a Ray driver whose local raylet dies (it happened once in ~5 CI runs on
# this 2-core machine) is ended by Ray itself with exit status 1, and in-process that took pytest down with it.
RAY_RUNS = """
import json, sys
import ray
from minillama import dataset
from minillama.errors import MinillamaError
jobs = json.loads(sys.argv[1])
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
try:
    out = []
    for model, src, dst, workers in jobs:
        try:
            dataset.prepare(model, dst, [src], engine="ray", workers=workers, shard_tokens=6000)
            out.append("ok")
        except MinillamaError as e:
            out.append("MinillamaError: " + str(e))
    print(json.dumps(out))
finally:
    ray.shutdown()
"""


def _ray_process(args: list[str]) -> subprocess.CompletedProcess:
    """Run python ARGS (a Ray driver) in a fresh process; one retry when it ended before printing any result
    (Ray ended it), never for a wrong result. Returns the successful run."""
    pytest.importorskip("ray", reason='the Ray engine needs pip install ".[ray]" in a checkout of minillama')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for attempt in range(2):
        p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
        if p.returncode == 0:
            return p
        if attempt == 0 and not p.stdout.strip():  # ended before any result: Ray's own failure, retried once
            continue
        raise AssertionError(f"the Ray run failed (exit {p.returncode}): {p.stderr[-3000:]}")
    raise AssertionError("unreachable")


def _ray_runs(jobs: list[list]) -> list[str]:
    """Run dataset.prepare(engine="ray") for each (model, source, out dir, workers) in one fresh process with a
    local Ray (_ray_process)."""
    return json.loads(_ray_process(["-c", RAY_RUNS, json.dumps(jobs)]).stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 22-30 s each (--durations, 2 busy cores): a Ray cluster starts
def test_ray_engine_gives_the_same_bytes(corpus, tmp_path):
    jobs, pairs = [], []
    for vocab, name in (("llama-bpe", "jsonl"), ("llama-spm", "txt")):  # uint32 and uint16, both readers
        model = str(vocab_path(f"ggml-vocab-{vocab}"))
        a, b = tmp_path / f"{vocab}-{name}-local", tmp_path / f"{vocab}-{name}-ray"
        dataset.prepare(model, a, [corpus[name]], workers=2, shard_tokens=6000)
        jobs.append([model, str(corpus[name]), str(b), 2])
        pairs.append((a, b, vocab, name))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": 3}\n', encoding="utf-8")
    jobs.append([str(vocab_path("ggml-vocab-llama-spm")), str(bad), str(tmp_path / "rb"), 1])
    results = _ray_runs(jobs)
    assert results[:2] == ["ok", "ok"], results
    for a, b, vocab, name in pairs:
        assert _files(a) == _files(b), (vocab, name)
    tok = load("ggml-vocab-llama-bpe")
    assert dataset.open(tmp_path / "llama-bpe-jsonl-ray").tokens().tolist() == _llamacpp_expected("llama-bpe", tok)
    assert results[2].startswith("MinillamaError: ") and "bad.jsonl, line 2: field 'text' is int, expected a string" \
        in results[2], results[2]


# An error-level line as Ray prints them on the driver's stderr: its C++ core's log format, "[date time
# LEVEL pid tid] file.cc:line: message" with LEVEL E (error), C (critical) or F (fatal), also behind an
# actor's "(Name pid=N) " prefix; Python logging's "date time\tERROR file.py:line -- message".
RAY_ERROR_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [ECF] \d+ \d+\]|\b(ERROR|CRITICAL|FATAL)\b")
# what every successful `minillama dataset --engine ray` printed before, as Ray 2.60 wrote it
RAY_ACTOR_RESTART_LINE = (
    "[2026-11-25 16:48:07,895 E 29719 29719] core_worker.cc:2465: Actor with class name: "
    "'MapWorker(MapBatches(Encoder))' and ID: 'f16bddfa925ea1bb20e62f5001000000' has constructor arguments in the "
    "object store and max_restarts > 0. If the arguments in the object store go out of scope or are lost, the "
    "actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for more details.")


@pytest.mark.slow  # 22-30 s each (--durations, 2 busy cores): a Ray cluster starts
def test_ray_run_prints_no_error_line(corpus, tmp_path):
    """A successful `minillama dataset --engine ray` (a local Ray started for the run) prints its summary and no
    error-level line: Ray logged one for every pool actor created with restarts allowed."""
    assert RAY_ERROR_LINE.search(RAY_ACTOR_RESTART_LINE)  # the pattern catches the line the issue reports
    assert RAY_ERROR_LINE.search("2026-11-25 16:48:07,895\tERROR streaming_executor.py:371 -- failed")
    src = tmp_path / "small.txt"
    src.write_text("\n\n".join(corpus["paras"][:40]) + "\n", encoding="utf-8")
    model = str(vocab_path("ggml-vocab-llama-spm"))
    p = _ray_process(["-m", "minillama", "dataset", "--model", model, "--out", str(tmp_path / "ray"),
                      "--engine", "ray", "--workers", "1", "--no-progress", str(src)])
    assert "40 documents" in p.stdout, p.stdout
    errors = [line for line in p.stderr.splitlines() if RAY_ERROR_LINE.search(line)]
    assert errors == [], p.stderr
    dataset.prepare(model, tmp_path / "local", [str(src)], workers=1)
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


# A tokenizer whose process dies (os._exit, as the OOM killer would end it) on one document, in a Ray run.
RAY_ACTOR_DIES = """
import os, sys
import ray
from minillama import dataset
from minillama.errors import MinillamaError
from minillama.tokenizer import Tokenizer

class Dying(Tokenizer):
    def encode(self, text, *args, **kwargs):
        if text == "the process dies here":
            os._exit(3)
        return super().encode(text, *args, **kwargs)

    def encode_concat(self, texts, *args, **kwargs):  # what the engines call: a batch's documents in one call
        if "the process dies here" in texts:
            os._exit(3)
        return super().encode_concat(texts, *args, **kwargs)

ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
try:
    dataset.prepare(Dying.from_file(sys.argv[1]), sys.argv[2], [sys.argv[3]], engine="ray", workers=1)
    print("ok")
except MinillamaError as e:
    print("MinillamaError: " + str(e))
finally:
    ray.shutdown()
"""


@pytest.mark.slow  # 22-30 s each (--durations, 2 busy cores): a Ray cluster starts
def test_ray_actor_that_dies_ends_the_run_with_one_error(tmp_path):
    """A tokenizer actor whose process dies is not restarted (a document that kills it would kill every restart,
    forever): the run ends with a MinillamaError that says so."""
    src = tmp_path / "t.txt"
    src.write_text("fine\n\nthe process dies here\n\nnever reached\n", encoding="utf-8")
    p = _ray_process(["-c", RAY_ACTOR_DIES, str(vocab_path("ggml-vocab-llama-spm")), str(tmp_path / "o"), str(src)])
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("MinillamaError: a Ray tokenizer actor died (") and last.endswith(
        "the finished shards are kept: run the same command again to resume"), last


def test_resume_when_kept_documents_arrive_encoded(corpus, tmp_path):
    """The Ray engine re-encodes a resumed run's kept documents: feed() must skip them inside a batch."""
    from minillama.dataset.local import encode_docs
    from minillama.dataset.shards import ShardWriter

    model = str(vocab_path("ggml-vocab-llama-spm"))
    index = dataset.prepare(model, tmp_path / "whole", [corpus["txt"]], workers=1, shard_tokens=3000)
    whole = _files(tmp_path / "whole")
    out = tmp_path / "part"
    dataset.prepare(model, out, [corpus["txt"]], workers=1, shard_tokens=3000)
    last = len(index["shards"]) - 1
    for name in os.listdir(out):  # as if killed while writing the last two shards
        if name.startswith((f"shard-{last:05d}", f"shard-{last - 1:05d}")) or name == "index.json":
            os.remove(out / name)
    tok = load("ggml-vocab-llama-spm")
    settings = json.loads((out / "shard-00000.json").read_text())["settings"]
    writer = ShardWriter(str(out), np.dtype("<u2"), 3000, settings)
    assert len(writer.kept) == last - 1 and writer.skip_docs > 0
    docs = corpus["paras"]
    for i in range(0, len(docs), 37):  # batches that straddle the first document to write
        writer.feed(*encode_docs(tok, docs[i:i + 37], True, False, [tok.eos_id], np.dtype("<u2"))[:3])
    head = {k: index[k] for k in ("dtype", "byteorder", "n_vocab", "model", "settings", "inputs")}
    writer.finish({**head, "bad_records": 0, "bad_examples": []})
    assert _files(out) == whole


def test_block_paragraph_reader_cuts_as_ngram_paragraphs(tmp_path, monkeypatch):
    """The fast paragraph reader (regex on blocks, for valid UTF-8 files) gives ngram.paragraphs' documents for
    texts made of blank-line pieces, blocks as small as one byte (cuts and characters straddle them)."""
    import random

    from minillama.dataset import sources
    from minillama.ngram import paragraphs

    rnd = random.Random(7)
    pieces = ["\n", "\n", " ", "\t", "\r", "a", "é", "\f", "\v", "x\n\n", "\n \n", "\n\t\n\n", "日本"]
    path = tmp_path / "t.txt"
    for _ in range(1500):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 80)))
        path.write_bytes(text.encode())
        monkeypatch.setattr(sources, "_BLOCK", rnd.choice([1, 2, 3, 5, 8, 13, 1 << 20]))
        assert list(sources.text_docs(str(path), "paragraph", None)) == paragraphs(text), repr(text)


def test_text_chunks_cover_the_file_and_end_at_cuts(tmp_path):
    """paragraph_chunks: contiguous chunks whose bytes are the file's, each ending right after a paragraph cut
    (so each splits into whole documents); a chunk whose bytes changed since the check names the byte."""
    from minillama.dataset import sources

    paras = _paragraphs()
    text = ("\n\n".join(paras) + "\n \n\n\t\nlast").encode()
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    for size in (7, 100, 4096, 1 << 20):
        chunks = list(sources.paragraph_chunks(str(path), size))
        assert b"".join(c.data for c in chunks) == text
        assert [c.start for c in chunks] == [sum(len(c.data) for c in chunks[:i]) for i in range(len(chunks))]
        assert all(c.data.endswith(b"\n") for c in chunks[:-1])
        assert [d for c in chunks for d in c.documents()] == paragraphs(text.decode())
        if size == 4096:
            assert len(chunks) > 10
    with pytest.raises(dataset.BadRecordError, match=r"t.txt, byte 12: expected UTF-8 text"):
        sources.TextChunk("t.txt", 10, b"ab\xffcd").documents()


@pytest.mark.parametrize("vocab", list(VOCABS))
def test_encode_concat_equals_encode_plus_suffix(vocab):
    """Tokenizer.encode_concat (a dataset batch in one call): each text's encode() and the suffix, in order, with
    each text's end; texts the core leaves to encode (lone surrogates) and parse_special take encode's path."""
    tok = load(f"ggml-vocab-{vocab}")
    texts = [*_paragraphs()[:40], "", " ", "a\udc80b", "x" * 3000, "日本語 テキスト"]
    assert tok.encodes_in_core() == (tok.backend == "native") and not tok.encodes_in_core(parse_special=True)
    for add_special, parse_special, suffix in ((True, False, [tok.eos_id]), (False, False, []), (True, True, [5, 6])):
        for batch in (texts, texts[:40], []):
            ids, ends = tok.encode_concat(batch, add_special, parse_special, suffix)
            rows = [tok.encode(t, add_special, parse_special) + suffix for t in batch]
            assert ids.dtype == np.int32 and ends.dtype == np.int64
            assert ids.tolist() == [i for r in rows for i in r]
            assert ends.tolist() == np.cumsum([len(r) for r in rows], dtype=np.int64).tolist()


def test_encode_concat_warns_double_bos_once_and_takes_what_encode_takes():
    """encode_concat with add_special on a bos-adding vocab (llama-spm, bos '<s>'): one DoubleBosWarning for a batch
    where one text starts with '<s>' (whatever the other texts' characters), none where no text does or add_special
    is off; an item that is no str is refused as encode refuses it (ArgumentTypeError), a str subclass encoded as
    its str."""
    from minillama.errors import ArgumentTypeError, DoubleBosWarning

    tok = load("ggml-vocab-llama-spm")

    def n_warned(batch, add_special=True):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            tok.encode_concat(batch, add_special, False, [2])
        return sum(issubclass(w.category, DoubleBosWarning) for w in seen)

    plain = ["日本語 <s>", "😀 x", "<", "<s", " <s>", "s>", "<S>", "\u3000<s>"]
    for batch in ([*plain, "<s>"], ["<s>日本語", *plain], [*plain[:4], "<s>😀", *plain[4:]], ["<s> x"]):
        assert n_warned(batch) == 1, batch
        assert n_warned(batch, add_special=False) == 0, batch
    assert n_warned(plain) == 0 and n_warned([]) == 0
    assert n_warned(["<s>a", "<s>b"]) >= 1

    class Text(str):
        pass

    ids, ends = tok.encode_concat([Text("ab c"), "d"], False, False, [2])
    assert (ids.tolist(), ends.tolist()) == ([*tok.encode("ab c", False), 2, *tok.encode("d", False), 2],
                                             [len(tok.encode("ab c", False)) + 1, len(ids)])
    for bad in (5, b"x", None):
        with pytest.raises(ArgumentTypeError, match="takes a str"):
            tok.encode_concat(["a", bad])


def test_doc_digests_equal_hashlib_blake2b():
    """shards.doc_digests, in the native core or not: hashlib's BLAKE2b of each document's UTF-8 (surrogatepass),
    at block boundaries (128 bytes) and past them, for every width of character."""
    import hashlib

    from minillama.dataset.shards import doc_digests

    docs = ["", "a", "é", "€" * 43, "😀" * 32, *("x" * n for n in (127, 128, 129, 255, 256, 257, 5000)),
            *_paragraphs()[:50]]
    for batch in (docs, [*docs, "lone \udc80 surrogate"]):
        raws = [d.encode("utf-8", "surrogatepass") for d in batch]
        expected = (b"".join(hashlib.blake2b(r, digest_size=16).digest() for r in raws), sum(map(len, raws)))
        assert doc_digests(batch, native=True) == expected == doc_digests(batch)


def test_native_paragraph_cut_equals_fileio_paragraphs():
    """The core's paragraph cut (TextChunk.documents on the native backend) is fileio.paragraphs: blank lines of any
    blanks, runs of them, newlines stripped, parts of whitespace only (str.isspace, non-ASCII too) dropped."""
    import random

    core = pytest.importorskip("minillama._native._core")
    rng = random.Random(5)
    alphabet = ["\n", "\n", " ", "\t", "\r", "\f", "\v", "a", "é", "\u3000", "\x85", "\xa0", "\u2028", "\x1c",
                "日", "\u200b", "😀"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(40))) for _ in range(5000)]
    texts += ["\n\n".join(_paragraphs()), "", "\n \n\n", "a\n\t\nb\n\n\n\nc"]
    for t in texts:
        assert core.paragraphs(t.encode()) == paragraphs(t), repr(t)
    assert core.paragraphs(b"ab\xffcd") is None and core.paragraphs("a\udc80".encode("utf-8", "surrogatepass")) is None


def test_native_workers_are_threads_and_pure_ones_processes(corpus, tmp_path, monkeypatch):
    """Where the tokenizer encodes in the native core with the GIL released, workers are threads sharing it (no
    process started); the pure backend's hold the GIL and are processes. Both give the same bytes."""
    from minillama.dataset import local

    model = str(vocab_path("ggml-vocab-llama-spm"))
    native = Tokenizer.from_file(model).encodes_in_core()

    def never(*_):
        raise AssertionError("the other kind of worker was started")

    monkeypatch.setattr(local, "Workers" if native else "Threads", never)
    dataset.prepare(model, tmp_path / "a", [corpus["txt"]], workers=2)
    dataset.prepare(model, tmp_path / "b", [corpus["txt"]], workers=1)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


@pytest.mark.skipif(sys.platform == "win32" or multiprocessing.get_start_method() != "fork",
                    reason="the fault is put into the workers by forking this process")
def test_a_failing_or_dying_worker_stops_the_run_with_a_clear_error(corpus, tmp_path, monkeypatch):
    from minillama.dataset import local

    model = str(vocab_path("ggml-vocab-llama-spm"))

    def fail(*_):
        raise dataset.BadRecordError("in.txt", "line 3", "a test failure")

    monkeypatch.setattr(local, "encode_units", fail)
    for threads in (True, False):  # worker threads (native backend) and processes
        monkeypatch.setattr(local, "THREADS", threads)
        with pytest.raises(dataset.BadRecordError, match="in.txt, line 3: a test failure"):
            dataset.prepare(model, tmp_path / f"a{threads}", [corpus["txt"]], workers=2)
    monkeypatch.setattr(local, "THREADS", False)  # a thread's os._exit would end this process: processes only
    monkeypatch.setattr(local, "encode_units", lambda *_: os._exit(3))
    with pytest.raises(MinillamaError, match=r"a worker process ended unexpectedly \(exit status 3"):
        dataset.prepare(model, tmp_path / "b", [corpus["txt"]], workers=2)
    assert not [n for n in os.listdir(tmp_path / "b") if n.startswith("shard-") or n == "index.json"]


def test_a_bad_byte_deep_in_a_paragraph_file_switches_to_the_line_reader(tmp_path, monkeypatch):
    """Chunks are checked as UTF-8 block by block; from a bad block on the line reader takes over, past the
    documents the chunks held: the documents, the bad record's name and its count are the line reader's."""
    from minillama.dataset import sources

    paras = _paragraphs()[:200]
    head = "\n\n".join(paras[:150]).encode()
    text = head + b"\n\nbad \xff byte\nsame paragraph\n\n" + "\n\n".join(paras[150:]).encode() + b"\n"
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    bad_line = head.count(b"\n") + 3
    for block in (64, 1000, 1 << 20):
        monkeypatch.setattr(sources, "_BLOCK", block)
        expected_bad = dataset.BadRecords()
        expected = list(sources._line_docs(str(path), "paragraph", expected_bad))
        assert expected == paras  # the bad paragraph is dropped
        got_bad = dataset.BadRecords()
        units = list(dataset.Source([str(path)], skip_bad=True).units(got_bad))
        assert isinstance(units[0], sources.TextChunk) == (block < len(head)) and isinstance(units[-1], str)
        assert [d for p in units for d in ([p] if isinstance(p, str) else p.documents())] == expected
        assert got_bad.examples == expected_bad.examples == [
            f"{path}, line {bad_line}: expected UTF-8 text, found byte 0xff at column 5 that is not (invalid start byte)"]
        docs = dataset.Source([str(path)]).documents()
        assert [next(docs) for _ in range(150)] == paras[:150]
        with pytest.raises(dataset.BadRecordError, match=f"line {bad_line}: expected UTF-8"):
            next(docs)


# --- the output directory: only our own files, one run at a time, inputs never replaced -----------------

USER_FILES = {"index.json": b'{"my": "own index"}\n', "notes.tmp": b"draft notes\n",
              "shard-00007.bin.bak": bytes(range(256)), "readme.txt": b"read me\n"}


def _text_file(path: Path, n_docs: int = 40) -> Path:
    path.write_text("\n\n".join(f"document {i}: some words about llamas and tokens" for i in range(n_docs)) + "\n",
                    encoding="utf-8")
    return path


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "minillama", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minillama: error: "), p.stderr
    return lines[0]


def test_a_directory_minillama_did_not_write_is_refused_and_left_byte_for_byte(tmp_path):
    """The user's index.json, .tmp, .bak and readme stay as they were, and nothing is added."""
    from minillama.errors import OutputError

    out = tmp_path / "mine"
    out.mkdir()
    for name, data in USER_FILES.items():
        (out / name).write_bytes(data)
    src = _text_file(tmp_path / "in.txt")
    with pytest.raises(OutputError, match=f"cannot write to '{out}': expected a new or empty directory"):
        dataset.prepare(default_vocab_path(), out, [src], workers=1)
    line = _one_error_line(_cli("dataset", "--model", default_vocab_path(), "--out", str(out), "--no-progress",
                                str(src)))
    assert f"'{out}'" in line and "readme.txt" in line
    assert _files(out) == USER_FILES


def test_an_interrupted_run_leaves_no_temporary_file(tmp_path):
    """Ctrl-C or SIGTERM while a shard is being written (CI once saw '.shard-00005.json.XXXX.tmp' left behind when
    the interrupt came between the temporary file's creation and the write): the run removes its own half-written
    files on the way out, and leaves the user's files alone."""
    from minillama.dataset.shards import claimed_dir

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), claimed_dir(str(out)) as path:
        for name in (".shard-00005.json.ys1ffwwz.tmp", "shard-00004.bin.tmp", ".index.json.abcdefgh.tmp"):
            Path(path, name).write_bytes(b"half")
        (out / "notes.tmp").write_bytes(b"the user's")  # not a name a run writes
        raise KeyboardInterrupt
    assert sorted(os.listdir(out)) == sorted([".lock", ".minillama-dataset", "notes.tmp"])
    assert (out / "notes.tmp").read_bytes() == b"the user's"


def test_a_run_of_ours_removes_only_its_own_files_and_says_what_it_kept(tmp_path):
    """In its own directory a run (resumed or with new settings) leaves alone what a user put there, and a
    resumed run says how many finished shards it kept."""
    model, src, out = default_vocab_path(), _text_file(tmp_path / "in.txt"), tmp_path / "out"
    index = dataset.prepare(model, out, [src], workers=1, shard_tokens=50)
    n = len(index["shards"])
    assert n >= 4
    user = {"notes.tmp": b"draft", "shard-00007.bin.bak": b"backup", "readme.txt": b"mine",
            "shard-00001.bin.orig": b"orig", ".shard-00001.json.tmp": b"not a write_output name"}
    for name, data in user.items():
        (out / name).write_bytes(data)
    for name in ("index.json", f"shard-{n - 1:05d}.json", f"shard-{n - 2:05d}.json"):  # as if killed before these
        (out / name).unlink()
    p = _cli("dataset", "--model", model, "--out", str(out), "--workers", "1", "--shard-tokens", "50",
             "--no-progress", str(src))
    assert p.returncode == 0, p.stderr
    assert f"{out}: resuming an earlier run: {n - 2} finished shards kept" in p.stderr
    assert all((out / name).read_bytes() == data for name, data in user.items())
    dataset.prepare(model, out, [src], workers=1, shard_tokens=80)  # other settings: every shard written again
    assert all((out / name).read_bytes() == data for name, data in user.items())
    assert dataset.open(out).index["settings"]["shard_tokens"] == 80


def test_a_second_run_on_a_locked_directory_fails_and_changes_nothing(tmp_path):
    """With the lock held by this test: a clear error, the holder's files untouched."""
    import fcntl

    model, out = default_vocab_path(), tmp_path / "out"
    dataset.prepare(model, out, [_text_file(tmp_path / "a.txt")], workers=1, shard_tokens=50)
    before = _files(out)
    with open(out / ".lock", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = _one_error_line(_cli("dataset", "--model", model, "--out", str(out), "--no-progress",
                                    str(_text_file(tmp_path / "b.txt", 7))))
    assert f"cannot write to '{out}'" in line and "held by another minillama dataset run" in line
    assert _files(out) == before


def test_two_concurrent_runs_on_one_directory(tmp_path):
    """With two real processes: the second fails at once, the first ends with its own data."""
    model, out = default_vocab_path(), tmp_path / "out"
    big = _text_file(tmp_path / "big.txt", 300_000)
    first = subprocess.Popen([sys.executable, "-m", "minillama", "dataset", "--model", model, "--out", str(out),
                              "--workers", "1", "--shard-tokens", "20000", "--no-progress", str(big)],
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "shard-00000.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended before the second began"
            time.sleep(0.02)
        second = _cli("dataset", "--model", model, "--out", str(out), "--no-progress",
                      str(_text_file(tmp_path / "small.txt", 5)))
        line = _one_error_line(second)
        assert "held by another minillama dataset run" in line
        assert first.poll() is None, "the first run ended before the second one's check: make big.txt bigger"
    finally:
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    ds = dataset.open(out)
    assert ds.index["inputs"] == [str(big)] and ds.n_docs == 300_000
    assert all(file_sha256(str(out / s["file"])) == s["sha256"] for s in ds.index["shards"])


def test_an_input_that_is_one_of_the_output_files_is_refused(tmp_path):
    """For dataset: an input (or the model) that the run would replace, also through a symlink."""
    model, out = default_vocab_path(), tmp_path / "out"
    dataset.prepare(model, out, [_text_file(tmp_path / "a.txt")], workers=1)
    before = _files(out)
    (tmp_path / "link.json").symlink_to(out / "index.json")
    for inp in (str(out / "index.json"), str(tmp_path / "link.json")):
        line = _one_error_line(_cli("dataset", "--model", model, "--out", str(out), "--docs", "file",
                                    "--no-progress", inp))
        assert f"cannot write to '{out}'" in line and f"the input '{inp}'" in line
    (out / "shard-00099.bin").write_bytes(Path(model).read_bytes())  # a model kept where a shard would go
    before = _files(out)
    line = _one_error_line(_cli("dataset", "--model", str(out / "shard-00099.bin"), "--out", str(out),
                                "--no-progress", str(tmp_path / "a.txt")))
    assert f"the input '{out / 'shard-00099.bin'}'" in line
    assert _files(out) == before


def test_a_dangling_symlink_out_is_followed(tmp_path):
    """--out as a symlink to a directory not made yet writes there and keeps the link (cp's
    rule for output files, README); a symlink to a file is refused naming what it is."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "later")
    src = _text_file(tmp_path / "in.txt")
    p = _cli("dataset", "--model", default_vocab_path(), "--out", str(link), "--no-progress", str(src))
    assert p.returncode == 0, p.stderr
    assert link.is_symlink() and dataset.open(tmp_path / "later").n_docs == 40
    (tmp_path / "file.link").symlink_to(src)
    line = _one_error_line(_cli("dataset", "--model", default_vocab_path(), "--out", str(tmp_path / "file.link"),
                                "--no-progress", str(src)))
    assert f"cannot write to '{tmp_path / 'file.link'}': expected a directory, found a regular file" in line


def test_workers_are_bounded_before_any_starts(tmp_path, monkeypatch):
    """--workers 100000 forked until 'Too many open files'; now an error naming the bound."""
    from minillama.dataset import local

    def never(*args, **kwargs):
        raise AssertionError("workers were started")

    monkeypatch.setattr(local, "run_local", never)
    bound = 4 * (os.cpu_count() or 1)
    src = _text_file(tmp_path / "in.txt")
    with pytest.raises(MinillamaError, match=f"expected workers from 1 to {bound} .*found 100000"):
        dataset.prepare(default_vocab_path(), tmp_path / "out", [src], workers=100_000)
    assert not (tmp_path / "out").exists()
    line = _one_error_line(_cli("dataset", "--model", default_vocab_path(), "--out", str(tmp_path / "out"),
                                "--workers", str(bound + 1), str(src)))
    assert f"expected workers from 1 to {bound}" in line


def test_an_input_that_is_no_regular_file_is_named_for_what_it_is(tmp_path):
    """A FIFO, a directory or a device was reported as 'no such file'."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory"), (Path(os.devnull), "a character device")):
        line = _one_error_line(_cli("dataset", "--model", default_vocab_path(), "--out", str(tmp_path / "out"),
                                    "--no-progress", str(path), timeout=60))
        assert f"cannot read '{path}': expected a regular data file, found {kind}" in line
    assert not (tmp_path / "out").exists()


def test_the_lock_ends_with_the_run_not_with_its_workers(tmp_path):
    """Workers forked while the run holds DIR/.lock do not hold it: after a kill -9 of the run's own process
    the directory is free again at once, even while a worker lingers."""
    import fcntl

    model, out = default_vocab_path(), tmp_path / "out"
    big = _text_file(tmp_path / "big.txt", 300_000)
    run = subprocess.Popen([sys.executable, "-m", "minillama", "dataset", "--model", model, "--out", str(out),
                            "--workers", "2", "--shard-tokens", "20000", "--no-progress", str(big)],
                           env={**os.environ, "PYTHONPATH": str(REPO), "MINILLAMA_BACKEND": "pure"},  # processes
                           start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "shard-00000.json").exists():
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.02)
        os.kill(run.pid, signal.SIGKILL)  # the main process only, as the OOM killer does
        run.wait()
        with open(out / ".lock", "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if a worker still held it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # whatever worker is left
