"""The mixers' elementwise work as Triton kernels, for a decode step and for a prompt, reading
the projections' outputs (strided column views of a fused output are fine) and writing the
mixer output in place.

The arithmetic is pyq2.runtime.mixers' (its torch forms are the reference these kernels are
tested against); what the kernels add is that a layer's many small operations become one pass
over its state, written back where it was read:

- gdn_decode: program (V head h, a slice of its value columns, sequence b) runs the causal
  convolution of h's q and k channels and of its value columns from the rolling window, SiLU,
  the L2 norms, the decay and beta, and the gated delta rule on its columns of the (d_k, d_v)
  float32 state of (b, h), in registers; a second kernel applies the gated RMSNorm with silu(z)
  per head (it needs every column of the head), unless the caller does (DecodeStep's gated_norm
  producer). For steps of up to SIDE_ROWS sequences the program also computes the head's alpha
  and beta from the un-rotated normed row and the side weights (SideRows), which it loads before
  its wait: no side projection kernel and no second stream. The window is a ring of conv_kernel
  slots indexed by position (mixers.GatedDeltaNet): the token at position p reads the slots of
  p - K + 1 .. p - 1 and writes slot p % K, which no program of the same step reads, so the
  programs that share a K head's channels need no ordering.
- attention_decode: program (chunk c, KV head, sequence b) normalises and rotates the group's
  queries and the new key, stores the new key and value in the cache (the program whose chunk
  holds the position), and attends to the chunk's positions (flash-decoding), a tile of
  attention_chunk positions at a time with a running softmax over attention_tiles tiles, in
  attention_warps warps (each set apart for steps of one sequence and of several); a second
  kernel merges the chunks' partial softmax sums per query head and multiplies by
  sigmoid(gate). Steps of STREAM_MIN_BATCH sequences or more with a bf16 cache (streams())
  attend through libpq2's kernel instead (pq2_attention_decode_cuda: blocks of STREAM_CHUNK
  positions streamed through a cp.async pipeline, four warps of tensor-core tiles): a Triton
  program per KV head and sequence first normalises and rotates the queries into the scratch
  and stores the new key and value; the same merge follows.
- A prompt piece of one sequence: gdn_prompt_conv (the convolution over the piece and the ring's
  rows before it, SiLU, the L2 norms, q and k tiled to the V heads: the inputs of
  flash-linear-attention's chunked rule) and gdn_gated_norm after it; attention_prompt (q and k
  normalised and rotated, k and v into the cache) before scaled_dot_product_attention.

On compute capability 9.0 and newer the decode kernels launch with programmatic dependent
launch (pdl()): a kernel's programs start while the kernel before it finishes, wait for it
(griddepcontrol.wait) before they read anything it or an earlier kernel wrote, then let the next
kernel launch. Two do work before their wait, on what no kernel of the same step writes before
them: gdn_decode loads the recurrent state (small grids) and the side projections' weight rows,
and attention_decode prefetches its chunk's cached keys and values into L2, and returns at once
where its chunk starts past the sequence's position (read before the wait: the positions move
only in the step's last kernels, pyq2.runtime.advance_kernels).

Importing this module needs triton; pyq2.runtime.mixers imports it only on CUDA.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import triton
import triton.language as tl

from ..errors import LibraryError
from ..lib import cuda as gpu
from ..lib import native
from ..lib.optional import require_torch

CHUNK = 128  # cache positions per tile of an attention decode program
CHUNK_ONE = 128  # ... in a step of one sequence
ATTENTION_TILES = 2  # tiles per attention decode program (online softmax across them)
ATTENTION_TILES_ONE = 1  # ... in a step of one sequence
ATTENTION_WARPS = 8  # warps per attention decode program
ATTENTION_WARPS_ONE = 8  # ... in a step of one sequence
GDN_BV = 64  # state columns per Gated-DeltaNet program
GDN_BV_ONE = 16  # ... in a step of one sequence
GDN_WARPS = 2
EARLY_STATE = 3  # gdn_decode loads the state first up to this many programs per multiprocessor
SIDE_ROWS = 8  # gdn_decode computes the side projections itself for steps of so many sequences
SIDE_WIDTH = 8192  # ... and normed rows of at most so many elements
STREAM_CHUNK = 256  # cache positions per block of libpq2's attention decode kernel
STREAM_MIN_BATCH = 2  # steps of at least so many sequences attend through it (bf16 caches)
MERGE_SPAN = 4096  # cache positions the second attention kernel merges per iteration
MERGE_TILE = 16384  # ... and at most so many partial sums (chunks x head_dim)
STAGE_BYTES = 160 * 1024  # shared memory for the keys and values in flight of a decode program


@functools.cache
def pdl(device_index: int) -> bool:
    """Whether the decode kernels launch with programmatic dependent launch (compute capability
    9.0 and newer, unless PYQ2_PDL=0): each waits for the kernel before it (griddepcontrol.wait)
    and lets the next one launch early, so that kernel launches overlap the work before them."""
    if os.environ.get("PYQ2_PDL", "1") == "0":
        return False
    return require_torch().cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def _sm_count(device_index: int) -> int:
    return require_torch().cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _dependent(PDL: tl.constexpr):
    """A decode kernel's start under PDL: wait until the kernel before it has finished and its
    writes are visible, then let the next kernel launch (it waits the same way)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def tileable(width: int) -> bool:
    """Whether these kernels tile a head of this width: a power of two, 16 or more (tl.arange
    and tl.dot sizes)."""
    return width >= 16 and not width & (width - 1)


