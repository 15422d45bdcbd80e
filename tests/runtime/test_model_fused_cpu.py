"""The model loader on a fused file, without a GPU: pyq2.runtime.load.check refuses what the decode
step cannot serve before anything is allocated, and pyq2.runtime.load.assemble (the loader's
assembly, here with numpy in place of the device) gives the file's fused matrix to the decode
step's matmuls as it is (pyq2.runtime.step.matmul_groups) while every member still answers by its
own name."""

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.gguf import io as gguf_io
from pyq2.gguf import weights as weight_io
from pyq2.offline.repack import repack
from pyq2.runtime.load import Model, assemble, check
from pyq2.runtime.step import matmul_groups

from ..conftest import reseal
from ..offline.test_fuse import ATTN, FFN, FUSED, GDN, _key, _names, _u64, with_keys, write_qwen35


def cpu_model(path, layout="tiles", rt=2):
    """The Model load builds, with numpy arrays for device memory."""
    backend = weight_io.Backend("native")
    with gguf_io.open_gguf(path) as gf:
        checked = check(gf)

        def upload(e, target):
            return target.from_raw(np.concatenate([r for _, r in e.slices(backend, gf, 1 << 20)]))

        def upload_dense(t, storage):
            return np.array(gf.data(t)).view(storage[1])

        seen = []
        weights, fused, dense = assemble(
            gf, checked, upload, upload_dense, layout, rt, lambda d, t, n: seen.append((d, t))
        )
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)
    return Model(checked.plan, checked.rotation, weights, dense, fused=fused)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from pyq2.offline.demo import write_demo_model

    d = tmp_path_factory.mktemp("m")
    demo = write_demo_model(d / "demo.gguf")
    repack(demo, d / "fused.gguf", fuse=True)
    repack(demo, d / "planes.gguf", layout="planes", fuse=True)
    return demo, d / "fused.gguf", d / "planes.gguf"


def test_fused_file_serves_the_fused_matrix_as_it_is(files):
    demo, fused_path, _ = files
    plain, fused = cpu_model(demo), cpu_model(fused_path)
    assert sorted(fused.fused) == sorted(
        [
            "blk.0.attn_qkv+attn_gate.weight",
            FUSED,
            *(f"blk.{i}.ffn_gate+ffn_up.weight" for i in (0, 1)),
        ]
    )
    assert list(fused.weights) == list(plain.weights)  # every weight by name, in file order
    assert fused.step_bytes(1) == plain.step_bytes(1)
    for stage in fused.plan.stages:
        got = matmul_groups(fused, stage.projections, True)
        f = fused.fused_for(stage.projections)
        if f is None:
            assert len(stage.projections) == 1 and len(got) == 1
            assert got[0][0][0] is fused.weights[stage.projections[0]].matrix
            continue
        ((mats, columns),) = got
        assert len(mats) == 1 and mats[0] is f.weight.matrix  # the file's matrix, no copy
        assert columns == [(m.name, m.row0, m.rows) for m in f.members]
        # run-time fusion of the unfused file concatenates the same bytes
        ((parts, cols),) = matmul_groups(plain, stage.projections, True)
        assert cols == columns
        splits = [p.geometry.regions[0] for p in parts]
        codes = [p.data[:s] for p, s in zip(parts, splits, strict=True)]
        scales = [p.data[s:] for p, s in zip(parts, splits, strict=True)]
        assert np.array_equal(np.concatenate(codes + scales), f.weight.matrix.data)
    for name in (*GDN, *ATTN, *FFN[0]):
        w = fused.weights[name]
        assert w.stored is None and w.shape == plain.weights[name].shape  # not copied yet
        assert (w.source, w.rotation_width) == (plain.weights[name].source, 256)


