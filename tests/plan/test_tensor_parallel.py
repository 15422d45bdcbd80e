"""Tensor parallelism on the CPU: the sharding plan (pyq2.plan.tensor_parallel) and `pyq2 repack
--tp G` / verify.

The plan is checked for what the model's arithmetic needs, in numpy float64: per layer, the sum
over ranks of each rank's row-parallel product of its column-parallel products equals the whole
layer's (an FFN, a Gated-DeltaNet mixer in tiled and grouped V-head order, attention with K/V
heads shared by query heads), and a rank's rotation of its columns equals those columns of the
whole rotation. The shard files are checked against numpy cuts of the original's raw blocks and
dense arrays (independently of the writer's reading code), then through verify; bad requests,
bad sets and edited shards are refused, and no partial shard set is ever left behind.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from pyq2.errors import FormatError, RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf import metadata
from pyq2.gguf.contents import read_contents
from pyq2.offline import shard
from pyq2.offline.info import describe, format_info
from pyq2.offline.repack import repack, shard_paths
from pyq2.offline.verify import verify
from pyq2.plan.decode import PRESETS, Dims, Keys, decode_plan
from pyq2.plan.tensor_parallel import Split, shard_plan, unit_ranges
from pyq2.runtime import load as model
from pyq2.spec import formats, reference
from pyq2.spec.rotation import Rotation

from ..conftest import listing, patched, reseal, run_pyq2

# qwen35 shapes that split 2 and 3 ways: 6 query heads of 64 over 2 K/V heads (units of 2
# heads: 128 columns), 6 V heads of 128 over 3 K heads, FFN 384 (3 groups of 128).
SMALL = Dims(2, 256, 384, 320, 6, 2, 64, 6, 3, 128, 2)


def model_of(dims: Dims, block: int = 128, grouped: bool = True):
    """(shapes, plan, keys, rotation) of a model of dims folded with a rotation of `block`."""
    tensors = dims.tensors()
    ne = {name: shape for name, _, shape in tensors}
    kv = dims.keys()
    plan = decode_plan(list(ne), kv)
    folded = [n for n, kind, _ in tensors if kind == "pq2" and n != "token_embd.weight"]
    rot = Rotation(1, block, "identity", {}, tuple(folded), ("token_embd.weight",), grouped)
    return ne, plan, kv, rot


def take(x: np.ndarray, pieces, axis: int) -> np.ndarray:
    """x's pieces along numpy axis `axis`, one after another."""
    return np.concatenate([np.take(x, np.arange(a, b), axis=axis) for a, b in pieces], axis=axis)


# ---- the plan --------------------------------------------------------------------------------