@triton.jit
def _softplus(x):
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _conv_silu(qkv_row, ring_row, conv_w, ch, mask, pos, C: tl.constexpr, K: tl.constexpr):
    """SiLU of the causal convolution of channels ch at position pos: the new input times the
    last tap, the ring's slots of the K - 1 positions before it times the others."""
    x = tl.load(qkv_row + ch, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.load(conv_w + ch * K + (K - 1), mask=mask, other=0.0)
    for j in tl.static_range(K - 1):
        slot = (pos + 1 + j) % K  # position pos - (K - 1) + j, modulo K
        w = tl.load(conv_w + ch * K + j, mask=mask, other=0.0)
        y += w * tl.load(ring_row + slot * C + ch, mask=mask, other=0.0)
    return x, y * tl.sigmoid(y)


@triton.jit
def _gdn_decode(
    qkv, alpha, beta, ring, state, o_out, positions, conv_w, a_ptr, dt_bias,
    normed, side_w, s_qkv, s_alpha, s_beta, s_normed, s_side, alpha_row, beta_row, scale,
    C: tl.constexpr, K: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr,
    EARLY: tl.constexpr, SIDE: tl.constexpr, W: tl.constexpr, W1: tl.constexpr,
    W2: tl.constexpr,
):  # fmt: skip
    NV: tl.constexpr = DV // BV
    h = tl.program_id(0) // NV
    vb = tl.program_id(0) % NV
    b = tl.program_id(1)
    kh = h % HK  # the file's tiled order: V head h reads K head h % HK
    dk = tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    mk = dk < DK
    tile = ((b * HV + h) * DK + dk[:, None]) * DV + dv[None, :]
    if SIDE:  # the side rows of head h are weights: loaded before the wait
        c1 = tl.arange(0, W1)
        c2 = W1 + tl.arange(0, W2)
        m2 = c2 < W
        wa = side_w + (alpha_row + h) * s_side
        wb = side_w + (beta_row + h) * s_side
        wa1 = tl.load(wa + c1, eviction_policy="evict_first")
        wa2 = tl.load(wa + c2, mask=m2, other=0.0, eviction_policy="evict_first")
        wb1 = tl.load(wb + c1, eviction_policy="evict_first")
        wb2 = tl.load(wb + c2, mask=m2, other=0.0, eviction_policy="evict_first")
    if EARLY:  # the state first (only this kernel writes it, in an earlier step): its latency
        # overlaps the wait for the kernel before; a large grid keeps the registers instead
        s = tl.load(state + tile, mask=mk[:, None], other=0.0)
    _dependent(PDL)
    pos = tl.load(positions + b)
    row = qkv + b * s_qkv
    ring_row = ring + b * K * C
    cq = kh * DK + dk
    ck = HK * DK + kh * DK + dk
    cv = 2 * HK * DK + h * DV + dv
    if SIDE:  # alpha and beta of (b, h): the un-rotated normed row times the side rows
        xr = normed + b * s_normed
        x1 = tl.load(xr + c1).to(tl.float32)
        x2 = tl.load(xr + c2, mask=m2, other=0.0).to(tl.float32)
        x_a = tl.sum(x1 * wa1.to(tl.float32), 0) + tl.sum(x2 * wa2.to(tl.float32), 0)
        x_b = tl.sum(x1 * wb1.to(tl.float32), 0) + tl.sum(x2 * wb2.to(tl.float32), 0)
    else:
        x_a = tl.load(alpha + b * s_alpha + h).to(tl.float32)
        x_b = tl.load(beta + b * s_beta + h).to(tl.float32)
    xq, q = _conv_silu(row, ring_row, conv_w, cq, mk, pos, C, K)
    xk, k = _conv_silu(row, ring_row, conv_w, ck, mk, pos, C, K)
    xv, v = _conv_silu(row, ring_row, conv_w, cv, dv < DV, pos, C, K)
    slot = ring_row + (pos % K) * C
    tl.store(slot + cv, xv)
    first = (h < HK) & (vb == 0)  # one writer for a K head's channels
    tl.store(slot + cq, xq, mask=mk & first)
    tl.store(slot + ck, xk, mask=mk & first)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    decay = tl.exp(tl.load(a_ptr + h) * _softplus(x_a + tl.load(dt_bias + h)))
    bt = tl.sigmoid(x_b)
    if not EARLY:
        s = tl.load(state + tile, mask=mk[:, None], other=0.0)
    s = s * decay
    delta = (v - tl.sum(k[:, None] * s, 0)) * bt
    s += k[:, None] * delta[None, :]
    tl.store(state + tile, s, mask=mk[:, None])
    tl.store(o_out + (b * HV + h) * DV + dv, tl.sum(q[:, None] * s, 0))


@triton.jit
def _gdn_norm(o_in, z, norm_w, out, s_z, s_out, eps, HV: tl.constexpr, DV: tl.constexpr,
              PDL: tl.constexpr):  # fmt: skip
    """The gated RMSNorm of one V head's output: rmsnorm(o) * norm_w * silu(z)."""
    _dependent(PDL)
    h = tl.program_id(0)
    b = tl.program_id(1)
    dv = tl.arange(0, DV)
    o = tl.load(o_in + (b * HV + h) * DV + dv)
    o = o * tl.rsqrt(tl.sum(o * o, 0) / DV + eps) * tl.load(norm_w + dv)
    zz = tl.load(z + b * s_z + h * DV + dv).to(tl.float32)
    tl.store(out + b * s_out + h * DV + dv, o * zz * tl.sigmoid(zz))


@triton.jit
def _norm_rope(ptr, d, norm_w, cos_row, sin_row, eps, D: tl.constexpr, HALF: tl.constexpr,
               NROT: tl.constexpr):  # fmt: skip
    """RMSNorm (times norm_w) and NEOX rotary embedding of the heads whose dim d is at ptr (d
    along the last axis): the partner of dim i < HALF is i + HALF, and back."""
    x = tl.load(ptr).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, -1, keep_dims=True) / D + eps)
    partner = tl.where(d < HALF, d + HALF, tl.where(d < NROT, d - HALF, d))
    xp = tl.load(ptr - d + partner).to(tl.float32)
    xn = x * inv * tl.load(norm_w + d)
    xpn = xp * inv * tl.load(norm_w + partner)
    rotated = d < NROT
    pair = tl.where(rotated, d % HALF, 0)
    c = tl.where(rotated, tl.load(cos_row + pair), 1.0)
    s = tl.where(rotated, tl.load(sin_row + pair), 0.0)
    sign = tl.where(d < HALF, -1.0, 1.0)
    return xn * c + sign * xpn * s


