"""The host examples of README.md and docs/host-api.md: their code is the code that runs.

- Always (no GPU): README.md holds one Python block (a whole model through pyq2.runtime.step) and
  docs/host-api.md three (the ctypes excerpt, the torch operators, generation), each valid Python;
  the generation block runs the demo model as it stands, its file name replaced; every line
  of the ctypes excerpt is a line of tools/examples/ctypes_host.py, in the file's order ("..."
  marks what the excerpt leaves out; indentation aside).
- Where a C compiler is found (no GPU): README.md's C block compiles against pq2.h, as the body of
  a function whose parameters are its free names (device pointers, sizes, the stream).
- With torch, CUDA and a CUDA build (marked gpu), on the demo model (pyq2.offline.demo), each block
  run as it stands with only its free names bound:
  - the DecodeStep block, its file name replaced by the demo model's path and `token` bound:
    its logits are those of a recorded re-run of the same step (so the block's run wrote them),
    and within FOLD_TOL of the head's product with the unfolded weights, from the inputs the
    head's producer read (in bf16, the step's default dtype: the logits' rounding adds ~1e-3 to
    the Q8 error);
  - the torch block, with raw, n, k the bytes and shape of a folded PQ2_0 weight of the file,
    rotation its contract and x a [2, 3, k] input: y within FOLD_TOL of x . W^T with the
    unfolded weights, and the bits of the uncompiled module and of a PQ2Linear built from the
    loaded model's tensor.
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

from pyq2.gguf import io as gguf_io

from ..conftest import (
    CTYPES_EXAMPLE,
    ROOT,
    assert_matches_unfolded,
    keyed_rng,
    needs_gpu,
    optional_torch,
    stage_activation,
)

torch = optional_torch()

README = ROOT / "README.md"
HOST_API = ROOT / "docs" / "host-api.md"
MODEL_PATH = '"Ternary-Bonsai-2-27B.gguf"'  # the DecodeStep block's file, replaced by the demo's
# The free names of README's C block: what a host has when it calls (device pointers, sizes).
C_PARAMS = (
    "const void *d_tiles, size_t tiles_bytes, int64_t n, int64_t k, int64_t m, const void *d_x, "
    "void *d_y, void *d_ws, void *stream"
)


def gpu_test(f):
    return pytest.mark.gpu(needs_gpu(f))


def code_blocks(path, lang: str) -> list[str]:
    return re.findall(
        rf"^```{lang}\n(.*?)^```$", path.read_text(encoding="utf-8"), flags=re.S | re.M
    )


def host_blocks() -> dict[str, str]:
    """The ```python blocks by role: "step" (README.md's), "ctypes", "torch" and "generate"
    (host-api.md's)."""
    steps = [b for b in code_blocks(README, "python") if "DecodeStep(" in b]
    assert len(steps) == 1, f"README.md has {len(steps)} Python blocks with a DecodeStep, not 1"
    roles = {"step": steps[0]}
    for block in code_blocks(HOST_API, "python"):
        role = (
            "step"
            if "DecodeStep(" in block
            else "ctypes"
            if "lib.pq2_" in block
            else "torch"
            if "PQ2Linear" in block
            else "generate"
            if "open_model(" in block
            else None
        )
        assert role is not None and role not in roles, f"an unexpected block:\n{block}"
        roles[role] = block
    return roles


def test_the_examples_are_four_blocks_of_valid_python():
    blocks = host_blocks()
    assert sorted(blocks) == ["ctypes", "generate", "step", "torch"]
    for role, block in blocks.items():
        compile(block, f"host example ({role})", "exec")
    assert MODEL_PATH in blocks["step"]


def test_the_ctypes_excerpt_is_the_examples_code():
    example = [line.strip() for line in CTYPES_EXAMPLE.read_text(encoding="utf-8").splitlines()]
    at = 0
    for line in host_blocks()["ctypes"].splitlines():
        line = line.strip()
        if not line or line == "...":
            continue
        assert line in example[at:], (
            f"host-api's ctypes excerpt line {line!r} is not in {CTYPES_EXAMPLE.name} "
            f"(after line {at})"
        )
        at += example[at:].index(line) + 1


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
def test_the_readme_c_block_compiles(tmp_path):
    (block,) = code_blocks(README, "c")
    lines = block.splitlines()
    includes = [line for line in lines if line.startswith("#include")]
    body = [line for line in lines if not line.startswith("#include")]
    src = tmp_path / "readme.c"
    src.write_text(
        "\n".join(includes)
        + f"\n\nvoid readme_example({C_PARAMS})\n{{\n"
        + "\n".join(body)
        + "\n}\n"
    )
    r = subprocess.run(
        ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"]
        + ["-I", str(ROOT / "native" / "include"), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"README.md's C block does not compile:\n{r.stderr}"


def run_block(role: str, names: dict, replace: tuple[str, str] | None = None) -> dict:
    """Execute a block with `names` bound; its namespace afterwards."""
    block = host_blocks()[role]
    if replace is not None:
        assert replace[0] in block
        block = block.replace(*replace)
    ns = dict(names)
    exec(compile(block, f"host example ({role})", "exec"), ns)
    return ns


@gpu_test
def test_the_decode_step_block_runs_the_demo_model(demo_gguf, demo_unfolded):
    w, _, rot = demo_unfolded
    ns = run_block("step", {"token": 7}, (MODEL_PATH, repr(str(demo_gguf))))
    step, model = ns["step"], ns["model"]
    torch.cuda.synchronize()
    logits = step.outputs["output.weight"].clone()
    assert logits.shape == (1, w["output.weight"].shape[0])
    assert step.ids.tolist() == [7]
    records = step.record()  # the same step again, eagerly: its producers' inputs and outputs
    head = records[-1]
    assert head["stage"].projections == ("output.weight",)
    assert torch.equal(logits, head["outputs"]["output.weight"])
    act = stage_activation(head["stage"], model.plan, head["inputs"], rot.gdn_v_grouped)
    assert_matches_unfolded(logits, act, w["output.weight"], "README step: logits")


@gpu_test
def test_the_torch_block_runs_on_a_demo_weight(demo_gguf, demo_unfolded):
    from pyq2.lib.torch_ops import PQ2Linear
    from pyq2.runtime.load import load

    w, _, rot = demo_unfolded
    name = "blk.0.ffn_down.weight"  # a folded PQ2_0 weight, input width 768
    with gguf_io.open_gguf(demo_gguf) as gf:
        t = gf.tensor(name)
        assert t.type_name == "PQ2_0" and rot.folds(name)
        raw = np.array(gf.data(t))
        k, n = t.ne
    r = keyed_rng("readme-torch")
    x = torch.from_numpy(r.standard_normal((2, 3, k)).astype(np.float32)).cuda()
    ns = run_block("torch", {"raw": raw, "n": n, "k": k, "rotation": rot, "x": x})
    y = ns["y"]
    assert (y.shape, y.dtype) == ((2, 3, n), torch.float32)
    assert_matches_unfolded(y.reshape(-1, n), x.reshape(-1, k), w[name], f"host-api torch: {name}")
    assert torch.equal(y, ns["lin"](x)), "compiled and eager differ"
    model = load(demo_gguf)
    loaded = PQ2Linear.from_weights(model.weights[name].matrix, model.rotation_for(k))
    assert torch.equal(y, loaded(x)), "host-api's module and the loaded model's differ"


def test_the_generate_block_runs_the_demo_model(demo_gguf, capsys):
    """host-api.md's whole-model block, its file name replaced by the demo model's: it prints the
    text generate() returns (on the CPU here, the GPU where there is one)."""
    block = host_blocks()["generate"]
    assert MODEL_PATH in block
    exec(compile(block.replace(MODEL_PATH, repr(str(demo_gguf))), "host-api.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.endswith("\n") and len(printed) > 1
