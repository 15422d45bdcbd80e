"""The architecture map: a model file's tensors in the order of one decode step's weight path.

pyq2 serves the `qwen35` architecture of Ternary-Bonsai-2 (Qwen3.5 layout): a token embedding,
then per layer either Gated-DeltaNet (recurrent) or full attention, each followed by a SwiGLU
FFN, then the output head. Which layers are attention comes from the file itself: the tensors a
layer holds (attn_q for attention, attn_qkv / ssm_out for Gated-DeltaNet), checked against
`qwen35.full_attention_interval` when the file has it.

`decode_plan(names, kv)` returns the weight path as a list of Stages. A stage is one producer of
a matmul's activation (the RMSNorm of the residual stream, the SwiGLU, or the mixer's output)
and the projections that read it: one producer serves every projection reading the same
activation. The non-weight work between stages (attention, the recurrence, the convolution,
the residual adds) is the host's; pyq2 does not run it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import FormatError
from ..keyvalues import Keys, KeyValues

ARCHITECTURES = ("qwen35",)

GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight")
# Tensors of every layer, then those of each mixer kind (suffixes after "blk.N.").
LAYER_TENSORS = (
    "attn_norm.weight",
    "post_attention_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
ATTENTION_TENSORS = (
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
)
RECURRENT_TENSORS = (
    "attn_qkv.weight",
    "attn_gate.weight",
    "ssm_alpha.weight",
    "ssm_beta.weight",
    "ssm_out.weight",
    "ssm_conv1d.weight",
    "ssm_a",
    "ssm_dt.bias",
    "ssm_norm.weight",
)
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Dims:
    """The sizes of a qwen35 model: what its tensor shapes and metadata follow from."""

    n_layers: int
    hidden: int
    ffn: int
    vocab: int
    n_head: int  # attention: query heads, K/V heads, head width
    n_head_kv: int
    head_dim: int
    v_heads: int  # Gated-DeltaNet: V heads, K heads, head width
    k_heads: int
    ssm_head_dim: int
    attention_interval: int  # layer i is full attention when (i + 1) % interval == 0

    def is_attention(self, layer: int) -> bool:
        return (layer + 1) % self.attention_interval == 0

    def keys(self, arch: str = "qwen35", eps: float = 1e-6, context: int = 4096) -> Keys:
        """The architecture's metadata keys of these sizes (Qwen3.5's rotary embedding: a
        quarter of each head, base 1e7, rope_sections)."""
        rope = self.head_dim // 4
        return Keys(
            {
                "general.architecture": arch,
                f"{arch}.block_count": self.n_layers,
                f"{arch}.embedding_length": self.hidden,
                f"{arch}.feed_forward_length": self.ffn,
                f"{arch}.attention.head_count": self.n_head,
                f"{arch}.attention.head_count_kv": self.n_head_kv,
                f"{arch}.attention.key_length": self.head_dim,
                f"{arch}.attention.value_length": self.head_dim,
                f"{arch}.attention.layer_norm_rms_epsilon": eps,
                f"{arch}.full_attention_interval": self.attention_interval,
                f"{arch}.ssm.conv_kernel": 4,
                f"{arch}.ssm.state_size": self.ssm_head_dim,
                f"{arch}.ssm.group_count": self.k_heads,
                f"{arch}.ssm.time_step_rank": self.v_heads,
                f"{arch}.ssm.inner_size": self.v_heads * self.ssm_head_dim,
                f"{arch}.context_length": context,
                f"{arch}.rope.freq_base": 1e7,
                f"{arch}.rope.dimension_count": rope,
                f"{arch}.rope.dimension_sections": rope_sections(rope),
            }
        )

    def tensors(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, kind, ne) of every tensor in file order: kind "pq2" for the folded projections
        and the embedding (ne = (K, N)), "dense" for norms, the un-folded ssm_alpha / ssm_beta
        and the recurrence's parameters."""
        out: list[tuple[str, str, tuple[int, ...]]] = [
            ("token_embd.weight", "pq2", (self.hidden, self.vocab))
        ]
        for i in range(self.n_layers):
            out += self._layer(i)
        return out + [
            ("output_norm.weight", "dense", (self.hidden,)),
            ("output.weight", "pq2", (self.hidden, self.vocab)),
        ]

    def _layer(self, i: int) -> list[tuple[str, str, tuple[int, ...]]]:
        b, hidden = f"blk.{i}.", self.hidden
        out: list[tuple[str, str, tuple[int, ...]]] = [(b + "attn_norm.weight", "dense", (hidden,))]
        if self.is_attention(i):
            hd = self.head_dim
            q, kv = self.n_head * hd, self.n_head_kv * hd
            out += [
                (b + "attn_q.weight", "pq2", (hidden, 2 * q)),  # the queries and the output gate
                (b + "attn_k.weight", "pq2", (hidden, kv)),
                (b + "attn_v.weight", "pq2", (hidden, kv)),
                (b + "attn_q_norm.weight", "dense", (hd,)),
                (b + "attn_k_norm.weight", "dense", (hd,)),
                (b + "attn_output.weight", "pq2", (q, hidden)),
            ]
        else:
            hd, vh = self.ssm_head_dim, self.v_heads
            inner, qk = vh * hd, self.k_heads * hd
            out += [
                (b + "attn_qkv.weight", "pq2", (hidden, 2 * qk + inner)),
                (b + "attn_gate.weight", "pq2", (hidden, inner)),
                (b + "ssm_alpha.weight", "dense", (hidden, vh)),
                (b + "ssm_beta.weight", "dense", (hidden, vh)),
                (b + "ssm_conv1d.weight", "dense", (4, 2 * qk + inner)),
                (b + "ssm_a", "dense", (vh,)),
                (b + "ssm_dt.bias", "dense", (vh,)),
                (b + "ssm_norm.weight", "dense", (hd,)),
                (b + "ssm_out.weight", "pq2", (inner, hidden)),
            ]
        return out + [
            (b + "post_attention_norm.weight", "dense", (hidden,)),
            (b + "ffn_gate.weight", "pq2", (hidden, self.ffn)),
            (b + "ffn_up.weight", "pq2", (hidden, self.ffn)),
            (b + "ffn_down.weight", "pq2", (self.ffn, hidden)),
        ]


