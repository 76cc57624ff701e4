"""The Ray engine: Ray Data reads the files and a pool of actors, each holding a Tokenizer, encodes them.

Reading and splitting are light and ask for no CPU (num_cpus=0), so that they still run when the
actors hold every core; each actor asks for one CPU.

Pipeline (one Ray Data pipeline per run of consecutive inputs of one kind, in input order):

    text / JSONL:  read_binary_files -> flat_map(split into documents, the same code as the local engine)
    Parquet:       read_parquet(columns=[text_field])
    then           map_batches(EncodeActor actors, concurrency=workers) -> the driver writes shards in order

Text and JSONL are read as whole files and cut into documents by sources.py, not by ray.data.read_text /
read_json: those decode and parse by rules of their own (pyarrow's JSON types, read_text's line
handling), and the point of this engine is the same bytes as the local one, with the same errors
(file and line). Ray's read_text and read_json read one file per task as whole blocks too, so nothing
is lost in streaming. With `preserve_order` the driver receives encoded batches in input order, and
the same ShardWriter as the local engine cuts shards by its fixed rule: the output is identical.

A resumed run re-encodes everything on the cluster (there is no cheap way to skip rows of a Ray
dataset by document count) but rewrites only the shards that were not finished.

The actors run with max_restarts=0. Ray Data passes every pool actor its DataContext and map function
as object-store references, and Ray (2.60, the pinned version) logs an ERROR line on the driver's
terminal for any actor created with such arguments and restarts allowed (ray-project/ray#53727: such a
restart fails if the arguments are lost), so every successful run printed one, whatever we pass (a pool
of an argument-free class prints it too). And with Ray Data's default (restart and retry forever) a
document whose encoding kills the actor (the OOM killer, a crash) hung the run, restarting it without end.
Without restarts an actor that dies ends the run with a MinillamaError saying so: the finished shards
are kept and the same command resumes from them.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

import numpy as np

from ..errors import MinillamaError
from ..tokenizer import Tokenizer
from .local import encode_docs, tick
from .shards import ShardWriter
from .sources import (
    BadRecordError,
    BadRecords,
    Source,
    file_format,
    jsonl_docs,
    over_limit,
    text_docs,
    too_long,
)

DOCS_PER_BATCH = 512
BLOCK_BYTES = 1 << 20


class _Collect(BadRecords):
    """BadRecords that also keeps every message until drained (to pass them on in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[str] = []

    def add(self, err: BadRecordError) -> None:
        super().add(err)
        self.pending.append(str(err))

    def drain(self) -> list[dict[str, Any]]:
        rows = [{"text": m, "bad": True} for m in self.pending]
        self.pending.clear()
        return rows


def _split(row: dict[str, Any], names: dict[str, str], source: Source) -> list[dict[str, Any]]:
    """One file's bytes -> its documents (and, with skip_bad, its bad records as rows of their own)."""
    path = names.get(row["path"], row["path"])
    bad = _Collect() if source.skip_bad else None
    if file_format(path, source.fmt) == "jsonl":
        it = jsonl_docs(path, source.text_field, bad, row["bytes"], source.max_doc_bytes)
    else:
        it = text_docs(path, source.docs, bad, row["bytes"], source.max_doc_bytes)
    out: list[dict[str, Any]] = []
    for doc in it:
        if bad is not None:
            out += bad.drain()
        out.append({"text": doc, "bad": False})
    if bad is not None:
        out += bad.drain()
    return out


def _parquet_rows(batch: dict[str, np.ndarray], names: dict[str, str], source: Source) -> dict[str, np.ndarray]:
    texts, bads = [], []
    text_field, limit = source.text_field, source.max_doc_bytes
    for text, path in zip(batch[text_field], batch["path"]):
        if text is None or over_limit(text, limit):
            name = names.get(path, path)
            err = (too_long(name, "a row", limit) if text is not None else
                   BadRecordError(name, "a row", f"column {text_field!r} is null, expected a string"))
            if not source.skip_bad:
                raise err
            texts.append(str(err))
            bads.append(True)
        elif text.strip():
            texts.append(text)
            bads.append(False)
    return {"text": np.array(texts, dtype=object), "bad": np.array(bads, dtype=bool)}


class EncodeActor:
    """A Ray actor holding one Tokenizer: a batch of documents -> one row of concatenated ids."""

    def __init__(self, tok: Tokenizer, settings: tuple) -> None:
        self.tok, self.settings = tok, settings

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        docs = [t for t, b in zip(batch["text"], batch["bad"]) if not b]
        bad = [t for t, b in zip(batch["text"], batch["bad"]) if b]
        lens, ids, digests, n_bytes = encode_docs(self.tok, docs, *self.settings)

        def one(x: object) -> np.ndarray:
            a = np.empty(1, dtype=object)
            a[0] = x
            return a

        return {"lens": one(lens.tobytes()), "ids": one(ids.tobytes()), "digests": one(digests),
                "n_bytes": np.array([n_bytes]), "bad": one(json.dumps(bad))}


def _groups(source: Source) -> list[tuple[bool, list[str]]]:
    """Consecutive inputs grouped by whether they are Parquet, in input order."""
    groups: list[tuple[bool, list[str]]] = []
    for p in source.paths:
        pq = file_format(p, source.fmt) == "parquet"
        if groups and groups[-1][0] == pq:
            groups[-1][1].append(p)
        else:
            groups.append((pq, [p]))
    return groups


def _find_bad(exc: BaseException) -> BadRecordError | None:
    seen = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, BadRecordError):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None


