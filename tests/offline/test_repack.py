"""The repacker (pyq2.offline.repack) and pyq2.offline.verify: layouts, byte-exact round trips,
pass-through, bad input, and what verify reports."""

import errno
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

import pyq2.gguf.weights
from pyq2.errors import FormatError, RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf.io import OutTensor
from pyq2.offline.demo import write_demo_model
from pyq2.offline.repack import default_out_path, repack
from pyq2.offline.verify import verify
from pyq2.spec import formats, layouts

from ..conftest import listing, patched, random_pq2, ternary_pq2, write_gguf_file

# ---- references and builders --------------------------------------------------------------


def data_region(path) -> bytes:
    with gguf_io.open_gguf(path) as f:
        start = f.data_offset
    with open(path, "rb") as fh:
        fh.seek(start)
        return fh.read()


def kv_records(path, skip_pyq2=True) -> list:
    """(key, raw record bytes) of every key/value, in file order."""
    with gguf_io.open_gguf(path) as f:
        return [(k, f.kv_record(k)) for k in f.keys() if not (skip_pyq2 and k.startswith("pyq2."))]


def tensors_of(path) -> dict:
    """name -> (type id, ne, bytes) of every tensor."""
    with gguf_io.open_gguf(path) as f:
        return {t.name: (t.type_id, t.ne, f.data(t).tobytes()) for t in f.tensors}


# (name, source type, K, N): odd N exercises the tile padding rows, N = 1 the smallest matrix.
WEIGHTS = [
    ("blk.0.attn_q.weight", "PQ2_0", 256, 100),
    ("blk.0.ffn_down.weight", "PQ2_0", 384, 65),
    ("blk.0.one_row.weight", "PQ2_0", 128, 1),
    ("blk.0.ffn_up.weight", "PQ2_0", 512, 64),
]


