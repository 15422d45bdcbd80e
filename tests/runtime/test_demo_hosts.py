"""The demo model (pyq2.offline.demo: folded, Gated-DeltaNet + attention) loaded with
pyq2.runtime.load.load and run through libpq2's two other hosts, against numpy from its UNFOLDED
float weights (tests/runtime/test_model.py does it for pyq2.runtime.step's DecodeStep over
pyq2.lib.cuda):

- the torch operators (pyq2.lib.torch_ops): the first decode step's weight path as torch.ops.pq2
  calls on the loaded model's tensors, written here as a host would (`torch_step`): get_rows with
  the inverse rotation, then per stage its producer op (norm_rotate_q8, rotate_q8 with the
  Gated-DeltaNet permutation, swiglu_rotate_q8) and matmul_q8 for each projection; the
  attention output projection (a plain rotated input) through PQ2Linear. Every projection
  matches the unfolded product within FOLD_TOL (the inputs each stage read come out of the same
  run), the embedding rows within ROW_TOL, the residual stream h = x + residual exactly, the
  un-rotated normed rows within NORMED_TOL; and the whole chain gives the bits of DecodeStep
  (fuse=False: the same calls through pyq2.lib.cuda). Under torch.compile(fullgraph=True) and in a
  captured CUDA graph replayed on new inputs, every output is the eager bits (torch.equal).
- the plain ctypes example (tools/examples/ctypes_host.py): every projection of every stage
  (norm, mixer with and without the permutation, swiglu), its producer and matmul_q8 on the
  loaded model's device buffers, with the inputs the first decode step's stage read: the unfolded
  product within FOLD_TOL, and bit for bit the pyq2.lib.cuda producer + matmul_q8 on the same inputs
  (the same kernels with the same arguments and the tuned configuration: deterministic): the
  output, the Q8 operand (q8, scales, sums, kernel operand) and the h_out of a norm stage with
  a residual.

Tolerances (relative RMS) and the reference are tests/conftest.py's. m = 1 (bit slices),
5 (token records), 17 (the GEMM family). Every buffer a check reads that the caller hands a call
to write is poisoned first (NaN, or values no producer writes); the torch operators allocate
their own outputs, and the inputs differ from test to test (keyed seeds), so a stale buffer
cannot pass.
"""

import numpy as np
import pytest

from ..conftest import gpu_module

torch = gpu_module()

from pyq2.lib import cuda as pgpu  # noqa: E402
from pyq2.lib import native as _native  # noqa: E402
from pyq2.runtime.load import load  # noqa: E402
from pyq2.runtime.step import DecodeStep  # noqa: E402
from pyq2.runtime.timing import fill_random_mixers  # noqa: E402
from pyq2.spec import layouts, reference  # noqa: E402

from ..conftest import (  # noqa: E402
    NORMED_TOL,
    ROW_TOL,
    assert_matches_unfolded,
    f64,
    graph_capture,
    import_ctypes_example,
    keyed_rng,
    stage_activation,
)

pytestmark = pytest.mark.gpu

MS = [1, 5, 17]
NAN = float("nan")


@pytest.fixture(scope="module")
def ops():
    import pyq2.lib.torch_ops

    return pyq2.lib.torch_ops


@pytest.fixture(scope="module")
def model(demo_gguf):
    m = load(demo_gguf)
    assert m.gdn_v_grouped and m.plan.attention_layers == (1,)  # both mixers, the permutation
    return m


def assert_same(got, want, what=""):
    """Same shape, dtype and bits."""
    assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype), what
    assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)), (
        f"{what}: the bits differ"
    )


# ---- the step through the torch operators ----------------------------------------------------


def wiring(plan):
    """Per stage of the plan, the values its producer reads by role, as keys of torch_step's
    values: "embedding" (the rows of the ids), "h.<i>" (the residual stream norm stage i wrote),
    a projection's name (its output), "mixer.<layer>" (the host's attention or recurrence
    output). The residual stream and its pending residual follow pyq2.runtime.step: a norm stage
    adds the output of the stage before it when that was the mixer's or the FFN's output
    projection."""
    roles, h, residual = [], "embedding", None
    for i, s in enumerate(plan.stages):
        if s.producer == "norm":
            roles.append({"x": h, "residual": residual})
            if residual is not None:
                h = f"h.{i}"
        elif s.producer == "mixer":
            roles.append({"x": f"mixer.{s.layer}"})
        else:
            b = f"blk.{s.layer}."
            roles.append({"gate": b + "ffn_gate.weight", "up": b + "ffn_up.weight"})
        residual = None if s.producer == "norm" else s.projections[0]
    return roles


