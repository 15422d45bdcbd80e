"""Output files (pyq2.atomic and the output side of pyq2.offline.repack): complete or absent, never
a temporary left, special files refused, symlinks kept, races decided by the file system, and
errors that name the path the user gave."""

import errno
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyq2 import atomic
from pyq2.cli import main
from pyq2.errors import RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf.io import OutTensor
from pyq2.offline.repack import repack
from pyq2.offline.verify import verify

from .conftest import listing, random_pq2, write_gguf_file


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- atomic_output ------------------------------------------------------------------------


def test_output_appears_only_when_complete(tmp_path):
    out = tmp_path / "o.bin"
    with atomic.atomic_output(out, force=False) as staged:
        assert os.path.dirname(os.path.dirname(staged)) == str(tmp_path)
        (temp,) = [n for n in os.listdir(tmp_path)]
        assert temp.startswith(f".o.bin.pyq2-{os.getpid()}-") and temp.endswith(".tmp")
        with open(staged, "wb") as f:
            f.write(b"new")
        assert not out.exists()
    assert out.read_bytes() == b"new" and listing(tmp_path) == ["o.bin"]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_failure_leaves_nothing(tmp_path, error):
    out = tmp_path / "o.bin"
    with pytest.raises(error), atomic.atomic_output(out, force=True) as staged:
        with open(staged, "wb") as f:
            f.write(b"half")
        raise error
    assert listing(tmp_path) == []


