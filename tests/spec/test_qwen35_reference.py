"""The numpy qwen35 reference: its pieces by hand, its chunking invariance, and transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.spec import qwen35 as q35
from pyq2.spec import qwen35_layers as layers

# --- a small random model with odd sizes ----------------------------------------------------

META = {
    "general.architecture": "qwen35",
    "qwen35.block_count": 6,  # layers 2 and 5 attention, 0 1 3 4 Gated DeltaNet
    "qwen35.context_length": 4096,
    "qwen35.embedding_length": 96,
    "qwen35.feed_forward_length": 160,
    "qwen35.attention.head_count": 3,
    "qwen35.attention.head_count_kv": 1,
    "qwen35.attention.key_length": 24,
    "qwen35.attention.value_length": 24,
    "qwen35.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen35.full_attention_interval": 3,
    "qwen35.rope.dimension_count": 12,  # < head_dim: partial rotary
    "qwen35.rope.freq_base": 10000.0,
    "qwen35.rope.dimension_sections": [2, 2, 2, 0],  # covers all 6 pairs, as [11, 11, 10, 0] does
    "qwen35.ssm.conv_kernel": 4,
    "qwen35.ssm.state_size": 16,
    "qwen35.ssm.group_count": 2,
    "qwen35.ssm.time_step_rank": 4,
    "qwen35.ssm.inner_size": 64,
}
N_VOCAB = 211


def random_weights(config, n_vocab: int, rng: np.random.Generator, tied: bool = False) -> dict:
    """Weights in GGUF conventions with sane magnitudes: norms ~1 as stored (1 + w), ssm_a < 0."""
    weights = {}
    for name, shape in q35.expected_shapes(config, n_vocab).items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("ssm_a"):
            w = -np.exp(rng.uniform(np.log(1.0), np.log(16.0), shape))
        elif name.endswith("ssm_dt.bias"):
            w = 0.5 * rng.standard_normal(shape)
        elif name.endswith("ssm_conv1d.weight"):
            w = 0.5 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        weights[name] = w.astype(np.float32)
    if tied:
        del weights["output.weight"]
    return weights


@pytest.fixture(scope="module")
def model():
    config = q35.Config.from_metadata(META)
    return config, random_weights(config, N_VOCAB, np.random.default_rng(0))


def _run(weights, config, tokens, splits, **kw):
    state = q35.State.new(config, capacity=8)
    parts = np.split(tokens, splits)
    logits = np.concatenate([q35.forward(weights, config, p, state, **kw) for p in parts])
    return logits, state


def _assert_state_close(a, b, bound):
    """Every cached array of a within bound * (its largest entry in b) of b's."""
    assert a.pos == b.pos and a.k.keys() == b.k.keys() and a.ssm.keys() == b.ssm.keys()
    pairs = [(a.keys(i), b.keys(i)) for i in a.k] + [(a.values(i), b.values(i)) for i in a.k]
    pairs += [(a.conv[i], b.conv[i]) for i in a.conv] + [(a.ssm[i], b.ssm[i]) for i in a.ssm]
    for x, y in pairs:
        assert x.shape == y.shape and np.abs(x - y).max() <= bound * np.abs(y).max()


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))


# --- 1. one shot == chunks == token by token ------------------------------------------------

# fp32 noise: BLAS rounds a row differently for different batch sizes (and token by token rounds
# the delta state to fp32 every step); six random layers amplify it a few times. Observed over
# three seeds: logits rel RMS <= 4.4e-6, max |diff| <= 1e-4 (logits std ~1, max ~4), cached
# state max |diff| <= 5.6e-5 of its largest entry.
LOGITS_REL_RMS = 2e-5
LOGITS_MAX = 5e-4
STATE_MAX = 3e-4


def test_prompt_chunking_invariance(model):
    config, weights = model
    tokens = np.random.default_rng(1).integers(0, N_VOCAB, 75)
    ref, ref_state = _run(weights, config, tokens, [])
    assert np.isfinite(ref).all() and ref.std() > 0.5
    # in chunks, token by token, and with the chunked delta rule (64 + 6 tokens, then 5)
    for splits, kw in (
        ([5, 40, 41], {}),
        (list(range(1, 75)), {}),
        ([70], {"delta_rule": "chunked"}),
    ):
        logits, state = _run(weights, config, tokens, splits, **kw)
        assert rel_rms(logits, ref) < LOGITS_REL_RMS
        assert np.abs(logits - ref).max() < LOGITS_MAX
        _assert_state_close(state, ref_state, STATE_MAX)


