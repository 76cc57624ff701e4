"""Output paths are written, not replaced (issue: `convert SRC /dev/null` replaced /dev/null, a symlinked
output lost its link): minillama.fileio.write_output and every command that writes a file."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support import REPO

from minillama.errors import MinillamaError, OutputError
from minillama.fileio import write_output
from minillama.tokenizer import default_vocab_path


def _writer(data: bytes):
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.write(data)
    return write


def test_new_path_is_written_with_umask_permissions(tmp_path: Path) -> None:
    out = tmp_path / "new.bin"
    write_output(out, _writer(b"abc"))
    assert out.read_bytes() == b"abc"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask
    assert os.listdir(tmp_path) == ["new.bin"]  # no temporary file left


def test_regular_file_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "old.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    write_output(out, _writer(b"new"))
    assert out.read_bytes() == b"new"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_symlink_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    write_output(link, _writer(b"new"))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new"


def test_dangling_symlink_writes_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.bin"
    link.symlink_to(tmp_path / "later.bin")
    write_output(link, _writer(b"x"))
    assert link.is_symlink() and (tmp_path / "later.bin").read_bytes() == b"x"


def test_character_device_is_written_directly(tmp_path: Path) -> None:
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a character device here ({e}); needs root")
    write_output(dev, _writer(b"discarded"))
    assert stat.S_ISCHR(dev.lstat().st_mode)


def test_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def run() -> None:
        try:
            write_output(fifo, _writer(b"x"))
        except BaseException as e:  # noqa: BLE001 - collected for the assertion below
            done.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    assert done and isinstance(done[0], OutputError), "write_output hung or did not refuse a FIFO"
    assert "FIFO" in str(done[0]) and str(fifo) in str(done[0])
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_directory_and_missing_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="expected a regular file or a new path, found a directory"):
        write_output(tmp_path, _writer(b"x"))
    with pytest.raises(OutputError, match="expected an existing directory"):
        write_output(tmp_path / "no" / "such.bin", _writer(b"x"))
    assert isinstance(OutputError("x"), MinillamaError)


def test_failed_write_leaves_old_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "keep.bin"
    out.write_bytes(b"precious")

    def fail(path: str) -> None:
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_output(out, fail)
    assert out.read_bytes() == b"precious" and os.listdir(tmp_path) == ["keep.bin"]


def test_existing_dot_tmp_file_is_not_touched(tmp_path: Path) -> None:
    (tmp_path / "out.gguf.tmp").write_bytes(b"user's own file")
    write_output(tmp_path / "out.gguf", _writer(b"x"))
    assert (tmp_path / "out.gguf.tmp").read_bytes() == b"user's own file"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "minillama", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_convert_through_symlink_and_into_fifo(tmp_path: Path) -> None:
    target = tmp_path / "vocab.gguf"
    target.write_bytes(b"")
    link = tmp_path / "link.gguf"
    link.symlink_to(target)
    p = _cli("convert", default_vocab_path(), str(link))
    assert p.returncode == 0, p.stderr
    assert link.is_symlink() and target.read_bytes()[:4] == b"GGUF"
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    p = _cli("convert", default_vocab_path(), str(fifo))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"cannot write '{fifo}'" in p.stderr and "FIFO" in p.stderr


# --- an output that is one of the inputs ------------------------------------------------------------

TEXT = "hello llamas and tokens\n\nhello again, llamas\n" * 20


def _same_file_cases(tmp_path: Path) -> list[tuple[list[str], str, str]]:
    """(command, input as typed, output as typed), run in tmp_path: the output is the input itself, a symlink to
    it or a hard link of it."""
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "link.txt").symlink_to("corpus.txt")
    os.link(tmp_path / "corpus.txt", tmp_path / "hard.txt")
    (tmp_path / "vocab.gguf").write_bytes(Path(default_vocab_path()).read_bytes())
    cases = []
    for out in ("corpus.txt", "link.txt", "hard.txt", "./corpus.txt"):
        cases += [(["train", "--vocab-size", "300", "--no-progress", "--out", out, "corpus.txt"], "corpus.txt", out),
                  (["train", "--vocab-size", "300", "--kind", "spm", "--no-progress", "--out", "t.gguf", "--llama2c",
                    out, "corpus.txt"], "corpus.txt", out),
                  (["ngram", "train", "--out", out, "corpus.txt"], "corpus.txt", out)]
    cases += [(["ngram", "train", "--model", "vocab.gguf", "--out", "vocab.gguf", "corpus.txt"], "vocab.gguf",
               "vocab.gguf"),
              (["convert", "vocab.gguf", "vocab.gguf"], "vocab.gguf", "vocab.gguf")]
    return cases


def test_no_command_writes_over_its_own_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train --out F F, train --llama2c F ... F, ngram train --out F F (and --model F), convert F F, also through a
    symlink or a hard link: exit 2 with one line naming both paths as typed; the input byte for byte as it was."""
    monkeypatch.chdir(tmp_path)
    for argv, inp, out in _same_file_cases(tmp_path):
        before = Path(inp).read_bytes()
        p = _cli(*argv)
        assert p.returncode == 2, (argv, p.stdout, p.stderr)
        assert p.stderr == (f"minillama: error: cannot write '{out}': expected an output that is not one of the "
                            f"inputs, found the same file as the input '{inp}'\n"), (argv, p.stderr)
        assert Path(inp).read_bytes() == before, argv
    assert not (tmp_path / "t.gguf").exists()  # refused before training, not after


