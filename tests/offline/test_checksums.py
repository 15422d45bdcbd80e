"""The checksum of every repacked tensor (pyq2.tensor.<name>.crc32, FORMATS.md 5): written by
repack, checked by every reader (pyq2.gguf.contents.read_contents: repack from a repacked file,
verify, the model loader), so that damaged bytes and relabelled keys (another layout, another
tile height, other members) are refused with the tensor's name; pyq2's keys held to their types
("2" for rt, floats for a shape are refused) and a missing key named."""

import struct
import zlib

import numpy as np
import pytest
from gguf import GGUFValueType as V

from pyq2.errors import FormatError
from pyq2.gguf import io as gguf_io
from pyq2.gguf import metadata
from pyq2.gguf.contents import read_contents
from pyq2.gguf.io import OutTensor
from pyq2.offline.repack import repack
from pyq2.offline.verify import verify
from pyq2.runtime import load

from ..conftest import listing, patched, random_pq2, reseal, write_gguf_file

W = "blk.0.w"


@pytest.fixture
def source(tmp_path):
    """A PQ2_0 file of one 64 x 256 weight: 64 rows are whole tiles at every rt, so its tiles
    bytes (rt 1, 2 or 4) and planes bytes all have the same size."""
    raw = random_pq2(np.random.default_rng(0), 64, 256)
    path = tmp_path / "src.gguf"
    write_gguf_file(path, [], [(OutTensor(W, gguf_io.PQ2_0, (256, 64), raw.nbytes), raw)])
    return path


def rewrite(src, dst, changes):
    """src with key/values replaced (key -> record, None drops it), tensors copied."""
    with gguf_io.open_gguf(src) as f:
        recs = []
        for k in f.keys():
            rec = changes.get(k, f.kv_record(k))
            if rec is not None:
                recs.append(rec)
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        gguf_io.write_gguf(dst, recs, outs, lambda i, t: (f.data(f.tensors[i]),))
    return dst


def key(attr, name=W):
    return metadata.tensor_key(name, attr)


def test_written_checksum_covers_keys_and_bytes(tmp_path, source):
    """The value is CRC-32 of the tensor's describing records (layout, rt, shape, source_type,
    in file order) and then of its bytes, as FORMATS.md 5 says."""
    out = tmp_path / "t.gguf"
    repack(source, out)
    with gguf_io.open_gguf(out) as f:
        assert f.value_type(key("crc32")) == V.UINT32
        names = [k for k in f.keys() if k.startswith(key(""))]
        assert names == [key(a) for a in ("layout", "rt", "shape", "source_type", "crc32")]
        crc = 0
        for k in names[:-1]:
            crc = zlib.crc32(f.kv_record(k), crc)
        crc = zlib.crc32(f.data(f.tensor(W)).tobytes(), crc)
        assert f.value(key("crc32")) == crc
        read_contents(f)  # and it checks