def test_members_answer_by_name(files):
    """Without fusion (or when a host asks) a member gets a matrix of its own: its rows."""
    demo, fused_path, _ = files
    plain, fused = cpu_model(demo), cpu_model(fused_path)
    for name in ATTN:
        assert fused.weights[name].stored is None
    groups = matmul_groups(fused, ATTN, False)
    assert [cols for _, cols in groups] == [
        [(ATTN[0], 0, 512)],
        [(ATTN[1], 0, 64)],
        [(ATTN[2], 0, 64)],
    ]
    for name, (mats, _) in zip(ATTN, groups, strict=True):
        assert mats[0] is fused.weights[name].matrix and mats[0].n == plain.weights[name].shape[0]
        assert np.array_equal(mats[0].data, plain.weights[name].matrix.data), name


def test_planes_fused_file_into_tiles(tmp_path):
    """A planes file fuses q/k/v of 40 rows; loaded as tiles, they are not whole tiles, so
    they are uploaded as matrices of their own (and the decode step runs them apart)."""
    src, planes = tmp_path / "m.gguf", tmp_path / "p.gguf"
    write_qwen35(src)
    repack(src, planes, layout="planes", fuse=True)
    model, ref = cpu_model(planes), cpu_model(src)
    assert sorted(model.fused) == sorted(
        [
            "blk.0.attn_qkv+attn_gate.weight",
            "blk.0.ffn_gate+ffn_up.weight",
            "blk.1.ffn_gate+ffn_up.weight",
        ]
    )
    for name in ATTN:
        assert model.weights[name].part is None
        assert np.array_equal(model.weights[name].matrix.data, ref.weights[name].matrix.data)
    assert [len(m) for m, _ in matmul_groups(model, ATTN, True)] == [1, 1, 1]
    as_planes = cpu_model(planes, "planes")
    assert FUSED in as_planes.fused  # planes: every member is whole tiles of one row


REFUSED = {
    "member-missing": (
        {_key("members"): _names(list(ATTN[:2])), _key("member_offsets"): _u64([0, 512]),
         _key("member_rows"): _u64([512, 128]), _key("member_positions"): _u64([16, 17])},
        # one member fewer: the original file would have one tensor fewer, so the positions
        # no longer match the file's order
        "member positions do not match the file's tensor order",
    ),
    "not-one-stage": (
        {_key("members"): _names([ATTN[1], ATTN[0], ATTN[2]])},
        f"fused tensor '{FUSED}' holds blk.1.attn_k.weight, blk.1.attn_q.weight, "
        "blk.1.attn_v.weight, which are not the projections of one stage",
    ),
    "inconsistent-offsets": (
        {_key("member_offsets"): _u64([0, 512, 600])},
        "member 'blk.1.attn_v.weight' starts at row 600",
    ),
    "also-unfused": (
        {_key("members"): _names([ATTN[0], ATTN[1], "blk.1.ffn_down.weight"])},
        "member 'blk.1.ffn_down.weight' is also stored as a tensor of its own",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_check_refuses_bad_fused_metadata(tmp_path, files, case):
    _, fused_path, _ = files
    changes, message = REFUSED[case]
    # resealed (the checksums recomputed), as a tool that edits the keys knowingly would: else
    # the checksum, which covers the member keys, refuses every such file first
    bad = reseal(with_keys(fused_path, tmp_path / "bad.gguf", changes))
    with gguf_io.open_gguf(bad) as gf, pytest.raises(FormatError) as e:
        check(gf)
    assert message in str(e.value), str(e.value)


def test_check_refuses_siblings_folded_apart(tmp_path, files):
    _, fused_path, _ = files
    key = "prism.hadamard.weight_names"
    with gguf_io.open_gguf(fused_path) as gf:
        names = [n for n in gf.value(key) if n != ATTN[2]]
    bad = with_keys(fused_path, tmp_path / "bad.gguf", {key: _names(names)})
    with (
        gguf_io.open_gguf(bad) as gf,
        pytest.raises(FormatError, match="folded with the rotation and weights that are not"),
    ):
        check(gf)
