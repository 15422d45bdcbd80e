"""Reference forward pass of the `qwen35` (Qwen3.5) text model on float weights, in numpy.

Weights are keyed by their GGUF tensor names and hold what llama.cpp's converter wrote, in numpy
order (a GGUF matrix of ne (K, N) is a numpy (N, K) array; `expected_shapes` lists them all),
under the five conventions of FORMATS.md 6.3, which the reference reads as they are: ggml leaf
names; norms stored as 1 + w except `ssm_norm` (every norm here multiplies by the stored weight);
`ssm_a` = -exp(A_log); the conv weight squeezed; Gated-DeltaNet value heads tiled (value head j
reads key head j % k_heads). FORMATS.md 6.4 is the arithmetic they imply: per layer
x += mixer(rms_norm(x, attn_norm)); x += ffn(rms_norm(x, post_attention_norm)); logits
= rms_norm(x, output_norm) @ output.T (token_embd when `output.weight` is absent); `attn_q` holds
per head [query | output gate]. Layer i is full attention when (i + 1) % full_attention_interval
== 0, else Gated DeltaNet.

Prompt and decode run one path: `forward` on any number of tokens gives the same logits and state
(to fp32 rounding) whether the tokens come at once, in chunks or one by one. The delta rule runs
token by token by default (`delta_rule="recurrent"`, the definition); `"chunked"` runs the chunked
form transformers and llama.cpp use for prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from pyq2.errors import FormatError

from .qwen35_layers import (
    F32,
    attention,
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    imrope_axes,
    l2_norm,
    linear,
    rms_norm,
    rope,
    sigmoid,
    silu,
    softplus,
)

__all__ = [
    "ARCH",
    "Config",
    "State",
    "attention",
    "attention_block",
    "causal_conv1d",
    "expected_shapes",
    "ffn",
    "forward",
    "gated_delta_net",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "imrope_axes",
    "l2_norm",
    "rms_norm",
    "rope",
]

ARCH = "qwen35"

# (field, key under "qwen35.", kind): every key the forward needs
_REQUIRED: tuple[tuple[str, str, str], ...] = (
    ("block_count", "block_count", "int"),
    ("n_embd", "embedding_length", "int"),
    ("n_ff", "feed_forward_length", "int"),
    ("n_head", "attention.head_count", "int"),
    ("n_head_kv", "attention.head_count_kv", "int"),
    ("head_dim", "attention.key_length", "int"),
    ("rms_eps", "attention.layer_norm_rms_epsilon", "float"),
    ("full_attention_interval", "full_attention_interval", "int"),
    ("n_rot", "rope.dimension_count", "int"),
    ("rope_base", "rope.freq_base", "float"),
    ("rope_sections", "rope.dimension_sections", "ints"),
    ("context_length", "context_length", "int"),
    ("conv_kernel", "ssm.conv_kernel", "int"),
    ("d_k", "ssm.state_size", "int"),
    ("k_heads", "ssm.group_count", "int"),
    ("v_heads", "ssm.time_step_rank", "int"),
    ("d_inner", "ssm.inner_size", "int"),
)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _read(kv: Mapping[str, Any], key: str, kind: str, required: bool = True) -> Any:
    if key not in kv:
        if required:
            raise FormatError(f"qwen35 metadata lacks the required key {key!r}")
        return None
    value = kv[key]
    ok_int = _is_int(value)
    if kind == "int" and ok_int:
        return int(value)
    if kind == "float" and (ok_int or isinstance(value, (float, np.floating))):
        return float(value)
    if kind == "ints" and isinstance(value, (list, tuple, np.ndarray)) and 1 <= len(value) <= 4:
        if all(_is_int(v) for v in value):
            return tuple(int(v) for v in value) + (0,) * (4 - len(value))
    want = {"int": "an integer", "float": "a number", "ints": "1 to 4 integers"}[kind]
    raise FormatError(f"qwen35 metadata key {key!r} should be {want}, not {value!r}")


@dataclass(frozen=True)
class Config:
    """Every size the qwen35 forward needs, read from GGUF metadata by `from_metadata`."""

    block_count: int  # as the file counts it, the MTP block included
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int  # attention.key_length (= value_length)
    rms_eps: float
    full_attention_interval: int
    n_rot: int  # rotary dims per head, the first n_rot of head_dim
    rope_base: float
    rope_sections: tuple[int, int, int, int]
    context_length: int
    conv_kernel: int
    d_k: int  # ssm.state_size: Gated-DeltaNet key head dim
    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    d_inner: int  # ssm.inner_size = v_heads * d_v
    n_nextn: int = 0  # nextn_predict_layers: trailing MTP blocks, not run here
    n_vocab: int | None = None  # len(tokenizer.ggml.tokens) when the metadata has it

    @classmethod
    def from_metadata(cls, kv: Mapping[str, Any]) -> Config:
        """Read `qwen35.*` keys (full names); FormatError names a missing or mistyped key."""
        arch = kv.get("general.architecture", ARCH)
        if arch != ARCH:
            raise FormatError(f"general.architecture is {arch!r}, not {ARCH!r}")
        values = {f: _read(kv, f"{ARCH}.{key}", kind) for f, key, kind in _REQUIRED}
        value_length = _read(kv, f"{ARCH}.attention.value_length", "int", required=False)
        n_nextn = _read(kv, f"{ARCH}.nextn_predict_layers", "int", required=False) or 0
        tokens = kv.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if isinstance(tokens, (list, tuple)) else None
        small = [key for f, key, kind in _REQUIRED if kind == "int" and values[f] < 1]
        if small:
            raise FormatError(f"qwen35 metadata key {ARCH}.{small[0]} is below 1")
        config = cls(**values, n_nextn=n_nextn, n_vocab=n_vocab)
        problems = [
            (value_length not in (None, config.head_dim), "value_length differs from key_length"),
            (config.rms_eps <= 0 or config.rope_base <= 0, "eps or rope.freq_base not positive"),
            (not 0 <= n_nextn < config.block_count, "nextn_predict_layers >= block_count"),
            (config.n_head % config.n_head_kv != 0, "head_count not a multiple of head_count_kv"),
            (config.v_heads % config.k_heads != 0, "time_step_rank not a multiple of group_count"),
            (config.d_inner % config.v_heads != 0, "inner_size not a multiple of time_step_rank"),
            (
                config.n_rot % 2 or config.n_rot > config.head_dim,
                "rope.dimension_count odd or > hd",
            ),
            (min(config.rope_sections) < 0 or sum(config.rope_sections) < 1, "rope sections"),
        ]
        for bad, what in problems:
            if bad:
                raise FormatError(f"qwen35 metadata inconsistent: {what}")
        # llama.cpp's per-layer override of the interval (qwen35.cpp load_arch_hparams): honoured
        # only where it says what the interval says
        recurrent = kv.get(f"{ARCH}.attention.recurrent_layers")
        if recurrent is not None and [bool(r) for r in recurrent][: config.n_layer] != [
            not config.is_attention(i) for i in range(config.n_layer)
        ]:
            raise FormatError("qwen35.attention.recurrent_layers disagrees with the interval")
        scaling = kv.get(f"{ARCH}.rope.scaling.type", "none")
        if scaling != "none":
            raise FormatError(f"qwen35.rope.scaling.type {scaling!r} is not supported")
        return config

    @property
    def n_layer(self) -> int:
        """Decoder layers the forward runs (block_count less the MTP blocks)."""
        return self.block_count - self.n_nextn

    @property
    def d_v(self) -> int:
        return self.d_inner // self.v_heads

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.d_k

    @property
    def conv_channels(self) -> int:
        """Channels of attn_qkv / ssm_conv1d: [q (key_dim) | k (key_dim) | v (d_inner)]."""
        return 2 * self.key_dim + self.d_inner

    def is_attention(self, layer: int) -> bool:
        """Whether layer `layer` is full attention (else Gated DeltaNet)."""
        return (layer + 1) % self.full_attention_interval == 0


def expected_shapes(config: Config, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Numpy shape of every tensor the forward reads (GGUF ne is the reverse). `output.weight`
    may be absent (tied to token_embd)."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, c.n_embd),
        "output_norm.weight": (c.n_embd,),
        "output.weight": (n_vocab, c.n_embd),
    }
    for i in range(c.n_layer):
        p = f"blk.{i}."
        layer = {
            "attn_norm.weight": (c.n_embd,),
            "post_attention_norm.weight": (c.n_embd,),
            "ffn_gate.weight": (c.n_ff, c.n_embd),
            "ffn_up.weight": (c.n_ff, c.n_embd),
            "ffn_down.weight": (c.n_embd, c.n_ff),
        }
        if c.is_attention(i):
            layer |= {
                "attn_q.weight": (2 * c.n_head * c.head_dim, c.n_embd),
                "attn_k.weight": (c.n_head_kv * c.head_dim, c.n_embd),
                "attn_v.weight": (c.n_head_kv * c.head_dim, c.n_embd),
                "attn_q_norm.weight": (c.head_dim,),
                "attn_k_norm.weight": (c.head_dim,),
                "attn_output.weight": (c.n_embd, c.n_head * c.head_dim),
            }
        else:
            layer |= {
                "attn_qkv.weight": (c.conv_channels, c.n_embd),
                "attn_gate.weight": (c.d_inner, c.n_embd),
                "ssm_alpha.weight": (c.v_heads, c.n_embd),
                "ssm_beta.weight": (c.v_heads, c.n_embd),
                "ssm_conv1d.weight": (c.conv_channels, c.conv_kernel),
                "ssm_a": (c.v_heads,),
                "ssm_dt.bias": (c.v_heads,),
                "ssm_norm.weight": (c.d_v,),
                "ssm_out.weight": (c.n_embd, c.d_inner),
            }
        shapes |= {p + name: shape for name, shape in layer.items()}
    return shapes


def _weight(weights: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in weights:
        raise FormatError(f"qwen35 weights lack the tensor {name!r}")
    w = np.asarray(weights[name], dtype=F32)
    if w.shape != shape:
        raise FormatError(f"tensor {name!r} has numpy shape {w.shape}, expected {shape}")
    return w


@dataclass
class State:
    """One sequence's cache: position, K/V per attention layer, conv and delta state per GDN layer.

    k[i], v[i]: (capacity, n_head_kv, head_dim) float32 with rows [0, pos) filled (keys after
    k-norm and rope). conv[i]: (conv_kernel - 1, conv_channels) float32, the last inputs of the
    conv (attn_qkv outputs, before the conv). ssm[i]: (v_heads, d_k, d_v) float32, tiled head
    order, S[h] mapping a key to a value as in transformers (llama.cpp's buffer holds each head
    transposed: ne (d_k, d_v, v_heads)).
    """

    pos: int = 0
    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)
    ssm: dict[int, np.ndarray] = field(default_factory=dict)

    @classmethod
    def new(cls, config: Config, capacity: int = 256) -> State:
        """An empty sequence; K/V buffers start at `capacity` rows and double as needed."""
        c, state = config, cls()
        for i in range(c.n_layer):
            if c.is_attention(i):
                state.k[i] = np.zeros((capacity, c.n_head_kv, c.head_dim), F32)
                state.v[i] = np.zeros((capacity, c.n_head_kv, c.head_dim), F32)
            else:
                state.conv[i] = np.zeros((c.conv_kernel - 1, c.conv_channels), F32)
                state.ssm[i] = np.zeros((c.v_heads, c.d_k, c.d_v), F32)
        return state

    def copy(self) -> State:
        def dup(d: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
            return {i: a.copy() for i, a in d.items()}

        return State(self.pos, dup(self.k), dup(self.v), dup(self.conv), dup(self.ssm))

    def keys(self, layer: int) -> np.ndarray:
        return self.k[layer][: self.pos]

    def values(self, layer: int) -> np.ndarray:
        return self.v[layer][: self.pos]

    def _append_kv(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        end = self.pos + k.shape[0]
        if end > self.k[layer].shape[0]:
            grow = max(end, 2 * self.k[layer].shape[0]) - self.k[layer].shape[0]
            pad = ((0, grow), (0, 0), (0, 0))
            self.k[layer] = np.pad(self.k[layer], pad)
            self.v[layer] = np.pad(self.v[layer], pad)
        self.k[layer][self.pos : end] = k
        self.v[layer][self.pos : end] = v


def attention_block(
    weights: Mapping[str, np.ndarray], config: Config, layer: int, x: np.ndarray, state: State
) -> np.ndarray:
    """Full-attention mixer of `layer` on normed x (T, n_embd); appends to state's K/V (state.pos
    is the first token's position and is advanced by `forward`, not here)."""
    c, p, t = config, f"blk.{layer}.", x.shape[0]
    hd, qk = c.head_dim, c.n_head * c.head_dim
    qg = linear(x, _weight(weights, p + "attn_q.weight", (2 * qk, c.n_embd)))
    qg = qg.reshape(t, c.n_head, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, qk)
    kv_shape = (c.n_head_kv * hd, c.n_embd)
    k = linear(x, _weight(weights, p + "attn_k.weight", kv_shape)).reshape(t, c.n_head_kv, hd)
    v = linear(x, _weight(weights, p + "attn_v.weight", kv_shape)).reshape(t, c.n_head_kv, hd)
    q = rms_norm(q, _weight(weights, p + "attn_q_norm.weight", (hd,)), c.rms_eps)
    k = rms_norm(k, _weight(weights, p + "attn_k_norm.weight", (hd,)), c.rms_eps)
    positions = np.arange(state.pos, state.pos + t)
    q = rope(q, positions, c.n_rot, c.rope_base, c.rope_sections)
    k = rope(k, positions, c.n_rot, c.rope_base, c.rope_sections)
    state._append_kv(layer, k, v)
    end = state.pos + t
    o = attention(q, state.k[layer][:end], state.v[layer][:end], positions, hd**-0.5)
    o = (o.reshape(t, qk) * sigmoid(gate)).astype(F32)
    return linear(o, _weight(weights, p + "attn_output.weight", (c.n_embd, qk)))


