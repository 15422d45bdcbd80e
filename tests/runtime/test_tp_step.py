"""Tensor parallelism on one GPU: the shards of `pyq2 repack --tp 2`, run rank after rank in
lockstep on one device, give the single-GPU step's results; the NCCL path runs with one rank.

Lockstep: every rank's DecodeStep makes its calls in turn; at a "reduce" call the ranks'
buffers are summed (in fp32, as NCCL does), and the "gather" call runs the step's own gather
with an all_gather that reads every rank's send buffer: what the collectives do across GPUs.
In float32:
- the first stage's outputs (every rank reads the same embedding rows and norm, so the same Q8
  operand) are within FIRST_TOL of the whole model's rows (fp32 rounding: a matmul of other N
  may sum in another order);
- every later output, the residual stream and the gathered logits are within TP_TOL relative
  RMS of the whole model's: the sums over a rank's columns then over the ranks round in another
  order than one sum over all columns (fp32), and those differences can move a rounding of a
  later Q8 quantisation by one step (on the demo model no such step moves: about 1e-7).
"""

import numpy as np
import pytest

from ..conftest import f64, gpu_module, graph_capture

torch = gpu_module()

from pyq2.offline.repack import repack  # noqa: E402
from pyq2.runtime.load import load, synthetic  # noqa: E402
from pyq2.runtime.step import DecodeStep  # noqa: E402
from pyq2.runtime.timing import fill_random_mixers  # noqa: E402
from pyq2.spec import reference  # noqa: E402

from ..conftest import run_pyq2  # noqa: E402

pytestmark = pytest.mark.gpu

TP_TOL = 2e-3
FIRST_TOL = 1e-6


class Lockstep:
    """The collective of one rank of a lockstep run on one GPU: run_lockstep sums the reduce
    buffers itself; all_gather reads every rank's send buffer (`group`: the ranks' steps)."""

    def __init__(self, size, rank, group):
        self.size, self.rank, self.group = size, rank, group

    def all_reduce(self, t):
        raise AssertionError("run_lockstep sums the buffers")

    def all_gather(self, t, out):
        for r, step in enumerate(self.group):
            out[r].copy_(step._send)


def run_lockstep(steps):
    """Every rank's calls in turn; a reduce sums the ranks' buffers (in fp32, as NCCL does); the
    gather runs twice over the ranks, so that the second pass reads every rank's send buffer
    filled by the first."""
    for calls in zip(*(s.calls for s in steps), strict=True):
        kinds = {c.kind for c in calls}
        assert len(kinds) == 1, kinds
        if calls[0].kind == "reduce":
            total = sum(c.reduced.float() for c in calls)
            for c in calls:
                c.reduced.copy_(total)
        else:
            for _ in range(2 if calls[0].kind == "gather" else 1):
                for c in calls:
                    c.fn()
    torch.cuda.synchronize()


def lockstep_steps(shards, m, **kw):
    steps: list = []
    for r, s in enumerate(shards):
        steps.append(DecodeStep(s, m, collective=Lockstep(len(shards), r, steps), **kw))
    return steps


def take(x, pieces):
    return torch.cat([x[:, a:b] for a, b in pieces], dim=1)


def small_model(path):
    """A qwen35 model that splits 3 ways (tests/plan/test_tensor_parallel.py's SMALL), folded,
    identity signs."""
    from ..offline.test_fuse import write_qwen35
    from ..plan.test_tensor_parallel import SMALL

    names = [n for n, kind, _ in SMALL.tensors() if kind == "pq2"]
    write_qwen35(path, SMALL, folded=names[1:])
    return path


