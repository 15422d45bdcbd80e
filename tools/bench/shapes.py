"""The projection shapes of a Ternary-Bonsai-2-27B decode step (no GPU or torch needed): N, K,
calls per step, PQ2_0 bytes (6.80 GB per token in all).

Derived from the 27B's sizes (pyq2.plan.decode.PRESETS) and its decode plan, with the siblings that
read one activation fused into one matrix, as pyq2.runtime.step runs them: per Gated-DeltaNet layer
in_proj (attn_qkv + attn_gate), per attention layer qkv (attn_q + attn_k + attn_v), per layer
out (ssm_out or attn_output), gate_up and down, and the head's lm_head.
"""

from __future__ import annotations

from pyq2.plan.decode import PRESETS, decode_plan
from pyq2.spec.formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS

ORDER = ("gate_up", "down", "in_proj", "qkv", "out", "lm_head")


def _shapes(preset: str = "bonsai-2-27b") -> dict[str, tuple[int, int, int]]:
    dims = PRESETS[preset]
    ne = {name: shape for name, _, shape in dims.tensors()}
    plan = decode_plan(list(ne), dims.keys())
    found: dict[str, tuple[int, int, int]] = {}
    for s in plan.stages:
        k = ne[s.projections[0]][0]
        n = sum(ne[p][1] for p in s.projections)
        first = s.projections[0].split(".")[-2]
        role = {
            "attn_qkv": "in_proj",
            "attn_q": "qkv",
            "ssm_out": "out",
            "attn_output": "out",
            "ffn_gate": "gate_up",
            "ffn_down": "down",
            "output": "lm_head",
        }[first]
        prev = found.get(role, (n, k, 0))
        assert prev[:2] == (n, k), f"{role}: {prev[:2]} and {(n, k)}"
        found[role] = (n, k, prev[2] + 1)
    return {name: found[name] for name in ORDER}


SHAPES = _shapes()  # name: (N, K, calls per decode step)


def pq2_bytes(n, k):
    """PQ2_0 bytes of an n x k matrix: 34 bytes per 128 weights."""
    return n * (k // PQ2_BLOCK_WEIGHTS) * PQ2_BLOCK_BYTES
