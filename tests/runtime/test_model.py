"""A whole model on the GPU: pyq2.runtime.load.load and the decode step's weight path
(pyq2.runtime.step) on the demo model (folded, Gated-DeltaNet + attention) against numpy from its
UNFOLDED float weights.

Every projection of the first decode step, given the inputs its producer read, equals the
float64 product of the unfolded weights with the un-rotated activation (RMSNorm of h + r, the
SwiGLU, or the mixer output permuted to the grouped V-head order) within FOLD_TOL = 1e-2
relative RMS: the Q8 path's bound (the weights are exact; only the activations are quantised).
The embedding rows with the inverse rotation equal the unfolded rows to fp32 rounding
(ROW_TOL), the side projections that read the un-rotated normed rows within NORMED_TOL (the
tolerances and the reference are tests/conftest.py's). Loading a raw file and its repacked
copies (tiles, planes) gives the same device bytes.
"""

import json
import os

import numpy as np
import pytest

from ..conftest import gpu_module

torch = gpu_module()

from pyq2.errors import FormatError  # noqa: E402
from pyq2.gguf import io as gguf_io  # noqa: E402
from pyq2.offline.repack import repack  # noqa: E402
from pyq2.runtime.load import load, synthetic  # noqa: E402
from pyq2.runtime.step import DecodeStep  # noqa: E402
from pyq2.runtime.timing import fill_random_mixers  # noqa: E402
from pyq2.spec import reference  # noqa: E402

