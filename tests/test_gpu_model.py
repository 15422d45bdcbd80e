"""A whole model on the GPU: pyq2.model.load and the decode step's weight path (pyq2.step) on the
demo model (folded, Gated-DeltaNet + attention) against numpy from its UNFOLDED float weights.

Every projection of the first decode step, given the inputs its producer read, equals the
float64 product of the unfolded weights with the un-rotated activation (RMSNorm of h + r, the
SwiGLU, or the mixer output permuted to the grouped V-head order) within FOLD_TOL = 1e-2
relative RMS: the Q8 path's bound (the weights are exact; only the activations are quantised).
The embedding rows with the inverse rotation equal the unfolded rows to fp32 rounding
(ROW_TOL). Loading a raw file and its repacked copies (tiles, planes) gives the same device
bytes.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from pyq2 import _native, formats, gguf_io, reference  # noqa: E402
from pyq2.demo import write_demo_model  # noqa: E402
from pyq2.errors import FormatError  # noqa: E402
from pyq2.model import load, synthetic  # noqa: E402
from pyq2.repack import repack  # noqa: E402
from pyq2.rotation import Rotation  # noqa: E402
from pyq2.step import DecodeStep  # noqa: E402

if not _native.load()[1].pq2_built_with_cuda():
    pytest.skip("libpq2 built without CUDA", allow_module_level=True)

pytestmark = pytest.mark.gpu

FOLD_TOL = 1e-2
ROW_TOL = 2e-6


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("model") / "demo.gguf")


def unfolded_weights(path):
    """name -> float64 [N, K] of every ternary weight, unfolded; name -> float64 dense."""
    out, dense = {}, {}
    with gguf_io.open_gguf(path) as gf:
        widths = {t.name: t.ne[0] for t in gf.tensors}
        rot = Rotation.from_file(gf, widths)
        for t in gf.tensors:
            raw = np.array(gf.data(t))
            if t.type_name in ("PQ2_0", "PTQ1_0"):
                k, n = t.ne
                if t.type_name == "PTQ1_0":
                    raw = formats.ptq1_to_pq2(raw)
                w = formats.pq2_dequantize(raw, n, k)
                folded = rot.folds(t.name) or t.name in rot.inverse_weight_names
                out[t.name] = reference.unfold(w, rot.block, rot.signs_for(k)) if folded else w
            else:
                dense[t.name] = raw.view(np.float32).reshape(tuple(reversed(t.ne)))
    return out, dense, rot


def f64(t):
    return t.double().cpu().numpy()


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_decode_step_matches_the_unfolded_model(demo, m, fuse):
    model = load(demo)
    assert model.gdn_v_grouped and model.plan.attention_layers == (1,)
    w, dense, _ = unfolded_weights(demo)
    plan = model.plan
    step = DecodeStep(model, m, dtype=torch.float32, seed=m, fuse=fuse)
    step.ids.copy_(torch.arange(m, dtype=torch.int32) * 37 % 1024)
    records = step.record()
    assert len(records) == 1 + len(plan.stages)
    ids = step.ids.cpu().numpy()
    emb = records[0]["outputs"]["h"]
    assert reference.rel_rms(f64(emb), w["token_embd.weight"][ids]) <= ROW_TOL
    checked = 0
    for r in records[1:]:
        s, inp = r["stage"], r["inputs"]
        if s.producer == "norm":
            h = f64(inp["x"]) + (0 if inp["residual"] is None else f64(inp["residual"]))
            act = reference.rmsnorm(h, f64(inp["norm"]), plan.eps)
        elif s.producer == "mixer":
            act = f64(inp["x"])
            if s.permute:
                act = reference.gdn_v_grouped(act, plan.v_heads, plan.k_heads)
        else:
            act = reference.swiglu(f64(inp["gate"]), f64(inp["up"]))
        for name in s.projections:
            err = reference.rel_rms(f64(r["outputs"][name]), act @ w[name].T)
            assert err <= FOLD_TOL, f"m={m} {name}: rel RMS {err:.3g}"
            checked += 1
        for name in s.unrotated:
            err = reference.rel_rms(f64(r["outputs"][name]), act @ dense[name].astype(np.float64).T)
            assert err <= 1e-5, f"{name}: rel RMS {err:.3g}"
    assert checked == len([n for n in w if n != "token_embd.weight"])


def test_load_raw_and_repacked_files_agree(demo, tmp_path):
    base = load(demo)
    for layout in ("tiles", "planes"):
        out = repack(demo, tmp_path / f"{layout}.gguf", layout=layout).out_path
        for target in ("tiles", "planes"):
            other = load(out, layout=target)
            ref = base if target == "tiles" else load(demo, layout="planes")
            for name, wt in ref.weights.items():
                assert torch.equal(wt.matrix.data, other.weights[name].matrix.data), (
                    layout,
                    target,
                    name,
                )
                assert other.weights[name].source == wt.source
    assert base.weights["output.weight"].source == "PTQ1_0"
    assert base.weights["blk.0.ffn_down.weight"].rotation_width == 768


def test_load_refuses_before_keeping_gpu_memory(demo, tmp_path):
    blob = bytearray(demo.read_bytes())
    bad = tmp_path / "bad.gguf"
    # an architecture pyq2 does not serve
    i = blob.find(b"qwen35")
    bad.write_bytes(blob[:i] + b"qwen99" + blob[i + 6 :])
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(FormatError, match="architecture 'qwen99' is not served"):
        load(bad)
    assert torch.cuda.memory_allocated() == before


def test_synthetic_tiny_runs_in_a_graph():
    from pyq2.bench import graph_ms

    model = synthetic("tiny")
    step = DecodeStep(model, 4)
    assert graph_ms(step.run, 3) > 0
    logits = step.outputs["output.weight"]
    assert torch.isfinite(logits.float()).all()


def test_load_refuses_a_non_finite_scale_and_frees_what_it_uploaded(demo, tmp_path):
    blob = bytearray(demo.read_bytes())
    with gguf_io.open_gguf(demo) as gf:
        at = gf.tensor("blk.0.ffn_gate.weight").offset + 5 * 34  # K = 256: row 2, block 1
    blob[at : at + 2] = np.float16(np.nan).tobytes()
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(blob)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(FormatError, match=r"'blk.0.ffn_gate.weight': row 2, block 1 has scale nan"):
        load(bad)
    assert torch.cuda.memory_allocated() == before