def test_two_writers_without_force_exactly_one_wins(tmp_path):
    """Both threads pass every early check and write; the hard link that publishes a file lets
    only the first in."""
    out, barrier, results = tmp_path / "o.bin", threading.Barrier(2), {}

    def write(tag):
        try:
            with atomic.atomic_output(out, force=False) as staged:
                with open(staged, "wb") as f:
                    f.write(tag.encode())
                barrier.wait()
            results[tag] = "won"
        except RepackError as e:
            results[tag] = str(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = out.read_text()
    assert results[winner] == "won"
    assert results["ab".replace(winner, "")] == f"output {out} exists (use --force to overwrite)"
    assert listing(tmp_path) == ["o.bin"]


@pytest.mark.parametrize("existing", [False, True])
def test_file_system_without_hard_links(tmp_path, monkeypatch, existing):
    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted", src, None, dst)

    monkeypatch.setattr(os, "link", no_link)
    out = tmp_path / "o.bin"
    if existing:
        out.write_bytes(b"old")
        with pytest.raises(RepackError, match="exists"), atomic.atomic_output(out, False) as st:
            open(st, "wb").close()
        assert out.read_bytes() == b"old"
    else:
        with atomic.atomic_output(out, False) as staged:
            with open(staged, "wb") as f:
                f.write(b"new")
        assert out.read_bytes() == b"new"
    assert listing(tmp_path) == ["o.bin"]


def test_stale_temporaries(tmp_path):
    """Removed: a dead writer's, and one carrying this pid that no writer of this process holds.
    Kept: a live process's, another output's, and anything that only looks similar."""
    gone = dead_pid()
    names = {
        "dead": f".o.bin.pyq2-{gone}-abcd1234.tmp",
        "mine": f".o.bin.pyq2-{os.getpid()}-old00000.tmp",
        "live": f".o.bin.pyq2-{os.getppid()}-live0000.tmp",
        "other": f".p.bin.pyq2-{gone}-abcd1234.tmp",
        "odd": f".o.bin.pyq2-{gone}.tmp",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / ".o.bin.x1.tmp").write_bytes(b"half")
    lines = []
    with atomic.atomic_output(tmp_path / "o.bin", force=False, notice=lines.append) as staged:
        open(staged, "wb").close()
    removed = {k for k, n in names.items() if not (tmp_path / n).exists()}
    assert removed == {"dead", "mine"}
    assert sorted(lines) == sorted(
        f"removed stale temporary {tmp_path / names[k]} (its writer, pid {pid}, is gone)"
        for k, pid in [("dead", gone), ("mine", os.getpid())]
    )


def _victim(tmp_path):
    """A directory elsewhere with a file that no cleanup may touch."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep me")
    (victim / ".o.bin.x1.tmp").write_bytes(b"also mine")  # a name a writer would use
    return victim


def test_stale_cleanup_never_follows_a_symlink_swapped_in(tmp_path, monkeypatch):
    """The race forced: between the moment the cleanup decides a temporary is stale and its
    removal, another user swaps the temporary for a symlink to a directory elsewhere. The
    cleanup leaves the link (and everything it points to) alone and says so."""
    out_dir = tmp_path / "shared"
    out_dir.mkdir()
    victim = _victim(tmp_path)
    stale = out_dir / f".o.bin.pyq2-{dead_pid()}-abcd1234.tmp"
    stale.mkdir()
    (stale / ".o.bin.x1.tmp").write_bytes(b"half")
    orphaned = atomic._orphaned

    def swap_then_answer(path, pid):  # runs after the name check, before the removal
        answer = orphaned(path, pid)
        (stale / ".o.bin.x1.tmp").unlink()
        stale.rmdir()
        stale.symlink_to(victim)
        return answer

    monkeypatch.setattr(atomic, "_orphaned", swap_then_answer)
    lines = []
    assert atomic.remove_stale(str(out_dir), "o.bin", lines.append) == []
    assert listing(victim) == [".o.bin.x1.tmp", "precious"]
    assert stale.is_symlink()
    assert lines == [f"left {stale} alone: a symlink, not a directory pyq2 made"]


def test_stale_cleanup_swap_after_the_directory_is_opened(tmp_path, monkeypatch):
    """The swap one step later: the directory is already open when its name becomes a symlink.
    The files are unlinked by the descriptor, so only the real temporary's files go."""
    out_dir = tmp_path / "shared"
    out_dir.mkdir()
    victim = _victim(tmp_path)
    stale = out_dir / f".o.bin.pyq2-{dead_pid()}-abcd1234.tmp"
    stale.mkdir()
    (stale / ".o.bin.x1.tmp").write_bytes(b"half")
    moved = out_dir / "moved-away"
    real_fstat = os.fstat

    def swap_on_fstat(fd):  # _remove_dir checks the opened directory with fstat
        st = real_fstat(fd)
        if stat.S_ISDIR(st.st_mode) and stale.is_dir() and not stale.is_symlink():
            stale.rename(moved)
            stale.symlink_to(victim)
        return st

    monkeypatch.setattr(os, "fstat", swap_on_fstat)
    lines = []
    atomic.remove_stale(str(out_dir), "o.bin", lines.append)
    assert listing(victim) == [".o.bin.x1.tmp", "precious"]
    assert listing(moved) == []  # the real temporary's file went, by its descriptor
    assert stale.is_symlink()  # rmdir of the name refuses a symlink
    assert len(lines) == 1 and lines[0].startswith(f"cannot remove stale temporary {stale}: ")


@pytest.mark.parametrize("what", ["symlink", "file", "foreign", "group-writable", "subdir"])
def test_stale_cleanup_leaves_what_pyq2_did_not_make(tmp_path, monkeypatch, what):
    """A temporary's name on a symlink, on a file, on a directory of another user or writable by
    others, or holding a directory, is left as it is, and each is one line."""
    victim = _victim(tmp_path)
    stale = tmp_path / f".o.bin.pyq2-{dead_pid()}-abcd1234.tmp"
    if what == "symlink":
        stale.symlink_to(victim)
    elif what == "file":
        stale.write_bytes(b"")
    else:
        stale.mkdir()
        (stale / ".o.bin.x1.tmp").write_bytes(b"half")
        if what == "foreign":
            monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
        elif what == "group-writable":
            stale.chmod(0o770)
        else:
            (stale / "sub").mkdir()
    lines = []
    assert atomic.remove_stale(str(tmp_path), "o.bin", lines.append) == []
    assert os.path.lexists(stale) and listing(victim) == [".o.bin.x1.tmp", "precious"]
    reason = {
        "symlink": "a symlink, not a directory pyq2 made",
        "file": "a regular file, not a directory pyq2 made",
        "foreign": f"owned by uid {os.getuid()}, not by this user",
        "group-writable": "mode 0770: others may write to it",
        "subdir": "it holds a directory (sub), which pyq2 never makes",
    }[what]
    assert lines == [f"left {stale} alone: {reason}"]


# ---- what OUT may be ----------------------------------------------------------------------


@pytest.fixture
def model(tmp_path):
    """A small GGUF with one PQ2_0 weight."""
    path = tmp_path / "m.gguf"
    raw = random_pq2(np.random.default_rng(0), 4, 128)
    write_gguf_file(path, [], [(OutTensor("w", gguf_io.PQ2_0, (128, 4), raw.nbytes), raw)])
    return path


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_fifo_is_refused_and_kept(tmp_path, model, force):
    fifo = tmp_path / "o.gguf"
    os.mkfifo(fifo)
    link = tmp_path / "link.gguf"
    link.symlink_to(fifo)
    with pytest.raises(RepackError, match=rf"output {fifo} is a FIFO; .*regular files only"):
        repack(model, fifo, force=force)
    with pytest.raises(RepackError, match=rf"output {link} \(a link to {fifo}\) is a FIFO"):
        repack(model, link, force=force, dry_run=True)
    assert listing(tmp_path) == ["link.gguf", "m.gguf", "o.gguf"]
    assert os.path.islink(link) and not os.path.isfile(fifo)


def test_socket_is_refused(tmp_path, capsys, model):
    """A special file is refused, never replaced. (Tests use FIFOs and sockets they make, never a
    system device: replacing /dev/full is exactly the failure this guards against.)"""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "o.gguf"))
        code, _, err = run(capsys, "repack", model, "-o", tmp_path / "o.gguf", "--force")
    finally:
        sock.close()
    assert code == 1
    assert err.startswith(f"pyq2: error: output {tmp_path / 'o.gguf'} is a socket;")
    assert stat.S_ISSOCK(os.lstat(tmp_path / "o.gguf").st_mode)
    assert listing(tmp_path) == ["m.gguf", "o.gguf"]


