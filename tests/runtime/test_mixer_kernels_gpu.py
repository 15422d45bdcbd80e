"""The Triton mixer kernels of a decode step and a prompt (pyq2.runtime.mixer_kernels), and the
attention decode kernel of libpq2 they call for steps of several sequences, against the torch
forms of the same layers (pyq2.runtime.mixers with kernels=False and without fla: plain torch
arithmetic), on odd shapes: groups of 1 and 3 query heads per KV head, a partial rotary width, a
key head width that is not a power of two, positions on both sides of every chunk boundary and
before the convolution window fills, several steps in a row (the window's ring carried over),
float32 and bf16 caches. Outputs are poisoned before each call.

Bit-exact: the convolution ring (the inputs copied) and the KV cache entries written. Within a
tolerance: float32 results differ by summation order (FP32_TOL); with a bf16 cache both sides
round q and the softmax weights to bf16 in different places (BF16_TOL).
"""

import pytest

from ..conftest import gpu_module

torch = gpu_module()
pytest.importorskip("triton")

from pyq2.runtime import mixer_kernels  # noqa: E402
from pyq2.runtime.mixers import Attention, Dims, GatedDeltaNet, Rope, SideRows  # noqa: E402

pytestmark = pytest.mark.gpu

FP32_TOL = 2e-5
BF16_TOL = 2e-2
DEV = torch.device("cuda")


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def dims(**kw):
    base = dict(n_head=6, n_head_kv=2, head_dim=64, rope_dim=32, rope_base=10000.0, eps=1e-6,
                conv_kernel=4, k_heads=3, v_heads=6, k_dim=64, v_dim=32)  # fmt: skip
    base.update(kw)
    return Dims(**base)


GDN_SHAPES = [
    dims(),
    dims(k_heads=2, v_heads=6, k_dim=48, v_dim=64, conv_kernel=3),
    dims(k_heads=4, v_heads=4, k_dim=128, v_dim=128),
]


