"""LAB (issue 35, batch 16; not product): attention decode as a persistent grid. Each program
walks work items (chunk c, KV head, sequence b) = item, item + NPROG, ... and prefetches the next
item's cached keys and values into L2 before it computes the current one, so the memory never
waits for a new wave of programs. Same arithmetic, partial sums and merge as
mixer_kernels.attention_decode (its second kernel is reused as is).

    from lab.attn.persist import attention_decode_persist  (same arguments as attention_decode)
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from pyq2.runtime import mixer_kernels as mk
from pyq2.runtime.mixer_kernels import _attention_merge, _dependent, _norm_rope, _prefetch_l2

PER_SM = 1  # programs per multiprocessor
STORE_FIRST = False  # read the new key and value back from the cache


@triton.jit
def _prefetch_item(k_cache, v_cache, positions, item, chunks, s_cb, s_ch, s_cs,
                   HKV: tl.constexpr, BS: tl.constexpr, TILES: tl.constexpr,
                   LINE: tl.constexpr, LINES: tl.constexpr):  # fmt: skip
    c = item % chunks
    rest = item // chunks
    kvh = rest % HKV
    b = rest // HKV
    pos = tl.load(positions + b)
    base = c * (TILES * BS)
    last = tl.maximum(pos - 1, 0)
    for t in tl.static_range(TILES):
        rows = tl.minimum(base + t * BS + tl.arange(0, BS), last)
        lines = (b * s_cb + kvh * s_ch + rows[:, None] * s_cs
                 + tl.arange(0, LINES)[None, :] * LINE)  # fmt: skip
        _prefetch_l2(k_cache + lines)
        _prefetch_l2(v_cache + lines)


@triton.jit
def _attention_partial_persist(
    q_gate, k_in, v_in, k_cache, v_cache, positions, q_norm, k_norm, cos, sin,
    m_out, l_out, acc_out,
    s_qg, s_k, s_v, s_cb, s_ch, s_cs, n_chunks, scale, eps, chunks, n_items, nprog,
    H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
    HALF: tl.constexpr, NROT: tl.constexpr, BS: tl.constexpr, TILES: tl.constexpr,
    PDL: tl.constexpr, LINE: tl.constexpr, LINES: tl.constexpr, STORE_FIRST: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    _prefetch_item(k_cache, v_cache, positions, pid, chunks, s_cb, s_ch, s_cs, HKV, BS, TILES,
                   LINE, LINES)  # fmt: skip
    _dependent(PDL)
    d = tl.arange(0, D)
    g = tl.arange(0, BG)
    for item in range(pid, n_items, nprog):
        nxt = item + nprog
        if nxt < n_items:
            _prefetch_item(k_cache, v_cache, positions, nxt, chunks, s_cb, s_ch, s_cs, HKV, BS,
                           TILES, LINE, LINES)  # fmt: skip
        c = item % chunks
        rest = item // chunks
        kvh = rest % HKV
        b = rest // HKV
        base = c * (TILES * BS)
        pos = tl.load(positions + b)
        if base <= pos:
            heads = kvh * G + tl.minimum(g, G - 1)
            cos_row = cos + pos * HALF
            sin_row = sin + pos * HALF
            q_ptr = q_gate + b * s_qg + heads[:, None] * (2 * D) + d[None, :]
            q = _norm_rope(q_ptr, d[None, :], q_norm, cos_row, sin_row, eps, D, HALF, NROT)
            k_new = _norm_rope(k_in + b * s_k + kvh * D + d, d, k_norm, cos_row, sin_row, eps,
                                  D, HALF, NROT)  # fmt: skip
            v_new = tl.load(v_in + b * s_v + kvh * D + d).to(tl.float32)
            cache = b * s_cb + kvh * s_ch
            owner = (pos >= base) & (pos < base + TILES * BS)
            dt = k_cache.dtype.element_ty
            k_new = k_new.to(dt)
            v_new = v_new.to(dt)
            tl.store(k_cache + cache + pos * s_cs + d, k_new, mask=owner & (d < D))
            tl.store(v_cache + cache + pos * s_cs + d, v_new, mask=owner & (d < D))
            if STORE_FIRST:  # the new key and value are read back from the cache (same bits)
                tl.debug_barrier()
            qd = q.to(dt)
            m_run = tl.full((BG,), float("-inf"), tl.float32)
            l_run = tl.zeros((BG,), tl.float32)
            acc = tl.zeros((BG, D), tl.float32)
            n_tiles = tl.minimum((pos - base) // BS + 1, TILES)
            for t in range(n_tiles):
                offs = base + t * BS + tl.arange(0, BS)
                old = (offs < pos)[:, None]
                at = (offs == pos)[:, None]
                tile = cache + offs[:, None] * s_cs + d[None, :]
                if STORE_FIRST:
                    upto = (offs <= pos)[:, None]
                    keys = tl.load(k_cache + tile, mask=upto, other=0.0)
                    values = tl.load(v_cache + tile, mask=upto, other=0.0)
                else:
                    keys = tl.where(at, k_new[None, :],
                                    tl.load(k_cache + tile, mask=old, other=0.0))  # fmt: skip
                    values = tl.where(at, v_new[None, :],
                                      tl.load(v_cache + tile, mask=old, other=0.0))  # fmt: skip
                scores = tl.dot(qd, tl.trans(keys), input_precision="ieee") * scale
                scores = tl.where((offs <= pos)[None, :], scores, float("-inf"))
                m_new = tl.maximum(m_run, tl.max(scores, 1))
                carry = tl.exp(m_run - m_new)
                p = tl.exp(scores - m_new[:, None])
                l_run = l_run * carry + tl.sum(p, 1)
                acc = acc * carry[:, None] + tl.dot(p.to(dt), values, input_precision="ieee")
                m_run = m_new
            valid = g < G
            slot = (b * H + kvh * G + g) * n_chunks + c
            tl.store(m_out + slot, m_run, mask=valid)
            tl.store(l_out + slot, l_run, mask=valid)
            tl.store(acc_out + slot[:, None] * D + d[None, :], acc, mask=valid[:, None])


def attention_decode_persist(q_gate: Any, k: Any, v: Any, k_cache: Any, v_cache: Any,
                             positions: Any, span: int, q_norm: Any, k_norm: Any, rope: Any,
                             scratch: Any, out: Any, dims: Any, scale: float) -> None:  # fmt: skip
    b, d = q_gate.shape[0], dims
    group = d.n_head // d.n_head_kv
    chunk, tiles = mk.attention_chunk(b), mk.attention_tiles(b)
    chunks = -(-span // (chunk * tiles))
    if chunks > scratch.n_chunks:
        raise ValueError(f"span {span} is more than the scratch's context")
    p = mk.pdl(q_gate.device.index)
    line = 128 // k_cache.element_size()
    merge = max(1, min(mk.MERGE_SPAN // (chunk * tiles), mk.MERGE_TILE // d.head_dim))
    merge = 1 << (merge.bit_length() - 1)
    tile_bytes = 2 * chunk * d.head_dim * k_cache.element_size()
    stages = 1 if tiles == 1 else max(1, min(3, mk.STAGE_BYTES // tile_bytes))
    n_items = chunks * d.n_head_kv * b
    nprog = min(n_items, mk._sm_count(q_gate.device.index) * PER_SM)
    _attention_partial_persist[(nprog,)](
        q_gate, k, v, k_cache, v_cache, positions, q_norm, k_norm, rope.cos, rope.sin,
        scratch.m, scratch.l, scratch.acc,
        q_gate.stride(0), k.stride(0), v.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scratch.n_chunks, scale, d.eps,
        chunks, n_items, nprog,
        H=d.n_head, HKV=d.n_head_kv, G=group, BG=max(16, triton.next_power_of_2(group)),
        D=d.head_dim, HALF=rope.half, NROT=rope.n_rot, BS=chunk, TILES=tiles, PDL=p, LINE=line,
        LINES=max(1, d.head_dim // line), STORE_FIRST=STORE_FIRST, num_warps=mk.ATTENTION_WARPS,
        num_stages=stages, launch_pdl=p,
    )  # fmt: skip
    _attention_merge[(d.n_head, b)](
        q_gate, positions, scratch.m, scratch.l, scratch.acc, out, q_gate.stride(0),
        out.stride(0), scratch.n_chunks, H=d.n_head, D=d.head_dim, BS=chunk * tiles, BC=merge,
        PDL=p, num_warps=4, launch_pdl=p,
    )  # fmt: skip
