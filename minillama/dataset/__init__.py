"""minillama.dataset: tokenize a data set into sharded token files that numpy.memmap opens (nanoGPT / llm.c layout).

    from minillama import dataset
    dataset.prepare("model.gguf", "out/", ["a.jsonl", "b.txt"], workers=2)   # or engine="ray"
    ds = dataset.open("out/")
    ds.shards[0][:10], ds.document(0), ds.doc_offsets
    x, y = ds.sample(batch_size=8, block_size=256, rng=0)

Each document is `tok.encode(doc, add_special, parse_special)` (the model's own bos/eos rules) followed
by an end-of-document separator: by default one eos, unless the model's encode already ends with eos
(its add_eos flag), so that every document ends with exactly one eos. Documents are read in input
order (sources.py), encoded in parallel (local.py: a process pool; ray_engine.py: Ray Data actors),
and written by one writer by a rule that depends only on the documents (shards.py): the same input
and settings give the same bytes whatever the engine or worker count. Runs resume: shards finished
by an interrupted run are kept (after checking them) and only the rest is encoded.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..errors import ArgumentError, MinillamaError
from ..fileio import input_path
from ..tokenizer import Tokenizer
from .shards import Dataset, ShardWriter, StaleShard, claimed_dir, dtype_for, file_sha256, open_dataset
from .sources import MAX_DOC_BYTES, BadRecordError, BadRecords, Source

__all__ = ["prepare", "open", "Dataset", "BadRecordError", "BadRecords", "Source", "resolve_separator", "ENGINES"]

ENGINES = ("local", "ray")
DEFAULT_SHARD_TOKENS = 100_000_000  # as nanoGPT's and llm.c's FineWeb shards
open = open_dataset  # noqa: A001  (dataset.open(DIR), the name the API promises)
WORKERS_PER_CORE = 4  # more processes than this add memory and file descriptors, not speed
MAX_CLUSTER_WORKERS = 1024  # actors on a Ray cluster (ray_address), whose cores this machine cannot count


def max_workers(engine: str = "local", ray_address: str | None = None) -> int:
    """The most workers a run takes: WORKERS_PER_CORE per core of this machine (where local processes and a
    local Ray's actors run), or MAX_CLUSTER_WORKERS actors on a Ray cluster."""
    if engine == "ray" and ray_address is not None:
        return MAX_CLUSTER_WORKERS
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def resolve_separator(tok: Tokenizer, separator: str | int | Sequence[int], add_special: bool) -> list[int]:
    """The ids appended after each document: 'eos' (default), 'bos', 'none', an id or a list of ids.

    'eos' appends nothing when encode(add_special=True) already ends documents with eos (add_eos vocabs)."""
    if isinstance(separator, str):
        name = separator.strip().lower()
        if name == "none":
            return []
        if name in ("eos", "bos"):
            tid = tok.eos_id if name == "eos" else tok.bos_id
            if tid is None:
                raise MinillamaError(f"separator {name!r}: the model has no {name} token; choose another "
                                     "separator (bos, eos, none or token ids)")
            if name == "eos" and add_special and tok.vocab.add_eos:
                return []
            return [tid]
        try:
            ids = [int(x) for x in name.split(",")]
        except ValueError:
            raise MinillamaError(f"separator must be eos, bos, none or token ids like 2 or 2,13; got "
                                 f"{separator!r}") from None
    elif isinstance(separator, int):
        ids = [separator]
    else:
        ids = [int(x) for x in separator]
    for i in ids:
        if not 0 <= i < tok.n_vocab:
            raise MinillamaError(f"separator id {i} is outside the vocab [0, {tok.n_vocab})")
    return ids


def _model_identity(model: str | os.PathLike[str] | Tokenizer) -> tuple[Tokenizer, dict]:
    if isinstance(model, Tokenizer):
        blob = pickle.dumps(model.vocab, protocol=4)
        return model, {"file": None, "sha256": hashlib.sha256(blob).hexdigest()}
    path = os.fspath(model)
    tok = Tokenizer.from_file(path)
    return tok, {"file": os.path.basename(path), "sha256": file_sha256(path)}


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM (timeout, Slurm, Docker stop) raises KeyboardInterrupt as Ctrl-C does, so a run
    stops the same way: workers ended, finished shards kept. Only in the main thread, and only where
    SIGTERM still has its default action (a caller's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def prepare(model: str | os.PathLike[str] | Tokenizer, out: str | os.PathLike[str], files: Sequence[str], *,
            workers: int | None = None, engine: str = "local", docs: str = "paragraph", text_field: str = "text",
            fmt: str = "auto", separator: str | int | Sequence[int] = "eos", add_special: bool = True,
            parse_special: bool = False, shard_tokens: int = DEFAULT_SHARD_TOKENS, skip_bad: bool = False,
            ray_address: str | None = None, progress: bool | None = None,
            log: Callable[[str], None] | None = None, max_doc_bytes: int = MAX_DOC_BYTES) -> dict:
    """Tokenize files into DIR/shard-NNNNN.bin + DIR/index.json + DIR/doc_offsets.npy; returns the index.

    model is a model/tokenizer file or a Tokenizer; workers (default: all cores) are processes for
    engine='local' and tokenizer actors for engine='ray' (ray_address: an existing cluster, e.g.
    'auto' or 'ray://head:10001'; None starts a local Ray). progress=None shows a bar on a terminal.
    SIGTERM stops a run as Ctrl-C does (KeyboardInterrupt, finished shards kept).
    A bad record raises BadRecordError (file and line/row) unless skip_bad, which counts it in the
    index instead; so is a document of more than max_doc_bytes bytes of UTF-8 (default 16 MiB, at most 1 TiB: encoding
    one takes up to 25-40 bytes of memory a byte). Shards already finished by an interrupted run with the
    same settings are kept, and log (if given) is told how many. out must be new, empty or an earlier output
    of prepare (OutputError otherwise, before anything is written); a second run on the same out fails at
    once while this one holds its lock.
    """
    if engine not in ENGINES:
        raise MinillamaError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if workers is None:
        workers = os.cpu_count() or 1
    bound = max_workers(engine, ray_address)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= bound:
        per = "on a Ray cluster" if bound == MAX_CLUSTER_WORKERS else \
            f"{WORKERS_PER_CORE} per core of this machine's {os.cpu_count() or 1}"
        raise ArgumentError(f"expected workers from 1 to {bound:,} ({per}), found {workers!r}")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise MinillamaError(f"shard_tokens must be a whole number of at least 1, got {shard_tokens!r}")
    files = [input_path(f, "data file") for f in files]
    source = Source(files, docs=docs, text_field=text_field, fmt=fmt, skip_bad=skip_bad, max_doc_bytes=max_doc_bytes)
    source.check()
    tok, model_id = _model_identity(model)
    sep = resolve_separator(tok, separator, add_special)
    dtype = dtype_for(tok.n_vocab)
    settings = {"docs": docs, "format": fmt, "text_field": text_field, "add_special": add_special,
                "parse_special": parse_special, "separator": separator if isinstance(separator, str) else list(sep),
                "separator_ids": sep, "shard_tokens": shard_tokens, "skip_bad": skip_bad}
    if max_doc_bytes != MAX_DOC_BYTES:  # only when set: the default keeps earlier runs' settings hash
        settings["max_doc_bytes"] = max_doc_bytes
    head = {"dtype": dtype.name, "byteorder": "little", "n_vocab": tok.n_vocab, "model": model_id, "settings": settings, "inputs": files}
    settings_hash = hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()
    shown = os.fspath(out)
    enc = (add_special, parse_special, sep, dtype)
    inputs = files if isinstance(model, Tokenizer) else [*files, os.fspath(model)]
    with sigterm_as_interrupt(), claimed_dir(shown, inputs) as out_dir:  # made, marked as ours and locked
        return _run(tok, source, out_dir, shown, head, settings_hash, enc, engine, workers, ray_address, progress,
                    log)


class _NoBar:
    """What the engines call on a progress bar, doing nothing: no bar is shown (tqdm is not even imported)."""

    format_dict: dict = {}

    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, progress: bool | None):
    """A tqdm bar of total bytes when progress, or when progress is None and stderr is a terminal (tqdm's
    disable=None); else _NoBar."""
    if not (progress or (progress is None and sys.stderr is not None and sys.stderr.isatty())):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc="dataset", total=total, unit="B", unit_scale=True, unit_divisor=1000, leave=False)