def torch_step(ops, model, dtype=torch.float32):
    """(step, mixer layers): step(ids, *mixer outputs) runs the first decode step's weight path
    through torch.ops.pq2 on the model's tensors and returns every value it computed by key
    (wiring's keys, "normed.<i>" the un-rotated normed rows of a stage with side projections)."""
    plan = model.plan

    def wargs(w):  # the operators' weight arguments of a pyq2.lib.cuda.PQ2Weights
        return w.data, w.n, w.k, layouts.layout_id(w.layout), layouts.layout_rt(w.layout, w.rt)

    def rargs(width):  # the operators' rotation arguments of an input width
        r = model.rotation_for(width)
        return (0, None) if r is None else (r.block, r.signs)

    # everything the traced function reads, looked up here: it only indexes these
    weight_args = {name: wargs(model.weights[name].matrix) for name in plan.weights()}
    rot_args = {
        i: rargs(model.weights[s.projections[0]].matrix.k) for i, s in enumerate(plan.stages)
    }
    emb_rot = rargs(model.weights[plan.embedding].matrix.k)
    norms = {i: model.dense[s.norm] for i, s in enumerate(plan.stages) if s.producer == "norm"}
    linears = {}  # the projections of a plain rotated input: PQ2Linear (rotate_q8 + matmul_q8)
    for s in plan.stages:
        if s.producer == "mixer" and not (s.permute and model.gdn_v_grouped):
            for name in s.projections:
                w = model.weights[name].matrix
                linears[name] = ops.PQ2Linear.from_weights(w, model.rotation_for(w.k))
    assert linears, "the demo model has an attention layer"
    layers = [s.layer for s in plan.stages if s.producer == "mixer"]
    roles = wiring(plan)
    p = torch.ops.pq2

    def step(ids, *mixer):
        out = {"embedding": p.get_rows(*weight_args[plan.embedding], ids, dtype, *emb_rot)}
        vals = dict(out)
        for j, layer in enumerate(layers):
            vals[f"mixer.{layer}"] = mixer[j]
        for i, s in enumerate(plan.stages):
            inp = {r: None if key is None else vals[key] for r, key in roles[i].items()}
            q = None
            if s.producer == "norm":
                res = p.norm_rotate_q8(
                    inp["x"], inp["residual"], norms[i], plan.eps, *rot_args[i],
                    dtype if s.unrotated else None,
                )  # fmt: skip
                q = res[:4]
                if inp["residual"] is not None:
                    out[f"h.{i}"] = res[4]
                if s.unrotated:
                    out[f"normed.{i}"] = res[5]
            elif s.producer == "mixer" and s.projections[0] in linears:
                for name in s.projections:
                    out[name] = linears[name](inp["x"])
            elif s.producer == "mixer":  # the Gated-DeltaNet output, permuted on its way
                q = p.rotate_q8(inp["x"], *rot_args[i], plan.v_heads, plan.k_heads)
            else:
                q = p.swiglu_rotate_q8(inp["gate"], inp["up"], *rot_args[i])
            if q is not None:
                for name in s.projections:
                    out[name] = p.matmul_q8(*weight_args[name], *q, dtype)
            vals.update(out)
        return out

    return step, layers


def step_inputs(model, layers, m, *key):
    """(ids [m] int32, the mixer outputs [m, width] f32 of each mixer layer), seeded by key."""
    r = keyed_rng("demo-step", m, *key)
    vocab = model.weights[model.plan.embedding].matrix.n
    ids = torch.from_numpy(r.integers(0, vocab, m).astype(np.int32)).cuda()
    mixer = []
    for layer in layers:
        (s,) = [s for s in model.plan.stages if s.producer == "mixer" and s.layer == layer]
        width = model.weights[s.projections[0]].matrix.k
        mixer.append(torch.from_numpy(r.standard_normal((m, width)).astype(np.float32)).cuda())
    return ids, mixer


