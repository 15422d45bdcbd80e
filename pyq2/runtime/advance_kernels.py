"""The tail of a decode step inside its graph, as two Triton kernels: greedy decoding's choice
(the first of equal maxima of every sequence's logits, torch.argmax's rule) written as the
chosen id and the next step's input, and every sequence's position moved on (clamped to the
context's last: a finished sequence may run on in the batch). The torch form of the same work
is GpuModel._advance_torch; tests compare the two. A NaN counts as the largest value (torch's
rule: the first NaN wins, as long as no +inf comes before it); a row of -inf gives index 0.

argmax_parts: program (part p, sequence b) reduces PARTS-th of the vocabulary to its maximum and
the first index holding it; advance: program b picks the first part holding the largest maximum
and moves the position on. Importing this module needs triton (pyq2.runtime.gpu_model imports it
only where the mixer kernels run).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ..lib.optional import require_torch

PARTS = 64  # programs per sequence in the first kernel
BLOCK = 4096  # logits a program reads per iteration


@triton.jit
def _argmax_parts(logits, s_l, V, CH, pmax, pidx, P: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    b = tl.program_id(1)
    start = p * CH
    best = tl.full((), float("-inf"), tl.float32)
    at = tl.minimum(start, V - 1)  # a part of -inf only (or past the vocabulary): its start
    for k0 in range(start, tl.minimum(start + CH, V), BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        x = tl.load(logits + b * s_l + k, mask=k < V, other=float("-inf")).to(tl.float32)
        x = tl.where(x == x, x, float("inf"))  # NaN: the largest
        m = tl.max(x, 0)
        i = tl.argmax(x, 0, tie_break_left=True) + k0
        take = m > best  # a later block's equal maximum is not the first
        at = tl.where(take, i, at)
        best = tl.where(take, m, best)
    tl.store(pmax + b * P + p, best)
    tl.store(pidx + b * P + p, at)


@triton.jit
def _advance(pmax, pidx, chosen, ids, positions, last, GREEDY: tl.constexpr, P: tl.constexpr):
    b = tl.program_id(0)
    if GREEDY:
        q = tl.arange(0, P)
        first = tl.argmax(tl.load(pmax + b * P + q), 0, tie_break_left=True)
        i = tl.sum(tl.where(q == first, tl.load(pidx + b * P + q), 0), 0)
        tl.store(chosen + b, i.to(tl.int64))
        tl.store(ids + b, i.to(tl.int32))
    pos = tl.load(positions + b)
    tl.store(positions + b, tl.minimum(pos + 1, last))


class Advance:
    """The two kernels' scratch for steps of up to `batch` sequences."""

    def __init__(self, batch: int, device: Any):
        torch = require_torch()
        self.pmax = torch.empty(batch, PARTS, dtype=torch.float32, device=device)
        self.pidx = torch.empty(batch, PARTS, dtype=torch.int32, device=device)

    def __call__(self, logits: Any, chosen: Any, ids: Any, positions: Any, last: int,
                 greedy: bool) -> None:  # fmt: skip
        """Rows b < B = logits.shape[0]: with `greedy` chosen[b] (int64) and ids[b] (int32) =
        the first index of row b's maximum; positions[b] = min(positions[b] + 1, last)."""
        b, v = logits.shape
        if b > self.pmax.shape[0] or logits.stride(1) != 1:
            raise ValueError(f"logits {tuple(logits.shape)}: at most {self.pmax.shape[0]} "
                             "rows of unit stride")  # fmt: skip
        if greedy:
            part = -(-v // PARTS)
            ch = -(-part // BLOCK) * BLOCK  # a part: whole blocks
            _argmax_parts[(PARTS, b)](logits, logits.stride(0), v, ch, self.pmax, self.pidx,
                                      P=PARTS, BLOCK=BLOCK, num_warps=8)  # fmt: skip
        _advance[(b,)](self.pmax, self.pidx, chosen, ids, positions, last, GREEDY=greedy,
                       P=PARTS, num_warps=1)  # fmt: skip
