"""The decode graph's tail as Triton kernels (pyq2.runtime.advance_kernels) against its torch form
(GpuModel._advance_torch): greedy's choice and the positions moved on, bit-exact (an index and an
integer). Vocabularies on both sides of a block and of a part, a row's maximum repeated in one
block, in two blocks and in two parts (the first index wins, as torch.argmax), rows of -inf and
with NaN, rows of every
batch size up to the scratch's, positions at the context's end (clamped). Outputs are poisoned
before each call."""

from types import SimpleNamespace

import pytest

from ..conftest import gpu_module

torch = gpu_module()
pytest.importorskip("triton")

from pyq2.runtime import advance_kernels  # noqa: E402
from pyq2.runtime.advance_kernels import Advance  # noqa: E402
from pyq2.runtime.gpu_model import GpuModel  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
BLOCK, PARTS = advance_kernels.BLOCK, advance_kernels.PARTS
CONTEXT = 100


def both(logits, positions, greedy, batch=16):
    """(chosen, ids, positions) from the kernels and from the torch form, poisoned first."""
    b = logits.shape[0]
    out = []
    for form in ("kernels", "torch"):
        chosen = torch.full((batch,), -7, dtype=torch.int64, device=DEV)
        ids = torch.full((batch,), -9, dtype=torch.int32, device=DEV)
        pos = positions.clone()
        if form == "kernels":
            Advance(batch, DEV)(logits, chosen[:b], ids[:b], pos[:b], CONTEXT - 1, greedy)
        else:
            host = SimpleNamespace(_chosen=chosen, positions=pos, context=CONTEXT)
            GpuModel._advance_torch(host, SimpleNamespace(m=b, logits=logits, ids=ids[:b]), greedy)
        torch.cuda.synchronize()
        out.append((chosen, ids, pos))
    return out


@pytest.mark.parametrize("v", [1, 5, BLOCK - 1, BLOCK + 1, PARTS * BLOCK + 3, 248320])
@pytest.mark.parametrize("b", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_choice_and_positions_match_the_torch_form(v, b, dtype):
    g = torch.Generator(device=DEV).manual_seed(v * 31 + b)
    logits = torch.randn(b, v, generator=g, device=DEV).to(dtype)
    positions = torch.tensor([CONTEXT - 1, 0, 5, CONTEXT - 2] * 4, device=DEV)
    (kc, ki, kp), (tc, ti, tp) = both(logits, positions, greedy=True)
    assert torch.equal(kc, tc) and torch.equal(ki, ti) and torch.equal(kp, tp)
    want = positions.clone()
    want[:b] = (want[:b] + 1).clamp(max=CONTEXT - 1)  # row 0 at the context's end stays there
    assert torch.equal(kp, want)


@pytest.mark.parametrize(
    "where",
    [(3, 4), (BLOCK - 1, BLOCK), (5, BLOCK + 5), (7, 2 * BLOCK * 3 + 1), (BLOCK * 5, BLOCK * 40)],
)
@pytest.mark.parametrize("v", [248320, PARTS * BLOCK + 3])  # parts of one block; of two
def test_equal_maxima_give_the_first_index(where, v):
    logits = torch.zeros(2, v, device=DEV)
    for i in where:
        logits[:, i] = 3.0
    logits[1, where[1]] = 4.0  # row 1: one maximum, the later index
    (kc, ki, _), (tc, ti, _) = both(logits, torch.zeros(16, dtype=torch.int64, device=DEV), True)
    assert kc[:2].tolist() == [where[0], where[1]] and torch.equal(kc, tc) and torch.equal(ki, ti)


@pytest.mark.parametrize("v", [1000, 248320])
def test_rows_of_minus_infinity_and_nan_give_torchs_index(v):
    """A row of -inf: index 0; a NaN is larger than +inf, and +inf than any finite value. Never
    an index outside the vocabulary."""
    logits = torch.randn(4, v, device=DEV)
    logits[0] = float("-inf")
    logits[1, 777] = float("nan")
    logits[2, 5], logits[2, v - 2] = float("nan"), float("inf")  # NaN before +inf
    logits[3, v - 1] = float("inf")
    (kc, ki, _), (tc, ti, _) = both(logits, torch.zeros(16, dtype=torch.int64, device=DEV), True)
    assert kc[:4].tolist() == [0, 777, 5, v - 1] and torch.equal(kc, tc) and torch.equal(ki, ti)


def test_not_greedy_moves_the_positions_only():
    logits = torch.randn(4, 1000, device=DEV)
    positions = torch.tensor([CONTEXT - 1, 0, 7, 8] + [3] * 12, device=DEV)
    (kc, ki, kp), (tc, ti, tp) = both(logits, positions, greedy=False)
    assert (kc == -7).all() and (ki == -9).all() and torch.equal(kp, tp)
    assert kp[:4].tolist() == [CONTEXT - 1, 1, 8, 9]


def test_bad_arguments_are_refused():
    adv = Advance(2, DEV)
    one = torch.zeros(3, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="at most 2 rows"):
        adv(torch.zeros(3, 10, device=DEV), one, one.int(), one, 5, True)
    with pytest.raises(ValueError, match="unit stride"):
        adv(torch.zeros(10, 2, device=DEV).t(), one, one.int(), one, 5, True)