def gdn_pair(d, batch, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    channels = 2 * d.k_heads * d.k_dim + d.v_heads * d.v_dim
    w = {
        "conv": torch.randn(channels, d.conv_kernel, generator=g) * 0.5,
        "a": -torch.rand(d.v_heads, generator=g) * 2 - 0.1,
        "dt_bias": torch.randn(d.v_heads, generator=g) * 0.3,
        "norm": 1 + 0.1 * torch.randn(d.v_dim, generator=g),
    }
    w = {k: v.to(DEV) for k, v in w.items()}
    fast = GatedDeltaNet(d, w, batch, DEV, use_fla=False, kernels=True)
    slow = GatedDeltaNet(d, w, batch, DEV, use_fla=False, kernels=False)
    assert fast.kernels is not None and slow.kernels is None
    state = torch.randn(fast.state.shape, generator=g).to(DEV) * 0.1
    ring = torch.randn(fast.conv.shape, generator=g).to(DEV)
    for m in (fast, slow):
        m.state.copy_(state), m.conv.copy_(ring)
    return fast, slow, g, channels


@pytest.mark.parametrize("d", GDN_SHAPES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("early", [True, False])  # the state loaded first, or where it is used
def test_gdn_decode_matches_the_torch_form(d, batch, dtype, early, monkeypatch):
    monkeypatch.setattr(mixer_kernels, "EARLY_STATE", 1 << 20 if early else 0)
    fast, slow, g, channels = gdn_pair(d, batch + 1, seed=batch)  # one row more than used
    positions = torch.tensor([0, 2, 57, 1000][:batch], device=DEV)
    tol = FP32_TOL if dtype == torch.float32 else 1e-2
    for step in range(3):
        qkv = torch.randn(batch, channels, generator=g).to(DEV, dtype)
        z = torch.randn(batch, d.v_heads * d.v_dim, generator=g).to(DEV, dtype)
        alpha = torch.randn(batch, d.v_heads, generator=g).to(DEV, dtype)
        beta = torch.randn(batch, d.v_heads, generator=g).to(DEV, dtype)
        outs = []
        for m in (fast, slow):
            out = torch.full((batch, d.v_heads * d.v_dim), float("nan"), device=DEV, dtype=dtype)
            m.decode(qkv, z, alpha, beta, positions + step, out)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all()
        assert rel(outs[0], outs[1]) < tol, step
        assert rel(fast.state, slow.state) < FP32_TOL, step
        assert torch.equal(fast.conv, slow.conv), step  # the unused row too


@pytest.mark.parametrize("d", GDN_SHAPES)
@pytest.mark.parametrize("width", [80, 200, 256])  # 64 + 16; 128 + 72 of a masked 128; 256
@pytest.mark.parametrize("extra", [0, 1])  # SIDE_ROWS sequences, and one more (torch's side)
@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("early", [True, False])  # the state loaded first, or where it is used
def test_gdn_decode_with_the_side_projections_matches_the_torch_form(
    d, width, extra, gate, early, monkeypatch
):
    """alpha and beta from the normed rows and the side weights (SideRows): in the kernel for
    steps of up to SIDE_ROWS sequences, in torch above; with the gated norm, or the output
    before it (gate False: DecodeStep's producer applies it)."""
    monkeypatch.setattr(mixer_kernels, "EARLY_STATE", 1 << 20 if early else 0)
    batch = mixer_kernels.SIDE_ROWS + extra
    fast, slow, g, channels = gdn_pair(d, batch + 1, seed=width + extra)
    positions = torch.arange(batch, device=DEV) * 131 % 1000  # 0 first: the window not full
    rows = 2 * d.v_heads + 5
    weight = (torch.randn(rows, width, generator=g) * width**-0.5).to(DEV, torch.bfloat16)
    normed = torch.empty(batch + 1, width, device=DEV, dtype=torch.bfloat16)
    side = SideRows(normed, weight, alpha_row=3, beta_row=d.v_heads + 5)
    assert mixer_kernels.side_fits(side, batch, d.v_heads) == (extra == 0)
    past = SideRows(normed, weight, alpha_row=3, beta_row=rows - d.v_heads + 1)
    assert not mixer_kernels.side_fits(past, 1, d.v_heads)  # beta's rows past the weights
    for step in range(3):
        normed.copy_(torch.randn(normed.shape, generator=g) * 2)
        qkv = torch.randn(batch, channels, generator=g).to(DEV)
        z = torch.randn(batch, d.v_heads * d.v_dim, generator=g).to(DEV)
        outs = []
        for m in (fast, slow):
            out = torch.full((batch, d.v_heads * d.v_dim), float("nan"), device=DEV)
            m.decode(qkv, z, None, None, positions + step, out, side, gate)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all()
        assert rel(outs[0], outs[1]) < FP32_TOL, step
        assert rel(fast.state, slow.state) < FP32_TOL, step
        assert torch.equal(fast.conv, slow.conv), step


ATTN_SHAPES = [
    dims(),  # 3 query heads per KV head, a quarter of the head rotated
    dims(n_head=4, n_head_kv=4, head_dim=128, rope_dim=128),
    dims(n_head=8, n_head_kv=1, head_dim=32, rope_dim=8),
]


def attention_pair(d, batch, context, cache, seed):
    """The layer with the kernels and without, the same norms and the same random caches; and
    the generator, for the inputs."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = {
        "q_norm": (1 + 0.1 * torch.randn(d.head_dim, generator=g)).to(DEV),
        "k_norm": (1 + 0.1 * torch.randn(d.head_dim, generator=g)).to(DEV),
    }
    rope = Rope(d, context, DEV)
    fast = Attention(d, w, batch, context, rope, DEV, cache, kernels=True)
    slow = Attention(d, w, batch, context, rope, DEV, cache, kernels=False)
    for t in (fast.k, fast.v):
        t.copy_(torch.randn(t.shape, generator=g))
    slow.k.copy_(fast.k), slow.v.copy_(fast.v)
    return fast, slow, g


def step_inputs(d, batch, g):
    """A decode step's projections into an attention layer: q_gate, k and v, random."""
    q_gate = torch.randn(batch, d.n_head * 2 * d.head_dim, generator=g).to(DEV)
    k = torch.randn(batch, d.n_head_kv * d.head_dim, generator=g).to(DEV)
    v = torch.randn(batch, d.n_head_kv * d.head_dim, generator=g).to(DEV)
    return q_gate, k, v


def decode_each(layers, q_gate, k, v, pos, span):
    """Each layer's decode of the same step, into an output poisoned first."""
    outs = []
    for m in layers:
        out = torch.full((q_gate.shape[0], m.d.n_head * m.d.head_dim), float("nan"), device=DEV)
        m.decode(q_gate, k, v, pos, span, out)
        outs.append(out)
    return outs


_K = mixer_kernels
# (positions a tile, tiles a program, warps, cache positions a merge iteration)
ATTN_PROGRAMS = [
    # the steps' own settings: several sequences, one sequence
    (_K.CHUNK, _K.ATTENTION_TILES, _K.ATTENTION_WARPS, _K.MERGE_SPAN),
    (_K.CHUNK_ONE, _K.ATTENTION_TILES_ONE, _K.ATTENTION_WARPS_ONE, _K.MERGE_SPAN),
    (_K.CHUNK, 1, _K.ATTENTION_WARPS, 2 * _K.CHUNK),  # two chunks a merge iteration
    # three tiles a program: positions in its first and last tile, and a second program
    (_K.CHUNK, 3, _K.ATTENTION_WARPS, _K.MERGE_SPAN),
    (_K.CHUNK, 2, _K.ATTENTION_WARPS, 4 * _K.CHUNK),  # 2-tile programs, two a merge pass
    (32, 8, 4, 4 * 32),  # narrow tiles, 8 a program, 4 warps; one program a merge iteration
]


@pytest.mark.parametrize("d", ATTN_SHAPES)
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ch,tiles,warps,merge_span", ATTN_PROGRAMS)
def test_attention_decode_matches_the_torch_form(
    d, cache, ch, tiles, warps, merge_span, monkeypatch
):
    monkeypatch.setattr(mixer_kernels, "attention_chunk", lambda batch: ch)
    monkeypatch.setattr(mixer_kernels, "attention_tiles", lambda batch: tiles)
    monkeypatch.setattr(mixer_kernels, "attention_warps", lambda batch: warps)
    monkeypatch.setattr(mixer_kernels, "MERGE_SPAN", merge_span)
    monkeypatch.setattr(mixer_kernels, "STREAM_MIN_BATCH", 1 << 30)  # the Triton programs only
    # every program's positions plus a second program: the span runs past max(4, tiles + 1) tiles
    last = max(4, tiles + 1) * ch
    batch, context = 5, last + 40
    fast, slow, g = attention_pair(d, batch, context, cache, seed=d.head_dim)
    assert fast.kernels is not None and slow.kernels is None
    # positions at 0, on both sides of chunk boundaries and at the end of the span; with several
    # tiles a program, on both sides of a program's end too (the steps below cross it)
    at = [0, ch - 1, ch, 2 * ch + 1] if tiles == 1 else [0, ch, tiles * ch - 1, tiles * ch]
    positions = torch.tensor([*at, last + 3], device=DEV)
    tol = FP32_TOL if cache == torch.float32 else BF16_TOL
    for step, span in ((0, last + 4), (1, last + 5), (2, context)):
        pos = positions + step
        q_gate, k, v = step_inputs(d, batch, g)
        outs = decode_each((fast, slow), q_gate, k, v, pos, span)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all()
        assert rel(outs[0], outs[1]) < tol, step
        rows = torch.arange(batch, device=DEV)
        written_fast = fast.k[rows, :, pos], fast.v[rows, :, pos]
        written_slow = slow.k[rows, :, pos], slow.v[rows, :, pos]
        if cache == torch.float32:
            assert rel(written_fast[0], written_slow[0]) < FP32_TOL
        else:  # one bf16 rounding of values within fp32 noise of each other
            assert rel(written_fast[0], written_slow[0]) < 1e-2
        assert torch.equal(written_fast[1], written_slow[1])
        # nothing else in the caches moved
        assert rel(fast.k, slow.k) < (FP32_TOL if cache == torch.float32 else 1e-2)
        assert torch.equal(fast.v, slow.v)


STREAM_SHAPES = [
    *ATTN_SHAPES,  # head widths 64, 128, 32; groups 3, 1, 8
    dims(n_head=12, n_head_kv=2, head_dim=256, rope_dim=64),  # the 27B's head, group 6
    dims(n_head=8, n_head_kv=1, head_dim=256, rope_dim=256),  # a full group of the widest head
]


@pytest.mark.parametrize("d", STREAM_SHAPES)
def test_attention_decode_through_libpq2_matches_the_torch_form(d):
    """Steps of several sequences with a bf16 cache attend through pq2_attention_decode_cuda
    (after the prep kernel): positions at 0, on both sides of the 32-position tiles and the
    blocks' chunk boundaries, a position whose chunk has one tile, and the span's end; the
    scratch's partial sums and the outputs poisoned before each step."""
    ch = mixer_kernels.STREAM_CHUNK
    last = 3 * ch
    context = last + 40
    at = [0, 31, 32, ch - 1, ch, ch + 1, 2 * ch + 5, last + 3]
    batch = len(at)
    fast, slow, g = attention_pair(d, batch, context, torch.bfloat16, seed=d.head_dim + 1)
    assert mixer_kernels.streams(batch, d, fast.k)
    positions = torch.tensor(at, device=DEV)
    for step, span in ((0, last + 4), (1, last + 5), (2, context)):
        pos = positions + step
        q_gate, k, v = step_inputs(d, batch, g)
        sc = fast.scratch
        for t in (sc.m, sc.l, sc.acc, sc.q):
            t.fill_(float("nan"))
        outs = decode_each((fast, slow), q_gate, k, v, pos, span)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all(), step
        assert rel(outs[0], outs[1]) < BF16_TOL, step
        # per sequence too: no position's error hides in the batch's norm
        for r in range(batch):
            assert rel(outs[0][r], outs[1][r]) < BF16_TOL, (step, at[r])
        rows = torch.arange(batch, device=DEV)
        assert rel(fast.k[rows, :, pos], slow.k[rows, :, pos]) < 1e-2
        assert torch.equal(fast.v[rows, :, pos], slow.v[rows, :, pos])
        assert rel(fast.k, slow.k) < 1e-2 and torch.equal(fast.v, slow.v)


def test_attention_decode_through_libpq2_is_deterministic():
    """Two runs of the same step give the same bits (the four warps' sums in a fixed order)."""
    d = STREAM_SHAPES[3]
    batch, context = 4, 700
    fast = attention_pair(d, batch, context, torch.bfloat16, seed=3)[0]
    g = torch.Generator(device="cpu").manual_seed(4)
    q_gate, k, v = step_inputs(d, batch, g)
    positions = torch.tensor([10, 300, 511, 650], device=DEV)
    outs = decode_each((fast, fast), q_gate, k, v, positions, context)
    torch.cuda.synchronize()
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])


