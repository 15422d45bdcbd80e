"""`pyq2 repack --fuse` (pyq2.offline.fuse): sibling projections written as one fused tensor each,
read back as the original tensors by repack, verify and info; round trips on the demo model and on a
qwen35 model of odd shapes, the fused bytes against the layout reference, the metadata, and
the refusal of fused metadata that contradicts itself or the file."""

import numpy as np
import pytest
from gguf import GGUFValueType as V

import pyq2.gguf.weights
from pyq2.errors import FormatError, RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf import metadata
from pyq2.gguf.io import OutTensor
from pyq2.offline import fuse
from pyq2.offline.info import describe
from pyq2.offline.repack import default_out_path, repack
from pyq2.offline.verify import verify
from pyq2.plan.decode import Dims
from pyq2.spec import formats, layouts
from pyq2.spec.rotation import contract_keys

from ..conftest import listing, patched, random_pq2, reseal, ternary_pq2, write_gguf_file

# ---- models -------------------------------------------------------------------------------

# A qwen35 model whose sibling groups fit some tile heights and not others: the Gated-DeltaNet
# qkv has 800 rows (whole 16- and 32-row tiles, not 64), attention k and v 40 (whole tiles of
# none); the FFN's 384 rows fit all. Layer 0 is Gated-DeltaNet, layer 1 attention.
ODD = Dims(2, 256, 384, 300, 16, 1, 40, 16, 2, 40, 2)
GDN = ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight")
ATTN = ("blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight")
FFN = [(f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight") for i in (0, 1)]
# the groups --fuse fuses in ODD, per (layout, rt)
ODD_FUSED = {
    ("planes", 0): [GDN, *FFN, ATTN],
    ("tiles", 1): [GDN, *FFN],
    ("tiles", 2): [GDN, *FFN],
    ("tiles", 4): FFN,
}


def write_qwen35(path, dims=ODD, seed=0, types=None, shuffle=False, folded=None, alignment=32):
    """A qwen35 GGUF of dims: random PQ2_0 weights (or the types `types` names: PTQ1_0, TQ2_0),
    F32 dense tensors, in the map's order or shuffled; with `folded` (weight names) an
    identity-sign rotation contract folding them. Returns {weight name: PQ2_0 raw bytes}."""
    rng = np.random.default_rng(seed)
    types = types or {}
    tensors, raws = [], {}
    for name, kind, ne in dims.tensors():
        if kind == "dense":
            data = rng.standard_normal(ne[::-1]).astype("<f4").reshape(-1)
            tensors.append((OutTensor(name, gguf_io.F32, ne, data.nbytes), data))
            continue
        k, n = ne
        kind = types.get(name, "PQ2_0")
        if kind == "PTQ1_0":
            raw = ternary_pq2(rng, n * k // 128)
            data, tid = formats.pq2_to_ptq1(raw), gguf_io.PTQ1_0
        elif kind == "TQ2_0":
            data = rng.integers(0, 256, (n * k // 256, 66), dtype=np.uint8)
            data[:, 64:] = (rng.random((len(data), 1)) * 0.05).astype("<f2").view(np.uint8)
            data, tid = data.reshape(-1), gguf_io.TQ2_0
            raw = formats.tq2_to_pq2(data)
        else:
            raw = data = random_pq2(rng, n, k)
            tid = gguf_io.PQ2_0
        raws[name] = raw.tobytes()
        tensors.append((OutTensor(name, tid, ne, data.nbytes), data))
    if shuffle:
        tensors = [tensors[i] for i in rng.permutation(len(tensors))]
    kv = [gguf_io.typed(key, v) for key, v in dims.keys().items()]
    if folded is not None:
        for key, value in contract_keys(128, None, folded):
            vtype = {int: V.UINT32, str: V.STRING}.get(type(value), V.ARRAY)
            kv.append((key, vtype, value, V.STRING) if vtype == V.ARRAY else (key, vtype, value))
    write_gguf_file(path, kv, tensors, alignment=alignment)
    return raws


def tensors_of(path):
    with gguf_io.open_gguf(path) as f:
        return {t.name: (t.type_id, t.ne, f.data(t).tobytes()) for t in f.tensors}


def fused_reference(raws, members, layout, rt, k=256):
    """The bytes of the members' rows as one matrix, converted whole by pyq2.spec.layouts."""
    raw = np.frombuffer(b"".join(raws[m] for m in members), np.uint8)
    n = raw.size // formats.pq2_matrix_bytes(1, k)
    return layouts.convert(raw, n, k, "raw", layout, 0, rt).tobytes()


LAYOUT_RTS = [("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)]
IDS = ["planes", "tiles-rt1", "tiles-rt2", "tiles-rt4"]


# ---- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("layout,rt", LAYOUT_RTS, ids=IDS)
def test_demo_round_trip(tmp_path, demo, layout, rt):
    fused, back, raw = tmp_path / "f.gguf", tmp_path / "b.gguf", tmp_path / "r.gguf"
    s = repack(demo, fused, layout=layout, rt=rt, fuse=True)
    assert (s.converted, s.passed, s.fused, s.fused_members, s.separate) == (15, 13, 4, 9, [])
    names = list(tensors_of(fused))
    assert names[2] == "blk.0.attn_qkv+attn_gate.weight"
    assert "blk.1.attn_q+attn_k+attn_v.weight" in names and "blk.1.attn_q.weight" not in names
    assert len(names) == 28 - 9 + 4
    assert verify(demo, fused).ok and verify(fused, demo).ok
    repack(fused, back, layout="raw")
    repack(demo, raw, layout="raw")
    assert back.read_bytes() == raw.read_bytes()  # the PTQ1_0 head comes back as PQ2_0 in both


@pytest.mark.parametrize("alignment", [32, 64], ids=["align32", "align64"])
@pytest.mark.parametrize("layout,rt", LAYOUT_RTS, ids=IDS)
def test_odd_shapes_round_trip_byte_identical(tmp_path, layout, rt, alignment):
    """All PQ2_0, tensors in a shuffled order: fused and back to raw is the original file."""
    src, fused, back = tmp_path / "m.gguf", tmp_path / "f.gguf", tmp_path / "b.gguf"
    raws = write_qwen35(src, shuffle=True, alignment=alignment, seed=alignment)
    notes = []
    s = repack(src, fused, layout=layout, rt=rt, fuse=True, notice=notes.append)
    want = ODD_FUSED[layout, rt]
    assert (s.fused, s.fused_members) == (len(want), sum(map(len, want)))
    assert len(notes) == len(s.separate) == 4 - len(want)
    got = tensors_of(fused)
    for group in want:
        name = fuse.fused_name(group)
        assert got[name][2] == fused_reference(raws, group, layout, rt), name
        assert not any(m in got for m in group)
    for group in {GDN, ATTN, *FFN} - set(want):
        assert all(got[m][0] == gguf_io.I8 for m in group)  # separate, each repacked
    assert verify(src, fused).ok and verify(fused, src).ok
    repack(fused, back, layout="raw")
    assert back.read_bytes() == src.read_bytes()
    # each fused tensor stands where the first of its members stood, the rest keep their order
    order, group_of = [], {m: g for g in want for m in g}
    for name in tensors_of(src):
        g = group_of.get(name)
        if g is None or fuse.fused_name(g) not in order:
            order.append(name if g is None else fuse.fused_name(g))
    assert list(got) == order


def test_a_member_of_more_dimensions_is_never_fused(tmp_path):
    src = tmp_path / "m.gguf"
    write_qwen35(src)
    with gguf_io.open_gguf(src) as f:
        recs = [f.kv_record(k) for k in f.keys()]
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        datas = [np.array(f.data(t)) for t in f.tensors]
    i = next(i for i, t in enumerate(outs) if t.name == "blk.0.ffn_up.weight")
    outs[i] = OutTensor(outs[i].name, outs[i].type_id, (256, 2, 192), outs[i].nbytes)
    bad = tmp_path / "3d.gguf"
    gguf_io.write_gguf(bad, recs, outs, lambda i, t: (datas[i],))
    with pytest.raises(FormatError, match=r"'blk.0.ffn_up.weight' has shape \[256, 2, 192\]: the"):
        repack(bad, tmp_path / "o.gguf", layout="planes", fuse=True)
    notes = []
    with pytest.raises(FormatError):
        repack(bad, tmp_path / "o.gguf", layout="planes", fuse=True, notice=notes.append)
    assert notes[-1].endswith("blk.0.ffn_up.weight has shape [256, 2, 192], not a 2-D matrix")
    assert listing(tmp_path) == ["3d.gguf", "m.gguf"]


def test_why_groups_stay_separate(tmp_path):
    src = tmp_path / "m.gguf"
    write_qwen35(src)
    notes = []
    s = repack(src, tmp_path / "f.gguf", layout="tiles", rt=4, fuse=True, notice=notes.append)
    assert notes == [f"--fuse: {line}" for line in s.separate]
    assert s.separate == [
        "blk.0.attn_qkv.weight, blk.0.attn_gate.weight stay separate: blk.0.attn_qkv.weight has "
        "800 rows, not a whole number of the 64-row tiles of tiles rt 4",
        "blk.1.attn_q.weight, blk.1.attn_k.weight, blk.1.attn_v.weight stay separate: "
        "blk.1.attn_k.weight has 40 rows, not a whole number of the 64-row tiles of tiles rt 4",
    ]
    assert "2 fused tensors hold 4 siblings, 2 sibling groups stay separate" in s.line()


@pytest.mark.parametrize(
    "types,folded,why",
    [
        ({"blk.0.attn_gate.weight": "PTQ1_0"}, None, "source types differ (PQ2_0, PTQ1_0)"),
        (
            {},
            ["blk.1.attn_q.weight", "blk.1.attn_k.weight"],
            "blk.1.attn_q.weight is folded with the rotation and blk.1.attn_v.weight is not",
        ),
    ],
    ids=["source-types", "rotation"],
)
def test_siblings_that_differ_stay_separate(tmp_path, types, folded, why):
    src, out = tmp_path / "m.gguf", tmp_path / "f.gguf"
    write_qwen35(src, types=types, folded=folded)
    s = repack(src, out, layout="planes", fuse=True)
    assert s.fused == 3 and len(s.separate) == 1 and s.separate[0].endswith(why)
    assert verify(src, out).ok


def test_siblings_of_other_widths_stay_separate(tmp_path):
    src, bad = tmp_path / "m.gguf", tmp_path / "w.gguf"
    write_qwen35(src)
    # attn_gate rewritten with K = 128: the map does not check widths, fusion does
    with gguf_io.open_gguf(src) as f:
        recs = [f.kv_record(k) for k in f.keys()]
        outs, datas = [], []
        for t in f.tensors:
            data, ne = np.array(f.data(t)), t.ne
            if t.name == "blk.0.attn_gate.weight":
                data, ne = random_pq2(np.random.default_rng(1), 640, 128), (128, 640)
            outs.append(OutTensor(t.name, t.type_id, ne, data.nbytes))
            datas.append(data)
    gguf_io.write_gguf(bad, recs, outs, lambda i, t: (datas[i],))
    s = repack(bad, tmp_path / "f.gguf", layout="planes", fuse=True)
    assert s.separate[0].endswith("their input widths differ (K = 256, 128)")


@pytest.mark.parametrize("kind", ["PTQ1_0", "TQ2_0"])
def test_ptq1_and_tq2_siblings(tmp_path, kind):
    types = {n: kind for n in GDN}
    src, fused, raw = tmp_path / "m.gguf", tmp_path / "f.gguf", tmp_path / "r.gguf"
    write_qwen35(src, types=types)
    repack(src, fused, layout="tiles", rt=2, fuse=True)
    name = fuse.fused_name(GDN)
    with gguf_io.open_gguf(fused) as f:
        assert f.value(f"pyq2.tensor.{name}.source_type") == {"PTQ1_0": 143, "TQ2_0": 35}[kind]
    assert verify(src, fused).ok
    back = tmp_path / "b.gguf"
    repack(src, raw, layout="raw")
    repack(fused, back, layout="raw")
    assert back.read_bytes() == raw.read_bytes()


@pytest.mark.parametrize("chunk", [1, 40 * 256 // 128 * 34], ids=["one-tile", "small"])
def test_members_stream_in_slices(tmp_path, monkeypatch, chunk):
    """Members are converted a slice at a time, member after member; the bytes are those of
    one whole conversion of the fused matrix."""
    monkeypatch.setattr(pyq2.gguf.weights, "CONVERT_CHUNK", chunk)
    src, fused = tmp_path / "m.gguf", tmp_path / "f.gguf"
    raws = write_qwen35(src)
    repack(src, fused, layout="tiles", rt=1, fuse=True)
    got = tensors_of(fused)
    for group in ODD_FUSED["tiles", 1]:
        assert got[fuse.fused_name(group)][2] == fused_reference(raws, group, "tiles", 1)
    assert verify(src, fused).ok  # reads the members back in slices too


def test_fused_source_to_every_layout(tmp_path):
    """A fused file is read as its original tensors: to another tile height (refused groups
    split), unfused, or fused again."""
    src, fused = tmp_path / "m.gguf", tmp_path / "f.gguf"
    raws = write_qwen35(src)
    repack(src, fused, layout="tiles", rt=2, fuse=True)
    rt4, planes, again = tmp_path / "4.gguf", tmp_path / "p.gguf", tmp_path / "a.gguf"
    s = repack(fused, rt4, layout="tiles", rt=4, fuse=True)
    assert s.fused == 2 and tensors_of(rt4)["blk.0.attn_qkv.weight"][0] == gguf_io.I8
    s = repack(fused, planes, layout="planes")
    assert s.fused == 0 and "blk.1.attn_q.weight" in tensors_of(planes)
    with gguf_io.open_gguf(planes) as f:
        assert not [k for k in f.keys() if k.endswith(metadata.MEMBER_ATTRS)]
    repack(fused, again, layout="tiles", rt=2, fuse=True)
    assert again.read_bytes() == fused.read_bytes()
    for p in (rt4, planes, again):
        assert verify(src, p).ok and verify(fused, p).ok
    got = tensors_of(rt4)
    assert got[fuse.fused_name(FFN[1])][2] == fused_reference(raws, FFN[1], "tiles", 4)


def test_dry_run_size(tmp_path, demo):
    out = tmp_path / "f.gguf"
    s = repack(demo, out, fuse=True, dry_run=True)
    assert s.fused == 4 and listing(tmp_path) == ["demo.gguf"]
    repack(demo, out, fuse=True)
    assert s.bytes_out == out.stat().st_size


def test_default_output_path():
    assert default_out_path("/m/a.gguf", "tiles", True).as_posix() == "/m/a.pyq2-tiles-fused.gguf"
    assert default_out_path("/m/a.pyq2-tiles-fused.gguf", "raw").as_posix() == "/m/a.pyq2-raw.gguf"


# ---- metadata -----------------------------------------------------------------------------


def test_fused_metadata(tmp_path, demo):
    out = tmp_path / "f.gguf"
    repack(demo, out, fuse=True)
    name = "blk.1.attn_q+attn_k+attn_v.weight"
    key = f"pyq2.tensor.{name}."
    with gguf_io.open_gguf(out) as f:
        assert f.value(key + "members") == list(ATTN)
        assert f.array_type(key + "members") == V.STRING
        assert f.value(key + "member_offsets") == [0, 512, 576]
        assert f.value(key + "member_rows") == [512, 64, 64]
        assert f.value(key + "member_positions") == [16, 17, 18]
        for attr in ("member_offsets", "member_rows", "member_positions"):
            assert f.array_type(key + attr) == V.UINT64
        assert f.value(key + "shape") == [256, 640] and f.value(key + "source_type") == 142
        keys = [k for k in f.keys() if k.startswith(key)]
        assert [k.removeprefix(key) for k in keys] == [
            "layout",
            "rt",
            "shape",
            "source_type",
            *metadata.MEMBER_ATTRS,
            metadata.CHECKSUM_ATTR,
        ]
        info = f.weight_info(f.tensor(name))
        members = metadata.fused_members(f, name, info)
    assert members == (
        metadata.Member(ATTN[0], 0, 512, 16),
        metadata.Member(ATTN[1], 512, 64, 17),
        metadata.Member(ATTN[2], 576, 64, 18),
    )


# ---- refusals -----------------------------------------------------------------------------

FUSED = "blk.1.attn_q+attn_k+attn_v.weight"


def _key(attr, name=FUSED):
    return metadata.tensor_key(name, attr)


def _u64(values):
    return lambda k: gguf_io.encode_kv(k, V.ARRAY, values, V.UINT64)


def _names(values):
    return lambda k: gguf_io.encode_kv(k, V.ARRAY, values, V.STRING)


def with_keys(src, dst, changes):
    """src rewritten with key/values changed: changes maps a key to record(key), or to None to
    drop it; keys it names that src lacks are added at the end."""
    with gguf_io.open_gguf(src) as f:
        recs = []
        for k in f.keys():
            if k not in changes:
                recs.append(f.kv_record(k))
            elif changes[k] is not None:
                recs.append(changes[k](k))
        recs += [make(k) for k, make in changes.items() if make and not f.has(k)]
        outs = [OutTensor(t.name, t.type_id, t.ne, t.nbytes) for t in f.tensors]
        gguf_io.write_gguf(dst, recs, outs, lambda i, t: (f.data(f.tensors[i]),))
    return dst


# (changes to the fused demo's keys, what the message says)
BAD = {
    "offsets": (
        {_key("member_offsets"): _u64([0, 512, 608])},
        "member 'blk.1.attn_v.weight' starts at row 608, but the members before it end at row 576",
    ),
    "rows-sum": (
        {_key("member_rows"): _u64([512, 64, 32])},
        "the members hold 608 rows, the matrix 640",
    ),
    "counts": (
        {_key("members"): _names(list(ATTN[:2]))},
        "2 members, 3 offsets, 3 row counts and 3 positions",
    ),
    "incomplete": (
        {_key("member_positions"): None},
        f"incomplete fused metadata (no {_key('member_positions')})",
    ),
    "not-on-tiles": (
        {_key("member_offsets"): _u64([0, 500, 576]), _key("member_rows"): _u64([500, 76, 64])},
        "member 'blk.1.attn_k.weight' starts at row 500, not at a multiple of the 32-row tiles",
    ),
    "zero-rows": (
        {_key("member_offsets"): _u64([0, 640, 640]), _key("member_rows"): _u64([640, 0, 0])},
        "member 'blk.1.attn_k.weight' has 0 rows",
    ),
    "also-unfused": (
        {_key("members"): _names([ATTN[0], "blk.1.attn_output.weight", ATTN[2]])},
        "member 'blk.1.attn_output.weight' is also stored as a tensor of its own",
    ),
    "two-fused": (
        {
            _key("members", "blk.1.ffn_gate+ffn_up.weight"): _names(
                ["blk.0.ffn_gate.weight", "blk.1.ffn_up.weight"]
            )
        },
        "member 'blk.0.ffn_gate.weight' is also a member of 'blk.0.ffn_gate+ffn_up.weight'",
    ),
    "named-twice": (
        {_key("members"): _names([ATTN[0], ATTN[1], ATTN[1]])},
        "member 'blk.1.attn_k.weight' is named twice",
    ),
    "position-twice": (
        {_key("member_positions"): _u64([16, 16, 18])},
        "member 'blk.1.attn_k.weight' has position 16, as 'blk.1.attn_q.weight' has",
    ),
    "position-range": (
        {_key("member_positions"): _u64([16, 17, 28])},
        "has position 28; the original file had 28 tensors",
    ),
    "positions-out-of-order": (  # free positions, but not where the fused tensor stands
        {_key("member_positions"): _u64([0, 1, 4])},
        "member positions do not match the file's tensor order",
    ),
    "no-such-tensor": (
        {_key("members", "blk.1.nothing.weight"): _names(list(ATTN))},
        f"{_key('members', 'blk.1.nothing.weight')} describes a fused tensor "
        "'blk.1.nothing.weight', which the file does not hold",
    ),
    "not-a-weight": (
        {_key(a, "output_norm.weight"): _u64([0, 1]) for a in metadata.MEMBER_ATTRS},
        "fused tensor 'output_norm.weight': fused metadata on not a PQ2-family weight",
    ),
    "names-type": (
        {_key("members"): _u64([1, 2, 3])},
        f"{_key('members')} is [1, 2, 3], not an array of strings",
    ),
}


@pytest.fixture(scope="module")
def fused_demo(tmp_path_factory):
    from pyq2.offline.demo import write_demo_model

    d = tmp_path_factory.mktemp("fused")
    src = write_demo_model(d / "demo.gguf")
    repack(src, d / "fused.gguf", fuse=True)
    return src, d / "fused.gguf"


@pytest.mark.parametrize("case", list(BAD))
def test_bad_fused_metadata_is_refused(tmp_path, fused_demo, case):
    src, good = fused_demo
    changes, message = BAD[case]
    bad = with_keys(good, tmp_path / "bad.gguf", changes)
    for call in (
        lambda: repack(bad, tmp_path / "o.gguf", layout="raw"),
        lambda: verify(src, bad),
        lambda: describe(bad),
    ):
        with pytest.raises(FormatError) as e:
            call()
        assert str(e.value).startswith(str(bad)) and message in str(e.value), str(e.value)
    assert listing(tmp_path) == ["bad.gguf"]


def test_verify_names_the_member_and_its_fused_tensor(tmp_path, fused_demo):
    src, _ = fused_demo
    changed, fused = tmp_path / "c.gguf", tmp_path / "f.gguf"

    def flip(blob, f):  # attn_k (K = 256: 2 blocks a row): row 3, block 1, qs byte 0, shift 0
        blob[f.tensor(ATTN[1]).offset + (3 * 2 + 1) * 34 + 2] ^= 0b01

    patched(src, changed, flip)
    repack(changed, fused, fuse=True)
    res = verify(src, fused)
    assert not res.ok
    assert res.message.startswith(f"tensor '{ATTN[1]}' row 3 column 128: code")
    assert res.message.endswith(f"(rows 512..575 of fused tensor '{FUSED}' in {fused})")


def test_fuse_raw_is_refused(tmp_path, demo):
    with pytest.raises(RepackError, match="--fuse writes fused tensors in the planes or tiles"):
        repack(demo, tmp_path / "o.gguf", layout="raw", fuse=True)
    assert listing(tmp_path) == ["demo.gguf"]


def test_fuse_needs_the_architecture_map(tmp_path):
    from .test_repack import write_model

    src = tmp_path / "m.gguf"
    write_model(src, np.random.default_rng(0))
    with pytest.raises(
        RepackError, match=r"--fuse fuses the siblings .* does not fit it: qwen35.block_count"
    ):
        repack(src, tmp_path / "o.gguf", fuse=True)
    assert listing(tmp_path) == ["m.gguf"]


def test_non_finite_scale_in_a_member_leaves_no_output(tmp_path, demo):

    def poison(blob, f):  # attn_v row 5, block 1
        at = f.tensor(ATTN[2]).offset + (5 * 2 + 1) * 34
        blob[at : at + 2] = np.float16(np.nan).tobytes()

    bad = patched(demo, tmp_path / "bad.gguf", poison)
    with pytest.raises(FormatError, match=rf"tensor '{ATTN[2]}': row 5, block 1 has scale nan"):
        repack(bad, tmp_path / "o.gguf", fuse=True)
    assert listing(tmp_path) == ["bad.gguf", "demo.gguf"]


def test_non_finite_scale_read_from_a_fused_file_names_the_member(tmp_path, fused_demo):
    _, good = fused_demo

    def poison(blob, f):  # attn_k's row 3 is row 515 of the fused tiles matrix
        t = f.tensor(FUSED)
        info = f.weight_info(t)
        _, scales = layouts.Layout("tiles", info.n, info.k, 2).row_ranges(512, 544)
        # tiles rt 2: row 3 of a tile is sub-tile 0, h 0, gid 3: scale index 2*3 of group 0
        blob[t.offset + scales.start + 2 * 3 * 2 : t.offset + scales.start + 2 * 3 * 2 + 2] = (
            np.float16(np.inf).tobytes()
        )

    bad = reseal(patched(good, tmp_path / "bad.gguf", poison))
    with pytest.raises(FormatError, match=rf"tensor '{ATTN[1]}': row 3, block 0 has scale inf"):
        repack(bad, tmp_path / "o.gguf", layout="raw")
    assert listing(tmp_path) == ["bad.gguf"]
