"""Memory that does not grow with a row: rows too wide for a slice are read and converted in
blocks of rows and columns (pyq2.gguf.weights.column_mode, read_block and convert, which repack
and the loader consume; verify's _blocks), with the same bytes as the slice path; tiles padding
that would multiply a weight is refused; a file that shrinks while it is read is one error line
(pread: no SIGBUS); peak memory measured in a child process on a very wide row and on a large
metadata array."""

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFValueType as V

from pyq2.cli import main
from pyq2.errors import FormatError, RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf import weights as weight_io
from pyq2.gguf.io import OutTensor
from pyq2.offline import repack as repack_mod
from pyq2.offline.repack import repack
from pyq2.offline.verify import verify
from pyq2.spec import formats

from ..conftest import listing, random_pq2, subprocess_env, ternary_pq2, write_gguf_file

LAYOUTS = [("raw", 0), ("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)]


@pytest.fixture
def narrow_budget(monkeypatch):
    """A conversion budget of 512 bytes, less than one row of K = 2048 (544 bytes): these small
    weights take the block path (the path of a row of 100 million), two groups at a time."""
    monkeypatch.setattr(weight_io, "CONVERT_CHUNK", 512)
    monkeypatch.setattr(repack_mod, "SPOOL_MEMORY", 1 << 10)  # and the scales go to a file


def wide_model(path, rng):
    """PQ2_0, PTQ1_0 and TQ2_0 weights of K = 2048 (one row, a few rows, more than a tile)."""
    tensors, raws = [], {}
    for name, n, kind in (("w.one", 1, "PQ2_0"), ("w.few", 37, "PQ2_0"), ("w.tall", 70, "PQ2_0"),
                          ("w.p", 5, "PTQ1_0"), ("w.t", 3, "TQ2_0")):  # fmt: skip
        k = 2048
        if kind == "PQ2_0":
            raw = random_pq2(rng, n, k)
            tensors.append((OutTensor(name, gguf_io.PQ2_0, (k, n), raw.nbytes), raw))
        elif kind == "PTQ1_0":
            raw = ternary_pq2(rng, n * k // 128)
            data = formats.pq2_to_ptq1(raw)
            tensors.append((OutTensor(name, gguf_io.PTQ1_0, (k, n), data.nbytes), data))
        else:
            data = rng.integers(0, 256, (n * k // 256, 66), dtype=np.uint8)
            data[:, 64:] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
            data[:, :64] &= 0b10101010  # codes 0 and 2 only: ternary
            data = data.reshape(-1)
            raw = formats.tq2_to_pq2(data)
            tensors.append((OutTensor(name, gguf_io.TQ2_0, (k, n), data.nbytes), data))
        raws[name] = raw
    write_gguf_file(path, [], tensors)
    return raws


def test_block_path_gives_the_bytes_of_the_slice_path(tmp_path, monkeypatch):
    """Every layout to every layout: the block path writes exactly what the slice path writes."""
    src = tmp_path / "m.gguf"
    wide_model(src, np.random.default_rng(0))
    wide = {}
    for budget, tag in ((16 << 20, "slice"), (512, "block")):  # 512 B: less than one row
        monkeypatch.setattr(weight_io, "CONVERT_CHUNK", budget)
        for layout, rt in LAYOUTS:
            out = tmp_path / f"{tag}-{layout}{rt}.gguf"
            repack(src, out, layout=layout, rt=rt)
            wide[tag, layout, rt] = out
            for layout2, rt2 in LAYOUTS:  # and from each stored layout
                back = tmp_path / f"{tag}-{layout}{rt}-{layout2}{rt2}.gguf"
                repack(out, back, layout=layout2, rt=rt2)
                assert verify(src, back).ok, (tag, layout, rt, layout2, rt2)
                if tag == "block":
                    slice_back = tmp_path / f"slice-{layout}{rt}-{layout2}{rt2}.gguf"
                    assert back.read_bytes() == slice_back.read_bytes()
                back.unlink() if tag == "block" else None
    for layout, rt in LAYOUTS:
        assert wide["block", layout, rt].read_bytes() == wide["slice", layout, rt].read_bytes()


def test_block_path_names_a_bad_scale_by_its_row_and_block(tmp_path, narrow_budget):
    src = tmp_path / "m.gguf"
    raw = random_pq2(np.random.default_rng(1), 3, 4096)
    blocks = raw.reshape(3, 32, 34)
    blocks[2, 29, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    write_gguf_file(src, [], [(OutTensor("w", gguf_io.PQ2_0, (4096, 3), raw.nbytes), raw)])
    with pytest.raises(FormatError, match=r"tensor 'w': row 2, block 29 has scale inf"):
        repack(src, tmp_path / "o.gguf", layout="planes")
    assert listing(tmp_path) == ["m.gguf"]


def test_verify_compares_wide_rows_in_blocks(tmp_path, narrow_budget):
    src = tmp_path / "m.gguf"
    wide_model(src, np.random.default_rng(2))
    out = tmp_path / "t.gguf"
    repack(src, out, layout="tiles", rt=4)
    assert verify(src, out).ok
    bad = tmp_path / "bad.gguf"
    blob = bytearray(src.read_bytes())
    with gguf_io.open_gguf(src) as f:
        t = f.tensor("w.tall")
        blob[t.offset + (40 * 16 + 13) * 34 + 2 + 5] ^= 0b11  # row 40, block 13, weight 20
    bad.write_bytes(bytes(blob))
    res = verify(bad, out)
    assert not res.ok and res.message.startswith("tensor 'w.tall' row 40 column 1684: code")


def test_tiles_padding_that_multiplies_a_weight_is_refused(tmp_path, capsys):
    """One row of K = 2^20 (272 KB) pads to 64 rows at rt 4 (17 MB): refused, nothing written;
    planes (no padding) takes it, and so do tiles at a height that pads it less than 16 MiB."""
    k = 1 << 20
    raw = random_pq2(np.random.default_rng(3), 1, k)
    src = tmp_path / "wide.gguf"
    write_gguf_file(src, [], [(OutTensor("w", gguf_io.PQ2_0, (k, 1), raw.nbytes), raw)])
    code = main(["repack", str(src), "-o", str(tmp_path / "o.gguf"), "--rt", "4"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1
    assert "tensor 'w' has 1 rows of K = 1048576: the tiles layout (rt 4) pads it to 64 rows" in err
    assert "Use --layout planes" in err and listing(tmp_path) == ["wide.gguf"]
    with pytest.raises(RepackError, match="pads it to 64 rows"):
        repack(src, tmp_path / "o.gguf", rt=4, dry_run=True)
    repack(src, tmp_path / "p.gguf", layout="planes")
    repack(src, tmp_path / "t.gguf", rt=2)  # 31 rows of padding: 8.4 MB, under the limit
    assert verify(src, tmp_path / "t.gguf").ok


# ---- a file that shrinks while it is read ---------------------------------------------------


@pytest.mark.parametrize("layout", ["tiles", "raw"])
def test_input_cut_between_slices_is_one_error_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, layout
):
    """Another process cuts the input while repack runs (forced here between two reads of a
    weight's slices): one error line naming the tensor, no output, no temporary, no SIGBUS."""
    src = tmp_path / "m.gguf"
    raw = random_pq2(np.random.default_rng(4), 512, 1024)
    write_gguf_file(src, [], [(OutTensor("w", gguf_io.PQ2_0, (1024, 512), raw.nbytes), raw)])
    monkeypatch.setattr(weight_io, "CONVERT_CHUNK", 64 << 10)  # 8 slices of 64 rows
    real, reads = gguf_io.GGUFFile.read, []

    def cut_after_the_first_slice(self, offset, n, what):
        if what.startswith("tensor"):
            reads.append(n)
            if len(reads) == 2:
                os.truncate(self.file, self.data_offset + 1000)
        return real(self, offset, n, what)

    monkeypatch.setattr(gguf_io.GGUFFile, "read", cut_after_the_first_slice)
    out = tmp_path / "o.gguf"
    code = main(["repack", str(src), "-o", str(out), "--layout", layout])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"pyq2: error: {src}: the file shrank from {raw.nbytes + 0}") or (
        "the file shrank from" in err
    )
    assert "tensor 'w'" in err and "another process is changing it" in err
    assert listing(tmp_path) == ["m.gguf"]


def test_input_cut_to_nothing_by_another_process(tmp_path):
    """The real thing: a child repacks a 64 MB file; once its temporary exists, the input is cut
    to 0 bytes (a rewrite). The child ends with one line and exit 1 (not SIGBUS, exit 135) and
    leaves nothing."""
    import time

    src = tmp_path / "big.gguf"
    k, n = 4096, 60_000
    blocks = np.zeros((n * k // 128, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    data = blocks.reshape(-1)
    gguf_io.write_gguf(src, [], [OutTensor("w", gguf_io.PQ2_0, (k, n), data.nbytes)],
                       lambda i, t: (data,))  # fmt: skip
    out = tmp_path / "o.gguf"
    p = subprocess.Popen(
        [sys.executable, "-m", "pyq2", "repack", str(src), "-o", str(out), "--rt", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    t0 = time.monotonic()
    while not [x for x in os.listdir(tmp_path) if x.startswith(".o.gguf.pyq2-")]:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 60
        time.sleep(0.001)
    os.truncate(src, 0)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, (p.returncode, err)
    assert len(err.splitlines()) == 1 and "the file shrank from" in err, err
    assert listing(tmp_path) == ["big.gguf"]


# ---- peak memory, measured ------------------------------------------------------------------

PEAK = """
import resource, sys
from pyq2.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, code)
"""


def peak_mb(*argv) -> tuple[int, int]:
    """(peak RSS in MB, exit status) of the command line in a child process."""
    p = subprocess.run(
        [sys.executable, "-c", PEAK, *map(str, argv)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    mb, code = p.stdout.split()[-2:]
    return int(mb), int(code)


def baseline_mb() -> int:
    p = subprocess.run(
        [sys.executable, "-c", PEAK, "info", "/nonexistent"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    return int(p.stdout.split()[-2])


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KB on Linux")
def test_peak_memory_of_a_wide_row_and_of_a_large_array(tmp_path):
    """A 34 MB row (K = 2^27, one row) and a 40 MB metadata array: every command stays within
    100 MB of what starting pyq2 takes. docs/cli.md gives the figures of
    tools/bench/hostile_memory.py on the issue's larger cases, before and after (a 136 MB row
    made repack peak at 4.8 GB)."""
    base = baseline_mb()
    k = 1 << 27
    wide = tmp_path / "wide.gguf"
    blocks = np.zeros((k // 128, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    data = blocks.reshape(-1)
    write_gguf_file(wide, [], [(OutTensor("w", gguf_io.PQ2_0, (k, 1), data.nbytes), data)])
    array = tmp_path / "array.gguf"
    big = np.arange(10_000_000, dtype=np.int32)
    raw = random_pq2(np.random.default_rng(5), 4, 256)
    write_gguf_file(
        array,
        [("general.name", V.ARRAY, big, V.INT32)],
        [(OutTensor("w", gguf_io.PQ2_0, (256, 4), raw.nbytes), raw)],
    )
    del blocks, data, big
    runs = {
        "wide info": ("info", wide),
        "wide repack tiles (refused)": ("repack", wide, "-o", tmp_path / "t.gguf"),
        "wide repack planes": ("repack", wide, "-o", tmp_path / "p.gguf", "--layout", "planes"),
        "wide repack back to raw": (
            "repack",
            tmp_path / "p.gguf",
            "-o",
            tmp_path / "r.gguf",
            "--layout",
            "raw",
        ),  # fmt: skip
        "wide verify": ("verify", wide, tmp_path / "p.gguf"),
        "array info": ("info", array),
        "array info --json": ("info", array, "--json"),
        "array repack": ("repack", array, "-o", tmp_path / "a.gguf"),
        "array verify": ("verify", array, tmp_path / "a.gguf"),
    }
    peaks = {}
    for what, argv in runs.items():
        mb, code = peak_mb(*argv)
        assert code == (1 if "refused" in what else 0), what
        peaks[what] = mb - base
    assert max(peaks.values()) < 100, peaks


@pytest.mark.parametrize("how", ["fuse", "tp"])
def test_block_path_of_fused_members_and_shard_parts(tmp_path, monkeypatch, demo, how):
    """Fused members (rows of another tensor) and a shard's parts (rows or columns of the whole)
    in blocks: the same files as in slices."""
    kwargs = {"fuse": True} if how == "fuse" else {"tp": 2}
    files = {}
    for budget in (16 << 20, 512):
        monkeypatch.setattr(weight_io, "CONVERT_CHUNK", budget)
        out = tmp_path / f"{budget}.gguf"
        s = repack(demo, out, layout="tiles", rt=1, **kwargs)
        paths = s.shards or [s.out_path]
        files[budget] = [open(p, "rb").read() for p in paths]
        if how == "fuse":  # and back: the members read in blocks
            back = tmp_path / f"{budget}-raw.gguf"
            repack(out, back, layout="raw")
            files[budget].append(back.read_bytes())
        assert verify(demo, paths).ok
    assert files[512] == files[16 << 20]
