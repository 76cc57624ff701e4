"""Shard files: write token ids in input order into fixed-rule shards, resume after a crash, read them back.

Layout of a data set directory (the nanoGPT / llm.c layout plus an index):

    shard-00000.bin         token ids, little-endian uint16 (n_vocab <= 65,536) or uint32, no header
    shard-00000.docs.npy    int64 start offset of each document inside that shard
    shard-00000.json        the shard's record: tokens, docs, sha256 of the .bin, hash of its input text,
                            the run's settings hash (written last: its presence means the shard is done)
    doc_offsets.npy         int64, n_docs + 1 entries: document i is tokens[offsets[i]:offsets[i+1]]
                            of all shards concatenated
    index.json              dtype, n_vocab, model file name and sha256, settings, inputs, per shard
                            tokens/docs/first token/first doc/sha256, totals, skipped bad records
    .minillama-dataset      the marker: this directory is a minillama dataset output (written first)
    .lock                   flock()ed by the run writing here, so two runs never write it at once

A run writes only into a new or empty directory or one that holds the marker, and there it removes
only files named as above (its own): anything else a user keeps there stays untouched.

The rule that makes output independent of engine and worker count: documents arrive in input order,
never split, and a shard ends after the first document that brings it to at least `shard_tokens` ids.
Every file is written under a temporary name and renamed, so a killed run leaves only whole files.
On the next run with the same settings, shards whose record, size and sha256 check out are kept; the
documents they hold are read again and hashed (not tokenized) to check the input did not change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import MinillamaError, OutputError
from ..fileio import file_kind, write_output, writing
from .index_check import check_index, load_offsets

FORMAT, VERSION = "minillama-dataset", 1
INDEX, OFFSETS = "index.json", "doc_offsets.npy"
MARKER, LOCK = ".minillama-dataset", ".lock"
TMP = ".tmp"
# The names a run writes: shards, their leftovers (".tmp": a shard being written; ".NAME.XXXXXXXX.tmp": a
# write_output temporary file) and the directory's own files. Nothing else is ever removed.
_SHARD = re.compile(r"shard-(\d{5,})\.(?:bin|docs\.npy|json)")
_LEFTOVER = re.compile(r"(?:shard-\d{5,}\.bin|doc_offsets\.npy)\.tmp"
                       r"|\.(?:shard-\d{5,}\.(?:docs\.npy|json)|index\.json|\.minillama-dataset)\.\w+\.tmp")


def dtype_for(n_vocab: int) -> np.dtype:
    """uint16 when every id fits (n_vocab <= 65,536), else uint32; little-endian either way."""
    return np.dtype("<u2") if n_vocab <= 1 << 16 else np.dtype("<u4")


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.bin"


def doc_digest(text: str) -> bytes:
    """A short hash of one document's text (what a resumed run compares instead of tokenizing again)."""
    return utf8_digest(text.encode("utf-8", "surrogatepass"))


def utf8_digest(raw: bytes) -> bytes:
    """doc_digest of the document whose UTF-8 (surrogatepass) bytes are raw, for callers that have them."""
    return hashlib.blake2b(raw, digest_size=16).digest()


def doc_digests(docs: Sequence[str], native: bool = False) -> tuple[bytes, int]:
    """The doc_digest of each document, joined, and the documents' UTF-8 bytes in all. native: hashed in the
    native core with the GIL released (the same BLAKE2b bytes) wherever it is built and the text holds no
    surrogate."""
    if native:
        try:
            from .._native import _core
        except ImportError:
            pass
        else:
            if (got := _core.utf8_digests(docs, 16)) is not None:
                return got
    raws = [doc.encode("utf-8", "surrogatepass") for doc in docs]
    return b"".join([utf8_digest(raw) for raw in raws]), sum(map(len, raws))


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _allocate(f, size: int) -> None:
    """Make f size bytes long with its blocks allocated (posix_fallocate where there is one): a full disk raises
    ENOSPC here rather than SIGBUS when a memory map of the file is written."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(f.fileno(), 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    f.truncate(size)


def write_atomic(path: str, data: bytes, shown: str | None = None) -> None:
    """Write data to path through fileio.write_output (a temporary file and a rename: never half-written); shown:
    the path in messages."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    write_output(path, write, shown)