def test_symlink_keeps_the_link_and_replaces_its_file(tmp_path, model):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target, link = tmp_path / "real" / "t.gguf", tmp_path / "links" / "o.gguf"
    target.write_bytes(b"old")
    link.symlink_to(os.path.relpath(target, link.parent))
    with pytest.raises(RepackError, match="exists"):
        repack(model, link)
    with atomic.atomic_output(link, force=True) as staged:
        assert os.path.dirname(os.path.dirname(staged)) == str(tmp_path / "real")
        open(staged, "wb").close()
    repack(model, link, force=True)
    assert os.path.islink(link) and os.path.samefile(link, target)
    assert verify(model, target).ok
    assert listing(tmp_path / "real") == ["t.gguf"] and listing(tmp_path / "links") == ["o.gguf"]


@pytest.mark.parametrize(
    "out", ["sub", "sub/", "new/", ""], ids=["dir", "dir-slash", "slash", "empty"]
)
def test_directory_or_empty_output_is_refused(tmp_path, model, out):
    (tmp_path / "sub").mkdir()
    if out:
        what = "is" if out.startswith("sub") else "names"
        path = str(tmp_path / out) + ("/" if out.endswith("/") else "")
        example = os.path.join(path, "m.pyq2-tiles.gguf")
        match = f"output {path} {what} a directory; -o names the file, e.g. {example}"
    else:
        path, match = "", "the output path is empty; give -o a file name"
    with pytest.raises(RepackError) as e:
        repack(model, path)
    assert str(e.value) == match
    assert listing(tmp_path) == ["m.gguf", "sub"] and listing(tmp_path / "sub") == []


@pytest.mark.parametrize("where", ["missing-dir", "parent-is-file"])
def test_errors_name_the_output_not_the_temporary(tmp_path, capsys, model, where):
    out = tmp_path / ("nodir" if where == "missing-dir" else "m.gguf") / "o.gguf"
    code, _, err = run(capsys, "repack", model, "-o", out)
    reason = "No such file or directory" if where == "missing-dir" else "Not a directory"
    assert (code, err) == (1, f"pyq2: error: {out}: {reason}\n")


def test_dry_run_does_not_refuse_an_existing_output(tmp_path, capsys, model):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"old")
    code, stdout, err = run(capsys, "repack", model, "-o", out, "--dry-run")
    assert code == 0 and err == ""
    assert stdout.startswith(f"would write {out} (tiles rt=2; it exists: needs --force)")
    code, stdout, _ = run(capsys, "repack", model, "-o", out, "--dry-run", "--force")
    assert stdout.startswith(f"would write {out} (tiles rt=2; it exists: --force replaces it)")
    assert out.read_bytes() == b"old" and listing(tmp_path) == ["m.gguf", "o.gguf"]


def test_nothing_to_convert_is_not_called_a_conversion(tmp_path, capsys):
    src = tmp_path / "plain.gguf"
    f32 = np.arange(8, dtype="<f4")
    write_gguf_file(src, [], [(OutTensor("norm", int(Q.F32), (8,), f32.nbytes), f32)])
    code, stdout, _ = run(capsys, "repack", src, "-o", tmp_path / "o.gguf")
    assert code == 0
    assert stdout.startswith(
        f"wrote {tmp_path / 'o.gguf'} (nothing to convert: no PQ2_0, PTQ1_0 or TQ2_0 tensors): "
        "0 tensors converted, 1 passed through;"
    )
    assert "rt=" not in stdout


def test_atomic_outputs_appear_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with atomic.atomic_outputs([a, b], force=False) as (sa, sb):
        Path(sa).write_text("A")
        Path(sb).write_text("B")
        assert listing(tmp_path) != ["a.gguf", "b.gguf"]
    assert a.read_text() == "A" and b.read_text() == "B"
    a.unlink(), b.unlink()
    # the second appears while they are written: the first, already moved, is removed again
    with pytest.raises(RepackError, match="b.gguf exists"):
        with atomic.atomic_outputs([a, b], force=False) as (sa, sb):
            Path(sa).write_text("A")
            Path(sb).write_text("B")
            b.write_text("other")
    assert listing(tmp_path) == ["b.gguf"] and b.read_text() == "other"
    # a failure while writing: nothing appears, no temporary stays
    with pytest.raises(OSError):
        with atomic.atomic_outputs([a, tmp_path / "c.gguf"], force=True) as (sa, _):
            Path(sa).write_text("A")
            raise OSError(28, "No space left on device")
    assert listing(tmp_path) == ["b.gguf"]
    # with force, a failed move leaves no mix of the earlier set and this one
    c, d = tmp_path / "c.gguf", tmp_path / "d.gguf"
    a.write_text("old a"), c.write_text("old c")
    d.mkdir(), (d / "x").write_text("")  # a target that cannot be replaced
    with pytest.raises(OSError):
        with atomic.atomic_outputs([a, d, c], force=True) as staged:
            for path, text in zip(staged, "ADC", strict=True):
                Path(path).write_text(text)
    assert listing(tmp_path) == ["b.gguf", "d.gguf"] and d.is_dir()