from ..conftest import (  # noqa: E402
    NORMED_TOL,
    ROW_TOL,
    assert_matches_unfolded,
    f64,
    graph_capture,
    run_pyq2,
    settled_allocated,
    stage_activation,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_decode_step_matches_the_unfolded_model(demo_gguf, demo_unfolded, m, fuse):
    model = load(demo_gguf)
    assert model.gdn_v_grouped and model.plan.attention_layers == (1,)
    w, dense, rot = demo_unfolded
    plan = model.plan
    step = DecodeStep(model, m, dtype=torch.float32, fuse=fuse)
    fill_random_mixers(step, m)
    step.ids.copy_(torch.arange(m, dtype=torch.int32) * 37 % 1024)
    records = step.record()
    assert len(records) == 1 + len(plan.stages)
    ids = step.ids.cpu().numpy()
    emb = records[0]["outputs"]["h"]
    assert reference.rel_rms(f64(emb), w["token_embd.weight"][ids]) <= ROW_TOL
    checked = 0
    for r in records[1:]:
        s = r["stage"]
        act = stage_activation(s, plan, r["inputs"], rot.gdn_v_grouped)
        for name in s.projections:
            assert_matches_unfolded(r["outputs"][name], act, w[name], f"m={m} {name}")
            checked += 1
        for name in s.unrotated:
            assert_matches_unfolded(r["outputs"][name], act, dense[name], name, NORMED_TOL)
    assert checked == len([n for n in w if n != "token_embd.weight"])


def test_load_raw_and_repacked_files_agree(demo_gguf, tmp_path):
    base = load(demo_gguf)
    for layout in ("tiles", "planes"):
        out = repack(demo_gguf, tmp_path / f"{layout}.gguf", layout=layout).out_path
        for target in ("tiles", "planes"):
            other = load(out, layout=target)
            ref = base if target == "tiles" else load(demo_gguf, layout="planes")
            for name, wt in ref.weights.items():
                assert torch.equal(wt.matrix.data, other.weights[name].matrix.data), (
                    layout,
                    target,
                    name,
                )
                assert other.weights[name].source == wt.source
    assert base.weights["output.weight"].source == "PTQ1_0"
    assert base.weights["blk.0.ffn_down.weight"].rotation_width == 768


def test_load_refuses_before_keeping_gpu_memory(demo_gguf, tmp_path):
    blob = bytearray(demo_gguf.read_bytes())
    bad = tmp_path / "bad.gguf"
    # an architecture pyq2 does not serve
    i = blob.find(b"qwen35")
    bad.write_bytes(blob[:i] + b"qwen99" + blob[i + 6 :])
    before = settled_allocated()
    with pytest.raises(FormatError, match="architecture 'qwen99' is not served"):
        load(bad)
    assert torch.cuda.memory_allocated() == before


def test_synthetic_tiny_runs_in_a_graph():
    from pyq2.runtime.timing import graph_ms

    model = synthetic("tiny")
    step = DecodeStep(model, 4)
    assert graph_ms(step.run, 3) > 0
    logits = step.outputs["output.weight"]
    assert torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("m", [1, 4])
def test_decode_step_graph_gives_the_bits_of_the_calls_in_order(m):
    """run() puts the side projections on a second stream; replayed as a CUDA graph it gives
    every output, side projections included, the bits of record() (each call in turn)."""
    model = synthetic("tiny")
    step = DecodeStep(model, m)
    assert step.side, "the preset has side projections"
    step.ids.copy_(torch.arange(m, dtype=torch.int32) * 7)
    step.record()
    want = {name: t.clone() for name, t in step.outputs.items()}
    g, _ = graph_capture(lambda: step.run(), ())
    for t in step.outputs.values():
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    for name, t in want.items():
        assert torch.equal(step.outputs[name], t), f"m={m} {name}: graph against calls in order"


HEAD_TOL = 1e-6  # the head at two batch sizes: fp32 sums of exact int32 group products


@pytest.mark.parametrize("m,last", [(5, 1), (40, 1), (40, 3), (17, 17)])
def test_a_step_with_last_rows_gives_the_full_steps_last_logits(m, last):
    """last_rows runs the final norm and the head on the step's last rows only: the Q8 of those
    rows is the full step's (the producer's bits do not depend on the rows around them), so
    the logits are the full step's last rows to the head's summation order (its matmul runs at
    another m: HEAD_TOL)."""
    model = synthetic("tiny")
    full = DecodeStep(model, m, dtype=torch.float32)
    part = DecodeStep(model, m, dtype=torch.float32, last_rows=last)
    ids = torch.arange(m, dtype=torch.int32) * 13 % 200
    for s in (full, part):
        s.ids.copy_(ids)
        s.logits.fill_(float("nan"))
        s.run()
    torch.cuda.synchronize()
    assert part.logits.shape == (last, full.logits.shape[1])
    assert torch.equal(part.head_q8.scales, full.head_q8.scales[m - last :])
    assert reference.rel_rms(f64(part.logits), f64(full.logits[m - last :])) <= HEAD_TOL
    with pytest.raises(ValueError, match="last_rows 0"):
        DecodeStep(model, m, last_rows=0)


def test_load_refuses_a_non_finite_scale_and_frees_what_it_uploaded(demo_gguf, tmp_path):
    blob = bytearray(demo_gguf.read_bytes())
    with gguf_io.open_gguf(demo_gguf) as gf:
        at = gf.tensor("blk.0.ffn_gate.weight").offset + 5 * 34  # K = 256: row 2, block 1
    blob[at : at + 2] = np.float16(np.nan).tobytes()
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(blob)
    before = settled_allocated()
    with pytest.raises(FormatError, match=r"'blk.0.ffn_gate.weight': row 2, block 1 has scale nan"):
        load(bad)
    assert torch.cuda.memory_allocated() == before


def test_bench_json_records_rows_and_the_environment(tmp_path):
    """pyq2 bench --json: one row per m and the environment the numbers belong to (the commit
    from PQ2_COMMIT)."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, PQ2_COMMIT="abc1234")
    args = ("bench", "--synthetic", "tiny", "--ms", "1,2", "--replays", "2", "--json", out)
    p = run_pyq2(*args, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    result = json.loads(out.read_text())
    assert [r["m"] for r in result["rows"]] == [1, 2]
    assert all(np.isfinite(r["ms"]) and r["ms"] > 0 for r in result["rows"])
    assert result["env"]["commit"] == "abc1234"
    assert result["env"]["gpu"] == torch.cuda.get_device_name()
    assert result["env"]["libpq2"].startswith("0.")
