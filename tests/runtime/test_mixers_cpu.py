"""The torch forms of the mixers (pyq2.runtime.mixers) on the CPU: a prompt in one chunk, in
several chunks and token by token (prefill for the first tokens, then decode steps) leaves the
same states and gives the same outputs within fp32 noise (TOL), for a Gated-DeltaNet layer (its
convolution ring carried across chunk edges that fall inside and outside the window) and an
attention layer (GQA, partial rope). The decode kernels are checked against these forms on the
GPU (test_mixer_kernels_gpu.py)."""

import pytest

torch = pytest.importorskip("torch")

from pyq2.runtime.mixers import Attention, Dims, GatedDeltaNet, Rope  # noqa: E402

TOL = 1e-5
T = 11
D = Dims(n_head=4, n_head_kv=2, head_dim=32, rope_dim=16, rope_base=10000.0, eps=1e-6,
         conv_kernel=4, k_heads=2, v_heads=4, k_dim=16, v_dim=8)  # fmt: skip


def rel(a, b):
    return float((a - b).norm() / b.norm())


def gdn_inputs(g):
    channels = 2 * D.k_heads * D.k_dim + D.v_heads * D.v_dim
    w = {
        "conv": torch.randn(channels, D.conv_kernel, generator=g) * 0.5,
        "a": -torch.rand(D.v_heads, generator=g) - 0.1,
        "dt_bias": torch.randn(D.v_heads, generator=g) * 0.3,
        "norm": 1 + 0.1 * torch.randn(D.v_dim, generator=g),
    }
    x = [
        torch.randn(T, n, generator=g)
        for n in (channels, D.v_heads * D.v_dim, D.v_heads, D.v_heads)
    ]
    return w, x


@pytest.mark.parametrize("cuts", [(1,), (2, 5), (3, 4, 9)])
def test_gdn_prompt_in_chunks_and_steps_agrees(cuts):
    w, (qkv, z, alpha, beta) = gdn_inputs(torch.Generator().manual_seed(len(cuts)))
    whole = GatedDeltaNet(D, w, 1, "cpu", use_fla=False)
    out_whole = torch.full((T, D.v_heads * D.v_dim), float("nan"))
    whole.prefill(qkv, z, alpha, beta, 0, 0, out_whole)
    # chunks at the cuts, the last part token by token as decode steps
    parts = GatedDeltaNet(D, w, 1, "cpu", use_fla=False)
    out = torch.full_like(out_whole, float("nan"))
    edges = (0, *cuts)
    for a, b in zip(edges, edges[1:], strict=False):
        parts.prefill(qkv[a:b], z[a:b], alpha[a:b], beta[a:b], 0, a, out[a:b])
    for t in range(cuts[-1], T):
        s = slice(t, t + 1)
        parts.decode(qkv[s], z[s], alpha[s], beta[s], torch.tensor([t]), out[s])
    assert rel(out, out_whole) < TOL
    assert rel(parts.state, whole.state) < TOL
    assert torch.equal(parts.conv, whole.conv)


@pytest.mark.parametrize("cuts", [(1,), (4, 7)])
def test_attention_prompt_in_chunks_and_steps_agrees(cuts):
    g = torch.Generator().manual_seed(10 + len(cuts))
    w = {"q_norm": 1 + 0.1 * torch.randn(D.head_dim, generator=g),
         "k_norm": 1 + 0.1 * torch.randn(D.head_dim, generator=g)}  # fmt: skip
    q_gate = torch.randn(T, D.n_head * 2 * D.head_dim, generator=g)
    k = torch.randn(T, D.n_head_kv * D.head_dim, generator=g)
    v = torch.randn(T, D.n_head_kv * D.head_dim, generator=g)
    rope = Rope(D, 16, "cpu")
    make = lambda: Attention(D, w, 1, 16, rope, "cpu", torch.float32)  # noqa: E731
    whole, parts = make(), make()
    out_whole = torch.full((T, D.n_head * D.head_dim), float("nan"))
    whole.prefill(q_gate, k, v, 0, 0, out_whole)
    out = torch.full_like(out_whole, float("nan"))
    edges = (0, *cuts)
    for a, b in zip(edges, edges[1:], strict=False):
        parts.prefill(q_gate[a:b], k[a:b], v[a:b], 0, a, out[a:b])
    for t in range(cuts[-1], T):
        s = slice(t, t + 1)
        parts.decode(q_gate[s], k[s], v[s], torch.tensor([t]), 16, out[s])
    assert rel(out, out_whole) < TOL
    assert rel(parts.k, whole.k) < TOL and rel(parts.v, whole.v) < TOL