def write_model(path, rng, weights=WEIGHTS, alignment=32, extra_kv=()):
    """A model mixing PQ2_0/PTQ1_0/TQ2_0 weights with pass-through tensors of several types.

    Returns {name: PQ2_0 raw bytes} of the weights (PTQ1_0/TQ2_0 converted by pyq2.spec.formats).
    """
    tensors, raws = [], {}
    f32 = rng.standard_normal(33).astype("<f4")
    tensors.append((OutTensor("norm.weight", int(Q.F32), (33,), f32.nbytes), f32))
    for name, kind, k, n in weights:
        if kind == "PQ2_0":
            raw = random_pq2(rng, n, k)
            data, tid = raw, gguf_io.PQ2_0
        elif kind == "PTQ1_0":
            raw = ternary_pq2(rng, n * k // 128)
            data, tid = formats.pq2_to_ptq1(raw), gguf_io.PTQ1_0
        else:  # TQ2_0: 256-weight blocks
            tq = rng.integers(0, 256, (n * k // 256, 66), dtype=np.uint8)
            tq[:, 64:] = (rng.random((len(tq), 1)) * 0.05).astype(np.float16).view(np.uint8)
            data, tid = tq.reshape(-1), gguf_io.TQ2_0
            raw = formats.tq2_to_pq2(data)
        raws[name] = raw.tobytes()
        tensors.append((OutTensor(name, tid, (k, n), data.nbytes), data))
    f16 = rng.standard_normal((3, 64)).astype("<f2")
    tensors.append((OutTensor("f16.weight", int(Q.F16), (64, 3), f16.nbytes), f16))
    q8 = rng.integers(0, 256, 4 * 34, dtype=np.uint8)
    tensors.append((OutTensor("q8.weight", int(Q.Q8_0), (64, 2), q8.nbytes), q8))
    kv = [
        ("general.architecture", V.STRING, "qwen35"),
        ("general.file_type", V.UINT32, 141),
        ("t.bool", V.BOOL, True),
        ("t.f32", V.FLOAT32, 0.1),
        ("t.i8", V.INT8, -3),
        ("t.tokens", V.ARRAY, ["a", "bb", ""], V.STRING),
        ("t.scores", V.ARRAY, [0.5, -1.0, 3.0], V.FLOAT32),
        ("t.empty", V.ARRAY, [], V.UINT8),
        ("t.u64", V.UINT64, 2**60),
        *extra_kv,
    ]
    write_gguf_file(path, kv, tensors, alignment=alignment)
    return raws


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    raws = write_model(path, np.random.default_rng(0))
    return path, raws


# ---- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [32, 64], ids=["align32", "align64"])
@pytest.mark.parametrize(
    "layout,rt",
    [("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)],
    ids=["planes", "tiles-rt1", "tiles-rt2", "tiles-rt4"],
)
def test_round_trip_to_raw_is_byte_identical(tmp_path, layout, rt, alignment):
    src = tmp_path / "m.gguf"
    write_model(src, np.random.default_rng(1), alignment=alignment)
    mid, back = tmp_path / "mid.gguf", tmp_path / "back.gguf"
    s1 = repack(src, mid, layout=layout, rt=rt)
    assert (s1.converted, s1.passed) == (len(WEIGHTS), 3)
    repack(mid, back, layout="raw")
    assert data_region(back) == data_region(src)
    # With a PQ2_0 source the whole file comes back: same keys, tensor infos and data.
    assert back.read_bytes() == src.read_bytes()


@pytest.mark.parametrize(
    "layout,rt",
    [("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)],
    ids=["planes", "tiles-rt1", "tiles-rt2", "tiles-rt4"],
)
def test_repacked_bytes_match_the_layout_reference(tmp_path, model, layout, rt):
    src, raws = model
    out = tmp_path / "o.gguf"
    repack(src, out, layout=layout, rt=rt)
    got = tensors_of(out)
    for name, _, k, n in WEIGHTS:
        tid, ne, data = got[name]
        want = layouts.convert(np.frombuffer(raws[name], np.uint8), n, k, "raw", layout, 0, rt)
        assert (tid, ne) == (gguf_io.I8, (want.nbytes,))
        assert data == want.tobytes(), name


@pytest.mark.parametrize("chunk", [1, 3 * 34 * 4], ids=["one-tile-per-slice", "small-slices"])
@pytest.mark.parametrize("kind", ["PQ2_0", "PTQ1_0", "TQ2_0"])
@pytest.mark.parametrize(
    "layout,rt",
    [("raw", 0), ("planes", 0), ("tiles", 1), ("tiles", 4)],
    ids=["raw", "planes", "tiles-rt1", "tiles-rt4"],
)
def test_row_slices_give_whole_tensor_bytes(tmp_path, monkeypatch, layout, rt, kind, chunk):
    """Weights are converted in slices of rows; the result must equal one whole conversion."""
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", chunk)
    weights = [("w.a", kind, 512, 200), ("w.b", kind, 256, 1), ("w.c", kind, 768, 129)]
    src, out = tmp_path / "m.gguf", tmp_path / "o.gguf"
    raws = write_model(src, np.random.default_rng(7), weights=weights)
    repack(src, out, layout=layout, rt=rt)
    got = tensors_of(out)
    for name, _, k, n in weights:
        want = layouts.convert(np.frombuffer(raws[name], np.uint8), n, k, "raw", layout, 0, rt)
        assert got[name][2] == want.tobytes(), name


STORED = [("planes", 0), ("tiles", 1), ("tiles", 4)]


@pytest.mark.parametrize("dst,dst_rt", [("raw", 0), ("planes", 0), ("tiles", 2), ("tiles", 4)])
@pytest.mark.parametrize("src,src_rt", STORED, ids=["planes", "tiles-rt1", "tiles-rt4"])
def test_repacked_source_is_read_in_slices(tmp_path, monkeypatch, src, src_rt, dst, dst_rt):
    """A planes/tiles source is read a slice of whole tiles at a time, never whole, and the
    slices give the bytes of one whole conversion."""
    weights = [("w.a", "PQ2_0", 512, 200), ("w.b", "PQ2_0", 256, 1), ("w.c", "PQ2_0", 768, 129)]
    raw_src, stored, out = tmp_path / "m.gguf", tmp_path / "s.gguf", tmp_path / "o.gguf"
    raws = write_model(raw_src, np.random.default_rng(8), weights=weights)
    repack(raw_src, stored, layout=src, rt=src_rt)
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", 1)  # one tile of 64 rows at most
    asked = []
    data = gguf_io.GGUFFile.data

    def spy(self, t, start=0, stop=None):
        view = data(self, t, start, stop)
        asked.append((t.name, view.nbytes))
        return view

    monkeypatch.setattr(gguf_io.GGUFFile, "data", spy)
    repack(stored, out, layout=dst, rt=dst_rt)
    assert verify(stored, out).ok and verify(out, stored).ok
    for name, _, k, n in weights:
        # at most 64 rows of codes, of scales or of raw blocks: a slice, not the tensor
        largest = max(size for t, size in asked if t == name)
        assert largest <= 64 * k // 128 * 34, name
        assert n < 64 or largest < layouts.layout_bytes(src, n, k, src_rt) // 2, name
    got = tensors_of(out)
    for name, _, k, n in weights:
        want = layouts.convert(np.frombuffer(raws[name], np.uint8), n, k, "raw", dst, 0, dst_rt)
        assert got[name][2] == want.tobytes(), name


def test_other_tensors_and_metadata_pass_through(tmp_path, model):
    src, _ = model
    out = tmp_path / "o.gguf"
    repack(src, out, layout="tiles", rt=2)
    before, after = tensors_of(src), tensors_of(out)
    for name in ("norm.weight", "f16.weight", "q8.weight"):
        assert after[name] == before[name]
    assert list(after) == list(before)  # tensor order kept
    assert kv_records(out) == kv_records(src)  # same keys, order, types and value bytes
    # The pyq2 keys come after all of the source's keys.
    keys = [k for k, _ in kv_records(out, skip_pyq2=False)]
    n_src = len(kv_records(src))
    assert all(k.startswith("pyq2.") for k in keys[n_src:]) and len(keys) > n_src


def test_pyq2_metadata(tmp_path, model):
    src, _ = model
    out = tmp_path / "o.gguf"
    repack(src, out, layout="tiles", rt=2)
    with gguf_io.open_gguf(out) as f:
        assert f.value("pyq2.format_version") == 2
        assert f.value_type("pyq2.format_version") == V.UINT32
        assert f.value("pyq2.layout") == "tiles"
        for name, _, k, n in WEIGHTS:
            key = f"pyq2.tensor.{name}."
            assert f.value(key + "layout") == "tiles" and f.value(key + "rt") == 2
            assert f.value_type(key + "rt") == V.UINT32
            assert f.value(key + "shape") == [k, n] and f.array_type(key + "shape") == V.UINT64
            assert f.value(key + "source_type") == 142
            info = f.weight_info(f.tensor(name))
            assert (info.layout.name, info.layout.rt, info.k, info.n) == ("tiles", 2, k, n)


def test_a_loader_expecting_pq2_fails_loudly(tmp_path, model):
    """What a llama.cpp-style loader checks (type and 2-D shape) cannot pass on a repacked file."""
    src, _ = model
    out = tmp_path / "o.gguf"
    repack(src, out, layout="planes")
    import gguf

    r = gguf.GGUFReader(out)  # the stock reader still reads it: I8 is a plain type
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    assert t.tensor_type == Q.I8 and t.shape.tolist() != [256, 100] and len(t.shape) == 1


def test_layout_to_layout_and_verify(tmp_path, model):
    src, _ = model
    paths = {}
    for layout, rt in [("planes", 0), ("tiles", 1), ("tiles", 4)]:
        paths[layout, rt] = tmp_path / f"{layout}{rt}.gguf"
        repack(src, paths[layout, rt], layout=layout, rt=rt)
    # tiles rt1 -> tiles rt4 and planes -> tiles rt4 give the direct rt4 bytes.
    for start in [("tiles", 1), ("planes", 0)]:
        o = tmp_path / f"from_{start[0]}{start[1]}.gguf"
        repack(paths[start], o, layout="tiles", rt=4)
        assert o.read_bytes() == paths["tiles", 4].read_bytes()
    for p in paths.values():
        assert verify(src, p).ok and verify(p, src).ok
    assert verify(paths["planes", 0], paths["tiles", 1]).ok


@pytest.mark.parametrize("kind", ["PTQ1_0", "TQ2_0"])
def test_ptq1_and_tq2_sources(tmp_path, kind):
    weights = [("w.a", kind, 256, 7), ("w.b", kind, 512, 64), ("w.c", "PQ2_0", 256, 3)]
    src = tmp_path / "m.gguf"
    raws = write_model(src, np.random.default_rng(2), weights=weights)
    raw, tiles = tmp_path / "raw.gguf", tmp_path / "tiles.gguf"
    s = repack(src, raw, layout="raw")
    assert s.converted == 3
    got = tensors_of(raw)
    for name, _, k, n in weights:
        assert got[name] == (gguf_io.PQ2_0, (k, n), raws[name]), name
    repack(src, tiles, layout="tiles", rt=4)
    with gguf_io.open_gguf(tiles) as f:
        assert f.value("pyq2.tensor.w.a.source_type") == {"PTQ1_0": 143, "TQ2_0": 35}[kind]
    assert verify(src, tiles).ok and verify(raw, tiles).ok
    # Back to raw from tiles gives the converted PQ2_0 file.
    back = tmp_path / "back.gguf"
    repack(tiles, back, layout="raw")
    assert back.read_bytes() == raw.read_bytes()


def test_demo_model_round_trip(tmp_path, demo):
    src = demo
    tiles, back = tmp_path / "t.gguf", tmp_path / "b.gguf"
    repack(src, tiles)
    repack(tiles, back, layout="raw")
    assert verify(src, back).ok and verify(src, tiles).ok
    with gguf_io.open_gguf(back) as f:
        assert f.tensor("output.weight").type_id == gguf_io.PQ2_0  # the PTQ1_0 head, now PQ2_0
    assert kv_records(back) == kv_records(src)


def test_demo_model_is_deterministic(tmp_path):
    a = write_demo_model(tmp_path / "a.gguf", seed=3)
    b = write_demo_model(tmp_path / "b.gguf", seed=3)
    c = write_demo_model(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_native_and_numpy_backends_agree(tmp_path, model):
    from pyq2.lib import native as _native

    if not _native.available():
        pytest.skip("libpq2 is not built")
    src, _ = model
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert repack(src, a, backend="numpy").backend == "numpy"
    assert repack(src, b, backend="native").backend == "libpq2"
    assert a.read_bytes() == b.read_bytes()


def test_file_without_weights_is_copied_unchanged(tmp_path):
    src, out = tmp_path / "m.gguf", tmp_path / "o.gguf"
    write_model(src, np.random.default_rng(3), weights=[])
    s = repack(src, out, layout="tiles")
    assert (s.converted, s.passed) == (0, 3)
    assert out.read_bytes() == src.read_bytes()


def test_three_d_weight(tmp_path):
    rng = np.random.default_rng(4)
    raw = random_pq2(rng, 6, 256)
    t = OutTensor("experts.weight", gguf_io.PQ2_0, (256, 3, 2), raw.nbytes)
    src = tmp_path / "m.gguf"
    write_gguf_file(src, [], [(t, raw)])
    out = tmp_path / "raw.gguf"
    repack(src, out, layout="raw")
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(FormatError, match=r"shape \[256, 3, 2\].*2-D"):
        repack(src, tmp_path / "t.gguf", layout="tiles")
    assert listing(tmp_path) == ["m.gguf", "raw.gguf"]


# ---- options ------------------------------------------------------------------------------


def test_dry_run_writes_nothing(tmp_path, model):
    src, _ = model
    out = tmp_path / "o.gguf"
    s = repack(src, out, dry_run=True)
    assert s.dry_run and (s.converted, s.passed) == (len(WEIGHTS), 3)
    assert listing(tmp_path) == ["model.gguf"]
    repack(src, out)
    assert s.bytes_out == out.stat().st_size


def test_existing_output_needs_force(tmp_path, model):
    src, _ = model
    out = tmp_path / "o.gguf"
    out.write_bytes(b"old")
    with pytest.raises(RepackError, match="exists.*--force"):
        repack(src, out)
    assert out.read_bytes() == b"old"
    repack(src, out, force=True)
    assert verify(src, out).ok


def test_output_equal_to_input_is_refused(tmp_path, model):
    src, _ = model
    before = src.read_bytes()
    link, hard = tmp_path / "link.gguf", tmp_path / "hard.gguf"
    link.symlink_to(src)
    os.link(src, hard)
    for out in (src, link, hard, tmp_path / "." / "model.gguf"):
        with pytest.raises(RepackError, match="is the input"):
            repack(src, out, force=True)
    assert src.read_bytes() == before


def test_default_output_path():
    assert default_out_path("/m/a.gguf", "tiles").as_posix() == "/m/a.pyq2-tiles.gguf"
    assert default_out_path("/m/a.pyq2-tiles.gguf", "raw").as_posix() == "/m/a.pyq2-raw.gguf"
    assert default_out_path("a.bin", "planes").as_posix() == "a.bin.pyq2-planes.gguf"


def test_default_output_is_written_next_to_input(tmp_path, model):
    src, _ = model
    s = repack(src, layout="planes")
    assert s.out_path == str(tmp_path / "model.pyq2-planes.gguf")
    assert verify(src, s.out_path).ok


@pytest.mark.parametrize("layout,rt", [("tiles", 3), ("bogus", 4)])
def test_bad_options(tmp_path, model, layout, rt):
    src, _ = model
    with pytest.raises(RepackError):
        repack(src, tmp_path / "o.gguf", layout=layout, rt=rt)


def test_progress_reports_every_byte(tmp_path, model):
    src, _ = model
    seen = []
    repack(src, tmp_path / "o.gguf", progress=lambda done, total, name: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)


# ---- bad input ----------------------------------------------------------------------------


def _poison_scale(path, name, block, value, block_bytes=34, scale_at=0):
    """Set the fp16 scale of a block of tensor `name` in place."""

    def edit(blob, f):
        at = f.tensor(name).offset + block * block_bytes + scale_at
        blob[at : at + 2] = np.float16(value).tobytes()

    patched(path, path, edit)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_scale_names_tensor_row_block(tmp_path, model, value):
    src, _ = model
    # attn_q: K = 256, two blocks per row; flat block 5 is row 2, block 1.
    _poison_scale(src, "blk.0.attn_q.weight", 5, value)
    with pytest.raises(FormatError, match=r"'blk.0.attn_q.weight': row 2, block 1 has scale"):
        repack(src, tmp_path / "o.gguf")
    assert listing(tmp_path) == ["model.gguf"]


def test_non_finite_scale_row_in_a_later_slice(tmp_path, model, monkeypatch):
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", 1)  # one 64-row tile per slice
    src, _ = model
    _poison_scale(src, "blk.0.attn_q.weight", 2 * 70 + 1, np.nan)  # row 70, block 1
    with pytest.raises(FormatError, match=r"'blk.0.attn_q.weight': row 70, block 1 has scale nan"):
        repack(src, tmp_path / "o.gguf")


def test_non_finite_scale_in_ptq1(tmp_path):
    src = tmp_path / "m.gguf"
    write_model(src, np.random.default_rng(5), weights=[("w.p", "PTQ1_0", 256, 4)])
    # Block 3 (row 1, block 1); a PTQ1_0 block keeps its scale last, at byte 26 of 28.
    _poison_scale(src, "w.p", 3, np.nan, block_bytes=28, scale_at=26)
    with pytest.raises(FormatError, match=r"tensor 'w.p': row 1, block 1"):
        repack(src, tmp_path / "o.gguf", layout="planes")


def planes_with_key(src, tmp_path, key, record):
    """src repacked to planes, then rewritten with metadata `key` replaced by record(key)."""
    planes = tmp_path / "p.gguf"
    repack(src, planes, layout="planes")
    bad = tmp_path / "bad.gguf"
    with gguf_io.open_gguf(planes) as f:
        recs = [f.kv_record(k) if k != key else record(k) for k in f.keys()]
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        gguf_io.write_gguf(bad, recs, outs, lambda i, t: (f.data(f.tensors[i]),))
    return bad


def test_inconsistent_pyq2_metadata(tmp_path, model):
    src, _ = model
    # Claim the weight is 3 rows bigger than its bytes.
    bad = planes_with_key(
        src,
        tmp_path,
        "pyq2.tensor.blk.0.attn_q.weight.shape",
        lambda k: gguf_io.encode_kv(k, V.ARRAY, [256, 103], V.UINT64),
    )
    with pytest.raises(FormatError, match="attn_q.weight' holds .* bytes"):
        repack(bad, tmp_path / "o.gguf")


@pytest.mark.parametrize("shape", [[0, 100], [256, 0], [-128, 100]], ids=["k0", "n0", "k-neg"])
def test_pyq2_shape_that_is_no_weight_names_file_and_tensor(tmp_path, model, shape):
    src, _ = model
    bad = planes_with_key(
        src,
        tmp_path,
        "pyq2.tensor.blk.0.attn_q.weight.shape",
        lambda k: gguf_io.encode_kv(k, V.ARRAY, shape, V.INT64),
    )
    why = (
        "pyq2.tensor.blk.0.attn_q.weight.shape is \\[-128, 100\\], not an array of at most 2 "
        "unsigned integers"
        if shape[0] < 0
        else ".*a weight needs"
    )
    with pytest.raises(FormatError, match=rf"^{bad}: tensor 'blk.0.attn_q.weight'(: | ){why}"):
        repack(bad, tmp_path / "o.gguf")


# A newer version needs a newer pyq2; version 1 stored the tiles lanes in another order, so
# reading it as version 2 would be wrong: it asks for a repack.
@pytest.mark.parametrize("version,hint", [(3, "upgrade pyq2"), (1, "repack the original GGUF")])
def test_other_format_version_is_refused(tmp_path, model, version, hint):
    src, _ = model
    bad = planes_with_key(
        src, tmp_path, "pyq2.format_version", lambda k: gguf_io.encode_kv(k, V.UINT32, version)
    )
    with pytest.raises(FormatError, match=rf"format_version is {version}.*{hint}"):
        repack(bad, tmp_path / "o.gguf")


def test_full_disk_leaves_no_output(tmp_path, model, full_disk):
    src, _ = model
    full_disk(4)  # header and a few tensors in
    with pytest.raises(OSError) as e:
        repack(src, tmp_path / "o.gguf")
    assert e.value.errno == errno.ENOSPC and listing(tmp_path) == ["model.gguf"]


def test_interrupt_leaves_no_output(tmp_path, model):
    src, _ = model

    def interrupt(done, total, name):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(src, tmp_path / "o.gguf", progress=interrupt)
    assert listing(tmp_path) == ["model.gguf"]


# ---- verify -------------------------------------------------------------------------------


def _flip(path, name, byte, mask):
    """XOR byte `byte` of tensor `name` with mask, in place."""

    def edit(blob, f):
        blob[f.tensor(name).offset + byte] ^= mask

    patched(path, path, edit)


@pytest.mark.parametrize("chunk", [1, 16 << 20], ids=["row-slices", "whole"])
def test_verify_names_first_code_mismatch(tmp_path, model, monkeypatch, chunk):
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", chunk)
    src, _ = model
    raw = tmp_path / "raw.gguf"
    repack(src, raw, layout="raw")
    # Row 1 of ffn_down (K = 384: 3 blocks a row), block 2, qs byte 5, shift 4: weight 5*4 + 2 = 22.
    _flip(raw, "blk.0.ffn_down.weight", (1 * 3 + 2) * 34 + 2 + 5, 0b00110000)
    res = verify(src, raw)
    assert not res.ok
    assert res.message.startswith("tensor 'blk.0.ffn_down.weight' row 1 column 278: code")


def test_verify_names_scale_mismatch_through_tiles(tmp_path, model):
    src, _ = model
    raw, tiles = tmp_path / "raw.gguf", tmp_path / "tiles.gguf"
    repack(src, raw, layout="raw")
    _flip(raw, "blk.0.attn_q.weight", 3 * 34, 0x01)  # scale of row 1, block 1
    repack(raw, tiles)
    res = verify(src, tiles)
    assert not res.ok and "tensor 'blk.0.attn_q.weight' row 1 block 1: scale" in res.message


def test_verify_mismatch_in_a_later_slice_of_two_layouts(tmp_path, model, monkeypatch):
    """tiles rt 1 against planes, a slice of 16 rows at a time: row 70 is in the fifth slice."""
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", 1)
    src, _ = model
    raw, planes, tiles = tmp_path / "raw.gguf", tmp_path / "p.gguf", tmp_path / "t.gguf"
    repack(src, raw, layout="raw")
    # attn_q (K = 256, 2 blocks a row): row 70, block 1, qs byte 0, shift 0: column 128.
    _flip(raw, "blk.0.attn_q.weight", (70 * 2 + 1) * 34 + 2, 0b11)
    repack(raw, planes, layout="planes")
    repack(src, tiles, layout="tiles", rt=1)
    res = verify(tiles, planes)
    assert res.message.startswith("tensor 'blk.0.attn_q.weight' row 70 column 128: code")


def test_verify_other_differences(tmp_path, model):
    src, _ = model
    other = tmp_path / "o.gguf"
    repack(src, other, layout="raw")
    _flip(other, "q8.weight", 7, 0xFF)
    res = verify(src, other)
    assert not res.ok and res.message == "tensor 'q8.weight' (Q8_0): bytes differ at offset 7"
    changed = tmp_path / "c.gguf"
    write_model(changed, np.random.default_rng(0), extra_kv=[("t.extra", V.UINT8, 1)])
    res = verify(src, changed)
    assert not res.ok and "t.extra" in res.message
    fewer = tmp_path / "f.gguf"
    write_model(fewer, np.random.default_rng(0), weights=WEIGHTS[:2])
    res = verify(src, fewer)
    assert not res.ok and "is missing from" in res.message
