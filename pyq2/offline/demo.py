"""`pyq2 demo`: the whole offline flow on a small, generated, Bonsai-like model.

write_demo_model() builds a deterministic PQ2_0 GGUF (no download) in the qwen35 layout of
Ternary-Bonsai-2: a Gated-DeltaNet layer and a full-attention layer (by default) of hidden 256 /
FFN 768 / vocab 1024, the output head in PTQ1_0, F32 norms and recurrence parameters. It is a
FOLDED model, as Ternary-Bonsai-2 files are: every projection is gaussian float weights W folded
with the Prism Hadamard rotation (W' = W diag(s) H, block 128, explicit signs per input width;
the token embedding with the inverse) and then quantised by the reference quantizer
(pyq2.spec.formats.pq2_quantize), with the prism.hadamard.* contract that says so. Its unfolded
float weights are reference.unfold of the stored ones. run_demo() repacks it to the tile-major
layout, verifies the result and reports; without a directory it works in a new temporary one,
removed at the end (also when interrupted) unless asked to keep it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .. import atomic, interrupts
from ..gguf import io as gguf_io
from ..gguf.contents import read_contents
from ..gguf.float_weights import read_float_weights
from ..gguf.io import GGUFValueType as V
from ..gguf.io import OutTensor
from ..gguf.metadata import KEY_PREFIX
from ..gguf.types import F32, PQ2_0, PTQ1_0
from ..plan.decode import Dims
from ..spec import formats, reference
from ..spec.rotation import PREFIX as ROTATION_PREFIX
from ..spec.rotation import contract_keys
from ..text.demo_vocab import MIN_VOCAB, demo_tokenizer_metadata
from .info import format_info
from .repack import repack
from .verify import verify

ARCH = "qwen35"
HADAMARD_BLOCK = 128


EMBEDDING_SCALE = 0.1  # the residual stream: about twice what the layers add to it
RANDOM_HEAD_SCALE = 0.25  # head "random": logits of a few units on normed rows
NEXT_HEAD_SCALE = 0.04  # head "next": the predicted token's logit about 10


def dense_values(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The demo's dense tensors, in the file's conventions (FORMATS.md 6.2): norms
    stored as their multipliers (about 1), a decaying recurrence (ssm_a = -exp(A_log) with A_log
    in [log 1, log 16]), a small dt bias, a convolution that passes its input on."""
    shape = ne[::-1]
    if name.endswith("ssm_a"):
        return -np.exp(rng.uniform(np.log(1.0), np.log(16.0), shape))
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-2.0, 0.0, shape)
    if name.endswith("ssm_conv1d.weight"):
        return 0.3 + 0.2 * rng.standard_normal(shape)
    if len(ne) == 1:  # norm weights
        return 1.0 + 0.1 * rng.standard_normal(shape)
    return 0.02 * rng.standard_normal(shape)


def tokenizer_keys(vocab: int) -> list[tuple[Any, ...]]:
    """The tokenizer.* records of a byte-level BPE vocabulary of `vocab` tokens; below
    MIN_VOCAB (the fuzzer's tiny models) placeholder tokens that no tokenizer accepts."""
    out: list[tuple[Any, ...]] = []
    if vocab < MIN_VOCAB:
        return [
            ("tokenizer.ggml.model", V.STRING, "gpt2"),
            ("tokenizer.ggml.tokens", V.ARRAY, [f"<tok{i}>" for i in range(vocab)], V.STRING),
            ("tokenizer.ggml.token_type", V.ARRAY, np.ones(vocab, np.int32), V.INT32),
        ]
    for key, value in demo_tokenizer_metadata(vocab).items():
        out.append(gguf_io.typed(key, value))
    return out


