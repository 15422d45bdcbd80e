"""`pyq2 repack` as a real process under signals and races: a signal removes the temporary and
exits 128 + N with one line, SIGKILL's leftover is removed by the next run, a Ctrl-C during the
imports is one line, and of two writers racing for one output exactly one wins.

Each test waits for the writer's temporary directory to appear (the repack is then under way)
before it signals; the input is large enough that the repack is still running by then.
"""

import filecmp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from pyq2.gguf import io as gguf_io
from pyq2.gguf.io import OutTensor

from .conftest import listing, random_pq2, subprocess_env, write_gguf_file

# One PQ2_0 matrix of 256 MB: about half a second of conversion on a slow CPU (about 2 GB/s).
BIG_K, BIG_N = 4096, 240_000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    blocks = np.zeros((BIG_N * BIG_K // 128, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # every scale finite
    data = blocks.reshape(-1)
    gguf_io.write_gguf(
        path, [], [OutTensor("w", gguf_io.PQ2_0, (BIG_K, BIG_N), data.nbytes)], lambda i, t: (data,)
    )
    return path


def default_dispositions():
    """In the child before exec: the signals these tests send back to their default action. pyq2
    leaves a signal its parent ignored ignored (pyq2.interrupts), and a test runner may have been
    started with some ignored (nohup ignores SIGHUP; a shell's background job, SIGINT)."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def start(*argv, code=None):
    """`python -m pyq2 ARGV` (or `python -c CODE ARGV`) started in a child process."""
    head = ["-c", code] if code else ["-m", "pyq2"]
    return subprocess.Popen(
        [sys.executable, *head, *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=tempfile.gettempdir(),  # not the repository root, whose pyq2/ holds no library
        preexec_fn=default_dispositions,
    )


def temporaries(directory, out_name):
    return [n for n in os.listdir(directory) if n.startswith(f".{out_name}.pyq2-")]


def wait_for_temporary(proc, directory, out_name, limit=60.0):
    """Poll until the writer's temporary directory exists (the repack is under way)."""
    t0 = time.monotonic()
    while not temporaries(directory, out_name):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < limit, "no temporary appeared"
        time.sleep(0.001)


@pytest.fixture
def workdir(tmp_path, big):
    """tmp_path with the big input linked in, and a small one that repacks at once."""
    os.link(big, tmp_path / "big.gguf")
    raw = random_pq2(np.random.default_rng(0), 4, 128)
    write_gguf_file(
        tmp_path / "small.gguf", [], [(OutTensor("w", gguf_io.PQ2_0, (128, 4), raw.nbytes), raw)]
    )
    return tmp_path


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name
)
def test_signal_removes_the_temporary(workdir, sig):
    p = start("repack", workdir / "big.gguf", "-o", workdir / "o.gguf")
    wait_for_temporary(p, workdir, "o.gguf")
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    assert err == f"pyq2: error: interrupted ({sig.name})\n" and out == ""
    assert listing(workdir) == ["big.gguf", "small.gguf"]


@pytest.mark.skipif(shutil.which("timeout") is None, reason="no timeout(1)")
def test_timeout_removes_the_temporary(workdir):
    """`timeout 1 pyq2 repack ...`: the writer is stopped (SIGSTOP) once its temporary exists, so
    the timer fires while the repack is under way; timeout then sends SIGTERM and SIGCONT. On a
    machine slow enough that the timer fires during the imports the outcome is the same."""
    argv = ["timeout", "1", sys.executable, "-m", "pyq2", "repack", workdir / "big.gguf"]
    p = subprocess.Popen(
        [*map(str, argv), "-o", str(workdir / "o.gguf")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=tempfile.gettempdir(),
        preexec_fn=default_dispositions,
    )
    while p.poll() is None:
        found = temporaries(workdir, "o.gguf")
        if found:
            os.kill(int(found[0].split("-")[1]), signal.SIGSTOP)
            break
        time.sleep(0.001)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (124, "", "pyq2: error: interrupted (SIGTERM)\n")
    assert listing(workdir) == ["big.gguf", "small.gguf"]


def test_sigkill_leftover_is_removed_by_the_next_run(workdir):
    killed = start("repack", workdir / "big.gguf", "-o", workdir / "o.gguf")
    wait_for_temporary(killed, workdir, "o.gguf")
    killed.kill()
    killed.communicate(timeout=60)
    (stale,) = temporaries(workdir, "o.gguf")
    assert stale.startswith(f".o.gguf.pyq2-{killed.pid}-")

    p = start("repack", workdir / "small.gguf", "-o", workdir / "o.gguf")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert err == (
        f"pyq2: removed stale temporary {workdir / stale} (its writer, pid {killed.pid}, is gone)\n"
    )
    assert listing(workdir) == ["big.gguf", "o.gguf", "small.gguf"]


def test_a_live_writers_temporary_is_kept(workdir):
    slow = start("repack", workdir / "big.gguf", "-o", workdir / "o.gguf", "--force")
    wait_for_temporary(slow, workdir, "o.gguf")
    slow.send_signal(signal.SIGSTOP)  # alive, and still holding its temporary
    try:
        (theirs,) = temporaries(workdir, "o.gguf")
        p = start("repack", workdir / "small.gguf", "-o", workdir / "o.gguf", "--force")
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0 and err == ""
        assert theirs in os.listdir(workdir)
    finally:
        slow.send_signal(signal.SIGTERM)
        slow.send_signal(signal.SIGCONT)
    assert slow.communicate(timeout=60)[1] == "pyq2: error: interrupted (SIGTERM)\n"
    assert listing(workdir) == ["big.gguf", "o.gguf", "small.gguf"]


# Sends the process SIGINT while it imports module TARGET, then runs the command line as the
# `pyq2` console script (pyq2.cli:main) or `python -m pyq2` does.
INTERRUPT_DURING_IMPORT = """
import importlib.abc, os, runpy, signal, sys
TARGET, HOW = sys.argv.pop(1), sys.argv.pop(1)

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
if HOW == "script":
    from pyq2.cli import main
    sys.exit(main())
runpy.run_module("pyq2", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "target,how",
    [
        ("pyq2.cli", "module"),
        ("numpy", "module"),
        ("numpy", "script"),
        ("pyq2.offline.repack", "script"),
    ],
    ids=["module-cli", "module-numpy", "script-numpy", "script-repack"],
)
def test_ctrl_c_during_imports(tmp_path, target, how):
    p = start(target, how, "repack", tmp_path / "in.gguf", code=INTERRUPT_DURING_IMPORT)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (130, "", "pyq2: error: interrupted (SIGINT)\n")


# A module whose import a signal cuts may raise another exception than KeyboardInterrupt: numpy's
# C extension turns it into ImportError ("PyCapsule_Import could not import module"). This
# finder does the same to the import of TARGET, after the signal.
CUT_IMPORT = """
import importlib.abc, os, runpy, signal, sys
TARGET, HOW = sys.argv.pop(1), sys.argv.pop(1)

class Cut(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            sys.meta_path.remove(self)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a point where Python checks signals
            except KeyboardInterrupt:
                raise ImportError("PyCapsule_Import could not import module") from None
        return None

sys.meta_path.insert(0, Cut())
if HOW == "script":
    from pyq2.cli import main
    sys.exit(main())
runpy.run_module("pyq2", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("how", ["module", "script"])
def test_an_import_a_signal_turned_into_another_error_is_one_line(tmp_path, how):
    p = start("numpy", how, "info", tmp_path / "in.gguf", code=CUT_IMPORT)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (130, "", "pyq2: error: interrupted (SIGINT)\n")


def test_two_writers_without_force_one_wins(tmp_path, big):
    """Whether the loser finds OUT at its start or only at its end (the hard link that would
    publish its file fails), exactly one writer succeeds and the other says so."""
    out = tmp_path / "o.gguf"
    procs = [start("repack", big, "-o", out, "--layout", "raw") for _ in range(2)]
    results = [(*p.communicate(timeout=60), p.returncode) for p in procs]
    assert sorted(code for _, _, code in results) == [0, 1], results
    (err,) = [err for _, err, code in results if code == 1]
    assert err == f"pyq2: error: output {out} exists (use --force to overwrite)\n"
    assert listing(tmp_path) == ["o.gguf"]
    assert filecmp.cmp(out, big, shallow=False)  # raw layout: the input's bytes, complete


def test_a_resumed_interruption_lets_the_next_signal_raise_again():
    """pyq2.interrupts.resume (pyq2 chat goes on after a Ctrl-C that stopped a reply): only the
    first signal raises until then; after resume() the next one raises too."""
    from pyq2 import interrupts
    from pyq2.errors import Interrupted

    assert interrupts.install()
    try:
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert interrupts.caught() == signal.SIGINT
        os.kill(os.getpid(), signal.SIGINT)  # a second one while stopping is dropped
        time.sleep(0.05)
        interrupts.resume()
        assert interrupts.caught() is None
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        interrupts.uninstall()
