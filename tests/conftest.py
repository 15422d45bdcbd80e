"""Helpers and fixtures shared by the test files.

tests/ is a package, so a test file imports these helpers with `from .conftest import ...`;
pytest's importlib mode keeps tests/ and the source tree off sys.path.
"""

import errno
import functools
import gc
import importlib.util
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import pyq2
from pyq2.gguf import io as gguf_io
from pyq2.lib import native as _native
from pyq2.offline.demo import write_demo_model
from pyq2.spec import formats, layouts, reference
from pyq2.spec.rotation import Rotation

ROOT = Path(__file__).resolve().parents[1]

# ---- the native library ------------------------------------------------------------------


def native_or_skip():
    """(ffi, lib) of libpq2; the test skipped where it does not load, failed instead when
    PYQ2_REQUIRE_NATIVE is set (CI sets it)."""
    from pyq2.errors import LibraryError

    try:
        return _native.load()
    except LibraryError as e:
        if os.environ.get("PYQ2_REQUIRE_NATIVE"):
            pytest.fail(f"PYQ2_REQUIRE_NATIVE is set but libpq2 does not load: {e}")
        pytest.skip(f"libpq2 not available: {e}")


def fake_q8(ffi):
    """A pq2_q8 whose pointers are aligned but never dereferenced: for calls that must refuse
    their arguments before touching memory."""
    q = ffi.new("pq2_q8 *")
    q.q8, q.scales, q.sums = (
        ffi.cast("int8_t *", 256),
        ffi.cast("float *", 256),
        ffi.cast("int32_t *", 256),
    )
    return q


# ---- the GPU --------------------------------------------------------------------------------


def optional_torch():
    """torch, or None where it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


@functools.cache
def gpu_ready() -> bool:
    """torch with CUDA, a GPU and a loadable libpq2 built with CUDA."""
    torch = optional_torch()
    return (
        torch is not None
        and torch.cuda.is_available()
        and _native.available()
        and bool(_native.load()[1].pq2_built_with_cuda())
    )


needs_gpu = pytest.mark.skipif(
    not gpu_ready(), reason="needs torch with CUDA, a GPU and a CUDA build of libpq2"
)


def gpu_module():
    """At the top of a GPU test module: torch, or the module skipped without torch, a CUDA
    device or a libpq2 built with CUDA (a libpq2 that does not load is an error here)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device", allow_module_level=True)
    if not _native.load()[1].pq2_built_with_cuda():
        pytest.skip("libpq2 built without CUDA", allow_module_level=True)
    return torch


def settled_allocated():
    """The CUDA memory torch's allocator holds once earlier tests' garbage is collected, so that
    only what the code under test keeps or frees changes it."""
    torch = optional_torch()
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def graph_capture(step, static):
    """(graph, outputs) of step(*static) captured in a CUDA graph, after one run on a side stream
    (pq2_cuda_init and the allocator's first allocations stay out of the capture)."""
    torch = optional_torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step(*static)
    return g, outs


# ---- subprocesses -------------------------------------------------------------------------

# Children import the same pyq2 as this process (installed or source tree), whatever the cwd.
PYQ2_PARENT = os.path.dirname(os.path.abspath(list(pyq2.__path__)[0]))


