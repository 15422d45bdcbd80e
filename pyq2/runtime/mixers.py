"""The host's part of a qwen35 layer on the GPU, in torch: attention and the Gated-DeltaNet
recurrence between a layer's input projections and its output projection.

Both read the projections' outputs as DecodeStep leaves them and write the mixer output the
step's mixer producer reads, in the file's conventions (pyq2.spec.qwen35 is the numpy reference
of the same arithmetic; FORMATS.md "qwen35 tensors" says what the file holds):

- attention: the joint query+gate projection split per head ([q | gate] of head_dim each),
  per-head RMSNorm of q and k with the file's multipliers, NEOX rotary embedding of the first
  rope_dim dimensions, K and V written into a preallocated cache, grouped-query softmax
  attention (query head h reads KV head h // (H / H_kv)), times sigmoid(gate);
- Gated-DeltaNet: the causal convolution continuing from its rolling state, SiLU, the q/k/v
  split, q and k tiled to the V heads (the file's tiled order: V head j reads K head j % H_k),
  L2-normalised, beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias), the gated delta rule on
  a float32 state per sequence, the gated RMSNorm with silu(z).

A prompt runs one sequence's tokens at a time (`prefill`, rows = tokens); a decode step runs
one token of each of B sequences (`decode`, row b = sequence b at its own position). On CUDA both
run pyq2.runtime.mixer_kernels (a few Triton launches per layer), the torch forms here being
their reference and the fallback. A prompt's recurrence uses
flash-linear-attention's chunk_gated_delta_rule where the `fla` package imports (its
fused_recurrent_gated_delta_rule for the torch form of a step) and a torch loop of the same
rule otherwise; everything here can be captured in a CUDA graph once warm.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from ..lib.optional import require_torch

L2_EPS = 1e-6  # the L2 normalisation of q and k: x / sqrt(sum(x^2) + eps), as fla and transformers


@dataclass(frozen=True)
class Dims:
    """The sizes the mixers need (from pyq2.spec.qwen35.Config)."""

    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_base: float
    eps: float
    conv_kernel: int
    k_heads: int
    v_heads: int
    k_dim: int  # Gated-DeltaNet key head width (ssm.state_size)
    v_dim: int  # value head width (ssm.inner_size / v_heads)


@dataclass(frozen=True)
class SideRows:
    """Where a Gated-DeltaNet decode step finds its side projections' input instead of their
    outputs: alpha[b, h] = normed[b] . weight[alpha_row + h], beta[b, h] = normed[b] .
    weight[beta_row + h] (the un-rotated normed rows and the side weights of DecodeStep with
    mixer_side)."""

    normed: Any  # (B', W)
    weight: Any  # (N, W)
    alpha_row: int
    beta_row: int

    def project(self, rows: int, heads: int) -> tuple[Any, Any]:
        """(alpha, beta) (rows, heads) float32, in torch."""
        x = self.normed[:rows].float()
        alpha = x @ self.weight[self.alpha_row : self.alpha_row + heads].float().t()
        beta = x @ self.weight[self.beta_row : self.beta_row + heads].float().t()
        return alpha, beta


@functools.cache
def fla_ops() -> tuple[Any, Any] | None:
    """(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule) of flash-linear-attention, or
    None when it does not import (said once on stderr when it is installed but broken)."""
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ModuleNotFoundError as e:
        if e.name != "fla":
            _fla_failed(e)
        return None
    except Exception as e:  # installed, but no triton / GPU for it, or a broken install
        _fla_failed(e)
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _fla_failed(error: Exception) -> None:
    """Say why an installed flash-linear-attention did not import (the prompt then runs
    the token-by-token torch recurrence, much slower)."""
    print(f"pyq2: flash-linear-attention did not import ({type(error).__name__}: {error}); "
          "prompts use the slower torch recurrence", file=sys.stderr)  # fmt: skip


def mixer_kernels(device: Any, width: int) -> Any:
    """pyq2.runtime.mixer_kernels (the Triton forms of the mixers) for heads of
    `width` on a CUDA device where triton imports and the kernels tile that width, unless
    PYQ2_MIXER_KERNELS=0; else None (the torch forms)."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    if os.environ.get("PYQ2_MIXER_KERNELS", "1") == "0":
        return None
    try:
        from . import mixer_kernels as kernels
    except ImportError:
        return None
    return kernels if kernels.tileable(width) else None


