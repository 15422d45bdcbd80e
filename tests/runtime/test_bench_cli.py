"""`pyq2 bench` where it cannot run: without a GPU (or torch) it says so and exits 1; without a
model or preset it is a usage error."""

import os

import pytest

from ..conftest import run_pyq2


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
    from pyq2.offline.demo import write_demo_model
    from pyq2.runtime.load import load

    path = write_demo_model(tmp_path / "demo.gguf")
    with pytest.raises(RuntimeError, match=r"pip install torch"):
        load(path)


def test_bench_tp_json_carries_rank_0s_environment(tmp_path, monkeypatch, capsys):
    """`pyq2 bench --tp G --json` writes what rank 0 returned, its environment included, and
    names rank 0's GPU (pyq2.runtime.launch.bench_rank measures; here a stand-in returns)."""
    import argparse
    import json

    from pyq2.runtime import bench
    from pyq2.runtime import launch as parallel

    env = {"gpu": "Some GPU", "commit": "abc1234"}
    row = {"m": 1, "ms": 2.0, "tokens_per_s": 500.0, "collectives_ms": 0.1}
    row.update({"single_gpu_ms": 3.0, "ratio_to_single": 0.667, "calls": 9})
    fake = {"model": "synthetic tiny", "tp": 2, "env": env, "read_bandwidth_gbs": 4000.0}
    fake.update({"step_bytes_m1_rank0": 10**9, "fused": True, "rows": [row]})
    calls = []
    monkeypatch.setattr(parallel, "launch", lambda *a: calls.append(a) or fake)
    out = tmp_path / "tp.json"
    args = argparse.Namespace(
        synthetic="tiny", ms="1", prompt=None, replays=2, no_fuse=False, json=str(out)
    )
    assert bench._run_tp(args, 2, []) == 0
    assert calls[0][:4] == (2, parallel.bench_rank, 2, "tiny")
    assert "tensor-parallel over 2 GPUs (Some GPU)" in capsys.readouterr().out
    assert json.loads(out.read_text()) == fake