def gated_delta_net(
    weights: Mapping[str, np.ndarray],
    config: Config,
    layer: int,
    x: np.ndarray,
    state: State,
    delta_rule: Literal["recurrent", "chunked"] = "recurrent",
) -> np.ndarray:
    """Gated-DeltaNet mixer of `layer` on normed x (T, n_embd); updates state.conv/ssm[layer]."""
    c, p, t = config, f"blk.{layer}.", x.shape[0]
    vh = (c.v_heads,)
    qkv = linear(x, _weight(weights, p + "attn_qkv.weight", (c.conv_channels, c.n_embd)))
    z = linear(x, _weight(weights, p + "attn_gate.weight", (c.d_inner, c.n_embd)))
    b = linear(x, _weight(weights, p + "ssm_beta.weight", (c.v_heads, c.n_embd)))
    a = linear(x, _weight(weights, p + "ssm_alpha.weight", (c.v_heads, c.n_embd)))
    conv_w = _weight(weights, p + "ssm_conv1d.weight", (c.conv_channels, c.conv_kernel))
    mixed, state.conv[layer] = causal_conv1d(qkv, state.conv[layer], conv_w)
    mixed = silu(mixed)
    tiled = np.arange(c.v_heads) % c.k_heads  # value head j reads key head j % k_heads
    q = l2_norm(mixed[:, : c.key_dim].reshape(t, c.k_heads, c.d_k))[:, tiled]
    k = l2_norm(mixed[:, c.key_dim : 2 * c.key_dim].reshape(t, c.k_heads, c.d_k))[:, tiled]
    v = mixed[:, 2 * c.key_dim :].reshape(t, c.v_heads, c.d_v)
    beta = sigmoid(b)
    dt = softplus(a + _weight(weights, p + "ssm_dt.bias", vh))
    g = _weight(weights, p + "ssm_a", vh).astype(np.float64) * dt  # ssm_a = -exp(A_log)
    rule = gated_delta_rule_chunked if delta_rule == "chunked" else gated_delta_rule_recurrent
    o, state.ssm[layer] = rule(q, k, v, g, beta, state.ssm[layer], c.d_k**-0.5)
    o = rms_norm(o, _weight(weights, p + "ssm_norm.weight", (c.d_v,)), c.rms_eps)
    o = (o * silu(z.reshape(t, c.v_heads, c.d_v))).reshape(t, c.d_inner)
    return linear(o, _weight(weights, p + "ssm_out.weight", (c.n_embd, c.d_inner)))