def rms_norm(x: Any, w: Any, eps: float) -> Any:
    torch = require_torch()
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def l2_norm(x: Any) -> Any:
    torch = require_torch()
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True) + L2_EPS)


def rope_apply(x: Any, cos: Any, sin: Any, half: int, n_rot: int) -> Any:
    """NEOX rotation of the first n_rot dims of x (T, H, D) by cos/sin (T, half)."""
    torch = require_torch()
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:n_rot]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rotated, x[..., n_rot:]], dim=-1)


class Compiled:
    """fn through torch.compile on CUDA tensors (its elementwise chains fused into a few
    kernels: what a decode step's many small operations need), plain fn on the CPU, with
    PYQ2_COMPILE=0, or after a compile error (said once on stderr)."""

    def __init__(self, fn: Any):
        self.fn: Any = fn
        self.compiled: Any = None
        self.failed = os.environ.get("PYQ2_COMPILE", "1") == "0"

    def __call__(self, *args: Any) -> Any:
        if self.failed or not args[0].is_cuda:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = require_torch().compile(self.fn, dynamic=False, fullgraph=True)
        try:
            return self.compiled(*args)
        except Exception as e:  # an inductor or Triton failure: the same arithmetic eagerly
            print(f"pyq2: torch.compile of {self.fn.__name__} failed ({e}); running it eagerly",
                  file=sys.stderr)  # fmt: skip
            self.failed = True
            return self.fn(*args)


def _attn_pre(q_gate, k, v, q_norm, k_norm, cos, sin, n_head, n_kv, hd, half, n_rot, eps):
    t = q_gate.shape[0]
    qg = q_gate.float().reshape(t, n_head, 2 * hd)
    q = rope_apply(rms_norm(qg[..., :hd], q_norm, eps), cos, sin, half, n_rot)
    kk = rope_apply(rms_norm(k.float().reshape(t, n_kv, hd), k_norm, eps), cos, sin, half, n_rot)
    return q, qg[..., hd:], kk, v.float().reshape(t, n_kv, hd)


def _gdn_split(y, alpha, beta, a, dt_bias, k_heads, v_heads, k_dim, v_dim):
    """The conv's output y (T, C) after SiLU split: q and k tiled to the V heads (the file's
    order: V head j reads K head j % H_k) and L2-normalised, v, the log decay g and beta."""
    torch = require_torch()
    t = y.shape[0]
    qk, rep = k_heads * k_dim, v_heads // k_heads
    q = y[:, :qk].reshape(t, k_heads, k_dim).repeat(1, rep, 1)
    k = y[:, qk : 2 * qk].reshape(t, k_heads, k_dim).repeat(1, rep, 1)
    v = y[:, 2 * qk :].reshape(t, v_heads, v_dim)
    g = a * torch.nn.functional.softplus(alpha.float() + dt_bias)
    return l2_norm(q), l2_norm(k), v, g, torch.sigmoid(beta.float())


def _gdn_pre(window, qkv, alpha, beta, conv_w, a, dt_bias, k_heads, v_heads, k_dim, v_dim):
    """One token of each sequence: the conv over its window (the K - 1 inputs before it, then
    the token), SiLU, the split (_gdn_split)."""
    torch = require_torch()
    xp = torch.cat([window, qkv.float()[:, None, :]], dim=1)  # (B, K, C)
    y = torch.nn.functional.silu((xp * conv_w.t()[None]).sum(1))
    return _gdn_split(y, alpha, beta, a, dt_bias, k_heads, v_heads, k_dim, v_dim)


def _gdn_post(o, z, norm, eps, v_heads, v_dim):
    torch = require_torch()
    t = o.shape[0]
    gated = rms_norm(o.float(), norm, eps) * torch.nn.functional.silu(
        z.float().reshape(t, v_heads, v_dim)
    )
    return gated.reshape(t, -1)


def _gate(o, gate):
    return (o.float() * gate.sigmoid()).reshape(o.shape[0], -1)


# A decode step's shapes are fixed per batch size: these compile once each. A prompt's vary with
# its length: its steps call the plain functions.
ATTN_PRE, GDN_PRE, GDN_POST, GATE = (Compiled(f) for f in (_attn_pre, _gdn_pre, _gdn_post, _gate))