def test_train_and_convert_say_what_they_wrote(tmp_path: Path) -> None:
    """Each path written, its size in bytes and the vocab size, on stdout."""
    from minillama.tokenizer import Tokenizer

    src = tmp_path / "corpus.txt"
    src.write_text(TEXT, encoding="utf-8")
    out, bin_ = tmp_path / "t.gguf", tmp_path / "t.bin"
    p = _cli("train", "--vocab-size", "300", "--kind", "spm", "--no-progress", "--out", str(out), "--llama2c",
             str(bin_), str(src))
    assert p.returncode == 0, p.stderr
    n = Tokenizer.from_file(out).n_vocab
    assert f"{out} ({out.stat().st_size:,} bytes), {bin_} ({bin_.stat().st_size:,} bytes)" in p.stdout
    assert f"vocab of {n:,} tokens" in p.stdout
    conv = tmp_path / "c.gguf"
    p = _cli("convert", default_vocab_path(), str(conv))
    assert p.returncode == 0, p.stderr
    n = Tokenizer.from_file(default_vocab_path()).n_vocab
    assert p.stdout.startswith(f"{conv}: ") and f"vocab of {n} tokens" in p.stdout
    assert f"{conv.stat().st_size:,} bytes" in p.stdout


# --- two outputs of one command that are one file ----------------------------------------------------

def _train_spm(out: str, bin_: str, *files: str) -> list[str]:
    return ["train", "--vocab-size", "300", "--kind", "spm", "--no-progress", "--out", out, "--llama2c", bin_, *files]


@pytest.mark.parametrize("same", ["X.gguf", "./X.gguf", "link.gguf", "hard.gguf", "sub/../X.gguf"])
@pytest.mark.parametrize("existing", [False, True])
def test_train_refuses_out_and_llama2c_that_are_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], same: str,
                                                         existing: bool) -> None:
    """train --out X --llama2c X (./X, a symlink to X, a hard link of X): the GGUF was written, then the tokenizer.bin
    over it, exit 0. Now: exit 2 before training, one line naming both options and both paths, X as it was."""
    from minillama.cli import main

    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(TEXT, encoding="utf-8")
    Path("sub").mkdir()
    Path("link.gguf").symlink_to("X.gguf")
    if existing:
        Path("X.gguf").write_bytes(b"previous")
        os.link("X.gguf", "hard.gguf")
    elif same == "hard.gguf":
        pytest.skip("a hard link needs an existing file")
    assert main(_train_spm("X.gguf", same, "corpus.txt")) == 2
    err = capsys.readouterr().err
    assert err == (f"minillama: error: cannot write '{same}': expected --llama2c to name another file than --out, "
                   f"found the same file as --out 'X.gguf'\n"), err
    assert (Path("X.gguf").read_bytes() == b"previous") if existing else not Path("X.gguf").exists()
    assert sorted(os.listdir()) == sorted(["corpus.txt", "sub", "link.gguf"]
                                          + (["X.gguf", "hard.gguf"] if existing else []))


