"""Writing an output file the user named, without touching anything else.

The rule, plainly: a new path or a regular file is written atomically (to a temporary file beside
it, then renamed over it, keeping the old file's permissions), so an error or Ctrl-C leaves the
old file whole; a symlink is followed and its target written the same way, so the link stays a
link; a character device (/dev/null) is written directly, as any Unix tool does; a directory, FIFO,
socket or block device is refused with an `OutputError` naming the path as the user typed it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable

from .errors import OutputError

_KINDS = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket",
          stat.S_ISBLK: "a block device"}


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
        kind = next((name for test, name in _KINDS.items() if test(st.st_mode)), "not a regular file")
        raise OutputError(f"cannot write {shown!r}: expected a regular file or a new path, found {kind}")
    target = os.path.realpath(shown)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write {shown!r}: expected an existing directory {os.path.dirname(shown) or '.'!r}"
                          f", found none")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"cannot write {shown!r}: expected a writable directory, found {e.strerror}") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