def ffn(weights: Mapping[str, np.ndarray], config: Config, layer: int, x: np.ndarray) -> np.ndarray:
    """SwiGLU: ffn_down(silu(ffn_gate x) * ffn_up x)."""
    c, p = config, f"blk.{layer}."
    gate = linear(x, _weight(weights, p + "ffn_gate.weight", (c.n_ff, c.n_embd)))
    up = linear(x, _weight(weights, p + "ffn_up.weight", (c.n_ff, c.n_embd)))
    return linear(silu(gate) * up, _weight(weights, p + "ffn_down.weight", (c.n_embd, c.n_ff)))


def forward(
    weights: Mapping[str, np.ndarray],
    config: Config,
    tokens: np.ndarray,
    state: State,
    *,
    delta_rule: Literal["recurrent", "chunked"] = "recurrent",
    trace: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Logits (len(tokens), n_vocab) float32 of `tokens` following `state`, which is advanced.

    `trace`, when given, receives the intermediate float32 activations (T, n_embd): "inp_embd",
    per layer i "blk.{i}.attn_norm" (mixer input), "blk.{i}.attn_out" (mixer output),
    "blk.{i}.ffn_inp" (after the first residual), "blk.{i}.ffn_out", "blk.{i}.l_out" (layer
    output), and "result_norm" (after output_norm).
    """
    c = config
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array, not {tokens.dtype} {tokens.shape}")
    if "token_embd.weight" not in weights:
        raise FormatError("qwen35 weights lack the tensor 'token_embd.weight'")
    n_vocab = np.shape(weights["token_embd.weight"])[0]
    if c.n_vocab is not None and n_vocab != c.n_vocab:
        raise FormatError(f"token_embd has {n_vocab} rows, the metadata {c.n_vocab} tokens")
    if delta_rule not in ("recurrent", "chunked"):
        raise ValueError(f"delta_rule must be 'recurrent' or 'chunked', not {delta_rule!r}")
    embd = _weight(weights, "token_embd.weight", (n_vocab, c.n_embd))
    if tokens.size == 0:
        return np.zeros((0, n_vocab), F32)
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise ValueError(f"token ids must lie in [0, {n_vocab})")
    record = trace if trace is not None else {}
    x = embd[tokens]
    record["inp_embd"] = x
    for i in range(c.n_layer):
        p = f"blk.{i}."
        h = rms_norm(x, _weight(weights, p + "attn_norm.weight", (c.n_embd,)), c.rms_eps)
        if c.is_attention(i):
            mixed = attention_block(weights, c, i, h, state)
        else:
            mixed = gated_delta_net(weights, c, i, h, state, delta_rule)
        x = (x + mixed).astype(F32)
        record[p + "attn_norm"], record[p + "attn_out"], record[p + "ffn_inp"] = h, mixed, x
        h = rms_norm(x, _weight(weights, p + "post_attention_norm.weight", (c.n_embd,)), c.rms_eps)
        out = ffn(weights, c, i, h)
        x = (x + out).astype(F32)
        record[p + "ffn_out"], record[p + "l_out"] = out, x
    state.pos += tokens.size
    x = rms_norm(x, _weight(weights, "output_norm.weight", (c.n_embd,)), c.rms_eps)
    record["result_norm"] = x
    head = "output.weight" if "output.weight" in weights else "token_embd.weight"
    return linear(x, _weight(weights, head, (n_vocab, c.n_embd)))