def save_npy_atomic(path: str, arr: np.ndarray, shown: str | None = None) -> None:
    """np.save arr at path, atomically as write_atomic."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save would append .npy to a name
            np.save(f, arr, allow_pickle=False)

    write_output(path, write, shown)


def own_file(name: str) -> bool:
    """True for the names a run writes in its output directory (the only files it may remove there)."""
    return name in (INDEX, OFFSETS, MARKER, LOCK) or bool(_SHARD.fullmatch(name) or _LEFTOVER.fullmatch(name))


def _out_dir(out: str) -> str:
    """The real directory --out names (a symlink is followed, a dangling one to the directory to make, as
    fileio.write_output follows one); OutputError if it is no directory or a foreign non-empty one."""
    try:
        st = os.stat(out)
    except FileNotFoundError:
        return os.path.realpath(out)
    except OSError as e:
        raise OutputError(f"cannot write to {out!r}: expected a directory, found {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write to {out!r}: expected a directory, found {file_kind(st.st_mode)}")
    path = os.path.realpath(out)
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise OutputError(f"cannot write to {out!r}: expected a readable directory, found {e.strerror}") from None
    if names and MARKER not in names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise OutputError(f"cannot write to {out!r}: expected a new or empty directory, or one written by minillama "
                          f"dataset (it holds {MARKER}), found {len(names):,} file{'s' if len(names) > 1 else ''} "
                          f"and no {MARKER} ({shown}); nothing was changed: choose another --out")
    return path


def refuse_inputs_inside(out: str, path: str, inputs: Iterable[str]) -> None:
    """OutputError when an input (a data file, the model) is one of the files a run writes in path (--out as
    typed: out), which the run would replace or remove."""
    for f in inputs:
        real = os.path.realpath(f)
        if own_file(os.path.basename(real)) and os.path.dirname(real) == path:
            raise OutputError(f"cannot write to {out!r}: expected inputs outside the files it writes there, found "
                              f"the input {f!r}, which is its {os.path.basename(real)}")


_HELD_LOCKS: set[int] = set()  # descriptors of the LOCKs this process holds


def _drop_locks_in_child() -> None:
    """In a forked worker: close the inherited LOCK descriptors (without unlocking them), so that the lock
    ends with the run's own process and never outlives it in a worker left behind by a kill -9."""
    for fd in _HELD_LOCKS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_drop_locks_in_child)


@contextlib.contextmanager
def claimed_dir(out: str, inputs: Iterable[str] = ()) -> Iterator[str]:
    """The real directory of --out, made if new, marked as ours and locked for the run (LOCK, flock): a
    second run on it fails at once with an OutputError instead of writing over this one."""
    path = _out_dir(out)
    refuse_inputs_inside(out, path, inputs)
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.exists(os.path.join(path, MARKER)):
            write_atomic(os.path.join(path, MARKER), (json.dumps({"format": FORMAT, "version": VERSION}) + "\n").encode(),
                         os.path.join(out, MARKER))
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise OutputError(f"cannot write to {out!r}: expected a writable directory, found {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"cannot write to {out!r}: expected no other run writing there, found its {LOCK} held "
                              "by another minillama dataset run; wait for it to end or choose another --out") from None
        _HELD_LOCKS.add(fd)
        try:
            yield path
        except BaseException:  # a run stopped mid-write (Ctrl-C, SIGTERM, an error) leaves no temporary file
            remove_leftovers(path)
            raise
        finally:
            _HELD_LOCKS.discard(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def remove_leftovers(path: str) -> None:
    """Remove what a run of ours left half-written in path (temporary files only, by their names)."""
    for name in os.listdir(path):
        if _LEFTOVER.fullmatch(name):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(path, name))


class StaleShard(Exception):
    """A kept shard's input text changed since it was written (internal: the run starts that shard again)."""

    def __init__(self, shard: int) -> None:
        super().__init__(shard)
        self.shard = shard


