"""The demo model's float twin (pyq2.offline.demo.write_float_twin) read by an implementation
nobody here wrote: transformers' Qwen3_5ForCausalLM, through its own GGUF reader, gives the
logits pyq2's CPU reference (pyq2.runtime.cpu_model: the folded file dequantised and unfolded,
pyq2.gguf.float_weights) gives on the folded file. This checks the unfolding (the rotation, the
grouped-to-tiled columns of ssm_out) and pyq2's reading of the file's conventions on the CPU; the
GPU runner is checked against both in tests/runtime/test_runner_gpu.py."""

import importlib.util

import numpy as np
import pytest

from pyq2.gguf import io as gguf_io
from pyq2.gguf.float_weights import read_float_weights
from pyq2.offline.demo import write_demo_model, write_float_twin
from pyq2.runtime.cpu_model import CpuModel
from pyq2.runtime.open_model import read_metadata
from pyq2.spec import qwen35
from pyq2.spec.reference import rel_rms

TWIN_TOL = 5e-5  # fp32 arithmetic of two implementations of one float model


def test_the_twin_holds_the_unfolded_weights_and_no_rotation(tmp_path):
    folded = write_demo_model(tmp_path / "demo.gguf")
    twin = write_float_twin(folded, tmp_path / "twin.gguf")
    with gguf_io.open_gguf(folded) as gf:
        want = read_float_weights(gf)
    with gguf_io.open_gguf(twin) as gf:
        assert not any(k.startswith(("prism.", "pyq2.")) for k in gf.keys())
        assert all(t.type_name == "F32" for t in gf.tensors)
        got = read_float_weights(gf)
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_transformers_on_the_twin_gives_the_references_logits(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loading requires it
    if importlib.util.find_spec("fla") is not None:
        pytest.skip(
            "fla is installed: transformers then runs its Triton kernels, which take CUDA tensors "
            "only (tests/runtime/test_runner_gpu.py compares transformers on the GPU)"
        )
    folded = write_demo_model(tmp_path / "demo.gguf", n_layers=4)
    twin = write_float_twin(folded, tmp_path / "twin.gguf")
    with gguf_io.open_gguf(folded) as gf:
        config = qwen35.Config.from_metadata(read_metadata(gf))
        cpu = CpuModel(gf, config, context=128)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 1000, 40)]
    ours = cpu.score(tokens)
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(
        str(tmp_path),
        gguf_file=twin.name,
        dtype=torch.float32,
        attn_implementation="eager",
        use_kernels=False,
    ).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()
    err = rel_rms(ours, theirs)
    assert err < TWIN_TOL, err
    assert (ours.argmax(1) == theirs.argmax(1)).all()