def rope_sections(rope_dim: int) -> list[int]:
    """Qwen3.5's four multi-axis rope sections for rope_dim rotated dimensions, as the 27B's
    11:11:10 of 32 pairs: the interleaved sections then cover every pair, so that for text (every
    axis at the token's position) each pair rotates."""
    pairs = rope_dim // 2
    t = -(-pairs // 3)
    return [t, t, pairs - 2 * t, 0]


# Ternary-Bonsai-2-27B, and a small model of the same structure (the demo's sizes).
PRESETS = {
    "bonsai-2-27b": Dims(64, 5120, 17408, 248320, 24, 4, 256, 48, 16, 128, 4),
    "tiny": Dims(2, 256, 768, 1024, 4, 1, 64, 4, 2, 64, 2),
}


@dataclass(frozen=True)
class Stage:
    """One producer and the projections that read its output.

    producer: "norm" (residual stream -> RMSNorm with `norm`), "swiglu" (the FFN's gate and up
    outputs), "mixer" (the attention or recurrence output, `permute` for the Gated-DeltaNet
    V-head order). projections: the weights in the matmul's order; unrotated: weights that read
    the same activation un-rotated (small un-folded projections such as ssm_alpha).
    """

    layer: int  # -1 for the embedding and the head
    producer: str
    projections: tuple[str, ...]
    norm: str | None = None
    unrotated: tuple[str, ...] = ()
    permute: bool = False


@dataclass(frozen=True)
class Plan:
    architecture: str
    n_layers: int
    attention_layers: tuple[int, ...]
    embedding: str
    stages: tuple[Stage, ...]
    eps: float
    v_heads: int = 0  # Gated-DeltaNet V heads and K heads (ssm.time_step_rank, ssm.group_count)
    k_heads: int = 0

    def weights(self) -> list[str]:
        """Every ternary weight the plan reads (the embedding and the projections), in order."""
        names = [self.embedding]
        for s in self.stages:
            names += list(s.projections)
        return names


def _layer_kinds(names: set[str], n_layers: int, interval: int | None) -> tuple[int, ...]:
    attention = []
    for i in range(n_layers):
        has_attn = f"blk.{i}.attn_q.weight" in names
        has_rec = f"blk.{i}.attn_qkv.weight" in names or f"blk.{i}.ssm_out.weight" in names
        if has_attn == has_rec:
            what = "both attention and Gated-DeltaNet" if has_attn else "no mixer"
            raise FormatError(f"layer {i} holds {what} tensors (attn_q / attn_qkv, ssm_out)")
        if interval and has_attn != ((i + 1) % interval == 0):
            raise FormatError(
                f"layer {i} is {'attention' if has_attn else 'Gated-DeltaNet'} but "
                f"full_attention_interval = {interval} says otherwise"
            )
        if has_attn:
            attention.append(i)
    return tuple(attention)


def check_names(names: Iterable[str], n_layers: int) -> None:
    """FormatError naming the tensors the qwen35 map does not know (up to 8 of them)."""
    known_layer = set(LAYER_TENSORS + ATTENTION_TENSORS + RECURRENT_TENSORS)
    unknown = []
    for name in names:
        m = _LAYER.match(name)
        if m:
            if int(m.group(1)) >= n_layers or m.group(2) not in known_layer:
                unknown.append(name)
        elif name not in GLOBAL_TENSORS:
            unknown.append(name)
    if unknown:
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise FormatError(
            f"tensors the qwen35 architecture map does not know: {', '.join(unknown[:8])}{more}"
        )


def _required(names: set[str], wanted: Iterable[str]) -> None:
    missing = [n for n in wanted if n not in names]
    if missing:
        raise FormatError(f"the model lacks {', '.join(missing[:8])}")


def decode_plan(tensor_names: Iterable[str], kv: KeyValues) -> Plan:
    """The weight path of one decode step (module docstring) of a file's tensors and keys."""
    arch = kv.value("general.architecture")
    if arch not in ARCHITECTURES:
        raise FormatError(
            f"architecture {arch!r} is not served (pyq2 knows {', '.join(ARCHITECTURES)})"
        )
    n_layers = kv.value(f"{arch}.block_count")
    if not isinstance(n_layers, int) or n_layers <= 0:
        raise FormatError(f"{arch}.block_count is {n_layers!r}, not a positive integer")
    interval = kv.value(f"{arch}.full_attention_interval")
    eps = float(kv.value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
    names = list(tensor_names)
    check_names(names, n_layers)
    present = set(names)
    _required(present, GLOBAL_TENSORS)
    attention = _layer_kinds(present, n_layers, interval if isinstance(interval, int) else None)
    stages = []
    for i in range(n_layers):
        b = f"blk.{i}."
        attn = i in attention
        mixer_in = ("attn_q", "attn_k", "attn_v") if attn else ("attn_qkv", "attn_gate")
        mixer_out = "attn_output" if attn else "ssm_out"
        side = () if attn else ("ssm_alpha", "ssm_beta")
        _required(present, [b + s + ".weight" for s in mixer_in + side + (mixer_out,)])
        _required(present, [b + s for s in LAYER_TENSORS])
        stages += [
            Stage(
                i,
                "norm",
                tuple(b + s + ".weight" for s in mixer_in),
                norm=b + "attn_norm.weight",
                unrotated=tuple(b + s + ".weight" for s in side),
            ),
            Stage(i, "mixer", (b + mixer_out + ".weight",), permute=not attn),
            Stage(
                i,
                "norm",
                (b + "ffn_gate.weight", b + "ffn_up.weight"),
                norm=b + "post_attention_norm.weight",
            ),
            Stage(i, "swiglu", (b + "ffn_down.weight",)),
        ]
    stages.append(Stage(-1, "norm", ("output.weight",), norm="output_norm.weight"))
    v_heads = k_heads = 0
    if len(attention) < n_layers:
        v_heads = kv.value(f"{arch}.ssm.time_step_rank")
        k_heads = kv.value(f"{arch}.ssm.group_count")
        if not (isinstance(v_heads, int) and isinstance(k_heads, int)) or (
            k_heads <= 0 or v_heads <= 0 or v_heads % k_heads
        ):
            raise FormatError(
                f"{arch}.ssm.time_step_rank = {v_heads!r} (V heads) and {arch}.ssm.group_count "
                f"= {k_heads!r} (K heads) must be positive integers, V a multiple of K"
            )
    return Plan(
        arch, n_layers, attention, "token_embd.weight", tuple(stages), eps, v_heads, k_heads
    )
