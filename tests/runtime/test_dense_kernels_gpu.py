"""pyq2.runtime.dense_kernels (a decode step's side projections) against the float64 product, on
odd shapes: every row count up to MAX_ROWS that changes the row block, a K that is not a multiple
of the column block, a single output row, bf16 and float32 inputs. Outputs are poisoned before
each call. Within a tolerance: the float32 sum's order differs from float64 (FP32_TOL), and a
bf16 output rounds once more (BF16_TOL)."""

import pytest

from ..conftest import gpu_module

torch = gpu_module()
pytest.importorskip("triton")

from pyq2.runtime import dense_kernels  # noqa: E402

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
BF16_TOL = 8e-3
DEV = torch.device("cuda")


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize("n, k", [(1, 100), (96, 5120), (7, 3001)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_rows_matches_float64(m, n, k, dtype):
    gen = torch.Generator(device=DEV).manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen, device=DEV).to(dtype)
    w = torch.randn(n, k, generator=gen, device=DEV).to(dtype)
    out = torch.full((m, n), float("nan"), device=DEV, dtype=dtype)
    dense_kernels.dense_rows(x, w, out)
    want = x.double() @ w.double().t()
    assert rel(out, want) < (FP32_TOL if dtype == torch.float32 else BF16_TOL)


def test_dense_rows_writes_strided_output_columns_only():
    """A column range of a wider output (the step's side outputs are views): the other columns
    keep their bits."""
    x = torch.randn(3, 256, device=DEV)
    w = torch.randn(5, 256, device=DEV)
    wide = torch.full((3, 9), 7.0, device=DEV)
    dense_kernels.dense_rows(x, w, wide[:, 2:7])
    assert rel(wide[:, 2:7], x.double() @ w.double().t()) < FP32_TOL
    assert (wide[:, :2] == 7.0).all() and (wide[:, 7:] == 7.0).all()


def test_dense_rows_refuses_bad_shapes():
    x = torch.randn(17, 64, device=DEV)
    w = torch.randn(4, 64, device=DEV)
    with pytest.raises(ValueError, match="1..16 rows"):
        dense_kernels.dense_rows(x, w, torch.empty(17, 4, device=DEV))
    with pytest.raises(ValueError, match="shapes"):
        dense_kernels.dense_rows(x[:2], w[:, :32], torch.empty(2, 4, device=DEV))
    with pytest.raises(ValueError, match="unit stride"):
        dense_kernels.dense_rows(x[:2, ::2], w[:, :32], torch.empty(2, 4, device=DEV))