def run_ray(tok: Tokenizer, source: Source, writer: ShardWriter, settings: tuple, workers: int, bad: BadRecords,
            progress, address: str | None) -> None:
    """Encode every document of source with Ray Data actors and feed the writer in input order."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise MinillamaError('--engine ray needs Ray Data: pip install ".[ray]" in a checkout of minillama') from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # not a line per pipeline start on the terminal
    # nor a warning that the progress bars we turn off below are off (the run has its own bar)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.target_max_block_size = BLOCK_BYTES  # a file's documents in many blocks: every actor gets work
    dtype = settings[3]
    try:
        for is_parquet, paths in _groups(source):
            names = {os.path.abspath(p): p for p in paths} | {p: p for p in paths}
            if is_parquet:
                ds = ray.data.read_parquet([os.path.abspath(p) for p in paths], columns=[source.text_field],
                                           include_paths=True, file_extensions=None, num_cpus=0)
                ds = ds.map_batches(_parquet_rows, fn_args=(names, source), batch_format="numpy", num_cpus=0)
            else:
                ds = ray.data.read_binary_files([os.path.abspath(p) for p in paths], include_paths=True,
                                                num_cpus=0)
                ds = ds.flat_map(_split, fn_args=(names, source), num_cpus=0)
            with warnings.catch_warnings():
                # max_restarts (see the module docstring) is a **ray_remote_args keyword, which Ray 2.60 warns is
                # deprecated and has no named replacement for; the pinned Ray still honours it
                warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
                ds = ds.map_batches(EncodeActor, fn_constructor_args=(tok, settings),
                                    compute=ray.data.ActorPoolStrategy(size=workers),
                                    batch_size=DOCS_PER_BATCH, batch_format="numpy", num_cpus=1, max_restarts=0)
            for row in ds.iter_rows():
                for msg in json.loads(row["bad"]):
                    bad.count += 1
                    if len(bad.examples) < 10:
                        bad.examples.append(msg)
                writer.feed(np.frombuffer(row["lens"], np.int64), np.frombuffer(row["ids"], dtype), row["digests"])
                tick(progress, int(row["n_bytes"]), writer)
    except ray.exceptions.RayActorError as exc:  # without restarts (module docstring) a dead actor ends the run
        raise MinillamaError(f"a Ray tokenizer actor died (its process was killed, ran out of memory or crashed: "
                             f"{str(exc).splitlines()[0]}); the finished shards are kept: run the same command again "
                             f"to resume") from exc
    except Exception as exc:
        # Ray wraps a worker's error in its own exceptions (and does not number Parquet rows): when the
        # input holds a bad record, read it here, without encoding, to raise the same error as the local engine.
        if _find_bad(exc) is None and "BadRecordError" not in str(exc):
            raise
        if not source.skip_bad:
            for _ in source.documents():
                pass
        raise
    finally:
        if started:
            ray.shutdown()