@triton.jit
def _step_qkv(q_gate, k_in, v_in, b, kvh, heads, d, s_qg, s_k, s_v, q_norm, k_norm, cos_row,
              sin_row, eps, D: tl.constexpr, HALF: tl.constexpr, NROT: tl.constexpr):  # fmt: skip
    """Sequence b's step inputs of KV head kvh in float32: the queries of `heads` normed and rotated
    [len(heads), D], the new key normed and rotated and the new value [D]."""
    q = _norm_rope(q_gate + b * s_qg + heads[:, None] * (2 * D) + d[None, :], d[None, :], q_norm,
                   cos_row, sin_row, eps, D, HALF, NROT)  # fmt: skip
    k_new = _norm_rope(k_in + b * s_k + kvh * D + d, d, k_norm, cos_row, sin_row, eps, D, HALF,
                       NROT)  # fmt: skip
    v_new = tl.load(v_in + b * s_v + kvh * D + d).to(tl.float32)
    return q, k_new, v_new


@triton.jit
def _prefetch_l2(ptr):
    """Each pointer's line into L2 (no registers held)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr],
                              dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _attention_partial(
    q_gate, k_in, v_in, k_cache, v_cache, positions, q_norm, k_norm, cos, sin,
    m_out, l_out, acc_out,
    s_qg, s_k, s_v, s_cb, s_ch, s_cs, n_chunks, scale, eps,
    H: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
    HALF: tl.constexpr, NROT: tl.constexpr, BS: tl.constexpr, TILES: tl.constexpr,
    PDL: tl.constexpr, LINE: tl.constexpr, LINES: tl.constexpr,
):  # fmt: skip
    # program c covers the TILES tiles of BS positions from c * TILES * BS; a chunk past the row's
    # position holds nothing it attends to: a graph at a longer span than a step needs pays only
    # these programs' start
    base = tl.program_id(0) * (TILES * BS)
    pos = tl.load(positions + tl.program_id(2))
    if base > pos:
        return
    # the chunk's cached keys and values (LINES lines of LINE elements a row, up to the
    # position) into L2 while the kernel before runs: no kernel of the step writes them before
    # this one
    last = tl.maximum(pos - 1, 0)
    for t in tl.static_range(TILES):
        rows = tl.minimum(base + t * BS + tl.arange(0, BS), last)
        lines = (tl.program_id(2) * s_cb + tl.program_id(1) * s_ch + rows[:, None] * s_cs
                 + tl.arange(0, LINES)[None, :] * LINE)  # fmt: skip
        _prefetch_l2(k_cache + lines)
        _prefetch_l2(v_cache + lines)
    _dependent(PDL)
    c = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    d = tl.arange(0, D)
    g = tl.arange(0, BG)
    heads = kvh * G + tl.minimum(g, G - 1)  # rows past the group repeat its last head
    cos_row = cos + pos * HALF
    sin_row = sin + pos * HALF
    q, k_new, v_new = _step_qkv(q_gate, k_in, v_in, b, kvh, heads, d, s_qg, s_k, s_v, q_norm,
                                k_norm, cos_row, sin_row, eps, D, HALF, NROT)  # fmt: skip
    cache = b * s_cb + kvh * s_ch
    owner = (pos >= base) & (pos < base + TILES * BS)
    dt = k_cache.dtype.element_ty
    k_new = k_new.to(dt)
    v_new = v_new.to(dt)
    tl.store(k_cache + cache + pos * s_cs + d, k_new, mask=owner & (d < D))
    tl.store(v_cache + cache + pos * s_cs + d, v_new, mask=owner & (d < D))
    qd = q.to(dt)
    m_run = tl.full((BG,), float("-inf"), tl.float32)
    l_run = tl.zeros((BG,), tl.float32)
    acc = tl.zeros((BG, D), tl.float32)
    # the tiles that hold positions up to pos (the first one always does)
    n_tiles = tl.minimum((pos - base) // BS + 1, TILES)
    for t in range(n_tiles):
        offs = base + t * BS + tl.arange(0, BS)
        old = (offs < pos)[:, None]
        at = (offs == pos)[:, None]
        tile = cache + offs[:, None] * s_cs + d[None, :]
        keys = tl.where(at, k_new[None, :], tl.load(k_cache + tile, mask=old, other=0.0))
        values = tl.where(at, v_new[None, :], tl.load(v_cache + tile, mask=old, other=0.0))
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


@triton.jit
def _attention_merge(
    q_gate, positions, m_in, l_in, acc_in, out, s_qg, s_out, n_chunks,
    H: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _dependent(PDL)
    h = tl.program_id(0)
    b = tl.program_id(1)
    n = tl.load(positions + b) // BS + 1  # the chunks that hold positions 0 .. pos
    d = tl.arange(0, D)
    base = (b * H + h) * n_chunks
    m_run = tl.full((), float("-inf"), tl.float32)
    l_run = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for first in range(0, n, BC):
        cc = first + tl.arange(0, BC)
        live = cc < n
        m = tl.load(m_in + base + cc, mask=live, other=float("-inf"))
        m_new = tl.maximum(m_run, tl.max(m, 0))
        w = tl.where(live, tl.exp(m - m_new), 0.0)
        carry = tl.exp(m_run - m_new)
        l_run = l_run * carry + tl.sum(w * tl.load(l_in + base + cc, mask=live, other=0.0), 0)
        part = tl.load(acc_in + (base + cc)[:, None] * D + d[None, :], mask=live[:, None],
                       other=0.0)  # fmt: skip
        acc = acc * carry + tl.sum(w[:, None] * part, 0)
        m_run = m_new
    gate = tl.load(q_gate + b * s_qg + h * 2 * D + D + d).to(tl.float32)
    tl.store(out + b * s_out + h * D + d, acc / l_run * tl.sigmoid(gate))


@triton.jit
def _attention_prep(
    q_gate, k_in, v_in, k_cache, v_cache, positions, q_norm, k_norm, cos, sin, q_out,
    s_qg, s_k, s_v, s_cb, s_ch, s_cs, eps,
    H: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
    NROT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Program (KV head, sequence) of a step that attends through libpq2's kernel: the group's
    queries normed and rotated into q_out [B, H, D], the new key normed and rotated and the new
    value into the cache at the sequence's position (_step_qkv, as _attention_partial)."""
    _dependent(PDL)
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    d = tl.arange(0, D)
    g = tl.arange(0, BG)
    pos = tl.load(positions + b)
    heads = kvh * G + tl.minimum(g, G - 1)
    cos_row = cos + pos * HALF
    sin_row = sin + pos * HALF
    q, k_new, v_new = _step_qkv(q_gate, k_in, v_in, b, kvh, heads, d, s_qg, s_k, s_v, q_norm,
                                k_norm, cos_row, sin_row, eps, D, HALF, NROT)  # fmt: skip
    dt = k_cache.dtype.element_ty
    tl.store(q_out + (b * H + heads[:, None]) * D + d[None, :], q.to(dt), mask=(g < G)[:, None])
    cache = b * s_cb + kvh * s_ch + pos * s_cs
    tl.store(k_cache + cache + d, k_new.to(dt))
    tl.store(v_cache + cache + d, v_new.to(dt))