def subprocess_env() -> dict:
    """The environment of a child Python that must import this process's pyq2."""
    return dict(os.environ, PYTHONPATH=PYQ2_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_pyq2(*argv, env=None, **kwargs) -> subprocess.CompletedProcess:
    """`python -m pyq2 ARGV` in a child process (text output captured; by default with the
    environment of subprocess_env). kwargs go to subprocess.run (cwd, timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "pyq2", *map(str, argv)],
        capture_output=True,
        text=True,
        env=subprocess_env() if env is None else env,
        **kwargs,
    )


# ---- PQ2_0 data ---------------------------------------------------------------------------


def keyed_rng(*key):
    """A numpy generator seeded by key (any repr-able values): the same key, the same numbers."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def random_raw(n, k, seed=0, finite=False):
    """Random PQ2_0 bytes of an n x k matrix: every code 0..3, scales of any fp16 bits (NaN and
    Inf included: they must move like any other bytes), or any finite bits with finite=True."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n * (k // 128), 34), dtype=np.uint8)
    if finite:
        d = raw[:, :2].copy().view(np.float16)
        raw[:, :2] = np.where(np.isfinite(d), d, np.float16(-0.75)).view(np.uint8)
    return raw.reshape(-1)


def random_pq2(rng, n, k):
    """PQ2_0 bytes of an n x k matrix as a model holds them: every code 0..3, small finite fp16
    scales of either sign."""
    blocks = rng.integers(0, 256, (n * k // 128, 34), dtype=np.uint8)
    d = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
    blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def ternary_pq2(rng, n_blocks, finite=True):
    """PQ2_0 blocks without code 3 (so representable in PTQ1_0): small positive scales, or
    scales of any fp16 bits with finite=False."""
    codes = rng.integers(0, 3, (n_blocks, 128), dtype=np.uint8)
    if finite:
        d = (rng.random(n_blocks) * 0.05).astype(np.float16)
    else:
        d = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16).view(np.float16)
    return formats.pq2_pack(codes, d).reshape(-1)


# ---- parametrisation ----------------------------------------------------------------------

# Every layout with every rt it takes.
LAYOUT_RTS = [("raw", 0), ("planes", 0)] + [("tiles", rt) for rt in layouts.TILE_RTS]


def shape_id(shape):
    return f"n{shape[0]}-k{shape[1]}"


def conversion_cases(shapes):
    """(shape, src layout, dst layout, src rt, dst rt): every conversion of every shape."""
    return [
        (shape, src, dst, src_rt, dst_rt)
        for shape in shapes
        for src, src_rt in LAYOUT_RTS
        for dst, dst_rt in LAYOUT_RTS
    ]


def conversion_id(case):
    shape, src, dst, src_rt, dst_rt = case
    return f"{shape_id(shape)}-{src}{src_rt or ''}-to-{dst}{dst_rt or ''}"


# ---- GGUF files ---------------------------------------------------------------------------


def write_gguf_file(path, kv, tensors, alignment=32):
    """Write a GGUF file of key/values kv (encode_kv arguments) and tensors ((OutTensor, data)
    pairs). A general.alignment key goes first when the alignment is not the default 32."""
    records = [gguf_io.encode_kv(*item) for item in kv]
    if alignment != 32:
        records.insert(
            0, gguf_io.encode_kv("general.alignment", gguf_io.GGUFValueType.UINT32, alignment)
        )
    gguf_io.write_gguf(
        path, records, [t for t, _ in tensors], lambda i, t: (tensors[i][1],), alignment=alignment
    )


def tensor_info_offset(blob, name):
    """Byte offset of the n_dims field of tensor `name` in a file's bytes."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return blob.rindex(key) + len(key)  # tensor infos follow the key/values


def patched(src, dst, edit):
    """Copy src to dst (which may be src) with edit(bytearray, GGUFFile of src) applied."""
    blob = bytearray(src.read_bytes())
    with gguf_io.open_gguf(src) as f:
        edit(blob, f)
    dst.write_bytes(bytes(blob))
    return dst


def reseal(path):
    """Recompute, in place, the checksums (pyq2.tensor.<name>.crc32) of a repacked file a test
    has edited on purpose, as a tool that edits such a file knowingly would: the file then
    reaches the check the test is about instead of failing its checksum. Returns the path."""
    from pyq2.gguf import contents, metadata

    patches = []
    with gguf_io.open_gguf(path) as f:
        index = metadata.describing_keys(f.keys())
        for t in f.tensors:
            key = metadata.tensor_key(t.name, metadata.CHECKSUM_ATTR)
            if not f.has(key) or f.value_type(key) != gguf_io.GGUFValueType.UINT32:
                continue
            members = f.value(metadata.tensor_key(t.name, "members"), [])
            if not isinstance(members, list):
                members = []
            members = [m for m in members if isinstance(m, str)]
            keys = metadata.description_keys(index, t.name, members)
            patches.append((f.fields[key].value_offset, contents._checksum(f, t, keys)))
    blob = bytearray(Path(path).read_bytes())
    for at, crc in patches:
        struct.pack_into("<I", blob, at, crc)
    Path(path).write_bytes(bytes(blob))
    return path


def listing(directory):
    return sorted(os.listdir(directory))


@pytest.fixture
def demo(tmp_path):
    """The demo model (pyq2.offline.demo), written to tmp_path/demo.gguf."""
    return write_demo_model(tmp_path / "demo.gguf")


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(n): the n-th write of the GGUF writer fails with ENOSPC."""

    def arm(n):
        calls = []

        def write(f, data):
            calls.append(1)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, "No space left on device")
            f.write(data)

        monkeypatch.setattr(gguf_io, "_write", write)

    return arm


# ---- the demo model against its unfolded float weights ------------------------------------

# Relative RMS bounds of the demo model's weight path against float64 numpy from its UNFOLDED
# float weights (tests/runtime/test_model.py, tests/runtime/test_demo_hosts.py,
# tests/lib/test_host_examples.py)
FOLD_TOL = 1e-2  # a folded projection: Q8 of the rotated activation against the unquantised
#                  product (the weights are exact; numpy's Q8 gives 5e-3 to 8.5e-3 on the
#                  demo's K = 256 head at m = 1)
ROW_TOL = 2e-6  # embedding rows with the inverse rotation: fp32 butterflies
NORMED_TOL = 1e-5  # the un-rotated RMSNorm output in fp32, and the side projections reading it


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory):
    """The demo model (pyq2.offline.demo), written once per session: read it, never edit it (the
    `demo` fixture gives a test a copy of its own)."""
    return write_demo_model(tmp_path_factory.mktemp("demo-model") / "demo.gguf")


@pytest.fixture(scope="session")
def demo_stored(demo_gguf, tmp_path_factory):
    """The demo model in every stored layout: "raw" (PQ2_0 as shipped), "planes", "tiles"
    (rt 4); read them, never edit them."""
    from pyq2.offline.repack import repack

    d = tmp_path_factory.mktemp("demo-stored")
    repack(demo_gguf, d / "planes.gguf", layout="planes")
    repack(demo_gguf, d / "tiles.gguf", layout="tiles", rt=4)
    return {"raw": demo_gguf, "planes": d / "planes.gguf", "tiles": d / "tiles.gguf"}


def unfolded_weights(path):
    """(name -> float64 [N, K] of every ternary weight, unfolded; name -> float32 dense tensor;
    the file's Rotation), read from the file with numpy only."""
    out, dense = {}, {}
    with gguf_io.open_gguf(path) as gf:
        widths = {t.name: t.ne[0] for t in gf.tensors}
        rot = Rotation.from_file(gf, widths)
        for t in gf.tensors:
            raw = np.array(gf.data(t))
            if t.type_name in ("PQ2_0", "PTQ1_0"):
                k, n = t.ne
                if t.type_name == "PTQ1_0":
                    raw = formats.ptq1_to_pq2(raw)
                w = formats.pq2_dequantize(raw, n, k)
                folded = rot.carries(t.name)
                out[t.name] = reference.unfold(w, rot.block, rot.signs_for(k)) if folded else w
            else:
                dense[t.name] = raw.view(np.float32).reshape(tuple(reversed(t.ne)))
    return out, dense, rot


@pytest.fixture(scope="session")
def demo_unfolded(demo_gguf):
    """unfolded_weights of the demo model."""
    return unfolded_weights(demo_gguf)


def f64(t):
    """float64 numpy of a torch tensor (any device) or of an array; None stays None."""
    if t is None:
        return None
    if hasattr(t, "detach"):
        return t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def stage_activation(stage, plan, inputs, grouped: bool) -> np.ndarray:
    """float64 [m, width]: the un-rotated activation a stage's projections read (pyq2.plan.decode
    Stage), from its producer's inputs by role (torch tensors or arrays, as pyq2.runtime.step
    records them): norm: RMSNorm(x + residual) * norm (residual None: x); mixer: x, in the grouped
    V-head order when the stage permutes and the file is `grouped`; swiglu: silu(gate) * up."""
    if stage.producer == "norm":
        h = f64(inputs["x"])
        if inputs.get("residual") is not None:
            h = h + f64(inputs["residual"])
        return reference.rmsnorm(h, f64(inputs["norm"]), plan.eps)
    if stage.producer == "mixer":
        act = f64(inputs["x"])
        if stage.permute and grouped:
            act = reference.gdn_v_grouped(act, plan.v_heads, plan.k_heads)
        return act
    return reference.swiglu(f64(inputs["gate"]), f64(inputs["up"]))


def assert_matches_unfolded(out, act, weight, what: str, tol: float = FOLD_TOL) -> None:
    """out (a projection's output) against act . weight^T in float64 within tol relative RMS."""
    want = f64(act) @ np.asarray(weight, dtype=np.float64).T
    got = f64(out)
    err = reference.rel_rms(got, want)
    assert err <= tol, f"{what}: rel RMS {err:.3g} > {tol}; {reference.worst_element(got, want)}"


# ---- tools/examples/ctypes_host.py --------------------------------------------------------

CTYPES_EXAMPLE = ROOT / "tools" / "examples" / "ctypes_host.py"


def import_ctypes_example():
    """tools/examples/ctypes_host.py as a module (a fresh copy on every call)."""
    spec = importlib.util.spec_from_file_location("ctypes_host", CTYPES_EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
