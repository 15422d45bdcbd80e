"""`pyq2 demo`: the whole offline flow on a small, generated, Bonsai-like model.

write_demo_model() builds a deterministic PQ2_0 GGUF (no download): qwen35-style metadata, a
few layers of hidden 256 / FFN 768 / vocab 1024, the output head in PTQ1_0, F32 norms. It is a
FOLDED model, as Ternary-Bonsai-2 files are: every projection is gaussian float weights W folded
with the Prism Hadamard rotation (W' = W diag(s) H, block 128, explicit signs per input width;
the token embedding with the inverse) and then quantised by the reference quantizer
(pyq2.formats.pq2_quantize), with the prism.hadamard.* contract that says so. Its unfolded float
weights are reference.unfold of the stored ones. run_demo() repacks it to the tile-major layout,
verifies the result and reports.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import formats, gguf_io, reference
from .gguf_io import GGUFValueType as V
from .gguf_io import OutTensor
from .gguf_types import F32, PQ2_0, PTQ1_0
from .info import format_info
from .repack import repack
from .rotation import contract_keys
from .verify import verify

ARCH = "qwen35"
HADAMARD_BLOCK = 128


def _weight_shapes(n_layers: int, hidden: int, ffn: int, vocab: int, n_head: int, n_head_kv: int):
    """(name, K, N) of every PQ2_0 weight; K is the input width."""
    head_dim = hidden // n_head
    shapes = [("token_embd.weight", hidden, vocab)]
    for i in range(n_layers):
        b = f"blk.{i}."
        shapes += [
            (b + "attn_q.weight", hidden, n_head * head_dim),
            (b + "attn_k.weight", hidden, n_head_kv * head_dim),
            (b + "attn_v.weight", hidden, n_head_kv * head_dim),
            (b + "attn_output.weight", n_head * head_dim, hidden),
            (b + "ffn_gate.weight", hidden, ffn),
            (b + "ffn_up.weight", hidden, ffn),
            (b + "ffn_down.weight", ffn, hidden),
        ]
    return shapes


def write_demo_model(
    path,
    seed: int = 0,
    n_layers: int = 2,
    hidden: int = 256,
    ffn: int = 768,
    vocab: int = 1024,
    n_head: int = 4,
    n_head_kv: int = 1,
) -> Path:
    """Write the demo model to `path` (same seed and sizes give the same bytes) and return it."""
    if hidden % HADAMARD_BLOCK or ffn % HADAMARD_BLOCK or hidden % n_head:
        raise ValueError(
            f"hidden ({hidden}) and ffn ({ffn}) must be multiples of "
            f"{HADAMARD_BLOCK}, hidden of n_head ({n_head})"
        )
    rng = np.random.default_rng(seed)
    signs = {w: rng.choice(np.array([-1, 1], np.int32), w) for w in sorted({hidden, ffn})}
    tensors: list[tuple[OutTensor, np.ndarray]] = []

    def pq2(name, k, n, ptq1=False):
        w = rng.standard_normal((n, k)) * 0.02
        # folded weights read rotated activations; the embedding's rows are rotated forward,
        # so that the host's inverse after the lookup gives the float row back
        w = reference.fold(w, HADAMARD_BLOCK, signs[k])
        raw = formats.pq2_quantize(w)
        if ptq1:
            data = formats.pq2_to_ptq1(raw, blocks_per_row=k // 128)
            tensors.append((OutTensor(name, PTQ1_0, (k, n), data.nbytes), data))
        else:
            tensors.append((OutTensor(name, PQ2_0, (k, n), raw.nbytes), raw))

    def f32(name, n):
        data = (1.0 + 0.1 * rng.standard_normal(n)).astype("<f4")
        tensors.append((OutTensor(name, F32, (n,), data.nbytes), data))

    folded = []
    for name, k, n in _weight_shapes(n_layers, hidden, ffn, vocab, n_head, n_head_kv):
        pq2(name, k, n)
        if name.startswith("blk."):
            folded.append(name)
        if name.endswith("attn_v.weight"):
            f32(name.replace("attn_v", "attn_norm"), hidden)
        if name.endswith("ffn_down.weight"):
            f32(name.replace("ffn_down", "ffn_norm"), hidden)
    f32("output_norm.weight", hidden)
    pq2("output.weight", hidden, vocab, ptq1=True)
    folded.append("output.weight")

    tokens = [f"<tok{i}>" for i in range(vocab)]
    kv: list[tuple[Any, ...]] = [
        ("general.architecture", V.STRING, ARCH),
        ("general.name", V.STRING, "pyq2 demo (Bonsai-like)"),
        ("general.file_type", V.UINT32, 141),  # LLAMA_FTYPE_MOSTLY_PQ2_0
        ("general.quantization_version", V.UINT32, 2),
        (f"{ARCH}.block_count", V.UINT32, n_layers),
        (f"{ARCH}.context_length", V.UINT32, 4096),
        (f"{ARCH}.embedding_length", V.UINT32, hidden),
        (f"{ARCH}.feed_forward_length", V.UINT32, ffn),
        (f"{ARCH}.attention.head_count", V.UINT32, n_head),
        (f"{ARCH}.attention.head_count_kv", V.UINT32, n_head_kv),
        (f"{ARCH}.attention.layer_norm_rms_epsilon", V.FLOAT32, 1e-6),
        (f"{ARCH}.rope.freq_base", V.FLOAT32, 1e7),
        ("tokenizer.ggml.model", V.STRING, "gpt2"),
        ("tokenizer.ggml.tokens", V.ARRAY, tokens, V.STRING),
        ("tokenizer.ggml.token_type", V.ARRAY, np.ones(vocab, np.int32), V.INT32),
        ("tokenizer.ggml.add_bos_token", V.BOOL, False),
    ]
    types = {str: V.STRING, bool: V.BOOL, int: V.UINT32}
    for key, value in contract_keys(HADAMARD_BLOCK, signs, folded, ["token_embd.weight"]):
        if isinstance(value, (list, np.ndarray)):
            is_str = len(value) and isinstance(value[0], str)
            kv.append((key, V.ARRAY, value, V.STRING if is_str else V.INT32))
        else:
            kv.append((key, types[type(value)], value))
    records = [gguf_io.encode_kv(*item) for item in kv]
    gguf_io.write_gguf(path, records, [t for t, _ in tensors], lambda i, t: (tensors[i][1],))
    return Path(path)


def run_demo(out_dir=None, echo=print) -> dict:
    """Generate the demo model in out_dir (a new temporary directory by default), repack it to
    tiles, verify, and echo info and the summary. Returns the paths and results."""
    out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="pyq2-demo-"))
    os.makedirs(out_dir, exist_ok=True)
    model = write_demo_model(out_dir / "demo-bonsai-pq2.gguf")
    echo(f"generated {model} ({model.stat().st_size / 1e6:.2f} MB, seed 0)")
    summary = repack(model, layout="tiles", rt=2, force=True)
    result = verify(model, summary.out_path)
    echo("")
    echo(format_info(summary.out_path))
    echo("")
    echo(summary.line())
    echo(("verify: " if result.ok else "verify FAILED: ") + result.message)
    return {"model": str(model), "repacked": summary.out_path, "summary": summary, "verify": result}
