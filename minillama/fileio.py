"""Reading the input files and writing the output files a user names, safely.

Inputs: a path must be a str or os.PathLike without NUL and name a regular file (a missing file, a
directory, a FIFO that would block open() forever, a device such as /dev/zero that never ends are
refused with an `InputError` naming the path as typed); whole-file reads are bounded (MAX_READ_BYTES).

Outputs: writing a file the user named, without touching anything else.

The rule, plainly: a new path or a regular file is written atomically (to a temporary file beside
it, then renamed over it, keeping the old file's permissions), so an error or Ctrl-C leaves the
old file whole; a symlink is followed and its target written the same way, so the link stays a
link; a character device (/dev/null) is written directly, as any Unix tool does; a directory, FIFO,
socket or block device is refused with an `OutputError` naming the path as the user typed it.
An output is never one of the command's own inputs (`refuse_input_as_output`, os.path.samefile: the same
path, a symlink to it or a hard link of it), so a command cannot replace what it reads, and two outputs of one
command are never one file (`refuse_same_outputs`). Outputs written inside `all_or_nothing()` are renamed into
place together when every one was written, or none is. An OSError while writing (a full disk, a quota, a
read-only file system) becomes an `OutputError` naming the path and the reason (`write_error`).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping

from .errors import ArgumentError, ArgumentTypeError, FormatError, InputError, MinillamaError, OutputError

_KINDS = {stat.S_ISREG: "a regular file", stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO (named pipe)",
          stat.S_ISSOCK: "a socket", stat.S_ISBLK: "a block device", stat.S_ISCHR: "a character device"}


def file_kind(mode: int) -> str:
    """What a stat mode names, for messages: 'a regular file', 'a directory', 'a FIFO (named pipe)', ..."""
    return next((name for test, name in _KINDS.items() if test(mode)), "a special file")


MAX_READ_BYTES = 1 << 28  # whole-text reads (stdin, a file to tokenize or count); larger data: `minillama dataset`


def input_path(path: object, what: str = "file") -> str:
    """path as a str, checked to name a regular file that can be read (InputError, ArgumentError otherwise)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"expected a path (str or os.PathLike) for the {what}, found {type(path).__name__}")
    shown = os.fspath(path)
    if isinstance(shown, bytes):
        shown = os.fsdecode(shown)
    if "\0" in shown:
        raise ArgumentError(f"expected a path without NUL characters for the {what}, found {shown!r}")
    try:
        st = os.stat(shown)
    except FileNotFoundError:
        raise InputError(f"cannot read {shown!r}: expected a {what}, found no such file") from None
    except OSError as e:
        raise InputError(f"cannot read {shown!r}: expected a readable {what}, found {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"cannot read {shown!r}: expected a regular {what}, found {file_kind(st.st_mode)}")
    if not os.access(shown, os.R_OK):
        raise InputError(f"cannot read {shown!r}: expected a readable {what}, found no read permission")
    return shown


def read_input(path: str, what: str = "file", limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a file ('-': standard input), at most limit of them (InputError past that)."""
    if path == "-":
        data = sys.stdin.buffer.read(limit + 1)
        shown = "standard input"
    else:
        shown = repr(input_path(path, what))
        if os.path.getsize(path) > limit:
            raise InputError(f"cannot read {shown}: expected at most {limit:,} bytes, found {os.path.getsize(path):,}")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"cannot read {shown}: expected at most {limit:,} bytes, found more")
    return data


def utf8_error(exc: UnicodeDecodeError, shown: str, start: int = 0) -> FormatError:
    """The one way a text input that is not UTF-8 is reported: the byte, its offset, the path as typed."""
    bad = exc.object[exc.start:exc.start + 1]
    return FormatError(f"expected UTF-8 text, found byte 0x{bad.hex()} that is not ({exc.reason})", path=shown,
                       offset=start + exc.start)


def read_text(path: str, what: str = "text file") -> str:
    """A whole UTF-8 text file ('-': standard input), bounded as read_input; FormatError (utf8_error) if not UTF-8."""
    data = read_input(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise utf8_error(exc, "standard input" if path == "-" else path) from None


def refuse_input_as_output(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """OutputError when out is the same file as one of inputs (os.path.samefile: the same path, through a
    symlink or a hard link), checked before any work so that a command never replaces what it reads.
    '-' (standard input), None and paths that do not exist yet are skipped."""
    shown = os.fspath(out)
    try:
        out_st = os.stat(shown)
    except OSError:  # a new path (or one write_output will refuse with its own message)
        return
    for path in inputs:
        if path is None or os.fspath(path) == "-":
            continue
        try:
            same = os.path.samestat(os.stat(path), out_st)  # os.path.samefile, with out's stat taken once
        except OSError:
            continue
        if same:
            raise OutputError(f"cannot write {shown!r}: expected an output that is not one of the inputs, found "
                              f"the same file as the input {os.fspath(path)!r}")


def refuse_same_outputs(outputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """OutputError when two of a command's outputs ({option: path}) are one file: the same real path (os.path.realpath:
    './X', a symlink to X) or, both existing, os.path.samefile (a hard link). Checked before any work, so that the
    second output can never be written over the first. None is skipped; so is a character device (/dev/null: both
    writes go to it, nothing is replaced)."""
    seen: list[tuple[str, str, str, os.stat_result | None]] = []
    for option, path in outputs.items():
        if path is None:
            continue
        shown = os.fspath(path)
        try:
            st: os.stat_result | None = os.stat(shown)
        except OSError:
            st = None
        if st is not None and stat.S_ISCHR(st.st_mode):
            continue
        real = os.path.realpath(shown)
        for other, other_shown, other_real, other_st in seen:
            if real == other_real or (st is not None and other_st is not None and os.path.samestat(st, other_st)):
                raise OutputError(f"cannot write {shown!r}: expected {option} to name another file than {other}, "
                                  f"found the same file as {other} {other_shown!r}")
        seen.append((option, shown, real, st))


#: Why a write failed, said plainly, for the errno values a user can do something about.
_WRITE_REASONS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                  errno.EROFS: "the file system is read-only", errno.EFBIG: "the file is too large for the file system",
                  errno.EIO: "an input/output error on the device"}


def write_error(shown: str, exc: OSError) -> OutputError:
    """The OutputError of an OSError while writing the output shown (the path as the user typed it): the path, the
    reason and the errno name, e.g. "cannot write 'out.gguf': the disk is full (ENOSPC)"."""
    code = errno.errorcode.get(exc.errno or 0)
    reason = _WRITE_REASONS.get(exc.errno or 0) or exc.strerror or str(exc) or type(exc).__name__
    err = OutputError(f"cannot write {shown!r}: {reason}" + (f" ({code})" if code else ""))
    err.errno = exc.errno  # type: ignore[attr-defined]  # for callers that tell a full disk from the rest
    return err


@contextlib.contextmanager
def writing(shown: str) -> Iterator[None]:
    """Turn an OSError raised inside into write_error(shown, ...): the one way a failed write is reported (an
    error minillama raised on purpose, e.g. an InputError, passes as it is)."""
    try:
        yield
    except MinillamaError:
        raise
    except OSError as exc:
        raise write_error(shown, exc) from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: The outputs written so far inside all_or_nothing(): (temporary file, target, path as typed); None outside.
_PENDING: contextvars.ContextVar[list[tuple[str, str, str]] | None] = contextvars.ContextVar("_PENDING", default=None)


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Outputs written by write_output inside stay in their temporary files beside their targets; when the block
    ends without an error they are renamed into place together, else removed: a failure (a full disk on the second
    output, Ctrl-C) leaves every previous file as it was and no new one. Two outputs with one target are refused."""
    if _PENDING.get() is not None:  # nested: the outer block commits
        yield
        return
    pending: list[tuple[str, str, str]] = []
    token = _PENDING.set(pending)
    done = 0
    try:
        yield
        for tmp, target, shown in pending:
            with writing(shown):
                os.replace(tmp, target)
            done += 1
    finally:
        _PENDING.reset(token)
        for tmp, _, _ in pending[done:]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def write_output(path: str | os.PathLike[str], write: Callable[[str], None], shown: str | None = None) -> None:
    """Have write(p) write the whole output to the path p it is given, then put it at path (see the module doc);
    an OSError while writing is an OutputError naming shown (the path as the user typed it; default: path)."""
    path = os.fspath(path)
    shown = path if shown is None else shown
    try:
        st = os.stat(path)  # follows symlinks: what is written is the link's target
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"cannot write {shown!r}: expected a writable file path, found {e.strerror}") from None
    if st is not None and stat.S_ISCHR(st.st_mode):
        with writing(shown):
            write(path)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"cannot write {shown!r}: expected a regular file or a new path, found "
                          f"{file_kind(st.st_mode)}")
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write {shown!r}: expected an existing directory {os.path.dirname(shown) or '.'!r}"
                          f", found none")
    pending = _PENDING.get()
    if pending is not None:
        for _, other, other_shown in pending:
            if other == target:
                raise OutputError(f"cannot write {shown!r}: expected another file than the output "
                                  f"{other_shown!r} written just before, found the same file")
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise write_error(shown, e) from e
            raise OutputError(f"cannot write {shown!r}: expected a writable directory, found {e.strerror}") from None
        os.close(fd)
        with writing(shown):
            write(tmp)
            os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
            if pending is not None:  # all_or_nothing() renames it with the others
                pending.append((tmp, target, shown))
                tmp = None
                return
            os.replace(tmp, target)
    finally:  # also when an interrupt comes between mkstemp and write
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


#: What a blank line may hold besides its newline, and the cut between paragraphs: a line of only these.
BLANK = " \t\r\f\v"
PARAGRAPH_CUT = re.compile(r"\n[ \t\r\f\v]*\n")


def paragraphs(text: str) -> list[str]:
    """text cut at blank lines into non-empty paragraphs, each stripped of newlines at both ends: the one
    paragraph cut (n-gram training documents, `minillama dataset --docs paragraph`)."""
    return [p.strip("\n") for p in PARAGRAPH_CUT.split(text) if p.strip()]