def test_train_two_distinct_outputs_and_dev_null_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check refuses only one file named twice: two files, or /dev/null twice (nothing is replaced), pass."""
    from minillama.cli import main

    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(TEXT, encoding="utf-8")
    assert main(_train_spm("a.gguf", "a.bin", "corpus.txt")) == 0
    assert Path("a.gguf").read_bytes()[:4] == b"GGUF" and Path("a.bin").stat().st_size > 0
    assert main(_train_spm(os.devnull, os.devnull, "corpus.txt")) == 0


# --- a full disk -----------------------------------------------------------------------------

class _FullFile:
    """A file opened for writing on a disk with no room left: every write raises ENOSPC, as the kernel does."""

    def __init__(self, f) -> None:
        self._f = f

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def _full_disk(monkeypatch: pytest.MonkeyPatch, full: Callable[[str], bool]) -> None:
    """Every file opened for writing whose path full(path) accepts is on a full disk."""
    import builtins

    real_open = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and full(os.fspath(file)):
            return _FullFile(f)
        return f

    monkeypatch.setattr(builtins, "open", fake_open)


def test_train_full_disk_keeps_both_previous_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """train --llama2c on a disk that fills up while the tokenizer.bin is written: exit 2 naming t.bin and the full
    disk; t.gguf and t.bin as they were (the new GGUF was left behind), no temporary file."""
    from minillama.cli import main

    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(TEXT, encoding="utf-8")
    Path("t.gguf").write_bytes(b"old gguf")
    Path("t.bin").write_bytes(b"old bin")
    _full_disk(monkeypatch, lambda p: os.path.basename(p).startswith(".t.bin."))
    assert main(_train_spm("t.gguf", "t.bin", "corpus.txt")) == 2
    out = capsys.readouterr()
    assert out.err == "minillama: error: cannot write 't.bin': the disk is full (ENOSPC)\n", out.err
    assert Path("t.gguf").read_bytes() == b"old gguf" and Path("t.bin").read_bytes() == b"old bin"
    assert sorted(os.listdir()) == ["corpus.txt", "t.bin", "t.gguf"]
    # and new paths: neither file appears
    assert main(_train_spm("n.gguf", "n.bin", "corpus.txt")) == 0  # the n.* names are on the disk with room
    _full_disk(monkeypatch, lambda p: True)
    assert main(_train_spm("m.gguf", "m.bin", "corpus.txt")) == 2
    assert "cannot write 'm.gguf': the disk is full (ENOSPC)" in capsys.readouterr().err
    assert not Path("m.gguf").exists() and not Path("m.bin").exists()


def _full_disk_cases() -> list[tuple[list[str], str, str]]:
    """(argv run in a folder holding corpus.txt and vocab.gguf, what the paths on the full disk contain, the path the
    error must name)."""
    dataset = ["dataset", "--model", "vocab.gguf", "--out", "ds", "--workers", "1", "--no-progress", "corpus.txt"]
    return [(["train", "--vocab-size", "300", "--no-progress", "--out", "o.gguf", "corpus.txt"], "", "'o.gguf'"),
            (["convert", "vocab.gguf", "o.gguf"], "", "'o.gguf'"),
            (["ngram", "train", "--model", "vocab.gguf", "--out", "o.npz", "corpus.txt"], "", "'o.npz'"),
            (dataset, "", "'ds/.minillama-dataset'"),
            (dataset, "shard-", "'ds/shard-00000.bin'")]


@pytest.mark.parametrize("argv, full, named", _full_disk_cases(),
                         ids=["train", "convert", "ngram", "dataset-marker", "dataset-shard"])
def test_full_disk_error_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], argv: list[str], full: str,
                                        named: str) -> None:
    """Item 16: dataset, convert, train and ngram on a full disk exited 2 with a bare '[Errno 28] No space left on
    device'. Now: one line saying which file could not be written and that the disk is full; no temporary file."""
    from minillama.cli import main

    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(TEXT, encoding="utf-8")
    Path("vocab.gguf").write_bytes(Path(default_vocab_path()).read_bytes())
    before = sorted(os.listdir())
    _full_disk(monkeypatch, lambda p: full in p)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"minillama: error: cannot write {named}: the disk is full (ENOSPC)\n", err
    assert sorted(set(os.listdir()) - {"ds"}) == before
    if argv[0] == "dataset":  # no shard and no temporary file: at most the marker and the lock
        assert set(os.listdir("ds")) <= {".lock", ".minillama-dataset"}, os.listdir("ds")


def test_write_error_says_why(tmp_path: Path) -> None:
    """The shared helper: the path as typed, the reason in words and the errno's name; a MinillamaError."""
    from minillama.fileio import write_error

    for code, words in [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "the disk quota is exceeded"),
                        (errno.EROFS, "the file system is read-only"), (errno.EACCES, "permission denied")]:
        err = write_error("out/x.gguf", OSError(code, os.strerror(code)))
        assert isinstance(err, OutputError) and isinstance(err, MinillamaError)
        assert str(err) == f"cannot write 'out/x.gguf': {words} ({errno.errorcode[code]})"
