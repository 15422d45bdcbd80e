"""Output files that appear complete or not at all, with no temporary outliving its writer.

atomic_output(OUT) yields the path to write: a file in a private directory next to the file
that OUT names (for a symlink, next to the file it points to), the directory named
`.<name>.pyq2-<pid>-<random>.tmp` after the output and the writing process. When the block ends
normally the file moves into place:

- without `force`, by a hard link to OUT, which fails if OUT exists by then: of two writers
  racing for one name exactly one wins, and the other fails with "OUT exists";
- with `force`, by a rename over the target: a symlink stays a link, to the new file.

On any failure, KeyboardInterrupt and pyq2.errors.Interrupted included, the directory is
removed and OUT is untouched. Creating, committing and removing the directory run with signals
held off (pyq2.interrupts.deferred). A writer killed outright (SIGKILL, a crash, power loss)
leaves its directory behind; the next writer to the same name removes it once the process whose
pid it carries is gone, and only when it is a directory this user made as pyq2 makes them (its
type, owner and mode are checked on a descriptor opened without following symlinks, and its
files are unlinked by that descriptor: a name swapped for a symlink never makes pyq2 remove
anything elsewhere, as root neither). An OSError about the directory or the file in it is
reported against OUT, the path the user gave.

atomic_outputs(OUTS) does the same for files that appear together (the shards of
`pyq2 repack --tp`): all are staged, then moved into place in order; if one cannot be, those
already moved are removed again (with `force`, the set's other targets too).

check_output() is the up-front half: a directory, device, FIFO or socket is never written or
replaced, even with `force`, and an existing OUT needs `force`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from . import interrupts
from .errors import RepackError, file_kind, shown_path

Notice = Callable[[str], None]  # receives one line for the user (pyq2 prints it on stderr)

# A file system without hard links answers os.link with one of these; OUT is then reserved
# with an O_EXCL create instead.
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}

_lock = threading.Lock()
_active: set[str] = set()  # temporary directories of this process's writers


def temp_prefix(name: str, pid: int | None = None) -> str:
    """The start of the name of a writer's temporary directory for output file `name`."""
    return f".{name}.pyq2-{os.getpid() if pid is None else pid}-"


def _temp_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(name)}\.pyq2-(\d+)-\w+\.tmp")


def target_of(out: str) -> str:
    """The file a write to OUT replaces: OUT, or for a symlink the file it points to."""
    return os.path.realpath(out) if os.path.islink(out) else out


def check_output(out: str, force: bool, dry_run: bool = False) -> bool:
    """Refuse an output that may not be written; returns whether OUT exists.

    Raises RepackError for an empty path, a directory, device, FIFO or socket (also behind a
    symlink, with or without force), and for an existing OUT without force unless dry_run.
    """
    if not out:
        raise RepackError("the output path is empty")
    try:
        st = os.stat(out)
    except FileNotFoundError:  # no OUT, or a symlink to a file still to be made
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        via = f" (a link to {shown_path(os.path.realpath(out))})" if os.path.islink(out) else ""
        raise RepackError(
            f"output {shown_path(out)}{via} is {kind}; pyq2 writes regular files only and never "
            f"replaces anything else, even with --force"
        )
    exists = os.path.lexists(out)
    if exists and not force and not dry_run:
        raise _exists(out)
    return exists


def _exists(out: str) -> RepackError:
    return RepackError(f"output {shown_path(out)} exists (use --force to overwrite)")


def _orphaned(path: str, pid: int) -> bool:
    """Whether the writer of temporary directory `path`, process `pid`, is gone."""
    if pid == os.getpid():
        with _lock:
            return path not in _active  # an earlier process with this pid left it
    if not 0 < pid < 1 << 31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, another user's
        return False
    return False


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NotOurs(OSError):
    """A temporary-looking name that is not a directory pyq2 made: left alone."""


def _check_ours(st: os.stat_result) -> None:
    """Refuse a directory this process's user did not make as pyq2 makes its temporaries: a
    directory owned by this (effective) user, writable by nobody else."""
    if not stat.S_ISDIR(st.st_mode):
        raise NotOurs(errno.ENOTDIR, "not a directory pyq2 made")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise NotOurs(errno.EPERM, f"owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o022:
        raise NotOurs(errno.EPERM, f"mode {stat.S_IMODE(st.st_mode):04o}: others may write to it")


def _remove_dir(path: str) -> None:
    """Remove a temporary directory pyq2 made: the files a writer puts there, then the directory.

    Nothing is followed. The directory is opened by its parent's descriptor with O_NOFOLLOW (a
    symlink put in its place fails to open), checked on that descriptor (type, owner, mode:
    _check_ours), and its entries are unlinked by that descriptor, so a name swapped for a
    symlink at any moment cannot make this remove anything elsewhere. unlink removes a symlink
    inside, never what it points to; a subdirectory (which no writer makes) makes it fail, left
    as it is. NotOurs (an OSError) for a name that is not such a directory."""
    parent, name = os.path.split(path)
    pfd = os.open(parent or ".", _DIR_FLAGS)
    try:
        try:
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=pfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                mode = os.lstat(path).st_mode
                kind = (
                    "a symlink"
                    if stat.S_ISLNK(mode)
                    else "a regular file"
                    if stat.S_ISREG(mode)
                    else file_kind(mode)
                )
                raise NotOurs(e.errno, f"{kind}, not a directory pyq2 made") from None
            raise
        try:
            _check_ours(os.fstat(fd))
            for entry in os.listdir(fd):
                if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise NotOurs(
                        errno.EISDIR, f"it holds a directory ({entry}), which pyq2 never makes"
                    )
                os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=pfd)  # rmdir never follows a symlink either
    finally:
        os.close(pfd)


