"""Readers: input files -> documents (str), streamed in input order, with bad records named by file and line.

Formats, recognised by extension (or forced with fmt=):

* text (any other name): one document per file, per paragraph or per line (`docs=`). Paragraphs are
  cut at blank lines exactly as `minillama.fileio.paragraphs` cuts them (a line of only spaces/tabs/CR
  between two newlines; each paragraph stripped of newlines; blank paragraphs dropped), streamed: a
  file is never in memory whole. Paragraphs of UTF-8 text are cut by that regex, in chunks of whole
  paragraphs (TextChunk) that an engine's workers split themselves; from a block that is not UTF-8 on,
  the file is read line by line, which names the bad line. Lines are cut at b"\\n" only.
* JSONL (.jsonl, .ndjson, .json): one JSON object per line; the document is its `text_field` (a string).
  Blank lines are skipped.
* Parquet (.parquet, .pq): the `text_field` column, read a batch of rows at a time (pyarrow, imported
  only here).

Documents with no text (empty or only whitespace) are skipped in every format: they carry nothing to
learn, and a data set of separators alone is not what anyone wants.

A bad record (bytes that are not UTF-8, a JSONL line that is not an object or lacks the field or holds a
non-string, a null Parquet value) raises BadRecordError naming the file as the user typed it and the
line (1-based) or row (0-based, as pyarrow counts); with skip_bad=True it is skipped and counted
instead (a bad line in a paragraph or file document drops that whole document). A file that cannot be
read at all (missing, a Parquet file without the column) always raises.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from ..backend import backend_choice, native_core
from ..errors import MinillamaError
from ..fileio import BLANK, PARAGRAPH_CUT, paragraphs

DOC_MODES = ("paragraph", "line", "file")
FORMATS = ("auto", "text", "jsonl", "parquet")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
MAX_EXAMPLES = 10  # bad records kept by name in the index
# A document longer than this (UTF-8 bytes) is a bad record: encoding holds a document whole, at up to
# 25-40 bytes of memory per byte when the tokenizer finds no cut in it (encoders/base.py), so without a cap
# one endless line would take all memory. Such lines are read past in blocks, never held whole.
MAX_DOC_BYTES = 16 << 20
# The most max_doc_bytes may be raised to: a document that long would take 25-40 TiB to encode, past any
# machine's memory (and Python's readline takes no size beyond an index-sized integer).
DOC_BYTES_CEILING = 1 << 40


class BadRecordError(MinillamaError, ValueError):
    """A record the reader cannot turn into a document; names the file and the line or row."""

    def __init__(self, path: str, where: str, what: str) -> None:
        super().__init__(f"{path}, {where}: {what}")
        self.path, self.where, self.what = path, where, what

    def __reduce__(self):  # picklable across process pools and Ray
        return BadRecordError, (self.path, self.where, self.what)


@dataclass
class BadRecords:
    """How many records were skipped (skip_bad=True) and the first few of them by name."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, err: BadRecordError) -> None:
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(str(err))


def file_format(path: str, fmt: str = "auto") -> str:
    """'text', 'jsonl' or 'parquet' for path (by extension when fmt is 'auto')."""
    if fmt != "auto":
        return fmt
    return EXTENSIONS.get(os.path.splitext(path)[1].lower(), "text")


