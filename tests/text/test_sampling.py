"""pyq2.text.sampling: SamplingParams, sample_numpy / sample_torch (same semantics), StopChecker."""

import random

import numpy as np
import pytest

from pyq2.text import sampling as smp

P = smp.SamplingParams


def _devices(torch):
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _both(logits, params, history=None, uniforms=None, device="cpu"):
    """(numpy's choice, torch's choice, or None without torch)."""
    a = smp.sample_numpy(logits, params, history, uniforms=uniforms)
    try:
        import torch
    except ImportError:
        return a, None
    mask = None if history is None else smp.make_history_mask(history, logits.shape[1], device)
    t = torch.as_tensor(logits, device=device)
    u = None if uniforms is None else torch.as_tensor(uniforms, device=device)
    return a, smp.sample_torch(t, params, mask, uniforms=u).cpu().numpy()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": "1"},
        {"top_k": -1},
        {"top_k": 2.0},
        {"top_k": True},
        {"top_p": 0.0},
        {"top_p": 1.01},
        {"top_p": float("nan")},
        {"repetition_penalty": 0.0},
        {"repetition_penalty": -1.0},
        {"seed": -1},
        {"seed": 1.5},
        {"seed": True},
        {"seed": 2**63},
    ],
)
def test_invalid_params_raise(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        P(**kwargs)


def test_params_defaults_and_rngs():
    p = P()
    assert p.greedy and p.top_k == 0 and p.top_p == 1.0 and p.repetition_penalty == 1.0
    assert not P(temperature=0.7).greedy
    a, b = P(seed=5).numpy_rng().random(3), P(seed=5).numpy_rng().random(3)
    assert (a == b).all()


def test_greedy_ties_take_the_lowest_id():
    logits = np.array([[1.0, 3.0, 3.0, 2.0], [-np.inf, 0.5, 0.5, 0.5]], dtype=np.float32)
    a, t = _both(logits, P())
    assert a.tolist() == [1, 1]
    assert t is None or t.tolist() == [1, 1]


def test_top_k_one_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(16, 500)).astype(np.float32)
    logits[3, [7, 9]] = 10.0  # a tie at the top: the lower id wins in every mode
    greedy = smp.sample_numpy(logits, P())
    assert greedy[3] == 7
    for params in (P(temperature=0.8, top_k=1), P(temperature=1.5, top_p=1e-9)):
        for u in (0.0, 0.5, 1 - 1e-12):
            a, t = _both(logits, params, uniforms=np.full(16, u))
            assert (a == greedy).all()
            assert t is None or (t == greedy).all()


def test_repetition_penalty_changes_the_argmax():
    logits = np.array([[2.0, 1.9, -1.0], [-1.0, -1.2, -5.0]], dtype=np.float32)
    history = [[0, 0, 2], [0]]
    a, t = _both(logits, P(repetition_penalty=1.5), history)
    assert a.tolist() == [1, 1]  # 2 / 1.5 < 1.9 and -1 * 1.5 < -1.2
    assert t is None or t.tolist() == [1, 1]
    assert smp.sample_numpy(logits, P(), history).tolist() == [0, 0]
    assert smp.sample_numpy(logits, P(repetition_penalty=1.5)).tolist() == [0, 0]  # no history


def test_inverse_cdf_draw():
    # probabilities 0.5, 0.25, 0.25 for ids 2, 0, 1 (ids 0 and 1 tie: 0 comes first)
    logits = np.log(np.array([[0.25, 0.25, 0.5]] * 6, dtype=np.float32))
    u = np.array([0.0, 0.49, 0.51, 0.74, 0.76, 0.999])  # clear of the boundaries
    a, t = _both(logits, P(temperature=1.0), uniforms=u)
    assert a.tolist() == [2, 2, 0, 0, 1, 1]
    assert t is None or t.tolist() == a.tolist()
    # top_k=2 keeps ids 2 and 0 (2/3, 1/3); top_p=0.6 keeps 2 and 0 too (0.5 < 0.6 <= 0.75)
    for params in (P(temperature=1.0, top_k=2), P(temperature=1.0, top_p=0.6)):
        a = smp.sample_numpy(logits, params, uniforms=u)
        assert a.tolist() == [2, 2, 2, 0, 0, 0]
    assert smp.sample_numpy(logits, P(temperature=1.0, top_p=0.45), uniforms=u).tolist() == [2] * 6


