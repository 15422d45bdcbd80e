"""GGUF I/O (pyq2.gguf.io): reading, streaming atomic writing, bad files."""

import os
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from pyq2.errors import FormatError
from pyq2.gguf import io as gguf_io
from pyq2.gguf.io import OutTensor

from ..conftest import listing, random_pq2, tensor_info_offset, write_gguf_file

# ---- references and builders --------------------------------------------------------------

# One key of every value type, arrays of every element type, an empty array, an odd bool byte
# is not representable through the writer, so bools are 0/1.
ALL_KV = [
    ("t.u8", V.UINT8, 200),
    ("t.i8", V.INT8, -5),
    ("t.u16", V.UINT16, 65000),
    ("t.i16", V.INT16, -300),
    ("t.u32", V.UINT32, 4_000_000_000),
    ("t.i32", V.INT32, -7),
    ("t.f32", V.FLOAT32, 0.1),
    ("t.u64", V.UINT64, 2**63 + 5),
    ("t.i64", V.INT64, -(2**40)),
    ("t.f64", V.FLOAT64, 1 / 3),
    ("t.bool", V.BOOL, True),
    ("t.str", V.STRING, "héllo"),
    ("t.empty_str", V.STRING, ""),
    ("t.a_u8", V.ARRAY, [1, 2, 255], V.UINT8),
    ("t.a_i32", V.ARRAY, [-1, 0, 1], V.INT32),
    ("t.a_f32", V.ARRAY, [0.5, -2.25], V.FLOAT32),
    ("t.a_u64", V.ARRAY, [1, 2**64 - 1], V.UINT64),
    ("t.a_bool", V.ARRAY, [True, False], V.BOOL),
    ("t.a_str", V.ARRAY, ["a", "", "ccc"], V.STRING),
    ("t.a_empty", V.ARRAY, [], V.INT32),
    ("t.a_f64", V.ARRAY, [1e300], V.FLOAT64),
]