def test_decode_kernels_in_a_graph_give_the_bits_of_launches_without_pdl(monkeypatch):
    """Replayed from a CUDA graph with programmatic dependent launch (where the device has it),
    the decode kernels of an attention and a Gated-DeltaNet layer in a row give the outputs,
    states and caches of plain eager launches, bit for bit, over several steps."""
    d = dims()
    batch = 3
    ch = mixer_kernels.attention_chunk(batch)
    context = 2 * ch + 9
    attn = [attention_pair(d, batch, context, torch.bfloat16, seed=5)[0] for _ in range(2)]
    gdn = [gdn_pair(d, batch, seed=6)[0] for _ in range(2)]
    g = torch.Generator(device="cpu").manual_seed(7)
    channels = 2 * d.k_heads * d.k_dim + d.v_heads * d.v_dim
    positions = torch.tensor([0, 5, ch], device=DEV)
    q_gate = torch.empty(batch, d.n_head * 2 * d.head_dim, device=DEV)
    k, v = (torch.empty(batch, d.n_head_kv * d.head_dim, device=DEV) for _ in range(2))
    qkv, z = torch.empty(batch, channels, device=DEV), torch.empty(batch, d.v_heads * d.v_dim,
                                                                   device=DEV)  # fmt: skip
    alpha, beta = (torch.empty(batch, d.v_heads, device=DEV) for _ in range(2))
    outs = [
        (torch.empty(batch, d.n_head * d.head_dim, device=DEV),
         torch.empty(batch, d.v_heads * d.v_dim, device=DEV))
        for _ in range(2)
    ]  # fmt: skip

    def layer_pair(i):
        attn[i].decode(q_gate, k, v, positions, context, outs[i][0])
        gdn[i].decode(qkv, z, alpha, beta, positions, outs[i][1])

    layer_pair(0)  # compile and warm before the capture; then both start from the same state
    attn[0].k.copy_(attn[1].k), attn[0].v.copy_(attn[1].v)
    gdn[0].state.copy_(gdn[1].state), gdn[0].conv.copy_(gdn[1].conv)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer_pair(0)
    monkeypatch.setattr(mixer_kernels, "pdl", lambda device_index: False)
    for step in range(3):
        for t in (q_gate, k, v, qkv, z, alpha, beta):
            t.copy_(torch.randn(t.shape, generator=g))
        for o in outs[0] + outs[1]:
            o.fill_(float("nan"))
        graph.replay()
        layer_pair(1)
        torch.cuda.synchronize()
        for a, b in zip(outs[0], outs[1], strict=True):
            assert torch.isfinite(a).all() and torch.equal(a, b), step
        assert torch.equal(attn[0].k, attn[1].k) and torch.equal(attn[0].v, attn[1].v), step
        assert torch.equal(gdn[0].state, gdn[1].state), step
        assert torch.equal(gdn[0].conv, gdn[1].conv), step
        positions += 1