def remove_stale(directory: str, name: str, notice: Notice | None = None) -> list[str]:
    """Remove the temporary directories for output `name` in `directory` whose writer is gone;
    returns their paths. Each removal (or failure to remove, or refusal: see _remove_dir) is one
    line to `notice`."""
    try:
        entries = os.listdir(directory or ".")
    except OSError:
        return []  # the write itself reports what is wrong with the directory
    pattern, removed = _temp_pattern(name), []
    for entry in entries:
        m = pattern.fullmatch(entry)
        if not m:
            continue
        path = os.path.join(directory, entry)
        pid = int(m.group(1))
        if not _orphaned(path, pid):
            continue
        try:
            _remove_dir(path)
        except FileNotFoundError:
            continue  # another writer to this name removed it first
        except NotOurs as e:
            if notice:
                notice(f"left {shown_path(path)} alone: {e.strerror}")
            continue
        except OSError as e:
            if notice:
                notice(f"cannot remove stale temporary {shown_path(path)}: {e.strerror or e}")
            continue
        removed.append(path)
        if notice:
            notice(f"removed stale temporary {shown_path(path)} (its writer, pid {pid}, is gone)")
    return removed


def _discard(tmpdir: str) -> None:
    try:
        _remove_dir(tmpdir)
    except OSError:
        pass  # gone already, or left for remove_stale of the next run to this name
    with _lock:
        _active.discard(tmpdir)


def _sync_dir(directory: str) -> None:
    """Make a rename in `directory` durable (where the file system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _commit(staged: str, out: str, target: str, force: bool) -> None:
    if force:
        os.replace(staged, target)
    else:
        try:
            os.link(staged, out)
        except FileExistsError:
            raise _exists(out) from None
        except OSError as e:
            if e.errno not in _NO_HARD_LINKS:
                raise
            try:
                os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            except FileExistsError:
                raise _exists(out) from None
            try:
                os.replace(staged, out)
            except BaseException:
                os.unlink(out)
                raise
    _sync_dir(os.path.dirname(os.path.abspath(target)))


def _about_out(e: OSError, temp_start: str, out: str) -> OSError:
    """e, reported against OUT when it names the temporary directory or a file in it."""
    names = [os.fspath(f) for f in (e.filename, e.filename2) if f is not None]
    if not any(isinstance(f, str) and f.startswith(temp_start) for f in names):
        return e
    return OSError(e.errno, e.strerror, out)  # OSError() picks the subclass of the errno


@contextmanager
def _staging(out, notice: Notice | None) -> Iterator[tuple[str, Callable[[bool], None]]]:
    """(the path to write OUT's bytes to, commit(force) to move it into place). The temporary
    directory is removed at the end, whatever happens; an OSError about it is reported against
    OUT. Stale temporaries of this name are removed first, each reported to `notice`."""
    out = os.fspath(out)
    target = target_of(out)
    directory, name = os.path.split(os.path.abspath(target))
    remove_stale(directory, name, notice)
    temp_start = os.path.join(directory, temp_prefix(name))
    tmpdir: str | None = None
    try:
        with interrupts.deferred():
            tmpdir = tempfile.mkdtemp(prefix=temp_prefix(name), suffix=".tmp", dir=directory)
            with _lock:
                _active.add(tmpdir)
        staged = os.path.join(tmpdir, name)

        def commit(force: bool) -> None:
            with interrupts.deferred():
                _commit(staged, out, target, force)

        yield staged, commit
    except BaseException as e:
        if isinstance(e, OSError):
            renamed = _about_out(e, temp_start, out)
            if renamed is not e:
                raise renamed from None
        raise
    finally:
        with interrupts.deferred():
            if tmpdir is not None:
                _discard(tmpdir)


@contextmanager
def atomic_output(out, force: bool, notice: Notice | None = None) -> Iterator[str]:
    """Yield the path to write OUT's bytes to; OUT appears when the block ends normally (see the
    module doc). Stale temporaries of this name are removed first, each reported to `notice`."""
    with _staging(out, notice) as (staged, commit):
        yield staged
        commit(force)


@contextmanager
def atomic_outputs(outs, force: bool, notice: Notice | None = None) -> Iterator[list[str]]:
    """atomic_output for files that appear together: yield the paths to write each one's bytes
    to; when the block ends normally they move into place in order. If moving one fails (an OUT
    that appeared meanwhile, without force; a signal between two), the ones this call already
    moved are removed again, so none stays. With force the set's other targets are removed too
    (an earlier set they belong to is being replaced): no mix of old and new files stays."""
    with contextlib.ExitStack() as stack:
        pairs = [stack.enter_context(_staging(out, notice)) for out in outs]
        yield [staged for staged, _ in pairs]
        targets = [target_of(os.fspath(out)) for out in outs]
        placed = 0
        try:
            for _, commit in pairs:
                commit(force)
                placed += 1
        except BaseException:
            with interrupts.deferred():
                for path in targets if force else targets[:placed]:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            raise