class ShardWriter:
    """Takes encoded documents in input order and writes shards by the fixed rule, resuming kept shards.

    add(lens, tokens, digests): lens are the documents' id counts, tokens their ids concatenated (None
    while replaying documents of kept shards), digests their doc_digest()s concatenated.
    """

    def __init__(self, out: str, dtype: np.dtype, shard_tokens: int, settings_hash: str,
                 shown: str | None = None) -> None:
        self.out, self.dtype, self.shard_tokens, self.settings_hash = out, dtype, shard_tokens, settings_hash
        #: out as the user typed it, for messages (a file that could not be written is named under it)
        self.shown = out if shown is None else shown
        os.makedirs(out, exist_ok=True)
        remove_leftovers(out)  # of a killed run of ours
        for name in (INDEX, OFFSETS):  # an index that is no longer true
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out, name))
        self.kept = self._kept_shards()
        self.skip_docs = sum(r["docs"] for r in self.kept)
        self.records: list[dict] = []
        self._f = None
        self._seen = 0
        self._start_shard()

    def _show(self, path: str) -> str:
        """A path inside out as the user would type it: under shown."""
        return os.path.join(self.shown, os.path.relpath(path, self.out))

    @property
    def total_tokens(self) -> int:
        """Ids in the shards so far (kept ones included)."""
        return sum(r["tokens"] for r in self.records) + self._n_tokens

    # --- resume -----------------------------------------------------------------------------
    def _kept_shards(self) -> list[dict]:
        """Records of the shards 0, 1, ... that are complete and made with these settings; later files go."""
        kept: list[dict] = []
        i = 0
        while True:
            rec = self._check_shard(i)
            if rec is None:
                break
            kept.append(rec)
            i += 1
        self._remove_from(i)
        return kept

    def _check_shard(self, i: int) -> dict | None:
        base = os.path.join(self.out, shard_name(i))
        try:
            with open(base[:-4] + ".json", encoding="utf-8") as f:
                rec = json.load(f)
            if rec.get("settings") != self.settings_hash:
                return None
            if os.path.getsize(base) != rec["tokens"] * self.dtype.itemsize:
                return None
            starts = np.load(base[:-4] + ".docs.npy", allow_pickle=False)
            if starts.shape != (rec["docs"],) or file_sha256(base) != rec["sha256"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return rec

    def _remove_from(self, first: int) -> None:
        for name in os.listdir(self.out):
            m = _SHARD.fullmatch(name)
            if m and int(m.group(1)) >= first:
                os.remove(os.path.join(self.out, name))

    def drop_from(self, shard: int) -> None:
        """Remove shard `shard` and later ones (their input changed); a new writer writes them again."""
        self.close_files()
        self._remove_from(shard)

    # --- writing ----------------------------------------------------------------------------
    def _start_shard(self) -> None:
        i = len(self.records)
        self._replaying = i < len(self.kept)
        self._n_tokens = 0
        self._starts: list[np.ndarray] = []
        self._n_docs = 0
        self._text = hashlib.blake2b(digest_size=16)
        if not self._replaying:
            self._path = os.path.join(self.out, shard_name(i))
            with writing(self._show(self._path)):
                self._f = open(self._path + TMP, "wb")
            self._sha = hashlib.sha256()

    def feed(self, lens: np.ndarray | None, tokens: np.ndarray | None, digests: bytes) -> None:
        """Documents in input order: the first skip_docs only check the kept shards (lens and tokens may be
        None for them), the rest are written (add)."""
        n = len(digests) // 16
        k = min(n, max(self.skip_docs - self._seen, 0))
        if k:
            self._replay(digests[:16 * k])
        self._seen += n
        if k < n:
            if lens is None or tokens is None:
                raise AssertionError("documents past the kept shards need their ids")
            lens = np.asarray(lens, dtype=np.int64)
            self.add(lens[k:], tokens[int(lens[:k].sum()):], digests[16 * k:])

    def _replay(self, digests: bytes) -> None:
        n, d = len(digests) // 16, 0
        while d < n:
            rec = self.kept[len(self.records)]
            k = min(n - d, rec["docs"] - self._n_docs)
            self._text.update(digests[16 * d:16 * (d + k)])
            self._n_docs += k
            d += k
            if self._n_docs == rec["docs"]:
                self._n_tokens = rec["tokens"]
                self._finish_shard()

    def add(self, lens: np.ndarray, tokens: np.ndarray, digests: bytes) -> None:
        """Append documents past the kept shards (ids concatenated), cutting shards by the rule."""
        d = t = 0  # documents and ids of this batch consumed so far
        while d < len(lens):
            need = self.shard_tokens - self._n_tokens
            ends = np.cumsum(lens[d:])
            k = int(np.searchsorted(ends, need)) + 1  # documents up to and including the one reaching `need`
            k = min(k, len(lens) - d)
            n = int(ends[k - 1])
            self._text.update(digests[16 * d:16 * (d + k)])
            chunk = np.ascontiguousarray(tokens[t:t + n], dtype=self.dtype)
            with writing(self._show(self._path)):
                self._f.write(chunk.data)
            self._sha.update(chunk.data)
            self._starts.append(self._n_tokens + np.concatenate(([0], ends[:k - 1])))
            self._n_tokens += n
            self._n_docs += k
            d, t = d + k, t + n
            if self._n_tokens >= self.shard_tokens:
                self._finish_shard()

    def _finish_shard(self) -> None:
        i = len(self.records)
        text = self._text.hexdigest()
        if self._replaying:
            rec = self.kept[i]
            if rec["text"] != text or rec["docs"] != self._n_docs:
                raise StaleShard(i)
        else:
            f, self._f = self._f, None
            with writing(self._show(self._path)):
                f.close()  # the buffer's last bytes: a full disk may show only here
            base = self._path[:-4]
            starts = np.concatenate(self._starts) if self._starts else np.zeros(0, np.int64)
            save_npy_atomic(base + ".docs.npy", starts.astype("<i8"), self._show(base + ".docs.npy"))
            with writing(self._show(self._path)):
                os.replace(self._path + TMP, self._path)
            rec = {"tokens": self._n_tokens, "docs": self._n_docs, "sha256": self._sha.hexdigest(), "text": text,
                   "settings": self.settings_hash}
            write_atomic(base + ".json", json.dumps(rec, indent=1).encode(), self._show(base + ".json"))
        self.records.append(rec)
        self._start_shard()

    def close_files(self) -> None:
        """Close and remove the shard being written (on an error: nothing half-written stays, also when the
        error, e.g. Ctrl-C or SIGTERM, came between closing it and renaming it)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        path = getattr(self, "_path", None)
        if path is not None and os.path.exists(path + TMP):
            os.remove(path + TMP)

    def finish(self, index: dict) -> dict:
        """Write the last shard, doc_offsets.npy and index.json (index gets the shard list and totals)."""
        if self._n_docs or not self.records:
            self._finish_shard()
        self.close_files()
        if len(self.records) < len(self.kept):  # the input now has fewer documents than before
            raise StaleShard(len(self.records))
        shards, tok0, doc0 = [], 0, 0
        for i, r in enumerate(self.records):
            shards.append({"file": shard_name(i), "tokens": r["tokens"], "docs": r["docs"], "first_token": tok0,
                           "first_doc": doc0, "sha256": r["sha256"]})
            tok0 += r["tokens"]
            doc0 += r["docs"]
        offsets_path = os.path.join(self.out, OFFSETS)
        try:
            with writing(self._show(offsets_path)):  # a memory map of a file the disk has no room for: SIGBUS, so allocated first
                with open(offsets_path + TMP, "wb") as f:
                    np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False,
                                                             "shape": (doc0 + 1,)})
                    _allocate(f, f.tell() + 8 * (doc0 + 1))
                offsets = np.lib.format.open_memmap(offsets_path + TMP, mode="r+")
                for s in shards:
                    starts = np.load(os.path.join(self.out, s["file"][:-4] + ".docs.npy"), mmap_mode="r")
                    offsets[s["first_doc"]:s["first_doc"] + s["docs"]] = starts + s["first_token"]
                offsets[doc0] = tok0
                offsets.flush()
                del offsets
                os.replace(offsets_path + TMP, offsets_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(offsets_path + TMP)
        index = {"format": FORMAT, "version": VERSION, **index, "tokens": tok0, "docs": doc0, "shards": shards,
                 "doc_offsets": OFFSETS}
        write_atomic(os.path.join(self.out, INDEX), (json.dumps(index, indent=1) + "\n").encode(),
                     os.path.join(self.shown, INDEX))
        return index


# --- reading ----------------------------------------------------------------------------------


@dataclass
class Dataset:
    """A prepared data set: memory-mapped shards, document boundaries, and an (x, y) window sampler."""

    path: str
    index: dict
    shards: list[np.ndarray]        # one read-only memmap per shard
    doc_offsets: np.ndarray         # int64, n_docs + 1: document i is ids [offsets[i], offsets[i+1])

    @property
    def n_tokens(self) -> int:
        return int(self.index["tokens"])

    @property
    def n_docs(self) -> int:
        return int(self.index["docs"])

    def __len__(self) -> int:
        return self.n_tokens

    def tokens(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Ids [start, stop) of all shards concatenated (a view when inside one shard, else a copy)."""
        stop = self.n_tokens if stop is None else stop
        parts = []
        for s, arr in zip(self.index["shards"], self.shards):
            lo, hi = max(start - s["first_token"], 0), min(stop - s["first_token"], s["tokens"])
            if lo < hi:
                parts.append(arr[lo:hi])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, self.shards[0].dtype if self.shards else np.uint32)

    def document(self, i: int) -> np.ndarray:
        """Ids of document i (its bos/eos and separator included), in input order."""
        if not 0 <= i < self.n_docs:
            raise MinillamaError(f"document {i} is outside this data set of {self.n_docs} documents")
        return self.tokens(int(self.doc_offsets[i]), int(self.doc_offsets[i + 1]))

    def sample(self, batch_size: int, block_size: int, rng: np.random.Generator | int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """batch_size random windows as (x, y) int64 arrays of shape (batch_size, block_size), y = x shifted
        by one (next-token targets). Windows lie inside one shard, shards drawn in proportion to their size."""
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        room = np.array([max(len(a) - block_size, 0) for a in self.shards], dtype=np.int64)
        if room.sum() == 0:
            raise MinillamaError(f"block_size {block_size} needs shards of more than {block_size} ids; the "
                                 f"largest here has {max((len(a) for a in self.shards), default=0)}")
        which = rng.choice(len(self.shards), size=batch_size, p=room / room.sum())
        x = np.empty((batch_size, block_size), np.int64)
        y = np.empty((batch_size, block_size), np.int64)
        for b, s in enumerate(which):
            i = int(rng.integers(0, room[s]))
            window = self.shards[s][i:i + block_size + 1]
            x[b], y[b] = window[:-1], window[1:]
        return x, y


def open_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open a directory written by prepare(): memmapped shards and document offsets (MinillamaError if not one)."""
    path = os.fspath(path)
    try:
        with open(os.path.join(path, INDEX), encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise MinillamaError(f"{path}: expected a prepared data set, found no {INDEX} (an unfinished run? run "
                             "'minillama dataset' again to resume)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise MinillamaError(f"{path}/{INDEX}: expected the index of a data set, found "
                             f"{'nesting too deep to read' if isinstance(exc, RecursionError) else exc}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise MinillamaError(f"{path}/{INDEX}: expected format {FORMAT!r}, found {index.get('format')!r}"
                             if isinstance(index, dict) else f"{path}/{INDEX}: expected a JSON object")
    dtype = check_index(path, index)  # types, bounds, names inside path, sizes: nothing below can fail
    shards = [np.memmap(os.path.join(path, s["file"]), dtype=dtype, mode="r") if s["tokens"] else np.zeros(0, dtype)
              for s in index["shards"]]
    offsets = load_offsets(path, index["docs"], index["tokens"])
    return Dataset(path, index, shards, offsets)