def _utf8(raw: bytes, path: str, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecordError(path, where, f"expected UTF-8 text, found byte 0x{raw[exc.start]:02x} at column "
                             f"{exc.start + 1} that is not ({exc.reason})") from None


def _lines(path: str, data: bytes | None = None, limit: int = MAX_DOC_BYTES
           ) -> Iterator[tuple[int, bytes | None, bool]]:
    """(line number, line without its b"\\n", whether a b"\\n" ended it), streamed from the file at path,
    or from data (the file's bytes, already read: the Ray engine's read_binary_files). A UTF-8 BOM that
    starts the file is dropped (utf-8-sig). A line of more than limit bytes comes as None, read past in
    blocks of at most limit bytes."""
    with open(path, "rb") if data is None else io.BytesIO(data) as f:
        if f.read(3) != codecs.BOM_UTF8:
            f.seek(0)
        n = 0
        while raw := f.readline(limit + 1):
            n += 1
            newline = raw.endswith(b"\n")
            if newline:
                raw = raw[:-1]
            if len(raw) > limit:
                while not newline and (rest := f.readline(limit + 1)):
                    newline = rest.endswith(b"\n")
                yield n, None, newline
            else:
                yield n, raw, newline


def too_long(path: str, where: str, limit: int) -> BadRecordError:
    """The bad record of a document over the size cap (MAX_DOC_BYTES unless max_doc_bytes says otherwise)."""
    return BadRecordError(path, where, f"expected a document of at most {limit:,} bytes (max_doc_bytes, "
                          "--max-doc-mib), found a longer one")


# fileio.paragraphs' cut, as one regex: a blank line with a newline on both sides (non-overlapping matches)
_PARAGRAPH_CUT_BYTES = re.compile(PARAGRAPH_CUT.pattern.encode())
# A chunk of a file may end at a cut right after a character that no cut can hold (neither a newline nor a
# blank): no cut of the whole-file scan covers that character, so the scan reaches the newline after it
# afresh, and the cut it makes there (greedy, ending at the second newline) is this one.
_NOT_CONTENT = frozenset(b"\n" + BLANK.encode())
_BLOCK = 1 << 20


@dataclass(frozen=True)
class TextChunk:
    """A run of whole paragraphs of a UTF-8 text file: bytes start..start+len(data) of path, ending where a
    paragraph cut of the whole file ends (or at its end). Its documents are the file's documents there, so
    a chunk is split where it is encoded (an engine's worker), and the reading process does nothing per
    document."""

    path: str
    start: int
    data: bytes

    def documents(self) -> list[str]:
        """fileio.paragraphs of the chunk's text: cut in the native core where it is built and the backend allows it
        (the GIL released meanwhile: worker threads cut their chunks in parallel), else here."""
        core = native_core(backend_choice())
        if core is not None and (docs := core.paragraphs(self.data)) is not None:
            return docs
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError as exc:  # checked when read: the file changed meanwhile
            raise BadRecordError(self.path, f"byte {self.start + exc.start}", "expected UTF-8 text, found a byte "
                                 "that is not (the file changed while it was read?)") from None
        return paragraphs(text)


def _last_chunk_end(block: bytes) -> int | None:
    """Where the last cut of block that a chunk may end at ends (None: there is none). The tail is searched
    first, a window twice as large each time (the regex starts at a newline: a fast scan in C)."""
    n = len(block)
    lo = n
    while lo > 0:
        lo = max(n - 2 * (n - lo) - 4096, 0)
        end = None
        for m in _PARAGRAPH_CUT_BYTES.finditer(block, lo):
            if m.start() > 0 and block[m.start() - 1] not in _NOT_CONTENT:
                end = m.end()
        if end is not None:
            return end
    return None


class _LongParagraph(Exception):
    """paragraph_chunks found no cut in more than the size cap: the line reader takes over (and names it)."""


def paragraph_chunks(path: str, size: int | None = None, limit: int = MAX_DOC_BYTES) -> Iterator[TextChunk]:
    """A file of paragraph documents as TextChunks of about size bytes (default _BLOCK), in order; raises
    UnicodeDecodeError at the first block that is not UTF-8, before any chunk holding part of it.

    Each chunk ends at a cut that _last_chunk_end finds inside one block read from the file, so chunks are cut
    only where the whole file is cut too: the documents of the chunks, in order, are the file's. A cut
    that straddles two blocks is passed over (a later one serves), and a file without any is one chunk.
    Only bytes are looked at here (the cut is ASCII, so it never splits a character); the UTF-8 check is
    the decoder's, in C. A UTF-8 BOM that starts the file is not text (utf-8-sig). Raises _LongParagraph
    when a chunk would be longer than limit bytes (it may hold a paragraph over the cap), before holding more."""
    size = size or _BLOCK
    check = codecs.getincrementaldecoder("utf-8")().decode
    parts: list[bytes] = []
    held = 0
    with open(path, "rb") as f:
        start = 3 if f.read(3) == codecs.BOM_UTF8 else 0
        f.seek(start)
        while block := f.read(size):
            check(block)
            end = _last_chunk_end(block)
            if end is None:
                parts.append(block)
                held += len(block)
                if held > limit:
                    raise _LongParagraph
                continue
            parts.append(block[:end])
            data = b"".join(parts)
            if len(data) > limit:  # it may hold a paragraph over the cap
                raise _LongParagraph
            yield TextChunk(path, start, data)
            start += len(data)
            parts = [block[end:]]
            held = len(parts[0])
    check(b"", True)
    data = b"".join(parts)
    if len(data) > limit:
        raise _LongParagraph
    if data:
        yield TextChunk(path, start, data)


def paragraph_units(path: str, bad: BadRecords | None, size: int | None = None,
                     limit: int = MAX_DOC_BYTES) -> Iterator[str | TextChunk]:
    """The paragraph documents of a text file: TextChunks (paragraph_chunks) while the file is UTF-8 and
    cut; from a block that is not UTF-8, or a paragraph over limit bytes, the line reader's documents (which
    name the bad line) past those the chunks hold. The file is read once when it is UTF-8 throughout and
    cut, with no work per document."""
    done = 0  # bytes given as chunks
    try:
        for chunk in paragraph_chunks(path, size, limit):
            yield chunk
            done = chunk.start + len(chunk.data)
        return
    except (UnicodeDecodeError, _LongParagraph):
        pass
    given = 0  # documents in those chunks: the same chunks read again, not kept
    try:
        for chunk in paragraph_chunks(path, size, limit):
            if chunk.start >= done:
                break
            given += len(chunk.documents())
    except (UnicodeDecodeError, _LongParagraph):
        pass
    yield from islice(_line_docs(path, "paragraph", bad, limit=limit), given, None)


def text_docs(path: str, docs: str, bad: BadRecords | None, data: bytes | None = None,
              limit: int = MAX_DOC_BYTES) -> Iterator[str]:
    """Documents of a text file: per line, per paragraph (fileio.paragraphs' cut, streamed) or the whole file.

    A paragraph is cut at a blank line that has a newline on both sides and does not follow another cut
    line: the non-overlapping matches of r"\\n[ \\t\\r\\f\\v]*\\n", found line by line.
    A document of more than limit bytes is a bad record.
    """
    if docs == "paragraph" and data is None:  # the common case, without a line loop while the text is UTF-8
        for unit in paragraph_units(path, bad, limit=limit):
            if isinstance(unit, str):
                yield unit
            else:
                yield from unit.documents()
        return
    yield from _line_docs(path, docs, bad, data, limit)


def _line_docs(path: str, docs: str, bad: BadRecords | None, data: bytes | None = None,
               limit: int = MAX_DOC_BYTES) -> Iterator[str]:
    """text_docs, read line by line (any bytes: a line that is not UTF-8 is a bad record, and so is a
    document of more than limit bytes, whose lines are not kept)."""
    buf: list[str] = []
    held = 0  # bytes of the lines in buf, with their newlines
    err: BadRecordError | None = None
    prev_cut = False

    def emit() -> Iterator[str]:
        nonlocal err, held
        if err is not None:
            if bad is None:
                raise err
            bad.add(err)
            err = None
        else:
            text = "\n".join(buf).strip("\n")
            if text.strip():
                yield text
        buf.clear()
        held = 0

    for n, raw, newline in _lines(path, data, limit):
        try:
            if raw is None or held + len(raw) > limit:
                raise too_long(path, f"line {n}", limit)
            line = _utf8(raw, path, f"line {n}")
            held += len(raw) + 1
        except BadRecordError as exc:
            if err is None:
                err = exc
            line = "\x00"  # stands for content; never a blank line
        if docs == "line":
            buf.append(line)
            yield from emit()
        elif docs == "paragraph" and n > 1 and newline and not line.strip(BLANK) and not prev_cut:
            yield from emit()
            prev_cut = True
        else:
            buf.append(line)
            prev_cut = False
    yield from emit()


def jsonl_docs(path: str, text_field: str, bad: BadRecords | None, data: bytes | None = None,
               limit: int = MAX_DOC_BYTES) -> Iterator[str]:
    """The text_field strings of a JSONL file's objects, one a line (a line over limit bytes is a bad record)."""
    for n, raw, _ in _lines(path, data, limit):
        if raw is not None and not raw.strip():
            continue
        try:
            where = f"line {n}"
            if raw is None:
                raise too_long(path, where, limit)
            line = _utf8(raw, path, where)
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise BadRecordError(path, where, f"expected a JSON object, found invalid JSON ({exc})") from None
            except RecursionError:
                raise BadRecordError(path, where, "expected a JSON object, found one nested too deeply to "
                                     "read") from None
            if not isinstance(rec, dict):
                raise BadRecordError(path, where, f"expected a JSON object, found a {type(rec).__name__}")
            if text_field not in rec:
                keys = ", ".join(map(repr, list(rec)[:8])) or "none"
                raise BadRecordError(path, where, f"no field {text_field!r} (fields: {keys})")
            text = rec[text_field]
            if not isinstance(text, str):
                raise BadRecordError(path, where, f"field {text_field!r} is {type(text).__name__}, expected a string")
        except BadRecordError as exc:
            if bad is None:
                raise
            bad.add(exc)
            continue
        if text.strip():
            yield text


def parquet_column(path: str, text_field: str):
    """A pyarrow ParquetFile, after checking it has a string column text_field (MinillamaError otherwise)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MinillamaError(f"{path}: reading Parquet needs pyarrow: pip install \".[parquet]\" in a checkout of minillama") from None
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise MinillamaError(f"{path}: expected a Parquet file, found one pyarrow cannot read ({exc})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise MinillamaError(f"{path}: expected a column {text_field!r}, found only "
                             f"{', '.join(map(repr, schema.names)) or 'no columns'}")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise MinillamaError(f"{path}: column {text_field!r} is {kind}, expected strings")
    return pf


def over_limit(text: str, limit: int) -> bool:
    """Whether text is more than limit bytes of UTF-8 (encoded only when it may be)."""
    return len(text) > limit or (len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit)


def _parquet_batches(pf, path: str, text_field: str) -> Iterator:
    """pf's record batches of column text_field; a page pyarrow cannot read (corrupt, cut short) is a
    MinillamaError naming the file and the row reached, not a bare ArrowInvalid."""
    import pyarrow as pa

    it = pf.iter_batches(batch_size=4096, columns=[text_field])
    row = 0
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise MinillamaError(f"{path}: expected Parquet pages pyarrow can read, found a damaged one at or after "
                                 f"row {row} ({exc})") from None
        row += batch.num_rows
        yield batch


def _parquet_docs(path: str, text_field: str, bad: BadRecords | None, limit: int) -> Iterator[str]:
    pf = parquet_column(path, text_field)
    row = 0
    for batch in _parquet_batches(pf, path, text_field):
        for text in batch.column(0).to_pylist():
            if text is None or over_limit(text, limit):
                exc = (too_long(path, f"row {row}", limit) if text is not None else
                       BadRecordError(path, f"row {row}", f"column {text_field!r} is null, expected a string"))
                if bad is None:
                    raise exc
                bad.add(exc)
            elif text.strip():
                yield text
            row += 1


@dataclass
class Source:
    """What to read: the files, in order, and how to cut them into documents."""

    paths: Sequence[str]
    docs: str = "paragraph"
    text_field: str = "text"
    fmt: str = "auto"
    skip_bad: bool = False
    max_doc_bytes: int = MAX_DOC_BYTES  # a longer document is a bad record

    def check(self) -> None:
        """Fail early, before anything is written, on settings or files that cannot work."""
        if not self.paths:
            raise MinillamaError("no input files given")
        if self.docs not in DOC_MODES:
            raise MinillamaError(f"docs must be one of {', '.join(DOC_MODES)}, got {self.docs!r}")
        if self.fmt not in FORMATS:
            raise MinillamaError(f"format must be one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if (isinstance(self.max_doc_bytes, bool) or not isinstance(self.max_doc_bytes, int)
                or not 1 <= self.max_doc_bytes <= DOC_BYTES_CEILING):
            raise MinillamaError(f"max_doc_bytes must be a whole number from 1 to {DOC_BYTES_CEILING:,} (1 TiB), got "
                                 f"{self.max_doc_bytes!r}")
        for p in self.paths:
            if not os.path.isfile(p):
                raise MinillamaError(f"{p}: no such file")
            if file_format(p, self.fmt) == "parquet":
                parquet_column(p, self.text_field)

    def documents(self, bad: BadRecords | None = None) -> Iterator[str]:
        """Every document of every file, in order. bad collects skipped records when skip_bad is set."""
        for unit in self.units(bad):
            if isinstance(unit, str):
                yield unit
            else:
                yield from unit.documents()

    def units(self, bad: BadRecords | None = None, chunk_bytes: int | None = None) -> Iterator[str | TextChunk]:
        """documents(), where a UTF-8 text file read by paragraph comes as TextChunks of about
        chunk_bytes bytes instead (each splits into its documents by itself): a reader that hands work to other
        processes then does nothing per document."""
        if self.skip_bad and bad is None:
            bad = BadRecords()
        sink = bad if self.skip_bad else None
        limit = self.max_doc_bytes
        for p in self.paths:
            kind = file_format(p, self.fmt)
            if kind == "jsonl":
                yield from jsonl_docs(p, self.text_field, sink, limit=limit)
            elif kind == "parquet":
                yield from _parquet_docs(p, self.text_field, sink, limit)
            elif self.docs == "paragraph":
                yield from paragraph_units(p, sink, chunk_bytes, limit)
            else:
                yield from text_docs(p, self.docs, sink, limit=limit)
