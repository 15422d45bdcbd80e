"""The projection shapes of a Ternary-Bonsai-2-27B decode step (no GPU or torch needed): N, K,
calls per step, PQ2_0 bytes (6.80 GB per token in all)."""

from __future__ import annotations

from pyq2.formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS

SHAPES = {  # name: (N, K, calls per decode step)
    "gate_up": (34816, 5120, 64),
    "down": (5120, 17408, 64),
    "in_proj": (16384, 5120, 48),
    "qkv": (14336, 5120, 16),
    "out": (5120, 6144, 64),
    "lm_head": (248320, 5120, 1),
}


def pq2_bytes(n, k):
    """PQ2_0 bytes of an n x k matrix: 34 bytes per 128 weights."""
    return n * (k // PQ2_BLOCK_WEIGHTS) * PQ2_BLOCK_BYTES