class Rope:
    """cos/sin of every position up to `context` (float64 angles rounded once), gathered by
    position (a device tensor, so that a captured graph reads the positions of each replay) for
    rope_apply."""

    def __init__(self, dims: Dims, context: int, device: Any):
        torch = require_torch()
        half = dims.rope_dim // 2
        inv = dims.rope_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / dims.rope_dim)
        angle = torch.arange(context, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = torch.cos(angle).float().to(device)
        self.sin = torch.sin(angle).float().to(device)
        self.half, self.n_rot = half, dims.rope_dim


class Attention:
    """One full-attention layer's cache (B sequences x context positions, bf16 by default) and
    its arithmetic."""

    def __init__(self, dims: Dims, weights: dict[str, Any], batch: int, context: int,
                 rope: Rope, device: Any, cache_dtype: Any = None,
                 scratch: Any = None, kernels: bool = True):  # fmt: skip
        """scratch: the decode kernels' AttentionScratch, shared by the layers (one is made
        when None); kernels=False keeps a decode step on the torch forms."""
        torch = require_torch()
        self.d, self.rope = dims, rope
        self.q_norm = weights["q_norm"].float().contiguous()
        self.k_norm = weights["k_norm"].float().contiguous()
        dtype = cache_dtype if cache_dtype is not None else torch.bfloat16
        shape = (batch, dims.n_head_kv, context, dims.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.scale = 1.0 / math.sqrt(dims.head_dim)
        self.kernels = mixer_kernels(device, dims.head_dim) if kernels else None
        if self.kernels is not None and scratch is None:
            scratch = self.kernels.AttentionScratch(
                batch, dims.n_head, dims.head_dim, context, device
            )
        self.scratch = scratch

    def prefill(self, q_gate: Any, k: Any, v: Any, seq: int, start: int, out: Any) -> None:
        """Rows: tokens start.. of sequence `seq`; out (T, H * D) gets the mixer output."""
        torch = require_torch()
        t = q_gate.shape[0]
        d = self.d
        pos = torch.arange(start, start + t, device=q_gate.device)
        if self.kernels is not None:  # q normalised and rotated, k and v into the cache
            qq = self.kernels.attention_prompt(
                q_gate, k, v, self.k[seq], self.v[seq], start, self.q_norm, self.k_norm,
                self.rope, d,
            )[None]  # fmt: skip
            gate = q_gate.unflatten(1, (d.n_head, 2 * d.head_dim))[..., d.head_dim :].float()
        else:
            cos, sin = self.rope.cos[pos], self.rope.sin[pos]
            dims = (d.n_head, d.n_head_kv, d.head_dim, self.rope.half, self.rope.n_rot, d.eps)
            q, gate, k, v = _attn_pre(q_gate, k, v, self.q_norm, self.k_norm, cos, sin, *dims)
            self.k[seq, :, start : start + t] = k.transpose(0, 1).to(self.k.dtype)
            self.v[seq, :, start : start + t] = v.transpose(0, 1).to(self.v.dtype)
            qq = q.transpose(0, 1)[None].to(self.k.dtype)
        # in the cache's dtype; a sequence's first chunk is plainly causal (the fused kernels)
        keys, values = self.k[seq : seq + 1, :, : start + t], self.v[seq : seq + 1, :, : start + t]
        if start == 0:
            f = torch.nn.functional
            o = f.scaled_dot_product_attention(qq, keys, values, is_causal=True, scale=self.scale,
                                               enable_gqa=True)  # fmt: skip
        else:
            visible = torch.arange(start + t, device=pos.device)[None, :] <= pos[:, None]
            o = self._attend(qq, keys, values, visible[None, None])
        out.copy_(_gate(o[0].transpose(0, 1), gate))

    def decode(self, q_gate: Any, k: Any, v: Any, positions: Any, span: int, out: Any) -> None:
        """Row b: sequence b's token at positions[b] (< span, the cache positions attended)."""
        torch = require_torch()
        d, b = self.d, q_gate.shape[0]
        if self.kernels is not None:
            self.kernels.attention_decode(
                q_gate, k, v, self.k, self.v, positions, span, self.q_norm, self.k_norm,
                self.rope, self.scratch, out, d, self.scale,
            )  # fmt: skip
            return
        cos, sin = self.rope.cos[positions], self.rope.sin[positions]
        dims = (d.n_head, d.n_head_kv, d.head_dim, self.rope.half, self.rope.n_rot, d.eps)
        q, gate, k, v = ATTN_PRE(q_gate, k, v, self.q_norm, self.k_norm, cos, sin, *dims)
        rows = torch.arange(b, device=positions.device)
        self.k[rows, :, positions] = k.to(self.k.dtype)
        self.v[rows, :, positions] = v.to(self.v.dtype)
        # attention in the cache's dtype over the span: the keys after a row's position masked
        keys, values = self.k[:b, :, :span], self.v[:b, :, :span]
        visible = torch.arange(span, device=positions.device)[None, :] <= positions[:, None]
        o = self._attend(q[:, :, None, :].to(keys.dtype), keys, values, visible[:, None, None, :])
        out.copy_(GATE(o[:, :, 0], gate))

    def _attend(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
        """q (N, H, T, D), k/v (N, H_kv, S, D), mask (N, 1, T, S) bool; (N, H, T, D)."""
        f = require_torch().nn.functional
        return f.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                              enable_gqa=True)  # fmt: skip


class GatedDeltaNet:
    """One Gated-DeltaNet layer's convolution window and float32 recurrent state per sequence,
    and its arithmetic.

    The window is a ring of conv_kernel slots per sequence: slot p % conv_kernel holds the input
    of the token at position p, for the last conv_kernel positions (mixer_kernels says why);
    slots of positions before 0 are zero."""

    def __init__(self, dims: Dims, weights: dict[str, Any], batch: int, device: Any,
                 use_fla: bool = True, kernels: bool = True):  # fmt: skip
        torch = require_torch()
        self.d = dims
        self.conv_w = weights["conv"].float().contiguous()  # (C, K)
        self.a = weights["a"].float().contiguous()
        self.dt_bias = weights["dt_bias"].float().contiguous()
        self.norm = weights["norm"].float().contiguous()
        channels = self.conv_w.shape[0]
        self.conv = torch.zeros(batch, dims.conv_kernel, channels, device=device)
        self.state = torch.zeros(batch, dims.v_heads, dims.k_dim, dims.v_dim, device=device)
        self.fla = fla_ops() if use_fla else None
        self.scale = 1.0 / math.sqrt(dims.k_dim)
        self.kernels = mixer_kernels(device, dims.v_dim) if kernels else None
        self.o = None  # the decode kernels' output before the gated norm
        if self.kernels is not None:
            self.o = torch.empty(batch, dims.v_heads, dims.v_dim, device=device)

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()

    def _slots(self, positions: Any) -> Any:
        """The ring slots of the K - 1 positions before each of `positions`, in order."""
        torch = require_torch()
        kernel = self.d.conv_kernel
        back = torch.arange(1, kernel, device=positions.device)
        return (positions[:, None] + back[None, :]) % kernel  # p - K + 1 + j = p + 1 + j mod K

    def prefill(self, qkv: Any, z: Any, alpha: Any, beta: Any, seq: int, start: int,
                out: Any, gate: bool = True) -> None:  # fmt: skip
        """Rows: tokens start.. of sequence `seq` (its states continue); `gate` as decode's."""
        torch = require_torch()
        t, kernel = qkv.shape[0], self.d.conv_kernel
        ring = self.conv[seq]
        if self.kernels is not None:
            self._prefill_kernels(qkv, z, alpha, beta, seq, start, out, gate)
            return
        before = self._slots(torch.tensor([start], device=qkv.device))[0]
        xp = torch.cat([ring[before], qkv.float()], dim=0)  # (K - 1 + T, C)
        y = sum(self.conv_w[:, j] * xp[j : j + t] for j in range(kernel))
        # the last K inputs back in their slots, as K decode steps would leave them
        ring[torch.arange(start + t - kernel, start + t, device=qkv.device) % kernel] = xp[t - 1 :]
        d = self.d
        params = (self.a, self.dt_bias, d.k_heads, d.v_heads, d.k_dim, d.v_dim)
        q, k, v, g, b = _gdn_split(torch.nn.functional.silu(y), alpha, beta, *params)
        state = self.state[seq : seq + 1]
        if self.fla is not None:
            o, final = self.fla[0](q[None], k[None], v[None], g=g[None], beta=b[None],
                                   scale=self.scale, initial_state=state,
                                   output_final_state=True)  # fmt: skip
            o = o[0]
        else:
            o, final = _recurrent(q[None], k[None], v[None], g[None], b[None], state, self.scale)
            o = o[0]
        state.copy_(final)
        out.copy_(_gdn_post(o, z, self.norm, d.eps, d.v_heads, d.v_dim) if gate else o.flatten(1))

    def _prefill_kernels(self, qkv: Any, z: Any, alpha: Any, beta: Any, seq: int, start: int,
                         out: Any, gate: bool) -> None:  # fmt: skip
        """prefill() with the convolution and the gated norm as Triton kernels."""
        torch = require_torch()
        d, t, kernel = self.d, qkv.shape[0], self.d.conv_kernel
        kernels, ring = self.kernels, self.conv[seq]
        assert kernels is not None
        q, k, v = kernels.gdn_prompt_conv(qkv, ring, self.conv_w, start, d)
        # the piece's last inputs into their slots (those before it are in theirs already)
        n = min(t, kernel)
        ring[torch.arange(start + t - n, start + t, device=qkv.device) % kernel] = qkv[
            t - n :
        ].float()
        g = self.a * torch.nn.functional.softplus(alpha.float() + self.dt_bias)
        b = torch.sigmoid(beta.float())
        state = self.state[seq : seq + 1]
        if self.fla is not None:
            o, final = self.fla[0](q[None], k[None], v[None], g=g[None], beta=b[None],
                                   scale=self.scale, initial_state=state,
                                   output_final_state=True)  # fmt: skip
        else:
            o, final = _recurrent(q[None], k[None], v[None], g[None], b[None], state, self.scale)
        state.copy_(final)
        if gate:
            kernels.gdn_gated_norm(o[0].float().contiguous(), z, self.norm, out, d)
        else:
            out.copy_(o[0].flatten(1))

    def decode(self, qkv: Any, z: Any, alpha: Any, beta: Any, positions: Any, out: Any,
               side: SideRows | None = None, gate: bool = True) -> None:  # fmt: skip
        """Row b: sequence b's next token, at positions[b]. With `side`, alpha and beta come from
        it (they are not read). Without `gate`, out (float32) gets the output before the gated
        norm (the caller's to apply: DecodeStep with gated_norm)."""
        torch = require_torch()
        d, b = self.d, qkv.shape[0]
        kernels = self.kernels
        if side is not None and (kernels is None or not kernels.side_fits(side, b, d.v_heads)):
            alpha, beta = side.project(b, d.v_heads)
            side = None
        if kernels is not None:
            kernels.gdn_decode(
                qkv, z, alpha, beta, self.conv, self.state, self.o, out, positions, self.conv_w,
                self.a, self.dt_bias, self.norm, d, self.scale, side, gate,
            )  # fmt: skip
            return
        rows = torch.arange(b, device=qkv.device)
        window = self.conv[rows[:, None], self._slots(positions)]  # (B, K - 1, C)
        params = (self.conv_w, self.a, self.dt_bias, d.k_heads, d.v_heads, d.k_dim, d.v_dim)
        q, k, v, g, beta_ = GDN_PRE(window, qkv, alpha, beta, *params)
        self.conv[rows, positions % d.conv_kernel] = qkv.float()
        state = self.state[:b]
        # (B, 1, H, D): each sequence one token
        q, k, v, g, beta_ = q[:, None], k[:, None], v[:, None], g[:, None], beta_[:, None]
        if self.fla is not None:  # (its fourth and fifth parameters are g and gk, by name here)
            o, final = self.fla[1](q, k, v, g=g, beta=beta_, scale=self.scale,
                                   initial_state=state, output_final_state=True)  # fmt: skip
        else:
            o, final = _recurrent(q, k, v, g, beta_, state, self.scale)
        state.copy_(final)
        if gate:
            out.copy_(GDN_POST(o[:, 0], z, self.norm, d.eps, d.v_heads, d.v_dim))
        else:
            out.copy_(o[:, 0].flatten(1))


def _recurrent(q, k, v, g, beta, state, scale) -> tuple[Any, Any]:
    """The gated delta rule token by token in torch (float32): q, k (N, T, H, Dk), v (N, T, H,
    Dv), g, beta (N, T, H), state (N, H, Dk, Dv). Per token: S = exp(g) S; S += k (beta (v -
    S^T k))^T; o = S^T (scale q)."""
    torch = require_torch()
    s = state.clone().float()
    outs = []
    for i in range(q.shape[1]):
        s = s * torch.exp(g[:, i])[..., None, None]
        kt, vt = k[:, i].float(), v[:, i].float()
        delta = (vt - torch.einsum("nhk,nhkv->nhv", kt, s)) * beta[:, i][..., None]
        s = s + kt[..., :, None] * delta[..., None, :]
        outs.append(torch.einsum("nhk,nhkv->nhv", q[:, i].float() * scale, s))
    return torch.stack(outs, dim=1), s