def test_unit_ranges_are_even_the_first_ranks_one_more():
    assert unit_ranges(17, 2) == [(0, 9), (9, 17)]
    assert unit_ranges(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert unit_ranges(3, 3) == [(0, 1), (1, 2), (2, 3)]


def test_27b_splits_two_ways_along_heads_and_rotation_blocks():
    ne, plan, kv, rot = model_of(PRESETS["bonsai-2-27b"], block=1024)
    p = shard_plan(ne, plan, kv, rot, 2)
    ffn = p.splits["blk.0.ffn_down.weight"]
    # 17408 = 17 rotation blocks of 1024: 9 + 8
    assert (ffn.axis, ffn.pieces) == (0, (((0, 9216),), ((9216, 17408),)))
    assert p.splits["blk.0.ffn_gate.weight"].pieces == ffn.pieces
    att = 3  # the first attention layer: 24 query heads of 256, 4 K/V heads
    assert p.splits[f"blk.{att}.attn_q.weight"].pieces == (((0, 6144),), ((6144, 12288),))
    assert p.splits[f"blk.{att}.attn_k.weight"].pieces == (((0, 512),), ((512, 1024),))
    assert p.splits[f"blk.{att}.attn_output.weight"].pieces == (((0, 3072),), ((3072, 6144),))
    # Gated-DeltaNet: 16 K heads of 128, 48 V heads; rank 0 holds K heads 0..7, its V heads
    # k + 16 r in tiled order, and grouped columns 0..3071 of ssm_out
    qkv = p.splits["blk.0.attn_qkv.weight"].pieces[0]
    assert qkv == ((0, 1024), (2048, 3072), (4096, 5120), (6144, 7168), (8192, 9216))
    assert p.splits["blk.0.ssm_out.weight"].pieces[0] == ((0, 3072),)
    assert p.splits["blk.0.ssm_alpha.weight"].pieces[1] == ((8, 16), (24, 32), (40, 48))
    assert p.splits["output.weight"].pieces == (((0, 124160),), ((124160, 248320),))
    for name in ("token_embd.weight", "blk.0.attn_norm.weight", "blk.3.attn_q_norm.weight"):
        assert p.split(name) is None
    # bytes each rank streams per token: within 3% of half
    bytes_of = [0, 0]
    for name in plan.weights()[1:]:
        k, n = ne[name]
        s = p.split(name)
        for r in range(2):
            kr, nr = s.shape((k, n), r) if s else (k, n)
            bytes_of[r] += formats.pq2_matrix_bytes(nr, kr)
    whole = sum(formats.pq2_matrix_bytes(ne[n][1], ne[n][0]) for n in plan.weights()[1:])
    assert [round(b / whole, 3) for b in bytes_of] == [0.520, 0.480]


def test_27b_does_not_split_four_ways_and_says_why():
    ne, plan, kv, rot = model_of(PRESETS["bonsai-2-27b"], block=1024)
    with pytest.raises(
        FormatError,
        match=r"4 GPUs: Gated-DeltaNet in units of 8 K heads "
        r"\(whole 128-groups and rotation blocks of 1024\) gives only 2 units",
    ):
        shard_plan(ne, plan, kv, rot, 4)


@pytest.mark.parametrize("g", [1, 2, 3])
@pytest.mark.parametrize("grouped", [True, False])
def test_each_layer_sums_over_ranks_to_the_whole_layer(g, grouped):
    """Per layer, with random float weights: sum over ranks of out_r @ mix(in_r @ x) equals the
    whole layer's out @ mix(in @ x), where mix is per head (its V-head order and K/V sharing
    as the model's)."""
    dims = SMALL
    ne, plan, kv, rot = model_of(dims, block=64, grouped=grouped)
    p = shard_plan(ne, plan, kv, rot, g)
    rng = np.random.default_rng(g)
    w = {n: rng.standard_normal(shape[::-1]) for n, shape in ne.items() if len(shape) == 2}
    x = rng.standard_normal(dims.hidden)

    def rows(name, r):
        s = p.split(name)
        return w[name] if s is None else take(w[name], s.pieces[r], 0)

    def cols(name, r):
        return take(w[name], p.split(name).pieces[r], 1)

    def ffn(b, r=None):
        gate, up, down = (b + s + ".weight" for s in ("ffn_gate", "ffn_up", "ffn_down"))
        if r is None:
            return w[down] @ reference.swiglu(w[gate] @ x, w[up] @ x)
        return cols(down, r) @ reference.swiglu(rows(gate, r) @ x, rows(up, r) @ x)

    def gdn(b, v_heads, k_heads, get_rows, get_out):
        qkv = get_rows(b + "attn_qkv.weight") @ x
        z = get_rows(b + "attn_gate.weight") @ x
        alpha = get_rows(b + "ssm_alpha.weight") @ x
        v = qkv[-z.size :]
        hd = z.size // v_heads
        # a per-V-head mix: V times the gate, scaled by that head's alpha and by its K head's q
        q = qkv[: k_heads * hd].reshape(k_heads, hd)
        o = (v * z).reshape(v_heads, hd) * alpha[:, None]
        o = o * q[np.arange(v_heads) % k_heads]  # tiled: V head j reads K head j % k_heads
        o = o.reshape(-1)
        if grouped:
            o = reference.gdn_v_grouped(o[None], v_heads, k_heads)[0]
        return get_out(b + "ssm_out.weight") @ o

    for layer in range(dims.n_layers):
        b = f"blk.{layer}."
        whole = ffn(b)
        assert np.allclose(sum(ffn(b, r) for r in range(g)), whole, rtol=1e-9, atol=1e-9)
        if layer in plan.attention_layers:
            group = dims.n_head // dims.n_head_kv
            q = (w[b + "attn_q.weight"] @ x).reshape(dims.n_head, 2, -1)
            k = (w[b + "attn_k.weight"] @ x).reshape(dims.n_head_kv, -1)
            o = (q[:, 0] * q[:, 1] * k[np.arange(dims.n_head) // group]).reshape(-1)
            whole = w[b + "attn_output.weight"] @ o
            total = 0
            for r in range(g):
                hd = dims.head_dim
                ((a, z),) = p.split(b + "attn_q.weight").pieces[r]
                h0, h1 = a // (2 * hd), z // (2 * hd)
                kv0 = p.split(b + "attn_k.weight").pieces[r][0][0] // hd
                ql = (rows(b + "attn_q.weight", r) @ x).reshape(h1 - h0, 2, -1)
                kl = (rows(b + "attn_k.weight", r) @ x).reshape(-1, hd)
                ol = ql[:, 0] * ql[:, 1] * kl[np.arange(h0, h1) // group - kv0]
                total = total + cols(b + "attn_output.weight", r) @ ol.reshape(-1)
            assert np.allclose(total, whole, rtol=1e-9, atol=1e-9)
        else:
            whole = gdn(b, dims.v_heads, dims.k_heads, lambda n: w[n], lambda n: w[n])
            total = 0
            for r in range(g):
                v_local = p.split(b + "ssm_alpha.weight").size(r)
                k_local = v_local // (dims.v_heads // dims.k_heads)
                total = total + gdn(
                    b, v_local, k_local, lambda n, r=r: rows(n, r), lambda n, r=r: cols(n, r)
                )
            assert np.allclose(total, whole, rtol=1e-9, atol=1e-9)
    head = p.split("output.weight")
    logits = np.concatenate([rows("output.weight", r) @ x for r in range(g)])
    assert np.allclose(logits, w["output.weight"] @ x) and head.extent == dims.vocab


def test_a_ranks_rotation_of_its_columns_is_those_columns_of_the_whole_rotation():
    ne, plan, kv, _ = model_of(SMALL)
    rng = np.random.default_rng(3)
    for block in (64, 128):
        rot = Rotation(
            1, block, "identity", {}, tuple(n for n in ne if "ffn_down" in n or "out" in n)
        )
        p = shard_plan(ne, plan, kv, rot, 2)
        for name, s in p.splits.items():
            if s.axis != 0 or not rot.folds(name):
                continue
            signs = rng.choice([-1, 1], s.extent).astype(np.int8)
            x = rng.standard_normal((2, s.extent))
            whole = reference.rotate(x, block, signs)
            for r in range(2):
                mine = reference.rotate(take(x, s.pieces[r], 1), block, take(signs, s.pieces[r], 0))
                assert np.allclose(mine, take(whole, s.pieces[r], 1)), (name, block, r)


def test_plan_refuses_shapes_that_do_not_split_and_says_which():
    ne, plan, kv, rot = model_of(SMALL)
    with pytest.raises(FormatError, match="4 GPUs: Gated-DeltaNet in units of 1 K heads"):
        shard_plan(ne, plan, kv, rot, 4)
    ne_a, plan_a, kv_a, rot_a = model_of(Dims(2, 256, 384, 320, 6, 2, 64, 6, 3, 128, 1))
    with pytest.raises(FormatError, match="4 GPUs: attention in units of 2 query heads"):
        shard_plan(ne_a, plan_a, kv_a, rot_a, 4)
    bad = dict(ne)
    bad["blk.1.attn_q.weight"] = (256, 100)
    with pytest.raises(FormatError, match=r"'blk.1.attn_q.weight' has 100 rows, but 2 x heads"):
        shard_plan(bad, plan, kv, rot, 2)
    keys = Keys(kv)
    keys["qwen35.attention.head_count_kv"] = 0
    with pytest.raises(FormatError, match="head_count_kv is 0"):
        shard_plan(ne, plan, keys, rot, 2)
    with pytest.raises(ValueError, match="not a positive integer"):
        shard_plan(ne, plan, kv, rot, 0)


# ---- shard files -----------------------------------------------------------------------------


def _raw_rows(path):
    """name -> (PQ2_0 raw blocks [N, G, 34] or dense array in numpy order), read from a file
    with numpy only (any stored layout)."""
    out = {}
    with gguf_io.open_gguf(path) as gf:
        for t in gf.tensors:
            info = gf.weight_info(t)
            data = np.array(gf.data(t))
            if info is None:
                item = {0: 4, 1: 2, 30: 2}[t.type_id]
                out[t.name] = data.view(f"V{item}").reshape(tuple(reversed(t.ne)))
                continue
            if info.layout.name != "raw":
                data = info.layout.to_raw(data)
            elif info.source_type == gguf_io.PTQ1_0:
                data = formats.ptq1_to_pq2(data)
            out[t.name] = data.reshape(info.n, info.k // 128, 34)
    return out


@pytest.mark.parametrize("layout,fuse", [("tiles", False), ("planes", False), ("tiles", True)])
def test_repack_tp_writes_the_ranks_cuts_of_the_original(tmp_path, demo_gguf, layout, fuse):
    out = tmp_path / "m.gguf"
    s = repack(demo_gguf, out, layout=layout, tp=2, fuse=fuse)
    assert s.shards == shard_paths(str(out), 2) and listing(tmp_path) == [
        "m.tp2-0.gguf",
        "m.tp2-1.gguf",
    ]
    original = _raw_rows(demo_gguf)
    with gguf_io.open_gguf(demo_gguf) as gf:
        plan = shard.plan_of_file(gf, read_contents(gf), 2)
    for rank, path in enumerate(s.shards):
        with gguf_io.open_gguf(path) as gf:
            assert metadata.shard_of(gf) == (2, rank)
            entries = read_contents(gf).entries
        got = _raw_rows(path)
        for e in entries:
            want = original[e.name]
            split = plan.split(e.name)
            if split is not None:
                pieces = split.pieces[rank]
                if e.info is None:  # numpy order is gguf's reversed
                    want = take(want, pieces, want.ndim - 1 - split.axis)
                elif split.axis == 1:
                    want = take(want, pieces, 0)
                else:  # columns, in 128-groups
                    want = take(want, [(a // 128, b // 128) for a, b in pieces], 1)
            have = got[e.fused][e.row0 : e.row0 + e.info.n] if e.fused else got[e.name]
            assert np.array_equal(have, want), (path, e.name)
            assert (e.split is None) == (split is None)
    res = verify(demo_gguf, s.shards[::-1])
    assert res.ok and res.shards == 2, res.message


def test_repack_tp_of_odd_types_and_shapes_verifies(tmp_path):
    from ..offline.test_fuse import write_qwen35

    src = tmp_path / "odd.gguf"
    names = [n for n, kind, _ in SMALL.tensors() if kind == "pq2"]
    write_qwen35(
        src,
        SMALL,
        types={"blk.0.ffn_down.weight": "PTQ1_0", "output.weight": "TQ2_0"},
        folded=names[1:],
    )
    for g in (2, 3):
        s = repack(src, tmp_path / f"o{g}.gguf", rt=4, tp=g)
        res = verify(src, s.shards)
        assert res.ok and res.shards == g, res.message


def test_tp_refusals_leave_nothing(tmp_path, demo_gguf):
    before = listing(tmp_path)
    with pytest.raises(RepackError, match="2 to 1024 shards"):
        repack(demo_gguf, tmp_path / "a.gguf", tp=1)
    with pytest.raises(RepackError, match="2 to 1024 shards"):
        repack(demo_gguf, tmp_path / "a.gguf", tp=1025)
    with pytest.raises(RepackError, match="not --layout raw"):
        repack(demo_gguf, tmp_path / "a.gguf", layout="raw", tp=2)
    with pytest.raises(RepackError, match=r"does not split: .*4 GPUs"):
        repack(demo_gguf, tmp_path / "a.gguf", tp=4)
    # OUT itself must name a file, not only the shard names made from it
    (tmp_path / "d").mkdir()
    with pytest.raises(RepackError, match="is a directory"):
        repack(demo_gguf, tmp_path / "d", tp=2)
    with pytest.raises(RepackError, match="names a directory"):
        repack(demo_gguf, str(tmp_path / "e") + os.sep, tp=2)
    (tmp_path / "d").rmdir()
    assert listing(tmp_path) == before
    s = repack(demo_gguf, tmp_path / "a.gguf", tp=2)
    with pytest.raises(RepackError, match="is a tensor-parallel shard"):
        repack(s.shards[0], tmp_path / "b.gguf")
    with pytest.raises(RepackError, match="exists"):
        repack(demo_gguf, tmp_path / "a.gguf", tp=2)


def test_a_failure_in_the_last_shard_leaves_no_shard(tmp_path, demo_gguf, monkeypatch):
    real = shard.ShardEntry.slices

    def failing(self, backend, gf, rows):
        if self.rank == 1:
            raise OSError(28, "No space left on device")
        return real(self, backend, gf, rows)

    monkeypatch.setattr(shard.ShardEntry, "slices", failing)
    with pytest.raises(OSError, match="No space"):
        repack(demo_gguf, tmp_path / "a.gguf", tp=2)
    assert listing(tmp_path) == []


def test_verify_refuses_incomplete_sets_and_edited_shards(tmp_path, demo_gguf):
    s = repack(demo_gguf, tmp_path / "a.gguf", tp=2)
    s0, s1 = s.shards
    res = verify(demo_gguf, [s1])
    assert not res.ok and "ranks 1 of 2; a set is ranks 0..1 of 2" in res.message
    res = verify(demo_gguf, [s0, s0])
    assert not res.ok and "each once" in res.message
    res = verify(demo_gguf, [s0, demo_gguf])
    assert not res.ok and "demo.gguf is a whole model, not a tensor-parallel shard" in res.message
    res = verify(s0, [s0, s1])
    assert not res.ok and "the original is the whole model" in res.message
    # a code byte of a cut weight
    with gguf_io.open_gguf(s1) as gf:
        t = gf.tensor("blk.0.ffn_down.weight")
        off = t.offset
    bad = tmp_path / "bad.gguf"
    patched(Path(s1), bad, lambda blob, _: blob.__setitem__(off, blob[off] ^ 0x3C))
    with pytest.raises(FormatError, match="'blk.0.ffn_down.weight': its bytes and pyq2 keys"):
        verify(demo_gguf, [s0, bad])  # the shard's checksum refuses it
    res = verify(demo_gguf, [s0, reseal(bad)])  # edited knowingly: verify finds the code
    assert not res.ok and "tensor 'blk.0.ffn_down.weight' row" in res.message
    # a recorded piece that is not the plan's (same length, other place)
    key = metadata.tensor_key("blk.0.ssm_out.weight", "tp_pieces")

    def edit(blob, _):
        i = blob.find(key.encode())
        j = blob.find(np.array([128, 256], "<u8").tobytes(), i)
        blob[j : j + 16] = np.array([0, 128], "<u8").tobytes()

    reseal(patched(Path(s1), bad, edit))  # the checksum covers the keys: edited knowingly
    res = verify(demo_gguf, [s0, bad])
    assert not res.ok and "holds columns 0:128 of 256" in res.message
    assert "gives columns 128:256 of 256" in res.message


def test_load_refuses_a_shard_whose_head_rows_are_not_head_rows(tmp_path, demo_gguf):
    s = repack(demo_gguf, tmp_path / "a.gguf", tp=2)
    with gguf_io.open_gguf(s.shards[1]) as gf:
        model.check(gf)  # as written
        a, b = (int(v) for v in gf.value(metadata.tensor_key("output.weight", "tp_pieces")))
    key = metadata.tensor_key("output.weight", "tp_pieces")

    def edit(blob, _):  # the same number of rows, from row 0
        i = blob.find(key.encode())
        j = blob.find(np.array([a, b], "<u8").tobytes(), i)
        blob[j : j + 16] = np.array([0, b - a], "<u8").tobytes()

    bad = reseal(patched(Path(s.shards[1]), tmp_path / "bad.gguf", edit))
    with gguf_io.open_gguf(bad) as gf, pytest.raises(FormatError, match="its head holds rows 0:"):
        model.check(gf)


def test_split_keys_are_checked(tmp_path):
    class KV(Keys):  # a file's keys as pyq2.gguf.metadata reads them
        path = "f.gguf"
        has = dict.__contains__

    kv = KV({metadata.KEY_TP_SIZE: 2, metadata.KEY_TP_RANK: 1})
    assert metadata.shard_of(kv) == (2, 1)
    with pytest.raises(FormatError, match="tensor-parallel size of at least 2"):
        metadata.shard_of(KV({metadata.KEY_TP_SIZE: 1, metadata.KEY_TP_RANK: 0}))
    with pytest.raises(FormatError, match="at most 1024"):
        metadata.shard_of(KV({metadata.KEY_TP_SIZE: 1 << 32 - 1, metadata.KEY_TP_RANK: 0}))
    with pytest.raises(FormatError, match="tensor-parallel size of at least 2"):
        metadata.shard_of(KV({metadata.KEY_TP_SIZE: 2, metadata.KEY_TP_RANK: 2}))
    with pytest.raises(FormatError, match="tensor-parallel size of at least 2"):
        metadata.shard_of(KV({metadata.KEY_TP_RANK: 0}))
    key = lambda a: metadata.tensor_key("w", a)  # noqa: E731
    kv.update({key("tp_axis"): 1, key("tp_extent"): 10})
    with pytest.raises(FormatError, match="incomplete tensor-parallel metadata"):
        metadata.tensor_split(kv, "w", (4, 5), 2, 1)
    kv[key("tp_pieces")] = [5, 10]
    assert metadata.tensor_split(kv, "w", (4, 5), 2, 1) == Split(1, 10, ((), ((5, 10),)))
    for pieces, why in (
        ([5, 11], r"\[5, 11\) ends beyond the extent 10"),
        ([6, 8, 7, 10], r"\[7, 10\) starts before the one before it ends"),
        ([5, 5, 5, 10], r"\[5, 5\) is empty"),
        ([5], "start/stop pairs"),
        ([], "start/stop pairs"),
    ):
        kv[key("tp_pieces")] = pieces
        with pytest.raises(FormatError, match=why):
            metadata.tensor_split(kv, "w", (4, 5), 2, 1)
    kv[key("tp_pieces")] = [0, 4]
    with pytest.raises(FormatError, match="hold 4 along axis 1, the tensor 5"):
        metadata.tensor_split(kv, "w", (4, 5), 2, 1)


def test_cli_repack_tp_verify_and_info(tmp_path, demo_gguf):
    out = tmp_path / "m.gguf"
    r = run_pyq2("repack", str(demo_gguf), "--tp", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "m.tp2-0.gguf, " in r.stdout and "2 tensor-parallel shards" in r.stdout
    s0, s1 = shard_paths(str(out), 2)
    r = run_pyq2("verify", str(demo_gguf), s1, s0)
    assert r.returncode == 0 and "identical in 2 tensor-parallel shards" in r.stdout, r.stderr
    r = run_pyq2("verify", str(demo_gguf), s1)
    assert r.returncode == 1 and "MISMATCH" in r.stderr
    r = run_pyq2("repack", str(demo_gguf), "--tp", "1", "-o", str(tmp_path / "x.gguf"))
    assert r.returncode == 2 and "2 to 1024 shards" in r.stderr
    d = describe(s1)
    assert d["tp"]["size"] == 2 and d["tp"]["rank"] == 1 and len(d["tp"]["parts"]) == 19
    fused = describe(repack(demo_gguf, tmp_path / "f.gguf", tp=2, fuse=True).shards[0])
    assert fused["tp"]["parts"]["blk.0.ffn_up.weight"] == "rows 0:384 of 768"
    assert len(fused["tp"]["parts"]) == 19
    text = format_info(d)
    assert (
        "shard:     rank 1 of 2" in text
        and "blk.0.ffn_down.weight     columns 384:768 of 768" in text
    )
    assert "invalid" not in str(d["prism_hadamard"])


def test_a_plan_whose_rank_would_read_one_width_with_two_sign_vectors_is_refused(tmp_path):
    from pyq2.offline.demo import write_demo_model

    # FFN 512 over 2: ffn_down's halves are 256 wide, as the hidden width is (other signs)
    src = write_demo_model(tmp_path / "m.gguf", ffn=512)
    with pytest.raises(RepackError, match="read input width 256 with different rotation signs"):
        repack(src, tmp_path / "o.gguf", tp=2)
    assert listing(tmp_path) == ["m.gguf"]


def test_repack_tp_reads_a_repacked_fused_source(tmp_path):
    """The rows of a cut weight come from the tiles they start in and from a fused tensor's
    members: K/V heads of 32 rows in rt-4 tiles of 64 rows, rank 1's starting inside one."""
    from ..offline.test_fuse import write_qwen35

    dims = Dims(2, 256, 384, 320, 8, 2, 32, 6, 3, 128, 2)
    src = tmp_path / "m.gguf"
    names = [n for n, kind, _ in dims.tensors() if kind == "pq2"]
    write_qwen35(src, dims, folded=names[1:])
    fused = repack(src, tmp_path / "f.gguf", rt=4, fuse=True)
    assert fused.fused == 4  # q/k/v among them
    s = repack(fused.out_path, tmp_path / "s.gguf", rt=1, tp=2)
    res = verify(src, s.shards)
    assert res.ok and res.shards == 2, res.message
    with gguf_io.open_gguf(s.shards[1]) as gf:
        assert read_contents(gf).by_name()["blk.1.attn_k.weight"].split.pieces[1] == ((32, 64),)
    plain = repack(src, tmp_path / "p.gguf", rt=1, tp=2)
    for a, b in zip(s.shards, plain.shards, strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_repack_tp_reports_one_progress_over_the_shards(tmp_path, demo_gguf):
    seen = []
    repack(demo_gguf, tmp_path / "a.gguf", tp=2, progress=lambda d, t, n: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1] and len({t for _, t in seen}) == 1