def write_demo_model(
    path,
    seed: int = 0,
    n_layers: int = 2,
    hidden: int = 256,
    ffn: int = 768,
    vocab: int = 1024,
    n_head: int = 4,
    n_head_kv: int = 1,
    head_dim: int = 64,
    v_heads: int = 4,
    k_heads: int = 2,
    attention_interval: int = 2,
    head: str = "next",
    force: bool = True,
) -> Path:
    """Write the demo model to `path` (same seed and sizes give the same bytes) and return it.
    Layer i is full attention when (i + 1) % attention_interval == 0, else Gated-DeltaNet.

    head "next": the output head's row of token perm(t) is the embedding row of t (perm a fixed
    random permutation), so the model mostly predicts perm(current token) with a margin far above
    the Q8 activations' error: greedy decoding is the same on every path. head "random": gaussian
    rows, logits whose top two are often close (what the logit comparisons want: every part of
    the model moves them)."""
    if head not in ("next", "random"):
        raise ValueError(f"head {head!r} is not 'next' or 'random'")
    dims = Dims(
        n_layers, hidden, ffn, vocab, n_head, n_head_kv, head_dim, v_heads, k_heads, head_dim,
        attention_interval,
    )  # fmt: skip
    widths = {hidden, ffn, n_head * head_dim, v_heads * head_dim}
    if any(w % HADAMARD_BLOCK for w in widths) or v_heads % k_heads:
        raise ValueError(
            f"every input width ({sorted(widths)}) must be a multiple of {HADAMARD_BLOCK}, "
            f"v_heads ({v_heads}) of k_heads ({k_heads})"
        )
    rng = np.random.default_rng(seed)
    signs = {w: rng.choice(np.array([-1, 1], np.int32), w) for w in sorted(widths)}
    tensors: list[tuple[OutTensor, np.ndarray]] = []

    floats: dict[str, np.ndarray] = {}
    perm = rng.permutation(vocab)

    def pq2(name, k, n, ptq1=False):
        scale = EMBEDDING_SCALE if name == "token_embd.weight" else 0.02
        w = rng.standard_normal((n, k)) * scale
        if name == "output.weight":
            w = w / scale * RANDOM_HEAD_SCALE
            if head == "next":  # row perm[t] = the embedding row of t
                w = np.empty_like(w)
                w[perm] = floats["token_embd.weight"] * (NEXT_HEAD_SCALE / EMBEDDING_SCALE)
        floats[name] = w
        # folded weights read rotated activations; the embedding's rows are rotated forward,
        # so that the host's inverse after the lookup gives the float row back
        w = reference.fold(w, HADAMARD_BLOCK, signs[k])
        raw = formats.pq2_quantize(w)
        if ptq1:
            data = formats.pq2_to_ptq1(raw, blocks_per_row=k // 128)
            tensors.append((OutTensor(name, PTQ1_0, (k, n), data.nbytes), data))
        else:
            tensors.append((OutTensor(name, PQ2_0, (k, n), raw.nbytes), raw))

    def f32(name, ne):
        data = dense_values(name, ne, rng).astype("<f4")
        tensors.append((OutTensor(name, F32, ne, data.nbytes), data))

    folded = []
    for name, kind, ne in dims.tensors():
        if kind == "dense":
            f32(name, ne)
        else:
            k, n = ne
            pq2(name, k, n, ptq1=name == "output.weight")
            if name != "token_embd.weight":
                folded.append(name)

    records = model_records(dims, "pyq2 demo (Bonsai-like)", HADAMARD_BLOCK, signs, folded)
    atomic.check_output(os.fspath(path), force)
    with atomic.atomic_output(path, force=force) as staged:
        gguf_io.write_gguf(staged, records, [t for t, _ in tensors], lambda i, t: (tensors[i][1],))
    return Path(path)


def model_records(
    dims: Dims, name: str, block: int, signs: dict[int, Any], folded: list[str]
) -> list[Any]:
    """The metadata records of a generated folded qwen35 file of `dims`: the architecture's
    keys, the name, PQ2_0 as the file type, the tokenizer (tokenizer_keys) and the rotation
    contract of `block` with explicit `signs` over the `folded` weights (the token embedding
    folded with the inverse)."""
    arch_keys = [gguf_io.typed(k, v) for k, v in dims.keys(ARCH).items()]
    kv: list[tuple[Any, ...]] = [
        *arch_keys[:1],
        ("general.name", V.STRING, name),
        ("general.file_type", V.UINT32, 141),  # LLAMA_FTYPE_MOSTLY_PQ2_0
        ("general.quantization_version", V.UINT32, 2),
        *arch_keys[1:],
        *tokenizer_keys(dims.vocab),
    ]
    types = {str: V.STRING, bool: V.BOOL, int: V.UINT32}
    for key, value in contract_keys(block, signs, folded, ["token_embd.weight"], True):
        if isinstance(value, (list, np.ndarray)):
            is_str = len(value) and isinstance(value[0], str)
            kv.append((key, V.ARRAY, value, V.STRING if is_str else V.INT32))
        else:
            kv.append((key, types[type(value)], value))
    return [gguf_io.encode_kv(*item) for item in kv]


def write_float_twin(src, path) -> Path:
    """Write the float twin of a folded model file: the same model with every tensor as F32 in
    the file's own conventions (pyq2.gguf.float_weights: weights dequantised and unfolded), its
    metadata less the rotation contract and pyq2's own keys, general.file_type 0 (all F32). A
    reader that knows neither PQ2_0 nor the rotation (transformers' GGUF integration, llama.cpp)
    loads it as a plain qwen35 model."""
    with gguf_io.open_gguf(src) as gf:
        weights = read_float_weights(gf)
        records = []
        for key in gf.keys():
            if key.startswith((ROTATION_PREFIX, KEY_PREFIX)):
                continue
            if key == "general.file_type":
                records.append(gguf_io.encode_kv(key, V.UINT32, 0))  # LLAMA_FTYPE_ALL_F32
            else:
                records.append(gf.kv_record(key))
        names = [e.name for e in read_contents(gf, check_bytes=False).entries]
    tensors = []
    for name in names:
        data = np.ascontiguousarray(weights[name], dtype="<f4")
        tensors.append((OutTensor(name, F32, tuple(reversed(data.shape)), data.nbytes), data))
    with atomic.atomic_output(path, force=True) as staged:
        gguf_io.write_gguf(staged, records, [t for t, _ in tensors], lambda i, t: (tensors[i][1],))
    return Path(path)


DEMO_FILES = ("demo-bonsai-pq2.gguf", "demo-bonsai-pq2.pyq2-tiles.gguf")


def run_demo(out_dir=None, echo=print, keep: bool = False, then=None, force: bool = False) -> dict:
    """Generate the demo model in out_dir, repack it to tiles, verify, and echo info and the
    summary; then `then(result)` while the files are there (the command generates text from the
    repacked file). Returns the paths and results.

    In out_dir, a demo file (DEMO_FILES) that exists, or a symlink in its place, is refused
    before anything is written (RepackError) unless `force`, which replaces it (through a
    symlink, its target, as repack --force does). Without out_dir the files go to a new
    temporary directory, removed at the end (the returned paths then name removed files) unless
    `keep`; the last line echoed says which.
    """
    if out_dir is not None:
        for name in DEMO_FILES:
            atomic.check_output(os.path.join(out_dir, name), force)
        return _demo_in(Path(out_dir), echo, then, force)
    tmp: str | None = None
    try:
        with interrupts.deferred():
            tmp = tempfile.mkdtemp(prefix="pyq2-demo-")
        result = _demo_in(Path(tmp), echo, then)
    finally:
        if tmp is not None and not keep:
            with interrupts.deferred():
                shutil.rmtree(tmp, ignore_errors=True)
    if keep:
        echo(f"kept the demo files in {tmp}")
    else:
        echo(f"removed the temporary directory {tmp} (-o DIR or --keep keeps the files)")
    return result


def _demo_in(out_dir: Path, echo, then=None, force: bool = True) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    model = write_demo_model(out_dir / DEMO_FILES[0], force=force)
    echo(f"generated {model} ({model.stat().st_size / 1e6:.2f} MB, seed 0)")
    summary = repack(model, out_dir / DEMO_FILES[1], layout="tiles", rt=2, force=force)
    result = verify(model, summary.out_path)
    echo("")
    echo(format_info(summary.out_path))
    echo("")
    echo(summary.line())
    echo(("verify: " if result.ok else "verify FAILED: ") + result.message)
    out = {"model": str(model), "repacked": summary.out_path, "summary": summary, "verify": result}
    if then is not None and result.ok:
        then(out)
    return out