def _run(tok: Tokenizer, source: Source, out: str, shown: str, head: dict, settings_hash: str, enc: tuple,
         engine: str, workers: int, ray_address: str | None, progress: bool | None,
         log: Callable[[str], None] | None) -> dict:
    """prepare()'s run once the settings are checked and out is claimed: encode and write, starting over a
    kept shard whose input changed (at most 3 times). shown is out as the user typed it, for messages."""
    dtype = enc[3]
    # The bar counts the documents' UTF-8 bytes against the input files' sizes: percent and ETA are exact for
    # text, and a JSONL file's keys and escapes make the end come a little before 100%.
    total = sum(os.path.getsize(p) for p in source.paths)
    for attempt in range(3):
        writer = ShardWriter(out, dtype, head["settings"]["shard_tokens"], settings_hash, shown)
        if writer.kept and log is not None and attempt == 0:
            n = len(writer.kept)
            log(f"{shown}: resuming an earlier run: {n:,} finished shard{'s' if n > 1 else ''} kept "
                f"({writer.skip_docs:,} documents, {sum(r['tokens'] for r in writer.kept):,} tokens)")
        bad = BadRecords()
        bar = _progress_bar(total, progress)
        try:
            if engine == "local":
                from .local import run_local

                run_local(tok, source, writer, enc, workers, bad, bar)
            else:
                from .ray_engine import run_ray

                run_ray(tok, source, writer, enc, workers, bad, bar, ray_address)
            index = writer.finish({**head, "bad_records": bad.count, "bad_examples": bad.examples})
        except StaleShard as stale:  # the input of a kept shard changed: write it (and what follows) again
            writer.drop_from(stale.shard)
            continue
        except BaseException:
            writer.close_files()
            raise
        finally:
            bar.close()
        return index
    raise MinillamaError(f"{shown}: the input files keep changing while they are read")
