"""`pyq2 bench --whole`: the whole model on the GPU (pyq2.runtime.gpu_model), in tokens per second
of a generation.

For each batch size B it runs B random prompts of `prompt` tokens (one sequence after another, in
chunks) and then `decode` greedy decode steps of all B sequences together, each step a CUDA graph
replay chained on the last one's choice as generate runs them, and reports the time to first token
(the whole batch's prompts), decode tokens/s, the time per decode step and its parts, each timed
alone as a CUDA graph at the final attention span: the weight path (embedding, producers,
projections, side projections overlapping them as in the step), attention, the recurrence, and the
rest (sampling, the ids back to the host, launch gaps: the step less the three). The byte floor of
one decode step counts every projection's weights and the embedding rows, the recurrent and
convolution states read and written, and the KV cache read at the last step's positions, over the
read bandwidth of the same run.
"""

from __future__ import annotations

import time
from typing import Any

from ..lib.optional import require_torch
from ..spec import qwen35
from ..text.sampling import SamplingParams
from .gpu_model import GpuModel
from .load import Model
from .timing import graph_ms


def state_bytes(config: qwen35.Config, b: int, positions: int, cache_itemsize: int = 2) -> int:
    """Bytes of the mixers' state one decode step of b sequences must touch: the recurrent state
    (fp32) and the conv state read and written per Gated-DeltaNet layer, the K and V cache read
    up to `positions` per attention layer."""
    c = config
    n_attn = sum(c.is_attention(i) for i in range(c.n_layer))
    n_gdn = c.n_layer - n_attn
    rec = n_gdn * b * 2 * 4 * (c.v_heads * c.d_k * c.d_v + (c.conv_kernel - 1) * c.conv_channels)
    kv = n_attn * b * 2 * c.n_head_kv * c.head_dim * positions * cache_itemsize
    return rec + kv


def measure_whole(
    model: Model,
    config: qwen35.Config,
    b: int,
    prompt: int,
    decode: int,
    read_gbs: float,
    replays: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    torch = require_torch()
    gm = GpuModel(None, config, prompt + decode + 2, b, model=model)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, gm.n_vocab, (b, prompt), generator=gen).tolist()
    params = SamplingParams()
    # warm: every prompt step shape, the decode graph, fla's autotuning
    gm.prefill([p[: min(prompt, gm.chunk + 3)] for p in prompts[:1]])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = gm.prefill(prompts)
    tokens = gm.sample(logits, params, [list(p) for p in prompts])
    ttft = time.perf_counter() - t0
    gm.decode_sample(tokens, params)()
    gm.warm(decode, params)  # every graph the timed steps replay
    torch.cuda.synchronize()
    # as generate runs them: each step chained on the last one's choice, its tokens read while
    # the next step runs
    t1 = time.perf_counter()
    pending = gm.decode_sample(None, params)
    for _ in range(decode - 2):
        ahead = gm.decode_sample(None, params)
        pending()
        pending = ahead
    pending()
    decode_s = time.perf_counter() - t1
    step_ms = decode_s / max(decode - 1, 1) * 1e3
    # the parts, each alone as a graph at the last step's span
    weight, attn, rec = (
        graph_ms(gm.part(b, which), replays) for which in ("weights", "attention", "recurrence")
    )
    weights_b = model.step_bytes(b)
    mixers_b = state_bytes(config, b, prompt + decode)
    floor = (weights_b + mixers_b) / (read_gbs * 1e9) * 1e3
    return {
        "batch": b,
        "prompt": prompt,
        "decode": decode,
        "ttft_ms": ttft * 1e3,
        "prompt_tokens_per_s": b * prompt / ttft,
        "decode_step_ms": step_ms,
        "decode_tokens_per_s": b / step_ms * 1e3,
        "weight_path_ms": weight,
        "attention_ms": attn,
        "recurrence_ms": rec,
        "rest_ms": step_ms - weight - attn - rec,
        "floor_ms": floor,
        "weight_bytes": weights_b,
        "state_bytes": mixers_b,
        "x_floor": step_ms / floor,
        "fla": next(iter(gm.gdn.values())).fla is not None if gm.gdn else False,
    }
