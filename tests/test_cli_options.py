"""Options of the `pyq2` command: --version, --rt only with the tiles layout, an empty -o, and
where `pyq2 demo` leaves its files."""

import os
import tempfile

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