def test_attention_decode_rejects_a_head_width_it_cannot_tile():
    d = dims(head_dim=48, rope_dim=16)
    a = torch.zeros(1, 2 * 6 * 48, device=DEV)
    with pytest.raises(ValueError, match="power of two"):
        mixer_kernels.attention_decode(a, a, a, a, a, a, 64, a, a, None, None, a, d, 1.0)


PIECES = [(0, 3), (3, 40), (40, 41), (41, 106)]  # a piece shorter than the window, then longer


@pytest.mark.parametrize("d", GDN_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_prompt_kernels_match_the_torch_form(d, dtype):
    fast, slow, g, channels = gdn_pair(d, 2, seed=7)
    for m in (fast, slow):
        m.reset()
    seq = 1
    for start, end in PIECES:
        t = end - start
        # the projections' outputs are column slices of one fused output: rows not contiguous
        qkv = torch.randn(t, channels + 5, generator=g).to(DEV, dtype)[:, 2 : 2 + channels]
        z = torch.randn(t, d.v_heads * d.v_dim, generator=g).to(DEV, dtype)
        alpha = torch.randn(t, d.v_heads, generator=g).to(DEV, dtype)
        beta = torch.randn(t, d.v_heads, generator=g).to(DEV, dtype)
        outs = []
        for m in (fast, slow):
            out = torch.full((t, d.v_heads * d.v_dim), float("nan"), device=DEV, dtype=dtype)
            m.prefill(qkv, z, alpha, beta, seq, start, out)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all()
        tol = 1e-4 if dtype == torch.float32 else 1e-2
        assert rel(outs[0], outs[1]) < tol, start
        assert rel(fast.state, slow.state) < 1e-4, start
        assert torch.equal(fast.conv, slow.conv), start  # the other sequence's row too


@pytest.mark.parametrize("d", ATTN_SHAPES)
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16])
def test_attention_prompt_kernel_matches_the_torch_form(d, cache):
    fast, slow, g = attention_pair(d, 2, 300, cache, seed=d.head_dim + 1)
    tol = FP32_TOL * 5 if cache == torch.float32 else BF16_TOL
    for start, end in PIECES:
        t = end - start
        width = d.n_head * 2 * d.head_dim
        q_gate = torch.randn(t, width + 3, generator=g).to(DEV)[:, 1 : 1 + width]
        k = torch.randn(t, d.n_head_kv * d.head_dim, generator=g).to(DEV)
        v = torch.randn(t, d.n_head_kv * d.head_dim, generator=g).to(DEV)
        outs = []
        for m in (fast, slow):
            out = torch.full((t, d.n_head * d.head_dim), float("nan"), device=DEV)
            m.prefill(q_gate, k, v, 0, start, out)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[0]).all()
        assert rel(outs[0], outs[1]) < tol, start
        assert rel(fast.k, slow.k) < (FP32_TOL if cache == torch.float32 else 1e-2), start
        assert torch.equal(fast.v, slow.v), start  # the values copied, the other row untouched