def gdn_decode(qkv: Any, z: Any, alpha: Any, beta: Any, ring: Any, state: Any, o: Any,
               out: Any, positions: Any, conv_w: Any, a: Any, dt_bias: Any, norm: Any,
               dims: Any, scale: float, side: Any = None, gate: bool = True) -> None:  # fmt: skip
    """One token of each of B = qkv.shape[0] sequences through a Gated-DeltaNet layer: ring
    (B', K, C) and state (B', HV, DK, DV) float32 updated in place for rows < B, o (B', HV, DV)
    float32 scratch, out (B, HV*DV) the gated output. dims: mixers.Dims.

    With `side` (mixers.SideRows, side_fits) the kernel computes alpha and beta itself from the
    un-rotated normed rows and the side weights (alpha and beta are then not read). Without
    `gate`, out (contiguous float32) gets the output before the gated norm (o is not used): the
    caller applies the norm (DecodeStep with gated_norm)."""
    b, d = qkv.shape[0], dims
    _check(out, qkv, z)
    if side is None:
        _check(alpha, beta)
    elif not side_fits(side, b, d.v_heads):
        raise ValueError("side rows the kernel cannot read (side_fits)")
    if not (ring.is_contiguous() and state.is_contiguous() and o.is_contiguous()):
        raise ValueError("the conv ring, the recurrent state and o must be contiguous")
    if not gate and not (out.is_contiguous() and out.dtype == require_torch().float32):
        raise ValueError("the output before the gated norm must be contiguous float32")
    if not tileable(d.v_dim):
        raise ValueError(f"value head width {d.v_dim} is not a power of two of at least 16")
    bv = min(d.v_dim, GDN_BV_ONE if b == 1 else GDN_BV)
    p = pdl(qkv.device.index)
    programs = d.v_heads * (d.v_dim // bv) * b
    early = programs <= EARLY_STATE * _sm_count(qkv.device.index)
    if side is None:  # (the side arguments unread)
        normed, side_w, rows, width = qkv, qkv, (0, 0), 16
    else:  # (alpha and beta unread)
        normed, side_w, rows, width = (
            side.normed,
            side.weight,
            (side.alpha_row, side.beta_row),
            side.normed.shape[1],
        )
        alpha = beta = qkv
    w1 = 1 << (width.bit_length() - 1)  # the largest power of two in the width, and the rest
    w2 = max(16, triton.next_power_of_2(width - w1))
    _gdn_decode[(d.v_heads * (d.v_dim // bv), b)](
        qkv, alpha, beta, ring, state, o if gate else out, positions, conv_w, a, dt_bias,
        normed, side_w, qkv.stride(0), alpha.stride(0), beta.stride(0), normed.stride(0),
        side_w.stride(0), *rows, scale,
        C=ring.shape[2], K=d.conv_kernel, HK=d.k_heads, HV=d.v_heads, DK=d.k_dim, DV=d.v_dim,
        BK=triton.next_power_of_2(d.k_dim), BV=bv, PDL=p, EARLY=early, SIDE=side is not None,
        W=width, W1=w1, W2=w2, num_warps=GDN_WARPS, launch_pdl=p,
    )  # fmt: skip
    if gate:
        _gdn_norm[(d.v_heads, b)](
            o, z, norm, out, z.stride(0), out.stride(0), d.eps, HV=d.v_heads, DV=d.v_dim,
            PDL=p, num_warps=1, launch_pdl=p,
        )  # fmt: skip


def side_fits(side: Any, rows: int, heads: int) -> bool:
    """Whether gdn_decode reads these side rows itself: a step of at most SIDE_ROWS sequences,
    a normed width of 16..SIDE_WIDTH (the program holds its head's two weight rows), each of
    the two row ranges inside the weights, rows with unit stride, one device."""
    w, x = side.weight, side.normed
    return (
        rows <= SIDE_ROWS
        and 16 <= x.shape[1] <= SIDE_WIDTH
        and x.shape[0] >= rows
        and w.shape[1] == x.shape[1]
        and 0 <= side.alpha_row <= w.shape[0] - heads
        and 0 <= side.beta_row <= w.shape[0] - heads
        and x.stride(-1) == 1
        and w.stride(-1) == 1
        and w.device == x.device
    )


@triton.jit
def _store_tiled(dst, y, t, w, kh, rows, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr):
    """L2-normalised rows of K head kh into every V head that reads it (h % HK == kh)."""
    y = y * tl.rsqrt(tl.sum(y * y, 1, keep_dims=True) + 1e-6)
    for rep in tl.static_range(HV // HK):
        tl.store(dst + (t[:, None] * HV + kh + rep * HK) * DK + w[None, :], y, mask=rows)


@triton.jit
def _gdn_prompt_conv(
    qkv, ring, conv_w, q_out, k_out, v_out, start, T, s_qkv,
    C: tl.constexpr, K: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BW: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """A prompt's tokens start.. of one sequence: program (token block, head of the q, k or v
    region) runs the causal convolution (rows before the prompt piece from the ring), SiLU and,
    for q and k, the L2 norm; q and k go to every V head that reads their K head."""
    r = tl.program_id(1)
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    w = tl.arange(0, BW)
    is_v = r >= 2 * HK
    width = tl.where(is_v, DV, DK)
    ch = tl.where(is_v, 2 * HK * DK + (r - 2 * HK) * DV, r * DK) + w
    mc = w < width
    y = tl.zeros((BT, BW), tl.float32)
    for j in tl.static_range(K):
        tt = t + j - (K - 1)  # the tap's row within the piece; < 0: the ring's
        x = tl.load(qkv + tt[:, None] * s_qkv + ch[None, :],
                    mask=((tt >= 0) & (tt < T))[:, None] & mc[None, :], other=0.0)  # fmt: skip
        slot = (start + tt + K) % K
        before = (tt < 0) & (start + tt >= 0)
        old = tl.load(ring + slot[:, None] * C + ch[None, :],
                      mask=before[:, None] & mc[None, :], other=0.0)  # fmt: skip
        y += tl.load(conv_w + ch * K + j, mask=mc, other=0.0)[None, :] * (x.to(tl.float32) + old)
    y = y * tl.sigmoid(y)
    rows = (t < T)[:, None] & mc[None, :]
    if r < HK:
        _store_tiled(q_out, y, t, w, r, rows, HK, HV, DK)
    elif r < 2 * HK:
        _store_tiled(k_out, y, t, w, r - HK, rows, HK, HV, DK)
    else:
        tl.store(v_out + (t[:, None] * HV + r - 2 * HK) * DV + w[None, :], y, mask=rows)


@triton.jit
def _attention_prompt(
    q_gate, k_in, v_in, k_cache, v_cache, q_out, q_norm, k_norm, cos, sin, start, T,
    s_qg, s_k, s_v, s_ch, s_cs, eps,
    G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
    NROT: tl.constexpr,
):  # fmt: skip
    """A prompt's token t of one sequence and KV head: the group's queries normalised and rotated
    into q_out (H, T, D), the key normalised and rotated and the value into the cache at position
    start + t."""
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    pos = start + t
    d = tl.arange(0, D)
    g = tl.arange(0, BG)
    heads = kvh * G + tl.minimum(g, G - 1)
    cos_row = cos + pos * HALF
    sin_row = sin + pos * HALF
    q_ptr = q_gate + t * s_qg + heads[:, None] * (2 * D) + d[None, :]
    q = _norm_rope(q_ptr, d[None, :], q_norm, cos_row, sin_row, eps, D, HALF, NROT)
    dt = q_out.dtype.element_ty
    tl.store(q_out + (heads[:, None] * T + t) * D + d[None, :], q.to(dt), mask=(g < G)[:, None])
    k = _norm_rope(k_in + t * s_k + kvh * D + d, d, k_norm, cos_row, sin_row, eps, D, HALF,
                   NROT)  # fmt: skip
    v = tl.load(v_in + t * s_v + kvh * D + d)
    cache = kvh * s_ch + pos * s_cs + d
    tl.store(k_cache + cache, k.to(k_cache.dtype.element_ty))
    tl.store(v_cache + cache, v.to(v_cache.dtype.element_ty))


def gdn_prompt_conv(
    qkv: Any, ring: Any, conv_w: Any, start: int, dims: Any
) -> tuple[Any, Any, Any]:
    """The convolution, SiLU and L2 norms of a prompt piece qkv (T, C) of one sequence at
    positions start.., its ring (K, C) float32 holding the inputs before start (read, not
    written): q, k (T, HV, DK) tiled to the V heads and v (T, HV, DV), float32."""
    torch = require_torch()
    t, d = qkv.shape[0], dims
    _check(qkv)
    if not ring.is_contiguous():
        raise ValueError("the conv ring must be contiguous")
    q = torch.empty(t, d.v_heads, d.k_dim, device=qkv.device)
    k = torch.empty_like(q)
    v = torch.empty(t, d.v_heads, d.v_dim, device=qkv.device)
    bt = 16
    _gdn_prompt_conv[(-(-t // bt), 2 * d.k_heads + d.v_heads)](
        qkv, ring, conv_w, q, k, v, start, t, qkv.stride(0),
        C=ring.shape[1], K=d.conv_kernel, HK=d.k_heads, HV=d.v_heads, DK=d.k_dim, DV=d.v_dim,
        BW=triton.next_power_of_2(max(d.k_dim, d.v_dim)), BT=bt, num_warps=4,
    )  # fmt: skip
    return q, k, v


def gdn_gated_norm(o: Any, z: Any, norm: Any, out: Any, dims: Any) -> None:
    """out (T, HV*DV) = rmsnorm(o) * norm * silu(z) per V head; o (T, HV, DV) float32
    contiguous."""
    d = dims
    _check(out, z)
    if not o.is_contiguous() or o.dtype != require_torch().float32:
        raise ValueError("o must be contiguous float32")
    _gdn_norm[(d.v_heads, o.shape[0])](
        o, z, norm, out, z.stride(0), out.stride(0), d.eps, HV=d.v_heads, DV=d.v_dim, PDL=False,
        num_warps=1,
    )  # fmt: skip


def attention_prompt(q_gate: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, start: int,
                     q_norm: Any, k_norm: Any, rope: Any, dims: Any) -> Any:  # fmt: skip
    """A prompt piece (T rows) of one sequence at positions start..: the keys and values into
    its cache (H_kv, context, D); the normalised, rotated queries (H, T, D) in the cache's
    dtype."""
    torch = require_torch()
    t, d = q_gate.shape[0], dims
    if not tileable(d.head_dim):
        raise ValueError(f"head_dim {d.head_dim} is not a power of two of at least 16")
    _check(q_gate, k, v)
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("the K and V caches need one layout with unit stride")
    q = torch.empty(d.n_head, t, d.head_dim, dtype=k_cache.dtype, device=q_gate.device)
    group = d.n_head // d.n_head_kv
    _attention_prompt[(t, d.n_head_kv)](
        q_gate, k, v, k_cache, v_cache, q, q_norm, k_norm, rope.cos, rope.sin, start, t,
        q_gate.stride(0), k.stride(0), v.stride(0), k_cache.stride(0), k_cache.stride(1), d.eps,
        G=group, BG=triton.next_power_of_2(group), D=d.head_dim, HALF=rope.half,
        NROT=rope.n_rot, num_warps=4,
    )  # fmt: skip
    return q


def attention_chunk(batch: int) -> int:
    """Cache positions per tile of an attention decode program for steps of `batch` sequences."""
    return CHUNK_ONE if batch == 1 else CHUNK


def attention_tiles(batch: int) -> int:
    """Tiles of attention_chunk(batch) positions per attention decode program."""
    return ATTENTION_TILES_ONE if batch == 1 else ATTENTION_TILES


def attention_warps(batch: int) -> int:
    """Warps per attention decode program for steps of `batch` sequences."""
    return ATTENTION_WARPS_ONE if batch == 1 else ATTENTION_WARPS


class AttentionScratch:
    """The partial softmax sums of every attention decode program of a step (shared by the
    attention layers, which run one after another): B x H x programs over the context, room for
    the programs of one sequence's steps and of several sequences' alike (context / the shortest
    program span x (head_dim + 2) floats per head and sequence); and the step's queries, normed
    and rotated, for libpq2's kernel (B x H x head_dim bf16)."""

    def __init__(self, batch: int, n_head: int, head_dim: int, context: int, device: Any):
        torch = require_torch()
        span = min(STREAM_CHUNK, *(attention_chunk(b) * attention_tiles(b) for b in (1, 2)))
        self.n_chunks = -(-context // span)
        shape = (batch, n_head, self.n_chunks)
        self.m = torch.empty(shape, dtype=torch.float32, device=device)
        self.l = torch.empty(shape, dtype=torch.float32, device=device)  # noqa: E741
        self.acc = torch.empty((*shape, head_dim), dtype=torch.float32, device=device)
        self.q = torch.empty((batch, n_head, head_dim), dtype=torch.bfloat16, device=device)


def streams(batch: int, dims: Any, cache: Any) -> bool:
    """Whether a step of `batch` sequences attends through libpq2's kernel, not
    _attention_partial: the library loads and has CUDA, the cache is bf16 on a device of compute
    capability 8.0 or newer, the head width and the group are ones it serves."""
    torch = require_torch()
    group, rest = divmod(dims.n_head, dims.n_head_kv)
    return (
        batch >= STREAM_MIN_BATCH
        and cache.dtype == torch.bfloat16
        and rest == 0
        and _serves(cache.device.index)
        and gpu.attention_serves(dims.head_dim, group)
    )


@functools.cache
def _serves(device_index: int) -> bool:
    """libpq2 loads, was built with CUDA, and the device is one its kernels run on."""
    try:
        lib = native.load()[1]
    except LibraryError:
        return False
    major, _ = require_torch().cuda.get_device_capability(device_index)
    return bool(lib.pq2_built_with_cuda()) and major >= 8


def attention_decode(q_gate: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, positions: Any,
                     span: int, q_norm: Any, k_norm: Any, rope: Any, scratch: AttentionScratch,
                     out: Any, dims: Any, scale: float) -> None:  # fmt: skip
    """One token of each of B sequences through an attention layer's cache (B', H_kv, context,
    D), reading positions below `span`; out (B, H*D) = attention times sigmoid(gate)."""
    b, d = q_gate.shape[0], dims
    if not tileable(d.head_dim):
        raise ValueError(f"head_dim {d.head_dim} is not a power of two of at least 16")
    _check(out, q_gate, k, v)
    group = d.n_head // d.n_head_kv
    in_lib = streams(b, d, k_cache)  # libpq2's kernel, else _attention_partial
    if in_lib:
        program = STREAM_CHUNK  # cache positions a block of libpq2's kernel attends to
    else:
        chunk, tiles = attention_chunk(b), attention_tiles(b)
        program = chunk * tiles  # cache positions a program attends to
    chunks = -(-span // program)
    if chunks > scratch.n_chunks:
        raise ValueError(f"span {span} is more than the scratch's context")
    p = pdl(q_gate.device.index)
    bg = max(16, triton.next_power_of_2(group))
    if in_lib:
        _attention_prep[(d.n_head_kv, b)](
            q_gate, k, v, k_cache, v_cache, positions, q_norm, k_norm, rope.cos, rope.sin,
            scratch.q, q_gate.stride(0), k.stride(0), v.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), d.eps,
            H=d.n_head, G=group, BG=bg, D=d.head_dim, HALF=rope.half, NROT=rope.n_rot, PDL=p,
            num_warps=4, launch_pdl=p,
        )  # fmt: skip
        gpu.attention_decode_partial(
            scratch.q[:b], k_cache, v_cache, positions, scratch.m[:b], scratch.l[:b],
            scratch.acc[:b], chunks, STREAM_CHUNK, scale,
        )  # fmt: skip
    else:
        line = 128 // k_cache.element_size()  # elements of a 128-byte line
        # a program of one tile has no loop to pipeline; several keep as many tiles of keys and
        # values in flight as STAGE_BYTES of shared memory hold
        tile_bytes = 2 * chunk * d.head_dim * k_cache.element_size()
        stages = 1 if tiles == 1 else max(1, min(3, STAGE_BYTES // tile_bytes))
        _attention_partial[(chunks, d.n_head_kv, b)](
            q_gate, k, v, k_cache, v_cache, positions, q_norm, k_norm, rope.cos, rope.sin,
            scratch.m, scratch.l, scratch.acc,
            q_gate.stride(0), k.stride(0), v.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scratch.n_chunks, scale,
            d.eps, H=d.n_head, G=group, BG=bg, D=d.head_dim, HALF=rope.half, NROT=rope.n_rot,
            BS=chunk, TILES=tiles, PDL=p, LINE=line, LINES=max(1, d.head_dim // line),
            num_warps=attention_warps(b), num_stages=stages, launch_pdl=p,
        )  # fmt: skip
    # programs a merge iteration: a power of two (tl.arange), the program span need not be one
    merge = max(1, min(MERGE_SPAN // program, MERGE_TILE // d.head_dim))
    merge = 1 << (merge.bit_length() - 1)
    _attention_merge[(d.n_head, b)](
        q_gate, positions, scratch.m, scratch.l, scratch.acc, out, q_gate.stride(0),
        out.stride(0), scratch.n_chunks, H=d.n_head, D=d.head_dim, BS=program, BC=merge,
        PDL=p, num_warps=4, launch_pdl=p,
    )  # fmt: skip


def _check(*tensors: Any) -> None:
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError("decode kernels need rows with unit stride")