def write_model(path, rng, kv=ALL_KV, alignment=32, weights=((256, 3),), extra_tensors=True):
    """A small file with PQ2_0 weights (K, N), an F32 and a Q8_0 tensor; returns {name: bytes}."""
    tensors = []
    for i, (k, n) in enumerate(weights):
        tensors.append(
            (
                OutTensor(f"w{i}.weight", gguf_io.PQ2_0, (k, n), n * k // 128 * 34),
                random_pq2(rng, n, k),
            )
        )
    if extra_tensors:
        f = rng.standard_normal(7).astype("<f4")
        tensors.append((OutTensor("norm.weight", int(Q.F32), (7,), f.nbytes), f.view(np.uint8)))
        q8 = rng.integers(0, 256, 2 * 34, dtype=np.uint8)
        tensors.append((OutTensor("q8.weight", int(Q.Q8_0), (32, 2), q8.nbytes), q8))
    write_gguf_file(path, kv, tensors, alignment=alignment)
    return {t.name: bytes(d) for t, d in tensors}


# ---- reading ------------------------------------------------------------------------------


def test_values_and_types_read_back(tmp_path):
    path = tmp_path / "m.gguf"
    data = write_model(path, np.random.default_rng(3), alignment=64)
    with gguf_io.open_gguf(path) as f:
        assert f.alignment == 64 and f.version == 3
        assert f.data_offset % 64 == 0 and all(t.offset % 64 == 0 for t in f.tensors)
        for key, vtype, value, *sub in ALL_KV:
            assert f.value_type(key) == vtype, key
            got = f.value(key)
            if vtype == V.FLOAT32:
                assert got == pytest.approx(value, rel=1e-7)
            elif vtype == V.ARRAY and sub[0] == V.FLOAT32:
                assert got == pytest.approx(value)
            else:
                assert got == value, key
            if vtype == V.ARRAY:
                assert f.array_len(key) == len(value)
                assert f.array_type(key) == (sub[0] if value else None)
        for t in f.tensors:
            assert f.data(t).tobytes() == data[t.name]
        assert f.tensor("norm.weight").type_name == "F32"


def test_header_parsing_matches_stock_reader(tmp_path):
    """Keys, record places, value types, values and tensor infos agree with gguf.GGUFReader."""
    path = tmp_path / "m.gguf"
    kv = ALL_KV + [
        ("big.str", V.ARRAY, [f"tok{i}" * (i % 5) for i in range(3000)], V.STRING),
        ("big.f32", V.ARRAY, np.arange(3000, dtype=np.float32), V.FLOAT32),
    ]
    write_model(path, np.random.default_rng(4), kv=kv)
    stock = gguf.GGUFReader(path)
    with gguf_io.open_gguf(path) as f:
        stock_kvs = list(stock.fields.items())[3:]  # the first three are the header
        assert [k for k, _ in stock_kvs] == f.keys()
        for key, a in stock_kvs:
            assert (a.offset, sum(p.nbytes for p in a.parts)) == (
                f.fields[key].offset,
                f.fields[key].size,
            ), key
            assert a.types[0] == f.value_type(key), key
            want = a.contents()
            if isinstance(want, list) or a.types[0] == V.FLOAT32:
                assert f.value(key) == pytest.approx(want), key
            else:
                assert f.value(key) == want, key
        assert (stock.alignment, stock.data_offset) == (f.alignment, f.data_offset)
        for a, b in zip(stock.tensors, f.tensors, strict=True):
            assert (a.name, int(a.tensor_type), a.n_bytes, a.data_offset) == (
                b.name,
                b.type_id,
                b.nbytes,
                b.offset,
            )
            assert tuple(int(d) for d in a.shape) == b.ne


def test_kv_records_copy_gives_identical_file(tmp_path):
    """Copying every record and tensor through write_gguf reproduces the file byte for byte."""
    src, dst = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_model(src, np.random.default_rng(5), alignment=128, weights=((256, 3), (128, 1)))
    with gguf_io.open_gguf(src) as f:
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        gguf_io.write_gguf(
            dst,
            [f.kv_record(k) for k in f.keys()],
            outs,
            lambda i, t: (f.data(f.tensors[i]),),
            alignment=f.alignment,
        )
        assert gguf_io.file_size([f.kv_record(k) for k in f.keys()], outs, 128) == f.size
    assert src.read_bytes() == dst.read_bytes()


def test_release_keeps_data_readable(tmp_path):
    path = tmp_path / "m.gguf"
    data = write_model(path, np.random.default_rng(6))
    with gguf_io.open_gguf(path) as f:
        t = f.tensors[0]
        f.release(t)
        assert f.data(t).tobytes() == data[t.name]
        assert f.data(t, 10, 20).tobytes() == data[t.name][10:20]


# ---- bad files ----------------------------------------------------------------------------


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.gguf"
    write_model(path, np.random.default_rng(7), weights=((256, 3),))
    return path


def test_empty_file(tmp_path):
    p = tmp_path / "e.gguf"
    p.write_bytes(b"")
    with pytest.raises(FormatError, match="empty file"):
        gguf_io.open_gguf(p)


def test_bad_magic(tmp_path, good_file):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + good_file.read_bytes()[4:])
    with pytest.raises(FormatError, match="not a GGUF file.*GGML"):
        gguf_io.open_gguf(p)


def test_truncated_at_every_region(tmp_path, good_file):
    blob = good_file.read_bytes()
    with gguf_io.open_gguf(good_file) as f:
        data_offset, last = f.data_offset, f.tensors[-1]
        kv_mid = f.fields["t.a_str"].offset + 20
    ti = tensor_info_offset(blob, "w0.weight")
    cuts = {
        "magic": 3,
        "version": 6,
        "counts": 20,
        "kv": kv_mid,
        "tensor_info": ti + 6,
        "first_tensor": data_offset + 10,
        "last_tensor": last.offset + last.nbytes - 1,
    }
    for where, cut in cuts.items():
        p = tmp_path / f"cut_{where}.gguf"
        p.write_bytes(blob[:cut])
        with pytest.raises(FormatError) as e:
            gguf_io.open_gguf(p)
        assert str(p) in str(e.value), where
        if where.endswith("tensor"):
            assert "truncated" in str(e.value) and "tensor '" in str(e.value)


