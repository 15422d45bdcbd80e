"""A qwen35 model on the GPU: libpq2's weight path (DecodeStep) with the torch mixers between a
layer's projections, as a generation backend (pyq2.runtime.generate).

A prompt runs one sequence at a time in chunks of at most `chunk` tokens (activation memory
bounded by the chunk), each chunk one DecodeStep of that many rows whose mixer hook runs the
layer's attention or recurrence for that sequence; the caches of every sequence are
preallocated for the context. A decode step runs one token of every sequence as one DecodeStep
of B rows, replayed from a CUDA graph per (B, attention span) once warm: the span is the cache
positions attention reads, SPAN_STEP doubled until it holds the step's positions (capped at the
context), so that a context of n positions needs about log2(n / SPAN_STEP) graphs and a graph
past the first span launches at most twice the chunks a step needs (the chunks past a position
return at once); the graph also moves the positions on and, for greedy decoding without a
repetition penalty, takes the argmax and writes it as the next step's input
(pyq2.runtime.advance_kernels where the mixer kernels run). Other sampling runs on the device
after the replay (pyq2.text.sampling.sample_torch); only the chosen ids come back to the
host. Steps of up to the recurrence kernel's SIDE_ROWS rows leave the side projections to the
mixer (DecodeStep's mixer_side: the decode kernel computes them; a prompt chunk of that size,
torch), and those of up to GATED_NORM_ROWS rows leave the gated norm to the ssm_out producer
(gated_norm). decode_sample() chains the steps on the device: a step's chosen
ids are the next step's input where they are, and reach the host through pinned memory while
the next step runs, so the host's work on a token (stop checks, detokenisation) overlaps the
GPU's next step.

Activations between kernels (the residual stream, the projections' outputs) are bfloat16 unless
`dtype` says otherwise (float32 for the reference checks); the recurrent state is float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..lib.optional import require_torch
from ..spec import qwen35
from ..spec.qwen35_layers import imrope_axes
from ..text.sampling import SamplingParams, make_history_mask, sample_torch
from .load import Model, load
from .mixers import Attention, Dims, GatedDeltaNet, Rope, SideRows, mixer_kernels
from .step import DecodeStep, gated_norm_fits

SPAN_STEP = 256  # the attention span of a decode graph grows in steps of this many positions
DEFAULT_CHUNK = 2048  # prompt tokens per DecodeStep
SHARED_ABOVE = 16  # steps of more rows than this share their stages' output buffers
GATED_NORM_ROWS = 1  # steps of at most so many rows apply the gated norm in the ssm_out producer


def mixer_dims(c: qwen35.Config) -> Dims:
    return Dims(
        c.n_head, c.n_head_kv, c.head_dim, c.n_rot, c.rope_base, c.rms_eps, c.conv_kernel,
        c.k_heads, c.v_heads, c.d_k, c.d_v,
    )  # fmt: skip


class GpuModel:
    """ModelBackend over a loaded Model (module docstring)."""

    def __init__(
        self,
        path: Any,
        config: qwen35.Config,
        context: int,
        batch: int,
        dtype: Any = None,
        chunk: int = DEFAULT_CHUNK,
        graphs: bool = True,
        model: Model | None = None,
        use_fla: bool = True,
        cache_dtype: Any = None,
        kernels: bool = True,
    ):
        torch = require_torch()
        self.config, self.context, self.batch, self.chunk = config, context, batch, chunk
        self.model = model if model is not None else load(path)
        if self.model.tp is not None:
            raise ValueError(
                f"{path} is one shard of a tensor-parallel set: generate runs whole models"
            )
        self.dtype = dtype if dtype is not None else torch.bfloat16
        emb = self.model.weights[self.model.plan.embedding].matrix
        self.device = emb.data.device
        self.n_vocab = emb.n
        self.name = f"gpu ({torch.cuda.get_device_name(self.device)})"
        dims = mixer_dims(config)
        self.rope = Rope(dims, context, self.device)
        axes = imrope_axes(config.rope_sections, config.n_rot // 2)
        if (axes == 3).any():  # pairs the text position leaves unrotated
            keep = torch.as_tensor(axes < 3, device=self.device)
            self.rope.cos[:, ~keep], self.rope.sin[:, ~keep] = 1.0, 0.0
        dense = self.model.dense
        # one scratch for every attention layer's decode kernels
        module = mixer_kernels(self.device, config.head_dim) if kernels else None
        scratch = None
        if module is not None:
            scratch = module.AttentionScratch(
                batch, config.n_head, config.head_dim, context, self.device
            )
        self.attn: dict[int, Attention] = {}
        self.gdn: dict[int, GatedDeltaNet] = {}
        for i in range(config.n_layer):
            b = f"blk.{i}."
            if config.is_attention(i):
                w = {
                    "q_norm": dense[b + "attn_q_norm.weight"],
                    "k_norm": dense[b + "attn_k_norm.weight"],
                }
                self.attn[i] = Attention(dims, w, batch, context, self.rope, self.device,
                                         cache_dtype, scratch, kernels)  # fmt: skip
            else:
                w = {
                    "conv": dense[b + "ssm_conv1d.weight"],
                    "a": dense[b + "ssm_a"],
                    "dt_bias": dense[b + "ssm_dt.bias"],
                    "norm": dense[b + "ssm_norm.weight"],
                }
                self.gdn[i] = GatedDeltaNet(
                    dims, w, batch, self.device, use_fla=use_fla, kernels=kernels
                )
        self.positions = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.lengths: list[int] = []
        self._steps: dict[tuple[int, bool], DecodeStep] = {}  # (rows, last row only)
        self._advance_kernels = None
        if module is not None:
            from .advance_kernels import Advance

            self._advance_kernels = Advance(batch, self.device)
        self._mode: tuple[Any, ...] = ("decode", 0)
        self._graphs: dict[tuple[int, int, bool], Any] = {}  # (rows, span, greedy)
        self._chosen = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.use_graphs = graphs
        self._generator: Any = None
        self._mask: Any = None
        self._host_ids: list[Any] = []  # decode_sample's two pinned buffers, in turn
        self._turn = 0
        self._no_mixers = False  # part("weights"): the step without its mixers
        # decode steps of up to so many rows leave the side projections to the recurrence kernel
        gdn_kernels = mixer_kernels(self.device, config.d_v) if kernels else None
        self.side_rows = gdn_kernels.SIDE_ROWS if gdn_kernels is not None else 0

    # ---- the weight path, with the mixers between its projections ---------------------------

    def _step(self, m: int, last_row: bool = False) -> DecodeStep:
        """The step of m rows (last_row: the head on the last row only, a prompt piece's next
        token). Steps of more than SHARED_ABOVE rows share one layer's output buffers; of the
        prompt pieces' (last_row) only the whole chunk's and the latest other such step are kept
        (a batch of prompts of many lengths would otherwise hold one each; decode steps are kept:
        graphs use them)."""
        key = (m, last_row)
        if key not in self._steps:
            if last_row and SHARED_ABOVE < m != self.chunk:
                for k in [k for k in self._steps
                          if k[1] and SHARED_ABOVE < k[0] != self.chunk]:  # fmt: skip
                    del self._steps[k]
            gated = not last_row and m <= GATED_NORM_ROWS and gated_norm_fits(self.config.d_v)
            self._steps[key] = DecodeStep(
                self.model, m, dtype=self.dtype, mixer=self._mixer, shared=m > SHARED_ABOVE,
                last_rows=1 if last_row else None,
                mixer_side=not last_row and m <= self.side_rows,
                gated_norm=gated,
            )  # fmt: skip
        return self._steps[key]

    def _mixer(self, layer: int) -> None:
        if self._no_mixers:
            return
        step = self._current
        out, b, mode = step.outputs, f"blk.{layer}.", self._mode
        if layer in self.attn:
            a = self.attn[layer]
            q, k, v = (out[b + n] for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight"))
            if mode[0] == "prefill":
                a.prefill(q, k, v, mode[1], mode[2], step.mixer_out[layer])
            else:
                a.decode(q, k, v, self.positions[: step.m], mode[1], step.mixer_out[layer])
            return
        g = self.gdn[layer]
        qkv, z = out[b + "attn_qkv.weight"], out[b + "attn_gate.weight"]
        alpha = beta = side = None
        if layer in step.side_inputs:  # the step left the side projections to the mixer
            normed, weight, first = step.side_inputs[layer]
            side = SideRows(normed, weight, first[b + "ssm_alpha.weight"],
                            first[b + "ssm_beta.weight"])  # fmt: skip
        else:
            alpha, beta = out[b + "ssm_alpha.weight"], out[b + "ssm_beta.weight"]
        gate = not step.gated_norm  # else the step's producer applies the gated norm
        if mode[0] == "prefill":
            if side is not None:
                alpha, beta = side.project(step.m, self.config.v_heads)
            g.prefill(qkv, z, alpha, beta, mode[1], mode[2], step.mixer_out[layer], gate)
        else:
            g.decode(qkv, z, alpha, beta, self.positions[: step.m], step.mixer_out[layer], side,
                     gate)  # fmt: skip

    def _run(self, step: DecodeStep, mode: tuple[Any, ...]) -> None:
        self._current, self._mode = step, mode
        step.run()

    # ---- ModelBackend -------------------------------------------------------------------------

    def prefill(self, prompts: list[list[int]]) -> Any:
        torch = require_torch()
        if len(prompts) > self.batch:
            raise ValueError(f"{len(prompts)} prompts for a model opened for {self.batch}")
        self._reset()
        last = [
            self._prompt(seq, ids, self.chunk, every_row=False) for seq, ids in enumerate(prompts)
        ]
        self._started([len(p) for p in prompts])
        return torch.stack(last)

    def extend(self, tokens: list[int]) -> Any:
        """The one sequence on with more prompt tokens from the positions it holds (its caches
        kept): the logits (1, V) of the last; sampling starts again from the seed (a new
        generation)."""
        if len(self.lengths) != 1 or not tokens:
            raise ValueError(f"extend: one sequence and at least one token ({len(self.lengths)} "
                             f"sequences, {len(tokens)} tokens)")  # fmt: skip
        start = self.lengths[0]
        if start + len(tokens) > self.context:
            raise ValueError(f"extend: {start} + {len(tokens)} positions do not fit the context "
                             f"of {self.context}")  # fmt: skip
        self._generator, self._mask = None, None
        last = self._prompt(0, tokens, self.chunk, every_row=False, offset=start)
        self._started([start + len(tokens)])
        return last[None]

    def score(self, tokens: list[int], chunk: int | None = None) -> Any:
        """Teacher-forced logits (T, V) float32 of one sequence from an empty cache, the prompt
        path in chunks of `chunk` tokens (default the model's)."""
        self._reset()
        rows = self._prompt(0, tokens, chunk or self.chunk, every_row=True)
        self._started([len(tokens)])
        return rows

    def _prompt(
        self, seq: int, ids: list[int], chunk: int, every_row: bool, offset: int = 0
    ) -> Any:
        """Sequence `seq`'s prompt through the model from position `offset` (the caches hold
        the positions before it), `chunk` tokens a step: the logits (float32) of every token,
        or of the last only."""
        torch = require_torch()
        rows = []
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk]
            step = self._step(len(piece), last_row=not every_row)
            step.ids.copy_(torch.tensor(piece, dtype=torch.int32))
            self._run(step, ("prefill", seq, offset + start))
            if every_row:
                rows.append(step.logits.float().clone())
        return torch.cat(rows) if every_row else step.logits[-1].float().clone()

    def _started(self, lengths: list[int]) -> None:
        """The sequences' lengths after their prompts: where their decode steps go on."""
        torch = require_torch()
        self.lengths = lengths
        self.positions[: len(lengths)] = torch.tensor(lengths, dtype=torch.int64)

    def decode(self, tokens: list[int]) -> Any:
        torch = require_torch()
        step = self._step(len(tokens))
        step.ids.copy_(torch.tensor(tokens, dtype=torch.int32))
        self._decode(step, greedy=False)
        return step.logits.float()

    def decode_sample(
        self, tokens: list[int] | None, params: SamplingParams
    ) -> Callable[[], list[int]]:
        """Start one decode step of every sequence and its sampling: tokens[b] is sequence b's
        next token, or None: the tokens the previous decode_sample chose, still on the device.
        Returns at once with a function that waits for this step's chosen tokens (pinned
        memory and an event, not a device synchronisation); call it before the decode_sample
        after the next one, which reuses its buffer."""
        torch = require_torch()
        b = len(self.lengths)
        step = self._step(b)
        if tokens is not None:
            if len(tokens) != b:
                raise ValueError(f"{len(tokens)} tokens for {b} sequences")
            step.ids.copy_(torch.tensor(tokens, dtype=torch.int32))
        greedy = params.argmax
        self._decode(step, greedy)
        if greedy:  # chosen, and written as the next step's input, by the step itself
            ids = self._chosen[:b]
        else:
            ids = self._choose(step.logits, params, None)
            step.ids.copy_(ids)  # the next step's input
        if not self._host_ids:
            self._host_ids = [
                torch.empty(self.batch, dtype=torch.int64, pin_memory=True) for _ in range(2)
            ]
        host = self._host_ids[self._turn][:b]
        self._turn = 1 - self._turn
        host.copy_(ids, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def chosen() -> list[int]:
            done.synchronize()
            return [int(t) for t in host.tolist()]

        return chosen

    def warm_up(self) -> None:
        """Pay the first-use costs now, as llama.cpp warms up at load: a prompt of a whole chunk
        and a few tokens more (Triton's compilation or its cache, flash-linear-attention's
        autotuning, the prompt steps' buffers), then a decode graph of the batch (the decode
        kernels' first runs, or the step eagerly where graphs are off); the caches are then
        emptied."""
        if self.context < 2:
            return
        n = max(1, min(self.chunk + 3, self.context - 2))
        self._reset()
        self._prompt(0, [0] * n, self.chunk, every_row=False)
        self._started([n] * self.batch)  # the other sequences' states: empty, as good here
        if self.use_graphs:
            self._graph(self.batch, _span(n, self.context), True, keep=False)
        else:
            self._decode(self._step(self.batch), True)
        self._reset()
        self.positions.zero_()
        self.lengths = []

    def warm(self, steps: int, params: SamplingParams | None = None) -> int:
        """Capture now the decode graphs the next `steps` steps of the current sequences will
        replay, for decode_sample with `params` (None: for decode), so that the timed steps of
        a generation or a benchmark capture none; returns how many were new (none where graphs
        are off)."""
        if not self.use_graphs:
            return 0
        b, n = len(self.lengths), max(self.lengths)
        greedy = params is not None and params.argmax
        last, span, new = _span(n + max(steps, 1) - 1, self.context), _span(n, self.context), 0
        while True:
            new += (b, span, greedy) not in self._graphs
            self._graph(b, span, greedy)
            if span >= last:
                return new
            span = _span(span, self.context)  # the next span: a step past this one's positions

    def _decode(self, step: DecodeStep, greedy: bool) -> None:
        """The step's ids through the model at the sequences' positions (its logits in
        step.logits), the positions moved on, and with `greedy` the argmax chosen into
        self._chosen and step.ids."""
        span = _span(max(self.lengths), self.context)
        if self.use_graphs:
            self._graph(step.m, span, greedy).replay()
        else:
            self._run(step, ("decode", span))
            self._advance(step, greedy)
        self.lengths = [n + 1 for n in self.lengths]

    def _advance(self, step: DecodeStep, greedy: bool) -> None:
        """After a decode step (in its graph): greedy's choice as the next input, the
        positions moved on (a finished sequence may run on in the batch: clamped)."""
        if self._advance_kernels is None:
            self._advance_torch(step, greedy)
            return
        b = step.m
        self._advance_kernels(step.logits[:b], self._chosen[:b], step.ids[:b],
                              self.positions[:b], self.context - 1, greedy)  # fmt: skip

    def _advance_torch(self, step: DecodeStep, greedy: bool) -> None:
        """_advance in torch (the reference of pyq2.runtime.advance_kernels)."""
        torch = require_torch()
        b = step.m
        if greedy:  # torch.argmax: the first of equal maxima, as sample_torch
            torch.argmax(step.logits, dim=1, out=self._chosen[:b])
            step.ids.copy_(self._chosen[:b])
        self.positions[:b] += 1
        self.positions[:b].clamp_(max=self.context - 1)

    def _reset(self) -> None:
        for a in self.attn.values():
            a.k.zero_(), a.v.zero_()
        for g in self.gdn.values():
            g.reset()
        self._generator, self._mask = None, None

    def _graph(self, b: int, span: int, greedy: bool, keep: bool = True) -> Any:
        """The CUDA graph of a decode step of b sequences reading `span` cache positions, with
        _advance(greedy) after it; the first one of b rows runs the step and _advance eagerly
        once (Triton autotuning, lazy allocations), on copies of the states that are put back
        before the capture unless not `keep` (the caller empties them; the span is no kernel's
        compile-time constant)."""
        torch = require_torch()
        key = (b, span, greedy)
        if key in self._graphs:
            return self._graphs[key]
        step = self._step(b)
        if not any(k[0] == b for k in self._graphs):
            live = [self.positions, self._chosen, step.ids]  # what the eager run writes
            if keep:
                live += [t for g in self.gdn.values() for t in (g.conv, g.state)]
                live += [t for a in self.attn.values() for t in (a.k, a.v)]
            saved = [t.clone() for t in live]
            self._run(step, ("decode", span))
            self._advance(step, True)
            self._advance(step, False)
            torch.cuda.synchronize()
            for t, old in zip(live, saved, strict=True):
                t.copy_(old)
            del live, saved
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                self._run(step, ("decode", span))
                self._advance(step, greedy)
        torch.cuda.current_stream().wait_stream(stream)
        self._graphs[key] = graph
        return graph

    def part(self, b: int, which: str) -> Callable[[], None]:
        """One part of a decode step of b sequences, at the attention span of its latest graph,
        to time alone: "weights" (embedding, producers, projections, and the side projections
        where the step runs them: steps of more than side_rows rows), "attention" or
        "recurrence" (every such layer's mixer)."""
        if which not in ("weights", "attention", "recurrence"):
            raise ValueError(f"part {which!r} is not weights, attention or recurrence")
        step = self._step(b)
        span = max((s for bb, s, _ in self._graphs if bb == b), default=_span(0, self.context))
        layers = list(self.attn if which == "attention" else self.gdn)

        def run() -> None:
            self._current, self._mode = step, ("decode", span)
            if which == "weights":  # as the step runs it: the side projections overlapping
                with self._without_mixers():
                    step.run()
            for i in layers if which != "weights" else ():
                self._mixer(i)

        return run

    @contextmanager
    def _without_mixers(self) -> Iterator[None]:
        self._no_mixers = True
        try:
            yield
        finally:
            self._no_mixers = False

    def sample(self, logits: Any, params: SamplingParams, history: list[list[int]]) -> list[int]:
        return [int(t) for t in self._choose(logits, params, history).tolist()]

    def _choose(self, logits: Any, params: SamplingParams, history: list[list[int]] | None) -> Any:
        """The chosen ids (B,) on the device. The repetition penalty's mask of seen tokens is
        made from `history` at the generation's first call (the prompts) and takes each call's
        chosen ids after it, on the device."""
        torch = require_torch()
        if self._generator is None:
            self._generator = params.torch_generator(self.device)
        mask = None
        if params.repetition_penalty != 1.0:
            if self._mask is None:
                if history is None:
                    raise ValueError("the first sampling of a generation needs its history")
                self._mask = make_history_mask(history, logits.shape[1], self.device)
            mask = self._mask
        ids = sample_torch(logits, params, mask, self._generator)
        if mask is not None:
            mask[torch.arange(ids.shape[0], device=self.device), ids] = True
        return ids


def _span(length: int, context: int) -> int:
    """The attention span of a decode step after `length` positions (the new one included):
    SPAN_STEP doubled until it holds length + 1 positions, at most the context."""
    span = SPAN_STEP
    while span < length + 1 and span < context:
        span *= 2
    return min(context, span)