@pytest.mark.parametrize(
    "params",
    [
        P(temperature=1.0),
        P(temperature=0.7, top_k=40),
        P(temperature=1.3, top_p=0.9),
        P(temperature=0.9, top_k=50, top_p=0.8, repetition_penalty=1.3),
        P(temperature=2.0, top_k=3),
        P(repetition_penalty=1.2),
    ],
)
def test_numpy_and_torch_choose_the_same_tokens(params):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    b, v = 64, 3000
    logits = rng.normal(scale=3.0, size=(b, v)).astype(np.float32)
    logits[: b // 2] = np.round(logits[: b // 2] * 2) / 2  # many ties
    logits[5, :100] = -np.inf
    history = [rng.integers(0, v, size=rng.integers(0, 200)).tolist() for _ in range(b)]
    for device in _devices(torch):
        for trial in range(5):
            u = rng.random(b)
            u[:3] = [0.0, 0.5, 1 - 2**-53]
            a, t = _both(logits, params, history, u, device)
            assert (a == t).all(), (device, trial, np.nonzero(a != t))


def test_torch_uses_its_generator_and_stays_on_device():
    torch = pytest.importorskip("torch")
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    params = P(temperature=1.0, seed=7)
    for device in _devices(torch):
        x = logits.to(device)
        a = smp.sample_torch(x, params, generator=params.torch_generator(device))
        b = smp.sample_torch(x, params, generator=params.torch_generator(device))
        assert a.device.type == device and a.dtype == torch.int64 and (a == b).all()
        assert (smp.sample_torch(x, P()) == x.argmax(1)).all()


def test_torch_does_not_synchronise_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logits = torch.randn(4, 5000, device="cuda")
    mask = smp.make_history_mask([[1, 2], [3], [], [4999]], 5000, "cuda")
    gen = P(seed=1).torch_generator("cuda")
    u = torch.rand(4, device="cuda", dtype=torch.float64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for params in (P(), P(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)):
            smp.sample_torch(logits, params, mask, gen)
            smp.sample_torch(logits, params, mask, uniforms=u)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_frequencies_follow_the_distribution():
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    n = 40_000
    logits = np.tile(np.log(probs).astype(np.float32) * 0.5, (n, 1))  # temperature 0.5 undoes it
    params = P(temperature=0.5, seed=123)
    counts = np.bincount(smp.sample_numpy(logits, params, rng=params.numpy_rng()), minlength=6)
    # 5 degrees of freedom: P(chi2 > 45) < 1e-8; the seed makes it deterministic anyway.
    assert _chi_square(counts, probs) < 45
    counts = np.bincount(
        smp.sample_numpy(logits[:8000], P(temperature=0.5, top_k=3), rng=np.random.default_rng(9)),
        minlength=6,
    )
    assert counts[3:].sum() == 0
    assert _chi_square(counts[:3], probs[:3] / probs[:3].sum()) < 40  # 2 dof
    try:
        import torch
    except ImportError:
        return
    gen = params.torch_generator()
    counts = np.bincount(
        smp.sample_torch(torch.as_tensor(logits), params, generator=gen), minlength=6
    )
    assert _chi_square(counts, probs) < 45


def test_sampling_argument_errors():
    logits = np.zeros((2, 5), dtype=np.float32)
    with pytest.raises(ValueError, match="2 rows"):
        smp.sample_numpy(logits, P(repetition_penalty=1.1), [[1]])
    with pytest.raises(ValueError, match="outside"):
        smp.sample_numpy(logits, P(repetition_penalty=1.1), [[1], [5]])
    with pytest.raises(ValueError, match="shape"):
        smp.sample_numpy(np.zeros(5, dtype=np.float32), P())
    with pytest.raises(ValueError, match="NaN"):
        smp.sample_numpy(np.full((1, 3), np.nan, dtype=np.float32), P())
    with pytest.raises(ValueError, match="no finite"):
        smp.sample_numpy(np.full((1, 3), -np.inf, dtype=np.float32), P(temperature=1.0))


# ---- StopChecker ----------------------------------------------------------------------------


def _run(stop, pieces):
    checker = smp.StopChecker(stop)
    out = [checker.push(p) for p in pieces]
    return out, checker.flush(), checker


def test_stop_string_spanning_tokens():
    out, tail, c = _run(["</s>"], ["Hello <", "/", "s>", " more"])
    assert out == ["Hello ", "", "", ""] and tail == "" and c.stopped and c.matched == "</s>"
    out, tail, c = _run(["\n\nUser:"], ["Fine.\n", "\nUs", "er: what"])
    assert "".join(out) == "Fine." and c.stopped


def test_held_back_prefix_is_released():
    out, tail, c = _run(["STOP"], ["ST", "ar", "t S", "TO", "ne"])
    assert out == ["", "STar", "t ", "", "STOne"] and not c.stopped and tail == ""
    out, tail, c = _run(["STOP"], ["the end ST"])
    assert out == ["the end "] and tail == "ST" and not c.stopped


def test_stop_in_one_push_and_several_stops():
    out, _, c = _run(["abc", "bd"], ["ab", "d", "ignored"])
    assert out == ["", "a", ""] and c.matched == "bd"
    out, _, c = _run(["xy", "yz"], ["axyz"])
    assert out == ["a"] and c.matched == "xy"
    # A stop string inside a longer one that began earlier: the one completed first wins.
    out, _, c = _run(["abcd", "bc"], ["a", "b", "c", "d"])
    assert "".join(out) == "a" and c.matched == "bc"
    assert _run([], ["a", "b"])[0] == ["a", "b"]
    with pytest.raises(ValueError):
        smp.StopChecker([""])


def test_stop_checker_on_random_splits():
    rnd = random.Random(5)
    stops = ["<|x|>", "STOP", "\n\n"]  # none inside another
    for _ in range(500):
        text = "".join(
            rnd.choice(["a", "<|", "x", "|>", "S", "TO", "P", "\n", " ", "é"]) for _ in range(20)
        )
        cuts = sorted(rnd.sample(range(1, len(text)), min(6, len(text) - 1)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out, tail, c = _run(stops, pieces)
        hits = [i for s in stops if (i := text.find(s)) >= 0]
        expected = text[: min(hits)] if hits else text
        assert "".join(out) + tail == expected and c.stopped == bool(hits)
