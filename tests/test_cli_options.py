"""Options of the `pyq2` command: --version, --rt only with the tiles layout, an empty -o, where
`pyq2 demo` leaves its files (and what it does not overwrite); a standard output that is full
or closed, strict JSON, bench's arguments checked before the GPU."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import pyq2
from pyq2.cli import main

from .conftest import listing, run_pyq2, subprocess_env


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    out, err = capsys.readouterr()
    assert e.value.code == 0 and err == ""
    first, second = out.splitlines()
    assert first == f"pyq2 {pyq2.__version__}" and second.startswith("libpq2 ")


def test_version_without_the_library(tmp_path):
    env = dict(subprocess_env(), PYQ2_LIBRARY=str(tmp_path / "missing.so"))
    p = run_pyq2("--version", env=env, cwd=tempfile.gettempdir())
    assert p.returncode == 0 and p.stderr == ""
    first, second = p.stdout.splitlines()
    assert first == f"pyq2 {pyq2.__version__}"
    assert second.startswith("libpq2 not loaded: PYQ2_LIBRARY=") and "missing.so" in second


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--layout", "planes", "--rt", "2"], "--rt applies to the tiles layout only"),
        (["--layout", "raw", "--rt", "4"], "--rt applies to the tiles layout only"),
        (["-o", ""], "the output path is empty"),
    ],
    ids=["rt-planes", "rt-raw", "empty-output"],
)
def test_usage_errors(tmp_path, capsys, argv, needle):
    (tmp_path / "in.gguf").write_bytes(b"")  # not read: the options are checked first
    with pytest.raises(SystemExit) as e:
        main(["repack", str(tmp_path / "in.gguf"), *argv])
    _, err = capsys.readouterr()
    assert e.value.code == 2 and needle in err.splitlines()[-1]
    assert listing(tmp_path) == ["in.gguf"]


def test_rt_with_tiles(tmp_path, capsys, demo):
    code, out, _ = run(capsys, "repack", demo, "-o", tmp_path / "o.gguf", "--rt", "4")
    assert code == 0 and "(tiles rt=4)" in out


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "kept"])
def test_demo_temporary_directory(tmp_path, capsys, monkeypatch, keep):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, _ = run(capsys, "demo", *(["--keep"] if keep else []))
    assert code == 0 and "verify: identical" in out
    (made,) = [line.split()[1] for line in out.splitlines() if line.startswith("generated")]
    demo_dir = os.path.dirname(made)
    assert os.path.dirname(demo_dir) == str(tmp_path)
    last = out.splitlines()[-1]
    if keep:
        assert last == f"kept the demo files in {demo_dir}"
        assert listing(demo_dir) == ["demo-bonsai-pq2.gguf", "demo-bonsai-pq2.pyq2-tiles.gguf"]
    else:
        assert (
            last == f"removed the temporary directory {demo_dir} (-o DIR or --keep keeps the files)"
        )
        assert listing(tmp_path) == []


# ---- standard output that does not take the output (issue 38) ----------------------------

CLOSED = "closed"
FULL = "/dev/full"


def run_with_stdout(where, *argv):
    """`python -m pyq2 ARGV` with standard output closed or sent to /dev/full."""
    env = subprocess_env()
    if where == CLOSED:
        return subprocess.run(
            [sys.executable, "-m", "pyq2", *map(str, argv)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
            preexec_fn=lambda: os.close(1),
        )
    with open(where, "w") as out:
        return subprocess.run(
            [sys.executable, "-m", "pyq2", *map(str, argv)],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )


def one_error_line(p, *needles):
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("pyq2: error: "), p
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full")
@pytest.mark.parametrize("where", [FULL, CLOSED])
@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["repack", "--help"], ["info", "D"]])
def test_output_that_cannot_be_written_is_one_error(tmp_path, demo, where, argv):
    argv = [str(demo) if a == "D" else a for a in argv]
    p = run_with_stdout(where, *argv)
    reason = "No space left on device" if where == FULL else "standard output is closed"
    one_error_line(p, reason)


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full")
def test_repack_to_a_full_stdout_says_the_output_was_written(tmp_path, demo):
    out = tmp_path / "o.gguf"
    p = run_with_stdout(FULL, "repack", demo, "-o", out)
    one_error_line(p, "cannot write to standard output", f"succeeded: {out} written")
    assert "nothing was written" not in p.stderr
    from pyq2.offline.verify import verify

    assert verify(demo, out).ok


def test_info_json_is_strict_json(tmp_path, capsys):
    """NaN and infinities of float keys come out as strings: strict parsers accept the output."""
    from gguf import GGUFValueType as V

    from pyq2.gguf.io import OutTensor

    from .conftest import write_gguf_file

    src = tmp_path / "f.gguf"
    f32 = np.arange(4, dtype="<f4")
    write_gguf_file(
        src,
        [
            ("x.nan", V.FLOAT32, float("nan")),
            ("x.inf", V.FLOAT64, float("inf")),
            ("x.list", V.ARRAY, [1.0, float("-inf")], V.FLOAT32),
        ],
        [(OutTensor("t", 0, (4,), f32.nbytes), f32)],
    )
    code, out, _ = run(capsys, "info", src, "--json")

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    d = json.loads(out, parse_constant=refuse)
    assert code == 0 and d["metadata"]["x.nan"] == "nan" and d["metadata"]["x.inf"] == "inf"
    assert d["metadata"]["x.list"]["values"] == [1.0, "-inf"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--ms", "0"], "--ms 0: batch sizes are integers of at least 1"),
        (["--ms", "1,x"], "--ms 1,x: batch sizes"),
        (["--ms", "4,-1"], "--ms 4,-1: batch sizes"),
        (["--replays", "0"], "--replays 0: at least 1"),
        (["--prompt", "0"], "--prompt 0: at least 1"),
    ],
)
def test_bench_arguments_are_checked_before_the_gpu(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--synthetic", "tiny", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err.splitlines()[-1]
    assert "GPU" not in err


# ---- demo -o DIR ------------------------------------------------------------------------


def test_demo_does_not_overwrite_or_write_through_symlinks_without_force(tmp_path, capsys):
    d = tmp_path / "d"
    assert run(capsys, "demo", "-o", d)[0] == 0
    before = {n: (d / n).read_bytes() for n in listing(d)}
    code, out, err = run(capsys, "demo", "-o", d)
    assert code == 1 and out == ""
    assert (
        err
        == f"pyq2: error: output {d / 'demo-bonsai-pq2.gguf'} exists (use --force to overwrite)\n"
    )
    assert {n: (d / n).read_bytes() for n in listing(d)} == before
    # a symlink where a demo file goes, to a file elsewhere: refused, the file untouched
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    e = tmp_path / "e"
    e.mkdir()
    (e / "demo-bonsai-pq2.pyq2-tiles.gguf").symlink_to(victim)
    code, _, err = run(capsys, "demo", "-o", e)
    assert code == 1 and "demo-bonsai-pq2.pyq2-tiles.gguf exists (use --force" in err
    assert victim.read_bytes() == b"keep" and listing(e) == ["demo-bonsai-pq2.pyq2-tiles.gguf"]
    # --force replaces them (through the symlink, its file, as repack --force does)
    assert run(capsys, "demo", "-o", d, "--force")[0] == 0
    assert run(capsys, "demo", "-o", e, "--force")[0] == 0
    assert (e / "demo-bonsai-pq2.pyq2-tiles.gguf").is_symlink() and victim.read_bytes() != b"keep"