def check_against_unfolded(model, unfolded, out, ids, layers, mixer, m):
    """Every value of torch_step's run against the float64 reference from the unfolded weights,
    each stage from the inputs it read in the same run."""
    w, dense, rot = unfolded
    plan = model.plan
    err = reference.rel_rms(f64(out["embedding"]), w[plan.embedding][ids.cpu().numpy()])
    assert err <= ROW_TOL, f"m={m} embedding rows: rel RMS {err:.3g}"
    vals = {**out, **{f"mixer.{layer}": x for layer, x in zip(layers, mixer, strict=True)}}
    checked = []
    for i, (s, roles) in enumerate(zip(plan.stages, wiring(plan), strict=True)):
        inp = {r: None if key is None else vals[key] for r, key in roles.items()}
        if s.producer == "norm":
            inp["norm"] = dense[s.norm]  # the file's, not the device copy
            if inp["residual"] is not None:  # h = x + residual, one fp32 add: exact
                assert_same(out[f"h.{i}"], inp["x"] + inp["residual"], f"m={m} h of stage {i}")
        act = stage_activation(s, plan, inp, rot.gdn_v_grouped)
        if s.unrotated:
            err = reference.rel_rms(f64(out[f"normed.{i}"]), act)
            assert err <= NORMED_TOL, f"m={m} normed rows of stage {i}: rel RMS {err:.3g}"
        for name in s.projections:
            assert_matches_unfolded(out[name], act, w[name], f"m={m} {name} (torch ops)")
            checked.append(name)
    assert sorted(checked) == sorted(n for n in w if n != plan.embedding)


@pytest.mark.parametrize("m", MS)
def test_torch_ops_match_the_unfolded_model(ops, model, demo_unfolded, m):
    step, layers = torch_step(ops, model)
    ids, mixer = step_inputs(model, layers, m, "eager")
    out = step(ids, *mixer)
    torch.cuda.synchronize()
    check_against_unfolded(model, demo_unfolded, out, ids, layers, mixer, m)

    # the same calls through pyq2.lib.cuda (DecodeStep, one matmul per projection): the same bits
    ds = DecodeStep(model, m, dtype=torch.float32, fuse=False)
    ds.ids.copy_(ids)
    for layer, x in zip(layers, mixer, strict=True):
        ds.mixer_out[layer].copy_(x)
    for t in ds.outputs.values():
        t.fill_(NAN)
    ds.run()
    for s in model.plan.stages:
        for name in s.projections:
            assert_same(out[name], ds.outputs[name], f"m={m} {name}: torch ops against DecodeStep")


@pytest.mark.parametrize("m", MS)
def test_torch_step_compiled_gives_the_eager_bits(ops, model, m):
    torch._dynamo.reset()
    step, layers = torch_step(ops, model)
    ids, mixer = step_inputs(model, layers, m, "compile")
    got = torch.compile(step, fullgraph=True)(ids, *mixer)
    want = step(ids, *mixer)
    assert sorted(got) == sorted(want)
    for key in want:
        assert_same(got[key], want[key], f"m={m} {key}: compiled against eager")


@pytest.mark.parametrize("m", MS)
def test_torch_step_in_a_cuda_graph_gives_the_eager_bits(ops, model, m):
    """Captured once, replayed on new ids and mixer outputs with every output poisoned first:
    the bits of an eager run on those inputs."""
    step, layers = torch_step(ops, model)
    ids, mixer = step_inputs(model, layers, m, "graph")
    static = [ids, *mixer]
    g, outs = graph_capture(step, static)
    for trial in range(2):
        new_ids, new_mixer = step_inputs(model, layers, m, "graph", trial)
        for s, v in zip(static, [new_ids, *new_mixer], strict=True):
            s.copy_(v)
        for t in outs.values():
            t.fill_(NAN)
        g.replay()
        want = step(new_ids, *new_mixer)
        assert sorted(outs) == sorted(want)
        for key in want:
            assert_same(outs[key], want[key], f"m={m} trial {trial} {key}: replay against eager")


# ---- the step's projections through the plain ctypes example --------------------------------


