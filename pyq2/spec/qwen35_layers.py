"""The numeric pieces of the qwen35 reference (`pyq2.spec.qwen35`), each a plain numpy function.

Arrays in and out are float32 with tokens on the first axis; reductions (norms, softmax, the conv
and the delta rule) run in float64 inside and round once on the way out. Nothing here knows tensor
names: `pyq2.spec.qwen35` feeds these the weights of a GGUF file as llama.cpp stores them.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64

# transformers' l2norm eps (modeling_qwen3_5.py `l2norm`, used with use_qk_l2norm_in_kernel=True)
L2_EPS = 1e-6
# how many tokens one chunk of `gated_delta_rule_chunked` covers (transformers and llama.cpp: 64)
CHUNK = 64


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), in float64, through tanh so that no |x| overflows."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, F64)))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), float32."""
    x64 = np.asarray(x, F64)
    return (x64 * sigmoid(x64)).astype(F32)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), float64, without overflow."""
    return np.logaddexp(0.0, np.asarray(x, F64))


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T for a weight in numpy order (N, K), i.e. a GGUF matrix of ne (K, N); float32."""
    return np.matmul(np.asarray(x, F32), np.asarray(w, F32).T)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis: llama.cpp's LLM_NORM_RMS.

    `w` is the multiplier as the GGUF stores it: for Qwen3.5's zero-centred norms that is already
    1 + w_hf, so no offset is added here.
    """
    x64 = np.asarray(x, F64)
    r = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (r * np.asarray(w, F64)).astype(F32)


def l2_norm(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (transformers' `l2norm`).

    llama.cpp's ggml_l2_norm is x / max(|x|, eps) with eps = the rms eps; the two differ only for
    vectors of norm near sqrt(eps).
    """
    x64 = np.asarray(x, F64)
    return (x64 / np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True) + eps)).astype(F32)


def imrope_axes(sections: tuple[int, ...], n_pairs: int) -> np.ndarray:
    """Which position axis (0 t, 1 h, 2 w, 3 e) each rotary pair takes, in interleaved M-RoPE.

    ggml's GGML_ROPE_TYPE_IMROPE rule (ggml-cpu ops.cpp `ggml_mrope_cache_init`): sector =
    pair % sum(sections); axis 1 if sector % 3 == 1 and sector < 3 * s1, axis 2 if sector % 3 == 2
    and sector < 3 * s2, axis 0 if sector % 3 == 0 and sector < 3 * s0, else axis 3.
    """
    s = [int(v) for v in tuple(sections) + (0, 0, 0, 0)][:4]
    sector = np.arange(n_pairs) % max(sum(s), 1)
    axes = np.full(n_pairs, 3, dtype=np.int64)
    for axis in range(3):
        axes[(sector % 3 == axis) & (sector < 3 * s[axis])] = axis
    return axes


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    n_rot: int,
    base: float,
    sections: tuple[int, ...] = (),
) -> np.ndarray:
    """NEOX-style rotary embedding of the first `n_rot` dims of each head; the rest pass through.

    x: (T, H, D) float32, positions: (T,) text positions. Pair i (i < n_rot/2) is dims (i,
    i + n_rot/2), rotated by pos * base^(-2i/n_rot). Text tokens give the t, h and w axes the same
    position and the fourth (e) axis position 0 (llama.cpp `llm_graph_input_pos::set_input`), so a
    pair only stays unrotated if `sections` leave it to axis 3; with no sections every pair rotates.
    Angles in float64.
    """
    half = n_rot // 2
    inv_freq = np.asarray(base, F64) ** (-2.0 * np.arange(half, dtype=F64) / n_rot)
    pos = np.asarray(positions, F64)[:, None] * np.ones(half)
    if sections:
        pos = np.where(imrope_axes(tuple(sections), half)[None, :] < 3, pos, 0.0)
    angle = (pos * inv_freq)[:, None, :]  # (T, 1, half)
    cos, sin = np.cos(angle), np.sin(angle)
    x64 = np.asarray(x, F64)
    x1, x2 = x64[..., :half], x64[..., half:n_rot]
    out = np.array(x, dtype=F32, copy=True)
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:n_rot] = x2 * cos + x1 * sin
    return out


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_positions: np.ndarray,
    scale: float,
) -> np.ndarray:
    """Causal grouped-query softmax attention against a whole cache.

    q: (T, H, D) at absolute positions `q_positions`; k, v: (S, H_kv, D) holding positions 0..S-1.
    Query head h reads kv head h // (H / H_kv) (grouped, as transformers' repeat_kv and ggml's
    mul_mat broadcast do). Key s is visible to a query at position p when s <= p. Returns
    (T, H, D) float32; scores and softmax in float64.
    """
    n_head, n_kv = q.shape[1], k.shape[1]
    kv_of_head = np.arange(n_head) // (n_head // n_kv)
    k64 = np.asarray(k, F64)[:, kv_of_head]  # (S, H, D)
    v64 = np.asarray(v, F64)[:, kv_of_head]
    scores = np.einsum("thd,shd->hts", np.asarray(q, F64), k64) * scale
    visible = np.arange(k.shape[0])[None, :] <= np.asarray(q_positions)[:, None]  # (T, S)
    scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v64).astype(F32)


