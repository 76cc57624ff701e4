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
path, a symlink to it or a hard link of it), so a command cannot replace what it reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable

from .errors import ArgumentError, ArgumentTypeError, FormatError, InputError, OutputError

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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_output(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Have write(p) write the whole output to the path p it is given, then put it at path (see the module doc)."""
    shown = os.fspath(path)
    try:
        st = os.stat(shown)  # follows symlinks: what is written is the link's target
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"cannot write {shown!r}: expected a writable file path, found {e.strerror}") from None
    if st is not None and stat.S_ISCHR(st.st_mode):
        write(shown)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"cannot write {shown!r}: expected a regular file or a new path, found "
                          f"{file_kind(st.st_mode)}")
    target = os.path.realpath(shown)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write {shown!r}: expected an existing directory {os.path.dirname(shown) or '.'!r}"
                          f", found none")
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        except OSError as e:
            raise OutputError(f"cannot write {shown!r}: expected a writable directory, found {e.strerror}") from None
        os.close(fd)
        write(tmp)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
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