def poison_q8(q):
    """Values no producer writes: q8 -128 (Q8 is -127..127), scales NaN, sums INT32_MIN, the
    kernel operand 0xff."""
    q.q8.fill_(-128)
    q.scales.fill_(NAN)
    q.sums.fill_(-(2**31))
    if q.kernel_operand is not None:
        q.kernel_operand.fill_(0xFF)


@pytest.mark.parametrize("m", MS)
def test_ctypes_example_runs_the_demo_model(model, demo_unfolded, m):
    ex = import_ctypes_example()
    lib = ex.load(_native.library_path())
    w, _, rot = demo_unfolded
    plan = model.plan
    # the first decode step's inputs of every stage (pyq2.runtime.step, the pyq2.lib.cuda host)
    ds = DecodeStep(model, m, dtype=torch.float32, fuse=False)
    fill_random_mixers(ds, m)
    r = keyed_rng("ctypes-demo", m)
    ds.ids.copy_(torch.from_numpy(r.integers(0, 1024, m).astype(np.int32)))
    records = ds.record()[1:]
    assert [rec["stage"] for rec in records] == list(plan.stages)
    kinds, checked = set(), []  # kinds: (producer, permuted)
    for rec in records:
        s, inp = rec["stage"], rec["inputs"]
        k = model.weights[s.projections[0]].matrix.k
        drot = model.rotation_for(k)  # the model's device signs, shared by both hosts
        crot = ex.rotation(drot.block, drot.signs)
        q = ex.Q8Buffers(lib, m, k, "cuda")
        poison_q8(q)
        heads = (0, 0)
        if s.producer == "norm":
            x, res, norm = inp["x"], inp["residual"], inp["norm"]
            h = h_want = None
            if res is not None:
                h, h_want = torch.full_like(x, NAN), torch.full_like(x, NAN)
            ex.norm_rotate_q8(lib, x, norm, plan.eps, crot, q, residual=res, h_out=h)
            want_q = pgpu.norm_rotate_q8(x, norm, plan.eps, drot, residual=res, h_out=h_want)
            if h is not None:
                assert_same(h, h_want, f"m={m} h_out of {s.projections}")
        elif s.producer == "mixer":
            heads = (plan.v_heads, plan.k_heads) if s.permute and model.gdn_v_grouped else (0, 0)
            ex.rotate_q8(lib, inp["x"], crot, q, *heads)
            want_q = pgpu.rotate_q8(inp["x"], drot, *heads)
        else:
            ex.swiglu_rotate_q8(lib, inp["gate"], inp["up"], crot, q)
            want_q = pgpu.swiglu_rotate_q8(inp["gate"], inp["up"], drot)
        kinds.add((s.producer, heads != (0, 0)))
        for got_t, want_t, part in (
            (q.q8, want_q.q8, "q8"),
            (q.scales, want_q.scales, "scales"),
            (q.sums, want_q.sums, "sums"),
        ):
            assert_same(got_t, want_t, f"m={m} the Q8 {part} of {s.projections}")
        assert (q.kernel_operand is None) == (want_q.kernel_operand is None)
        if want_q.kernel_operand is not None:  # all its bytes written at this m (pq2.h)
            assert_same(q.kernel_operand, want_q.kernel_operand, f"m={m} the kernel operand")
        act = stage_activation(s, plan, inp, rot.gdn_v_grouped)
        for name in s.projections:
            mat = model.weights[name].matrix
            y = torch.full((m, mat.n), NAN, device="cuda")
            got = ex.matmul_q8(lib, ex.device_weights(mat.data, mat.n, mat.k, mat.rt), q, out=y)
            assert got is y
            y_want = torch.full((m, mat.n), NAN, device="cuda")
            mat.matmul_q8(want_q, y_want)
            torch.cuda.synchronize()
            assert_same(y, y_want, f"m={m} {name}: ctypes against pyq2.lib.cuda")
            assert_matches_unfolded(y, act, w[name], f"m={m} {name} (ctypes)")
            checked.append(name)
    assert kinds == {("norm", False), ("mixer", True), ("mixer", False), ("swiglu", False)}
    assert sorted(checked) == sorted(n for n in w if n != plan.embedding)