@pytest.mark.parametrize(
    "model,g,fuse,m",
    [
        ("demo", 2, False, 1),
        ("demo", 2, True, 1),
        ("demo", 2, False, 5),
        ("demo", 2, True, 5),
        ("small", 3, True, 1),
        ("small", 3, False, 4),
    ],
)
def test_shards_in_lockstep_give_the_single_gpu_step(demo_gguf, tmp_path, model, g, fuse, m):
    src = demo_gguf if model == "demo" else small_model(tmp_path / "small.gguf")
    whole = load(repack(src, tmp_path / "w.gguf").out_path)
    shards = [load(p) for p in repack(src, tmp_path / "s.gguf", tp=g, fuse=fuse).shards]
    assert [s.tp for s in shards] == [(g, r) for r in range(g)]
    one = DecodeStep(whole, m, dtype=torch.float32)
    fill_random_mixers(one, m)
    steps = lockstep_steps(shards, m, dtype=torch.float32)
    vocab = whole.weights["output.weight"].shape[0]
    ids = torch.arange(m, dtype=torch.int32, device="cuda") * 91 % vocab
    plan = whole.plan
    for r, (step, shard) in enumerate(zip(steps, shards, strict=True)):
        step.ids.copy_(ids)
        for stage in plan.stages:  # the rank's columns of the mixer's output
            if stage.producer == "mixer":
                name = "attn_output" if stage.layer in plan.attention_layers else "attn_gate"
                cut = shard.splits[f"blk.{stage.layer}.{name}.weight"].pieces[r]
                step.mixer_out[stage.layer].copy_(take(one.mixer_out[stage.layer], cut))
    one.ids.copy_(ids)
    one.run(("embedding", "producer", "projection", "side"))
    run_lockstep(steps)
    worst = 0.0
    first = set(plan.stages[0].projections + plan.stages[0].unrotated)
    for name, want in one.outputs.items():
        for r, (step, shard) in enumerate(zip(steps, shards, strict=True)):
            split = shard.splits.get(name)
            got = step.outputs[name]
            if split is not None and split.axis == 1:
                want_r = take(want, split.pieces[r])
            else:  # whole, or summed over the ranks
                want_r = want
            assert got.shape == want_r.shape, name
            err = reference.rel_rms(f64(got), f64(want_r))
            assert name not in first or err <= FIRST_TOL, (name, r, err)
            worst = max(worst, err)
            assert err <= TP_TOL, (name, r, err)
    rows = [s.splits["output.weight"].pieces[r] for r, s in enumerate(shards)]
    assert len({b - a for ((a, b),) in rows}) == (1 if model == "demo" else 2)  # small: uneven
    for step in steps:
        assert torch.equal(steps[0].logits, step.logits)
        assert reference.rel_rms(f64(step.logits), f64(one.outputs["output.weight"])) <= TP_TOL
        assert torch.equal(steps[0].h[0], step.h[0]) and torch.equal(steps[0].h[1], step.h[1])
    print(f"{model} G={g} m={m} fuse={fuse}: worst rel RMS {worst:.2e}")


def test_a_shards_step_needs_its_collective(demo_gguf, tmp_path):
    shard = load(repack(demo_gguf, tmp_path / "s.gguf", tp=2).shards[1])
    with pytest.raises(ValueError, match="is shard 1 of 2: its step needs a collective"):
        DecodeStep(shard, 1)
    with pytest.raises(ValueError, match="collective of rank 0 of 2 for .*rank 1 of 2"):
        DecodeStep(shard, 1, collective=Lockstep(2, 0, []))


def test_synthetic_shards_have_the_plans_shapes():
    for rank in (0, 1):
        model = synthetic("tiny", tp=(2, rank))
        step = DecodeStep(model, 2, collective=Lockstep(2, rank, []))
        assert model.plan.v_heads == 2 and model.plan.k_heads == 1
        assert step.logits.shape == (2, 1024)
        del step, model
    torch.cuda.empty_cache()


def test_nccl_with_one_rank_gives_the_bits_of_the_step_without_it(demo_gguf, tmp_path):
    dist = torch.distributed
    from pyq2.runtime.collective import Nccl

    dist.init_process_group(
        "nccl",
        init_method=f"file://{tmp_path}/store",
        world_size=1,
        rank=0,
        device_id=torch.device("cuda", 0),
    )
    try:
        whole = load(repack(demo_gguf, tmp_path / "w.gguf").out_path)
        plain = DecodeStep(whole, 3)
        fill_random_mixers(plain, 1)
        nccl = DecodeStep(whole, 3, collective=Nccl())
        fill_random_mixers(nccl, 1)
        assert sum(c.kind == "reduce" for c in nccl.calls) == 2 * whole.plan.n_layers
        for step in (plain, nccl):
            step.ids.copy_(torch.tensor([5, 77, 1000], dtype=torch.int32))
            g, _ = graph_capture(step.run, ())
            g.replay()
        torch.cuda.synchronize()
        for name in plain.outputs:
            assert torch.equal(plain.outputs[name], nccl.outputs[name]), name
        assert torch.equal(nccl.logits, plain.outputs["output.weight"])
    finally:
        dist.destroy_process_group()


def test_bench_tp_runs_on_one_gpu(tmp_path):
    out = tmp_path / "tp.json"
    p = run_pyq2(
        "bench",
        "--synthetic",
        "tiny",
        "--tp",
        "1",
        "--ms",
        "1,4",
        "--replays",
        "2",
        "--json",
        out,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "tensor-parallel over 1 GPUs" in p.stdout and "decode m=4" in p.stdout
    import json

    result = json.loads(out.read_text())
    assert result["env"]["gpu"] == torch.cuda.get_device_name()
    rows = result["rows"]
    assert [r["m"] for r in rows] == [1, 4] and all(np.isfinite(r["ms"]) for r in rows)
    assert all(r["single_gpu_ms"] > 0 for r in rows)


def test_bench_tp_needs_as_many_gpus():
    g = torch.cuda.device_count() + 1
    p = run_pyq2("bench", "--synthetic", "tiny", "--tp", str(g), "--ms", "1", timeout=120)
    assert p.returncode == 1
    assert f"needs {g} GPUs; this host has {g - 1}" in p.stderr