def causal_conv1d(
    x: np.ndarray, conv_state: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv (no bias, no activation) continuing from `conv_state`.

    x: (T, C); conv_state: (K-1, C), the K-1 inputs before x (zeros at the start); w: (C, K), the
    squeezed `ssm_conv1d.weight` (GGUF ne (K, C)). y[t, c] = sum_j w[c, j] * xp[t + j, c] with
    xp = [conv_state; x] (ggml_ssm_conv, = torch conv1d with weight (C, 1, K)). Returns
    (y float32 (T, C), new conv_state = the last K-1 rows of xp).
    """
    kernel = w.shape[1]
    xp = np.concatenate([np.asarray(conv_state, F32), np.asarray(x, F32)], axis=0)
    windows = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=0)  # (T, C, K)
    y = np.einsum("tck,ck->tc", windows.astype(F64), np.asarray(w, F64))
    return y.astype(F32), np.array(xp[xp.shape[0] - (kernel - 1) :], dtype=F32)


def gated_delta_rule_recurrent(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule, one token at a time (transformers `torch_recurrent_gated_delta_rule`).

    q, k: (T, H, d_k), already L2-normalised and per value head; v: (T, H, d_v); g (log decay,
    <= 0) and beta: (T, H); state: (H, d_k, d_v). Per token and head:
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T (scale q).
    Float64 inside; returns (o float32 (T, H, d_v), new state float32).
    """
    s = np.array(state, dtype=F64)
    q64 = np.asarray(q, F64) * scale
    k64, v64 = np.asarray(k, F64), np.asarray(v, F64)
    decay, b = np.exp(np.asarray(g, F64)), np.asarray(beta, F64)
    out = np.empty(v.shape, dtype=F64)
    for t in range(q.shape[0]):
        s *= decay[t][:, None, None]
        delta = (v64[t] - np.einsum("hk,hkv->hv", k64[t], s)) * b[t][:, None]
        s += k64[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q64[t], s)
    return out.astype(F32), s.astype(F32)


def gated_delta_rule_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    scale: float,
    chunk: int = CHUNK,
) -> tuple[np.ndarray, np.ndarray]:
    """The same rule as `gated_delta_rule_recurrent`, `chunk` tokens at a time (WY / UT form).

    The math of transformers `torch_chunk_gated_delta_rule` and llama.cpp
    `build_delta_net_chunking`: within a chunk with cumulative log decay G and
    D[i, j] = exp(G_i - G_j) (i >= j), M = I + strict_lower(beta_i k_i.k_j D), U = M^-1 (beta v),
    W = M^-1 (beta exp(G) k), V' = U - W S, O = (exp(G) q) S + lower(q.k D) V',
    S <- exp(G_last) S + (exp(G_last - G) k)^T V'. A last partial chunk is not padded.
    """
    s = np.array(state, dtype=F64)
    out = np.empty(v.shape, dtype=F64)
    for start in range(0, q.shape[0], chunk):
        sl = slice(start, min(start + chunk, q.shape[0]))
        qc = np.asarray(q[sl], F64).transpose(1, 0, 2) * scale  # (H, n, d_k)
        kc = np.asarray(k[sl], F64).transpose(1, 0, 2)
        vc = np.asarray(v[sl], F64).transpose(1, 0, 2)  # (H, n, d_v)
        bc = np.asarray(beta[sl], F64).T  # (H, n)
        cum = np.cumsum(np.asarray(g[sl], F64).T, axis=1)
        n = cum.shape[1]
        lower = np.tril(np.ones((n, n), dtype=bool))
        diff = cum[:, :, None] - cum[:, None, :]
        decay = np.exp(np.where(lower, diff, -np.inf))  # (H, n, n), 0 above the diagonal
        kk = kc @ kc.transpose(0, 2, 1)
        m = np.eye(n) + np.tril(bc[:, :, None] * kk * decay, -1)
        u = np.linalg.solve(m, bc[:, :, None] * vc)
        w = np.linalg.solve(m, (bc * np.exp(cum))[:, :, None] * kc)
        v_new = u - w @ s
        attn = (qc @ kc.transpose(0, 2, 1)) * decay
        o = (qc * np.exp(cum)[:, :, None]) @ s + attn @ v_new
        out[sl] = o.transpose(1, 0, 2)
        last = cum[:, -1:]
        k_decayed = kc * np.exp(last - cum)[:, :, None]
        s = np.exp(last)[:, :, None] * s + k_decayed.transpose(0, 2, 1) @ v_new
    return out.astype(F32), s.astype(F32)