def test_unknown_type_id(tmp_path, good_file):
    blob = bytearray(good_file.read_bytes())
    at = tensor_info_offset(blob, "norm.weight")
    n_dims = struct.unpack_from("<I", blob, at)[0]
    struct.pack_into("<I", blob, at + 4 + 8 * n_dims, 200)
    p = tmp_path / "t.gguf"
    p.write_bytes(bytes(blob))
    with pytest.raises(FormatError, match="tensor 'norm.weight': unknown ggml type id 200"):
        gguf_io.open_gguf(p)


def test_k_not_multiple_of_128(tmp_path, good_file):
    blob = bytearray(good_file.read_bytes())
    at = tensor_info_offset(blob, "w0.weight")
    struct.pack_into("<Q", blob, at + 4, 200)  # ne0 = K
    p = tmp_path / "k.gguf"
    p.write_bytes(bytes(blob))
    with pytest.raises(FormatError, match=r"'w0.weight' \(PQ2_0\): K = 200 is not a multiple"):
        gguf_io.open_gguf(p)


def test_missing_file_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        gguf_io.open_gguf(tmp_path / "nope.gguf")


# ---- writing: streaming and atomicity ----------------------------------------------------


def _simple_job(rng):
    tensors = [
        (OutTensor(f"t{i}", int(Q.F32), (1000,), 4000), rng.standard_normal(1000).astype("<f4"))
        for i in range(4)
    ]
    recs = [gguf_io.encode_kv("general.architecture", V.STRING, "x")]
    return recs, [t for t, _ in tensors], [d for _, d in tensors]


def test_tensor_data_is_requested_one_at_a_time(tmp_path):
    recs, outs, datas = _simple_job(np.random.default_rng(8))
    calls = []

    def data(i, t):
        calls.append(i)
        # The previous tensor has been handed to the file before this one is asked for.
        assert calls == list(range(i + 1))
        yield datas[i][:500]
        yield datas[i][500:]

    gguf_io.write_gguf(tmp_path / "o.gguf", recs, outs, data)
    with gguf_io.open_gguf(tmp_path / "o.gguf") as f:
        assert [f.data(t).tobytes() for t in f.tensors] == [d.tobytes() for d in datas]


@pytest.mark.parametrize("failure", ["exception", "keyboard_interrupt", "enospc", "short_data"])
def test_failed_write_leaves_nothing(tmp_path, full_disk, failure):
    recs, outs, datas = _simple_job(np.random.default_rng(9))
    out = tmp_path / "o.gguf"

    def data(i, t):
        if i == 2 and failure == "exception":
            raise RuntimeError("boom")
        if i == 2 and failure == "keyboard_interrupt":
            raise KeyboardInterrupt
        return (datas[i][:10],) if failure == "short_data" else (datas[i],)

    if failure == "enospc":
        full_disk(3)
    expected = {
        "exception": RuntimeError,
        "keyboard_interrupt": KeyboardInterrupt,
        "enospc": OSError,
        "short_data": ValueError,
    }[failure]
    with pytest.raises(expected):
        gguf_io.write_gguf(out, recs, outs, data)
    assert listing(tmp_path) == []


def test_failed_write_keeps_existing_destination(tmp_path):
    recs, outs, datas = _simple_job(np.random.default_rng(10))
    out = tmp_path / "o.gguf"
    out.write_bytes(b"previous")

    def data(i, t):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        gguf_io.write_gguf(out, recs, outs, data)
    assert out.read_bytes() == b"previous" and listing(tmp_path) == ["o.gguf"]


def test_written_file_has_ordinary_permissions(tmp_path):
    recs, outs, datas = _simple_job(np.random.default_rng(11))
    out = tmp_path / "o.gguf"
    gguf_io.write_gguf(out, recs, outs, lambda i, t: (datas[i],))
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask


def test_writer_rejects_wrong_sizes(tmp_path):
    bad = OutTensor("w", gguf_io.PQ2_0, (256, 2), 100)
    with pytest.raises(ValueError, match="do not match"):
        gguf_io.write_gguf(tmp_path / "o.gguf", [], [bad], lambda i, t: (b"",))
    assert listing(tmp_path) == []
