"""The architecture map (pyq2.plan.decode) on the CPU: the decode step's plan of the demo model and
of the presets, and the refusals of files pyq2 cannot serve."""

import pytest

from pyq2.errors import FormatError
from pyq2.gguf import io as gguf_io
from pyq2.offline.demo import write_demo_model
from pyq2.plan.decode import PRESETS, Keys, decode_plan


def preset_plan(name, drop=(), **override):
    dims = PRESETS[name]
    names = [n for n, _, _ in dims.tensors() if n not in drop]
    return decode_plan(names, Keys({**dims.keys(), **override}))


def test_demo_plan(tmp_path):
    path = write_demo_model(tmp_path / "demo.gguf")
    with gguf_io.open_gguf(path) as gf:
        plan = decode_plan([t.name for t in gf.tensors], gf)
    assert plan.attention_layers == (1,) and (plan.v_heads, plan.k_heads) == (4, 2)
    kinds = [(s.layer, s.producer) for s in plan.stages]
    assert kinds == [
        (0, "norm"), (0, "mixer"), (0, "norm"), (0, "swiglu"),
        (1, "norm"), (1, "mixer"), (1, "norm"), (1, "swiglu"),
        (-1, "norm"),
    ]  # fmt: skip
    first = plan.stages[0]
    assert first.projections == ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight")
    assert first.unrotated == ("blk.0.ssm_alpha.weight", "blk.0.ssm_beta.weight")
    assert first.norm == "blk.0.attn_norm.weight"
    assert plan.stages[1].permute and not plan.stages[5].permute
    assert plan.stages[4].projections == tuple(f"blk.1.attn_{p}.weight" for p in "qkv")
    assert plan.stages[6].norm == "blk.1.post_attention_norm.weight"
    assert plan.stages[-1].projections == ("output.weight",)


def test_27b_plan_matches_the_benchmark_shapes():
    """257 producers and projections as the weight-path benchmark counts them: per layer 4
    producers; the fused in_proj (16384) is attn_qkv + attn_gate, qkv (14336) q + k + v."""
    plan = preset_plan("bonsai-2-27b")
    dims = PRESETS["bonsai-2-27b"]
    shapes = {n: ne for n, _, ne in dims.tensors()}
    assert len(plan.stages) == 257 and len(plan.attention_layers) == 16
    assert plan.attention_layers == tuple(range(3, 64, 4))
    n_out = lambda names: sum(shapes[n][1] for n in names)  # noqa: E731
    assert n_out(plan.stages[0].projections) == 16384
    assert n_out(plan.stages[3 * 4].projections) == 14336
    assert shapes["blk.0.ssm_out.weight"] == (6144, 5120)
    assert shapes["blk.3.attn_output.weight"] == (6144, 5120)
    assert n_out(plan.stages[2].projections) == 34816 and shapes["output.weight"][1] == 248320
    assert (plan.v_heads, plan.k_heads) == (48, 16)


def test_refusals():
    with pytest.raises(FormatError, match=r"architecture 'llama' is not served"):
        preset_plan("tiny", **{"general.architecture": "llama"})
    with pytest.raises(FormatError, match=r"does not know: blk\.0\.mystery\.weight"):
        dims = PRESETS["tiny"]
        names = [n for n, _, _ in dims.tensors()] + ["blk.0.mystery.weight"]
        decode_plan(names, dims.keys())
    with pytest.raises(FormatError, match=r"does not know: blk\.7\.ffn_up\.weight"):
        dims = PRESETS["tiny"]
        decode_plan([n for n, _, _ in dims.tensors()] + ["blk.7.ffn_up.weight"], dims.keys())
    with pytest.raises(FormatError, match="full_attention_interval = 1 says otherwise"):
        preset_plan("tiny", **{"qwen35.full_attention_interval": 1})
    with pytest.raises(FormatError, match="lacks blk.1.ffn_down.weight"):
        preset_plan("tiny", drop=("blk.1.ffn_down.weight",))
    with pytest.raises(FormatError, match="layer 0 holds no mixer"):
        preset_plan("tiny", drop=("blk.0.attn_qkv.weight", "blk.0.ssm_out.weight"))
    with pytest.raises(FormatError, match="lacks output.weight"):
        preset_plan("tiny", drop=("output.weight",))
    with pytest.raises(FormatError, match="V a multiple of K"):
        preset_plan("tiny", **{"qwen35.ssm.group_count": 3})
    with pytest.raises(FormatError, match="block_count is 0"):
        preset_plan("tiny", **{"qwen35.block_count": 0})
