"""`pyq2 bench` where it cannot run: without a GPU (or torch) it says so and exits 1; without a
model or preset it is a usage error."""

import os

import pytest

from .conftest import run_pyq2


def run_module(*args):
    return run_pyq2(*args, env=dict(os.environ), timeout=120)


def has_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(has_cuda(), reason="checks the answer on a machine without a GPU")
def test_bench_without_a_gpu_says_so():
    p = run_module("bench", "--synthetic", "tiny")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "pyq2: error: pyq2 bench needs a CUDA GPU and PyTorch with CUDA"
    ]


def test_bench_usage_errors():
    p = run_module("bench")
    assert p.returncode == 2 and "MODEL" in p.stderr and "Traceback" not in p.stderr
    p = run_module("bench", "--synthetic", "nonesuch")
    assert p.returncode == 2 and "bonsai-2-27b" in p.stderr


def test_load_without_torch_says_what_to_install(tmp_path):
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401

        pytest.skip("torch is installed")
    except ImportError:
        pass
    from pyq2.demo import write_demo_model
    from pyq2.model import load

    path = write_demo_model(tmp_path / "demo.gguf")
    with pytest.raises(RuntimeError, match=r"pip install torch"):
        load(path)
