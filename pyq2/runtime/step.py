"""The weight path of one decode step on a Model, as calls on fixed buffers (capturable).

`DecodeStep(model, m)` allocates every buffer once and lists the calls of one step of m tokens
in the order of the model's plan (pyq2.plan.decode): the embedding rows with the inverse rotation
into the residual stream h, then per stage one producer of the Q8 operand and the projections that
read it:

- norm stage: h = h + r (r: the output of the stage's previous projection, the mixer's output
  projection or ffn_down; none before the first layer), RMSNorm with the stage's norm weight,
  rotate, Q8; the un-rotated normed rows also go to the un-folded side projections (ssm_alpha,
  ssm_beta: dense; pyq2.runtime.dense_kernels for a decode step's few rows, else torch.matmul);
- mixer stage: the mixer's output (attention or recurrence: the host's work, a buffer the host
  fills, `mixer_out[layer]`: with `mixer` given, a "mixer" call mixer(layer) right before the
  stage's producer, after the stage's inputs are all written), permuted to the grouped V-head order
  for a Gated-DeltaNet layer when the file says so, rotated, Q8, then attn_output / ssm_out;
- swiglu stage: silu(gate) * up of the FFN's gate and up outputs, rotated, Q8, then ffn_down.

With `shared`, the stages of one role (a layer's q/k/v outputs, its FFN outputs, ...) write one
buffer for all layers instead of one each (what a prompt of many rows needs: the outputs of one
layer instead of all of them; `outputs` and `record()` then show the last layer's).

With `last_rows` (n), the last stage (the final norm and the head) runs on the step's last n rows
only: `logits` has n rows (a prompt's next token needs its last row's alone; the head's rows at
every token are most of a long prompt's memory and a few percent of its time).

With `fuse` (the default), the projections of one stage that read the same activation (attention
q/k/v, Gated-DeltaNet qkv and gate, FFN gate and up; the side projections alike) run as one
matmul writing one output whose column ranges are the projections' outputs: on the file's fused
matrix when the file has one for them (`pyq2 repack --fuse`, Model.fused; no copy), else on a
concatenation of their tiles-layout matrices made once for all the model's steps (one more device
copy of those weights). Without `fuse` each projection runs alone (the members of a fused matrix
then get matrices of their own: Weight.matrix).

A tensor-parallel shard's step (pyq2.plan.tensor_parallel; `collective` given, of the shard's size
and rank) runs the rank's parts: after each row-parallel projection (attn_output, ssm_out,
ffn_down) a "reduce" call sums its output over the ranks in place, before the next norm producer
adds it to the residual stream; after the head a "gather" call puts every rank's logits in
`logits`. Every rank then holds the same residual stream and logits. A whole model takes a
collective of one rank too (NCCL then adds nothing to the arithmetic).

Everything the projections write stays in `outputs[name]` (a view into the fused output).
With `gated_norm`, a Gated-DeltaNet layer's mixer_out is float32 and takes the recurrence's
output before its gated RMSNorm: the mixer producer applies the norm with silu(z) (z: the
layer's attn_gate output), then permutes, rotates and quantises.

With `mixer_side`, the side projections are the host's: no call runs them, the norm producer
still writes their input, and `side_inputs[layer]` says where the mixer finds it and their
weights (a Gated-DeltaNet decode kernel computes them with the recurrence).

`run()` makes the calls on the current stream, the side projections on a second one that forks
from it after their producer and joins it again (so they overlap the projections, as a host's
would); `record()` runs them eagerly in order and returns each stage's inputs and outputs (what a
reference needs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lib.cuda import (
    PQ2Weights,
    Q8Operand,
    gated_norm_rotate_q8,
    norm_rotate_q8,
    rotate_q8,
    swiglu_rotate_q8,
)
from ..lib.optional import require_torch
from ..plan.decode import Stage
from ..plan.tensor_parallel import head_rows
from .collective import Collective
from .load import Model


@dataclass
class Call:
    kind: str  # "embedding", "producer", "projection", "side", "mixer", "reduce", "gather"
    stage: Stage | None
    fn: Callable[[], Any]
    inputs: dict[str, Any] | None = None  # a producer's input buffers, by role
    reduced: Any = None  # a "reduce" call's buffer, summed over the ranks in place


class DecodeStep:
    def __init__(
        self,
        model: Model,
        m: int,
        dtype: Any = None,
        fuse: bool = True,
        collective: Collective | None = None,
        mixer: Callable[[int], Any] | None = None,
        shared: bool = False,
        last_rows: int | None = None,
        mixer_side: bool = False,
        gated_norm: bool = False,
    ):
        torch = require_torch()
        g, rank = model.tp or (1, 0)
        if collective is None and g > 1:
            raise ValueError(f"{model.source} is shard {rank} of {g}: its step needs a collective")
        if collective is not None and (collective.size, collective.rank) != (g, rank):
            raise ValueError(
                f"collective of rank {collective.rank} of {collective.size} for "
                f"{model.source}, which is rank {rank} of {g}"
            )
        self.collective = collective
        self.mixer = mixer
        self.model, self.m = model, m
        if last_rows is not None and not 1 <= last_rows <= m:
            raise ValueError(f"last_rows {last_rows} for a step of {m} rows")
        self.head_m = m if last_rows is None else last_rows
        self.dtype = dtype if dtype is not None else torch.bfloat16
        plan = model.plan
        emb = model.weights[plan.embedding].matrix
        dev = emb.data.device
        self.hidden = emb.k

        def empty(*shape, dtype=None):
            return torch.empty(*shape, dtype=dtype or self.dtype, device=dev)

        buffers: dict[tuple[Any, ...], Any] = {}
        last = len(plan.stages) - 1

        def output(role: tuple[Any, ...], cols: int, rows: int = m, dtype: Any = None) -> Any:
            """A stage's output buffer: its own, or with `shared` the one every layer's stage of
            the same role writes (each is read before the next layer's writes it)."""
            if not shared:
                return empty(rows, cols, dtype=dtype)
            key = (role, cols, rows)
            if key not in buffers:
                buffers[key] = empty(rows, cols, dtype=dtype)
            return buffers[key]

        self.ids = torch.zeros(m, dtype=torch.int32, device=dev)
        self.h = [empty(m, self.hidden), empty(m, self.hidden)]
        self.outputs: dict[str, Any] = {}
        self.q8: dict[int, Q8Operand] = {}  # by width; the head's is self.head_q8
        self.normed: dict[int, Any] = {}
        self.mixer_out: dict[int, Any] = {}
        # per stage: [(matrix, output, names)] of the matmuls, and the side matmul
        self.matmuls: dict[int, list[tuple[PQ2Weights, Any]]] = {}
        self.side: dict[int, tuple[Any, Any]] = {}
        # with mixer_side, per layer: (normed rows, side weights, first row of each weight)
        self.side_inputs: dict[int, tuple[Any, Any, dict[str, int]]] = {}
        self.mixer_side, self.gated_norm = mixer_side, gated_norm
        ws = 256
        for i, stage in enumerate(plan.stages):
            width = self._width(stage)
            rows = self.head_m if i == last else m
            if i == last:
                self.head_q8 = Q8Operand.empty(rows, width, dev)
            else:
                self.q8.setdefault(width, Q8Operand.empty(m, width, dev))
            self.matmuls[i] = []
            for mats, columns in matmul_groups(model, stage.projections, fuse):
                key = tuple(name for name, _, _ in columns)
                if len(mats) > 1 and key not in model.concatenated:
                    model.concatenated[key] = concat_rows(mats)
                w = model.concatenated[key] if len(mats) > 1 else mats[0]
                out = output((stage.layer < 0, *(_role(n) for n in key)), w.n, rows)
                self.matmuls[i].append((w, out))
                ws = max(ws, w.workspace_size(rows))
                for name, first, cols in columns:
                    self.outputs[name] = out[:, first : first + cols]
            if stage.unrotated:
                self.normed.setdefault(width, empty(m, width))
                side_key = (tuple(stage.unrotated), self.dtype)
                if side_key not in model.side_weights:
                    model.side_weights[side_key] = torch.cat(
                        [model.dense[n] for n in stage.unrotated]
                    ).to(self.dtype)
                side_w = model.side_weights[side_key]
                col, first_rows = 0, {}
                for n in stage.unrotated:
                    first_rows[n] = col
                    col += model.dense[n].shape[0]
                if mixer_side:  # the mixer computes them: no output buffer
                    self.side_inputs[stage.layer] = (self.normed[width], side_w, first_rows)
                else:
                    out = output(("side", *(_role(n) for n in stage.unrotated)), col)
                    self.side[i] = (side_w, out)
                    for n in stage.unrotated:
                        rows = model.dense[n].shape[0]
                        self.outputs[n] = out[:, first_rows[n] : first_rows[n] + rows]
            if stage.producer == "mixer":  # the host writes it before the stage's producer
                gated = gated_norm and stage.permute  # a Gated-DeltaNet layer's, before its norm
                if gated and not gated_norm_fits(width // plan.v_heads):
                    raise ValueError(
                        f"gated_norm: V heads of {width // plan.v_heads} are not a power of two "
                        "in 4..128"
                    )
                x = output(("mixer", gated), width, dtype=torch.float32 if gated else None)
                self.mixer_out[stage.layer] = x.zero_()
        head = plan.stages[-1].projections[0]
        self.logits = self.outputs[head]  # every rank's rows, gathered (a shard's step)
        if collective is not None:
            split = model.splits.get(head)
            vocab = split.extent if split is not None else model.weights[head].shape[0]
            # a shard's head rows are those of head_rows (pyq2.runtime.load.check)
            self._head_rows = head_rows(vocab, g) if split is not None else [(0, vocab)]
            most = max(b - a for a, b in self._head_rows)
            self._send = empty(self.head_m, most)
            self._gathered = empty(g, self.head_m, most)
            self.logits = empty(self.head_m, vocab)
        self.workspace = torch.empty(ws, dtype=torch.uint8, device=dev)
        self.side_stream = torch.cuda.Stream(device=dev)  # run(): the side projections
        self.calls = self._calls()

    def _width(self, stage: Stage) -> int:
        return self.model.weights[stage.projections[0]].shape[1]

    def _calls(self) -> list[Call]:
        model, plan = self.model, self.model.plan
        emb = model.weights[plan.embedding]
        calls = [
            Call(
                "embedding",
                None,
                lambda: emb.matrix.get_rows(
                    self.ids, rotation=model.rotation_for(emb.matrix.k), out=self.h[0]
                ),
                {"ids": self.ids},
            )
        ]
        cur, residual = 0, None
        last = len(plan.stages) - 1
        for i, stage in enumerate(plan.stages):
            width = self._width(stage)
            q = self.head_q8 if i == last else self.q8[width]
            rot = model.rotation_for(width)
            if stage.producer == "norm":
                # the head's stage: the last head_m rows (nothing reads its h_out)
                first = self.m - q.m
                x = self.h[cur][first:]
                if residual is not None:
                    residual = residual[first:]
                h_out = self.h[1 - cur][first:] if residual is not None else None
                inputs = {"x": x, "residual": residual, "norm": model.dense[str(stage.norm)]}
                fn = _bind(
                    norm_rotate_q8,
                    x,
                    model.dense[str(stage.norm)],
                    plan.eps,
                    rot,
                    residual=residual,
                    h_out=h_out,
                    normed=self.normed.get(width) if stage.unrotated else None,
                    out=q,
                )
                cur = cur if residual is None else 1 - cur
            elif stage.producer == "mixer":
                if self.mixer is not None:  # the host's attention or recurrence of the layer
                    calls.append(Call("mixer", stage, _bind(self.mixer, stage.layer)))
                heads = (
                    (plan.v_heads, plan.k_heads)
                    if stage.permute and model.gdn_v_grouped
                    else (0, 0)
                )
                x = self.mixer_out[stage.layer]
                if self.gated_norm and stage.permute:
                    b = f"blk.{stage.layer}."
                    z = self.outputs[b + "attn_gate.weight"]
                    inputs = {"o": x, "z": z}
                    fn = _bind(gated_norm_rotate_q8, x, z, model.dense[b + "ssm_norm.weight"],
                               plan.eps, rot, plan.v_heads, heads[1], out=q)  # fmt: skip
                else:
                    inputs = {"x": x}
                    fn = _bind(rotate_q8, x, rot, *heads, out=q)
            else:
                gate, up = (self.outputs[p] for p in _ffn_inputs(stage))
                inputs = {"gate": gate, "up": up}
                fn = _bind(swiglu_rotate_q8, gate, up, rot, out=q)
            calls.append(Call("producer", stage, fn, inputs))
            if i in self.side:  # right after its producer: run() forks it from there
                side_w, out = self.side[i]
                normed = self.normed[width]
                calls.append(Call("side", stage, _side_matmul(normed, side_w, out)))
            for w, out in self.matmuls[i]:
                calls.append(Call("projection", stage, _bind(w.matmul_q8, q, out, self.workspace)))
            if self.collective is not None and stage.producer != "norm":
                # a row-parallel projection (pyq2.plan.tensor_parallel): this rank's columns'
                # partial sum
                out = self.outputs[stage.projections[0]]
                fn = _bind(self.collective.all_reduce, out)
                calls.append(Call("reduce", stage, fn, reduced=out))
            if self.collective is not None and stage.layer < 0:
                local = self.outputs[stage.projections[0]]
                calls.append(Call("gather", stage, _bind(self._gather, local)))
            # a norm stage consumes the pending residual; the mixer's and the FFN's output
            # projection make the next one
            residual = None if stage.producer == "norm" else self.outputs[stage.projections[0]]
        return calls

    def _gather(self, local: Any) -> None:
        """Every rank's logits (this rank's: local) into self.logits, through buffers of the most
        rows any rank has."""
        assert self.collective is not None
        self._send[:, : local.shape[1]].copy_(local)
        self.collective.all_gather(self._send, self._gathered)
        for r, (a, b) in enumerate(self._head_rows):
            self.logits[:, a:b].copy_(self._gathered[r, :, : b - a])

    def run(self, kinds: tuple[str, ...] | None = None) -> None:
        """Make the step's calls on the current stream; those of `kinds` only, when given, one
        after another. The whole step runs the side projections on a second stream, each forked
        after its producer and joined before the next norm producer (the first that may rewrite
        the normed rows it reads) and at the end, so that they overlap the projections."""
        torch = require_torch()
        if kinds is not None or not self.side:
            for c in self.calls:
                if kinds is None or c.kind in kinds:
                    c.fn()
            return
        main, pending = torch.cuda.current_stream(), None
        for c in self.calls:
            # the host's mixer reads the side projections' outputs (ssm_alpha, ssm_beta)
            joins = c.kind == "mixer" or (
                c.kind == "producer" and c.stage is not None and c.stage.producer == "norm"
            )
            if pending is not None and joins:
                main.wait_event(pending)
                pending = None
            if c.kind != "side":
                c.fn()
                continue
            self.side_stream.wait_stream(main)
            with torch.cuda.stream(self.side_stream):
                c.fn()
            pending = torch.cuda.Event()
            pending.record(self.side_stream)
        if pending is not None:
            main.wait_event(pending)

    def record(self) -> list[dict[str, Any]]:
        """Run the step eagerly; per producer (and the embedding first), copies of its inputs
        (Call.inputs) and of the outputs of the calls after it."""
        torch = require_torch()
        records: list[dict[str, Any]] = []
        for c in self.calls:
            if c.inputs is not None:
                copies = {k: None if v is None else v.clone() for k, v in c.inputs.items()}
                records.append({"stage": c.stage, "inputs": copies, "outputs": {}})
            c.fn()
            torch.cuda.synchronize()
            if c.kind == "embedding":
                records[-1]["outputs"]["h"] = self.h[0].clone()
        for r in records:
            if r["stage"] is not None:
                for name in r["stage"].projections + r["stage"].unrotated:
                    if name in self.outputs:  # (not the side projections with mixer_side)
                        r["outputs"][name] = self.outputs[name].clone()
        return records


def gated_norm_fits(v_dim: int) -> bool:
    """Whether the gated-norm producer (pq2_gated_norm_rotate_q8_cuda) takes V heads of this
    width: a power of two, 4..128."""
    return 4 <= v_dim <= 128 and not v_dim & (v_dim - 1)


def matmul_groups(
    model: Model, names: tuple[str, ...], fuse: bool
) -> list[tuple[list[PQ2Weights], list[tuple[str, int, int]]]]:
    """The matmuls of projections that read one activation: per matmul the matrices whose rows
    it runs (concat_rows), and (name, first column, columns) of each projection's output."""
    fused = model.fused_for(names) if fuse else None
    if fused is not None:
        return [([fused.weight.matrix], [(m.name, m.row0, m.rows) for m in fused.members])]
    mats = [model.weights[n].matrix for n in names]
    groups = [mats] if fuse and fusable(mats) else [[w] for w in mats]
    out, it = [], iter(names)
    for group in groups:
        columns, col = [], 0
        for w in group:
            columns.append((next(it), col, w.n))
            col += w.n
        out.append((group, columns))
    return out


def fusable(mats: list[PQ2Weights]) -> bool:
    """Whether matrices can run as one: tiles of one tile height, every one but the last a whole
    number of tiles (a tiles matrix of whole tiles is its code region then its scale region, so
    such matrices concatenate region by region)."""
    if len(mats) < 2 or any(w.layout != "tiles" or w.rt != mats[0].rt for w in mats):
        return False
    tr = mats[0].geometry.tile_rows
    return all(w.n % tr == 0 for w in mats[:-1]) and len({w.k for w in mats}) == 1


def concat_rows(mats: list[PQ2Weights]) -> PQ2Weights:
    """The matrices' rows one after another, as one matrix (fusable), or the one matrix."""
    if len(mats) == 1:
        return mats[0]
    torch = require_torch()
    codes, scales = [], []
    for w in mats:
        split = w.geometry.regions[0]
        codes.append(w.data[:split])
        scales.append(w.data[split:])
    first = mats[0]
    return PQ2Weights(torch.cat(codes + scales), sum(w.n for w in mats), first.k, "tiles", first.rt)


def _side_matmul(x: Any, w: Any, out: Any) -> Callable[[], Any]:
    """out = x . w^T: pyq2.runtime.dense_kernels for a step of up to its STEP_ROWS rows where
    triton imports (unless PYQ2_DENSE_KERNELS=0), else torch.matmul."""
    torch = require_torch()
    if x.device.type == "cuda" and os.environ.get("PYQ2_DENSE_KERNELS", "1") != "0":
        try:
            from . import dense_kernels
        except ImportError:
            dense_kernels = None  # type: ignore[assignment]
        if dense_kernels is not None and x.shape[0] <= dense_kernels.STEP_ROWS:
            return _bind(dense_kernels.dense_rows, x, w, out)
    return _bind(torch.matmul, x, w.t(), out=out)


def _ffn_inputs(stage: Stage) -> tuple[str, str]:
    b = f"blk.{stage.layer}."
    return b + "ffn_gate.weight", b + "ffn_up.weight"


def _role(name: str) -> str:
    """A projection's name without its layer: blk.3.attn_qkv.weight -> attn_qkv.weight."""
    return name.split(".", 2)[2] if name.startswith("blk.") else name


def _bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: fn(*args, **kwargs)