@pytest.mark.parametrize(
    "change",
    ["tiles-to-planes", "rt2-to-rt4", "rt2-to-rt1", "damaged-byte", "checksum-off"],
)
def test_relabelled_or_damaged_tensor_is_refused_by_every_reader(tmp_path, capsys, source, change):
    """Each change keeps the byte count the metadata implies, so only the checksum can tell;
    repack (from the repacked file), verify (exit 2: could not compare) and the model loader's
    check all refuse it, naming the tensor, and nothing is written."""
    from pyq2.cli import main

    good = tmp_path / "t.gguf"
    repack(source, good)  # tiles rt 2
    bad = tmp_path / "bad.gguf"
    if change == "tiles-to-planes":
        rewrite(
            good,
            bad,
            {
                key("layout"): gguf_io.encode_kv(key("layout"), V.STRING, "planes"),
                key("rt"): gguf_io.encode_kv(key("rt"), V.UINT32, 0),
            },
        )
    elif change.startswith("rt2-to"):
        rt = int(change[-1])
        rewrite(good, bad, {key("rt"): gguf_io.encode_kv(key("rt"), V.UINT32, rt)})
    elif change == "damaged-byte":
        patched(good, bad, lambda b, f: b.__setitem__(f.tensor(W).offset + 7, b[7] ^ 0x01))
    else:

        def off_by_one(b, f):
            at = f.fields[key("crc32")].value_offset
            struct.pack_into("<I", b, at, (f.value(key("crc32")) + 1) % (1 << 32))

        patched(good, bad, off_by_one)
    with gguf_io.open_gguf(bad) as f:
        read_contents(f, check_sums=False)  # structurally it is a fine file
        with pytest.raises(FormatError, match=rf"tensor '{W}': its bytes and pyq2 keys give"):
            load.check(f)
    with pytest.raises(FormatError, match=rf"^{bad}: tensor '{W}': .*checksum"):
        repack(bad, tmp_path / "o.gguf", layout="raw")
    assert listing(tmp_path) == ["bad.gguf", "src.gguf", "t.gguf"]
    code = main(["verify", str(source), str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pyq2: error: ") and f"tensor '{W}'" in err
    # the same edit made knowingly (checksums recomputed) is read as what it now says: verify
    # then tells the weights apart (the relabelling is what the checksum is for)
    if change != "checksum-off":
        assert not verify(source, reseal(bad)).ok


def test_relabelled_fused_members_are_refused(tmp_path, demo):
    """A fused tensor's member keys are covered too: members swapped, rows moved from one
    member to another."""
    fused = tmp_path / "f.gguf"
    repack(demo, fused, fuse=True, layout="planes")
    name = "blk.0.ffn_gate+ffn_up.weight"
    rows = key("member_rows", name)
    offsets = key("member_offsets", name)
    bad = rewrite(
        fused,
        tmp_path / "bad.gguf",
        {
            rows: gguf_io.encode_kv(rows, V.ARRAY, [767, 769], V.UINT64),
            offsets: gguf_io.encode_kv(offsets, V.ARRAY, [0, 767], V.UINT64),
        },
    )
    with pytest.raises(FormatError) as e:
        repack(bad, tmp_path / "o.gguf", layout="raw")
    assert f"tensor '{name}': its bytes and pyq2 keys give the checksum" in str(e.value)


@pytest.mark.parametrize(
    "attr,record,why",
    [
        ("rt", lambda k: gguf_io.encode_kv(k, V.STRING, "2"), "rt is '2', not an unsigned integer"),
        ("rt", lambda k: gguf_io.encode_kv(k, V.FLOAT32, 2.0), "rt is 2.0, not an unsigned"),
        ("rt", lambda k: gguf_io.encode_kv(k, V.BOOL, True), "rt is True, not an unsigned"),
        (
            "shape",
            lambda k: gguf_io.encode_kv(k, V.ARRAY, [256.0, 64.0], V.FLOAT32),
            "shape is [256.0, 64.0], not an array of at most 2 unsigned integers",
        ),
        (
            "shape",
            lambda k: gguf_io.encode_kv(k, V.ARRAY, np.arange(3_000_000), V.UINT64),
            "shape has 3000000 elements; pyq2 writes at most 2 there",
        ),
        ("layout", lambda k: gguf_io.encode_kv(k, V.UINT32, 2), "layout is 2, not a string"),
        (
            "source_type",
            lambda k: gguf_io.encode_kv(k, V.STRING, "142"),
            "source_type is '142', not an unsigned integer",
        ),
        ("crc32", lambda k: gguf_io.encode_kv(k, V.STRING, "0"), "crc32 is '0', not an unsigned"),
        ("rt", lambda k: None, f"incomplete pyq2 metadata (no {key('rt')})"),
        ("shape", lambda k: None, f"incomplete pyq2 metadata (no {key('shape')})"),
        (
            "crc32",
            lambda k: None,
            f"no {key('crc32')}; a file repacked by a pyq2 older than its checksums: repack the "
            "original GGUF again",
        ),
        (
            "layout",
            lambda k: None,
            f"no {key('layout')}, but {key('rt')}",  # not read as a plain I8 tensor
        ),
    ],
    ids=[
        "rt-string",
        "rt-float",
        "rt-bool",
        "shape-floats",
        "shape-huge",
        "layout-int",
        "source-string",
        "crc-string",
        "no-rt",
        "no-shape",
        "no-crc",
        "no-layout",
    ],
)
def test_loose_or_missing_keys_are_refused_naming_the_key(tmp_path, source, attr, record, why):
    good = tmp_path / "t.gguf"
    repack(source, good)
    bad = rewrite(good, tmp_path / "bad.gguf", {key(attr): record(key(attr))})
    with pytest.raises(FormatError) as e:
        repack(bad, tmp_path / "o.gguf")
    msg = str(e.value)
    assert msg.startswith(f"{bad}: tensor '{W}'") and len(msg) < 400, msg
    assert why in msg, msg


def test_checksums_cost_one_read_of_the_repacked_tensors(tmp_path, source, monkeypatch):
    """read_contents reads each planes or tiles tensor once for its checksum; info (which does
    not decode weights) skips it."""
    from pyq2.offline.info import describe

    good = tmp_path / "t.gguf"
    repack(source, good)
    reads = []
    real = gguf_io.GGUFFile.read

    def counting(self, offset, n, what):
        if what.startswith("tensor"):
            reads.append(n)
        return real(self, offset, n, what)

    monkeypatch.setattr(gguf_io.GGUFFile, "read", counting)
    with gguf_io.open_gguf(good) as f:
        read_contents(f)
        assert sum(reads) == f.tensor(W).nbytes
    reads.clear()
    describe(good)
    assert reads == []