def test_trace_and_tied_head(model):
    config, weights = model
    tokens = np.arange(7)
    trace: dict = {}
    logits = q35.forward(weights, config, tokens, q35.State.new(config), trace=trace)
    assert set(trace) >= {"inp_embd", "blk.5.l_out", "blk.0.attn_out", "result_norm"}
    last = trace[f"blk.{config.n_layer - 1}.l_out"]
    np.testing.assert_allclose(
        trace["result_norm"], layers.rms_norm(last, weights["output_norm.weight"], config.rms_eps)
    )
    np.testing.assert_allclose(logits, trace["result_norm"] @ weights["output.weight"].T, atol=1e-5)
    tied = {k: v for k, v in weights.items() if k != "output.weight"}
    logits = q35.forward(tied, config, tokens, q35.State.new(config))
    np.testing.assert_allclose(
        logits, trace["result_norm"] @ weights["token_embd.weight"].T, atol=1e-5
    )


# --- 2. against transformers, loaded from a float GGUF by its own reader --------------------


def write_gguf(path: Path, meta: dict, weights: dict, n_vocab: int) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "qwen35")
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    writer.add_eos_token_id(0)
    for name, array in weights.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_gguf(path: Path) -> tuple[dict, dict]:
    """(metadata as Python values, tensors in numpy order) via gguf's own reader."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    kv = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    return kv, tensors


# (meta changes, tied): the first is the main case; the second has d_v != d_k (transformers and
# this reference allow it, llama.cpp's qwen35 graph asserts d_k == d_v), 2 kv heads (so that the
# grouped GQA head order shows) and a tied output head
VARIANT_2 = {
    "qwen35.ssm.inner_size": 80,
    "qwen35.embedding_length": 160,
    "qwen35.attention.head_count": 4,
    "qwen35.attention.head_count_kv": 2,
}
VARIANTS = [({}, False), (VARIANT_2, True)]
# relative RMS error of logits and layer outputs, fp32 both sides; observed 9.0e-6 and 4.0e-6 for
# the two variants (5.0e-6 for transformers' cached decode). It is fp32 noise, not a convention
# gap: transformers' delta rule and norms run in fp32 even in a float64 model, and its delta-rule
# kernels, run in float64, match ours to 1e-15.
HF_TOL = 5e-5


@pytest.mark.parametrize("changes,tied", VARIANTS)
def test_against_transformers(tmp_path, changes, tied):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loading requires it
    meta = META | changes
    config = q35.Config.from_metadata(meta)
    weights = random_weights(config, N_VOCAB, np.random.default_rng(2), tied=tied)
    write_gguf(tmp_path / "model.gguf", meta, weights, N_VOCAB)

    kv, tensors = read_gguf(tmp_path / "model.gguf")
    config = q35.Config.from_metadata(kv)
    assert config.n_vocab == N_VOCAB and ("output.weight" in tensors) != tied
    tokens = np.random.default_rng(3).integers(0, N_VOCAB, 70)  # > 64: two transformers chunks
    trace: dict = {}
    ours = q35.forward(tensors, config, tokens, q35.State.new(config), trace=trace)

    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(
        str(tmp_path),
        gguf_file="model.gguf",
        dtype=torch.float32,
        attn_implementation="eager",
        use_kernels=False,  # transformers >= 5.2x defaults to hub kernels, which need `kernels`
    ).eval()
    assert hf.config.layer_types[2] == "full_attention" and hf.config.num_hidden_layers == 6
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(tokens[None]), use_cache=False, output_hidden_states=True)
    theirs = out.logits[0].double().numpy()
    # per layer first, so that a convention error points at its layer
    for i in range(config.n_layer - 1):
        hidden = out.hidden_states[i + 1][0].double().numpy()
        assert rel_rms(trace[f"blk.{i}.l_out"], hidden) < HF_TOL, f"layer {i}"
    # transformers' cached path (conv update and recurrent kernel): 40 tokens, then one by one
    with torch.no_grad():
        step = hf(input_ids=torch.tensor(tokens[None, :40]), use_cache=True)
        cached = [step.logits[0]]
        for token in tokens[40:]:
            step = hf(input_ids=torch.tensor([[token]]), past_key_values=step.past_key_values)
            cached.append(step.logits[0])
    assert rel_rms(ours, torch.cat(cached).double().numpy()) < HF_TOL
    error = rel_rms(ours, theirs)
    agree = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    print(
        f"qwen35 vs transformers {'tied' if tied else 'base'}: rel RMS {error:.2e}, argmax {agree}"
    )
    assert np.isfinite(theirs).all() and theirs.std() > 0.1
    assert error < HF_TOL
    assert agree == 1.0


# --- 3. the pieces by hand ------------------------------------------------------------------


def test_rms_and_l2_norm():
    x = np.array([[3.0, 4.0], [0.0, 2.0]], np.float32)
    np.testing.assert_allclose(
        layers.rms_norm(x, np.array([1.0, 2.0]), 0.0),
        [[3 / 12.5**0.5, 8 / 12.5**0.5], [0.0, 2.0 * 2 / 2**0.5]],
        1e-6,
    )
    np.testing.assert_allclose(layers.l2_norm(x, 0.0), [[0.6, 0.8], [0.0, 1.0]], 1e-6)


def test_rope_is_a_rotation_of_pairs():
    n_rot, base, head_dim = 8, 100.0, 10
    x = np.zeros((3, 1, head_dim), np.float32)
    x[:, 0, 1], x[:, 0, 5], x[:, 0, 9] = 1.0, 0.5, 7.0  # pair 1 = dims (1, 5); dim 9 unrotated
    pos = np.array([0, 1, 5])
    y = layers.rope(x, pos, n_rot, base)
    angle = pos * base ** (-2 * 1 / n_rot)
    np.testing.assert_allclose(y[:, 0, 1], np.cos(angle) - 0.5 * np.sin(angle), atol=1e-6)
    np.testing.assert_allclose(y[:, 0, 5], 0.5 * np.cos(angle) + np.sin(angle), atol=1e-6)
    np.testing.assert_array_equal(y[:, 0, 9], 7.0)
    # relative: <rope(q, m), rope(k, n)> depends on m - n only
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, head_dim)).astype(np.float32)
    dot = [
        float(np.sum(layers.rope(q, [m], n_rot, base) * layers.rope(k, [m - 3], n_rot, base)))
        for m in (3, 10, 50)
    ]
    np.testing.assert_allclose(dot, dot[0], rtol=1e-5)


def test_imrope_sections():
    np.testing.assert_array_equal(layers.imrope_axes((11, 11, 10, 0), 32), np.arange(32) % 3)
    # a pair left to the fourth axis takes position 0 for text, as in llama.cpp
    axes = layers.imrope_axes((2, 2, 1, 1), 6)
    np.testing.assert_array_equal(axes, [0, 1, 2, 0, 1, 3])
    x = np.ones((1, 1, 12), np.float32)
    y = layers.rope(x, [4], 12, 10.0, (2, 2, 1, 1))
    np.testing.assert_array_equal(y[0, 0, [5, 11]], 1.0)
    assert not np.allclose(y[0, 0, [4, 10]], 1.0)


def test_attention_gqa_causal():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 5)).astype(np.float32)
    k, v = rng.standard_normal((2, 3, 2, 5)).astype(np.float32)
    out = layers.attention(q, k, v, np.array([0, 1, 2]), 0.5)
    for t in range(3):
        for h in range(4):
            s = np.exp(0.5 * k[: t + 1, h // 2] @ q[t, h])
            np.testing.assert_allclose(out[t, h], s @ v[: t + 1, h // 2] / s.sum(), rtol=1e-5)


def test_conv_direct_and_continued():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    y, state = layers.causal_conv1d(x, np.zeros((3, 5), np.float32), w)
    xp = np.vstack([np.zeros((3, 5)), x])
    direct = np.stack([np.sum(w.T * xp[t : t + 4], axis=0) for t in range(9)])
    np.testing.assert_allclose(y, direct, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[-3:])
    y1, s1 = layers.causal_conv1d(x[:4], np.zeros((3, 5), np.float32), w)
    y2, s2 = layers.causal_conv1d(x[4:5], s1, w)
    y3, s3 = layers.causal_conv1d(x[5:], s2, w)
    np.testing.assert_allclose(np.vstack([y1, y2, y3]), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s3, state)


def _delta_inputs(rng, t, h=3, dk=4, dv=5):
    q = layers.l2_norm(rng.standard_normal((t, h, dk)))
    k = layers.l2_norm(rng.standard_normal((t, h, dk)))
    v = rng.standard_normal((t, h, dv)).astype(np.float32)
    g = -np.exp(rng.uniform(-3, 1, (t, h)))
    beta = layers.sigmoid(rng.standard_normal((t, h)))
    s0 = rng.standard_normal((h, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, s0


def test_delta_rule_matches_the_matrix_formula():
    """S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T; o_t = S_t^T q_t / sqrt(d_k)."""
    q, k, v, g, beta, s0 = _delta_inputs(np.random.default_rng(0), 6, h=1)
    s = s0[0].astype(np.float64)
    expect = []
    for t in range(6):
        kt = k[t, 0, :, None].astype(np.float64)
        s = np.exp(g[t, 0]) * (np.eye(4) - beta[t, 0] * kt @ kt.T) @ s + beta[t, 0] * kt @ v[t, :1]
        expect.append(s.T @ q[t, 0] / 2.0)
    out, state = layers.gated_delta_rule_recurrent(q, k, v, g, beta, s0, 0.5)
    np.testing.assert_allclose(out[:, 0], expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[0], s, rtol=1e-5, atol=1e-6)


def test_delta_rule_memorises_orthonormal_keys():
    """No decay, beta 1, orthonormal keys: the state is an exact key -> value memory."""
    keys = np.eye(4, dtype=np.float32)[:, None, :]  # (T=4, H=1, d_k=4)
    v = np.arange(12, dtype=np.float32).reshape(4, 1, 3)
    out, state = layers.gated_delta_rule_recurrent(
        keys, keys, v, np.zeros((4, 1)), np.ones((4, 1)), np.zeros((1, 4, 3), np.float32), 1.0
    )
    np.testing.assert_allclose(out, v, atol=1e-6)  # reading k_t right after writing it
    np.testing.assert_allclose(state[0], v[:, 0], atol=1e-6)


def test_delta_rule_chunked_equals_recurrent():
    q, k, v, g, beta, s0 = _delta_inputs(np.random.default_rng(1), 150)
    ref, ref_state = layers.gated_delta_rule_recurrent(q, k, v, g, beta, s0, 0.5)
    for chunk in (64, 7, 1):
        out, state = layers.gated_delta_rule_chunked(q, k, v, g, beta, s0, 0.5, chunk=chunk)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(state, ref_state, rtol=1e-5, atol=1e-5)


def test_delta_rule_matches_transformers_kernels():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    q, k, v, g, beta, s0 = _delta_inputs(np.random.default_rng(2), 150)
    ref, ref_state = layers.gated_delta_rule_recurrent(q, k, v, g, beta, s0, 4**-0.5)
    args = [torch.tensor(np.asarray(a, np.float32))[None] for a in (q, k, v, g, beta)]
    state = torch.tensor(s0)[None]
    for kernel in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        out, final = kernel(*args, initial_state=state, output_final_state=True)
        assert rel_rms(ref, out[0].double().numpy()) < 1e-5
        assert rel_rms(ref_state, final[0].double().numpy()) < 1e-5


# --- Config.from_metadata -------------------------------------------------------------------


def test_config_from_metadata():
    c = q35.Config.from_metadata(META | {"qwen35.nextn_predict_layers": 1})
    assert (c.n_layer, c.d_v, c.key_dim, c.conv_channels, c.rope_sections) == (
        5,
        16,
        32,
        128,
        (2, 2, 2, 0),
    )
    assert [c.is_attention(i) for i in range(6)] == [False, False, True, False, False, True]
    same = META | {"qwen35.attention.recurrent_layers": [True, True, False, True, True, False]}
    assert q35.Config.from_metadata(same) == q35.Config.from_metadata(META)


@pytest.mark.parametrize(
    "key,value",
    [
        ("qwen35.ssm.group_count", None),
        ("qwen35.attention.head_count", "3"),
        ("qwen35.attention.head_count_kv", True),
        ("qwen35.block_count", 6.0),
        ("qwen35.rope.dimension_sections", 11),
        ("qwen35.attention.layer_norm_rms_epsilon", "1e-6"),
        ("qwen35.attention.head_count_kv", 0),
    ],
)
def test_config_names_bad_key(key, value):
    meta = {k: v for k, v in META.items() if k != key}
    if value is not None:
        meta[key] = value
    with pytest.raises(FormatError, match=key.replace(".", r"\.")):
        q35.Config.from_metadata(meta)


@pytest.mark.parametrize(
    "changes",
    [
        {"qwen35.ssm.time_step_rank": 3},
        {"qwen35.attention.head_count_kv": 2},
        {"qwen35.attention.value_length": 32},
        {"qwen35.rope.dimension_count": 13},
        {"general.architecture": "qwen3next"},
        {"qwen35.attention.recurrent_layers": [True] * 6},
    ],
)
def test_config_rejects_inconsistent(changes):
    with pytest.raises(FormatError):
        q35.Config.from_metadata(META | changes)


def test_forward_rejects_wrong_shape(model):
    config, weights = model
    bad = weights | {"blk.0.ssm_conv1d.weight": weights["blk.0.ssm_conv1d.weight"].T}
    with pytest.raises(FormatError, match="ssm_conv1d"):
        q35.forward(bad, config, np.arange(3), q35.State.new(config))
