"""tools/examples/ctypes_host.py, the plain-ctypes host example.

Without a GPU (CI): the example imports without torch; its ctypes structs have the size, field
names, offsets and field types of the cffi declarations derived from pq2.h, and every signature
it declares has the header's argument types; its host half (pq2_convert_layout through ctypes)
gives pyq2.lib.cpu's bytes; a failing call raises with the status name and pq2_last_error.
On a GPU: its rotated projection gives the bits of pyq2.lib.cuda's rotate_q8 + matmul_q8 on the same
inputs (the same kernels, deterministic), and the unfolded float product within FOLD_TOL
(tests/conftest.py; Q8 of the rotated activations against the unquantised product).
tests/runtime/test_demo_hosts.py runs its producers and matmul on the demo model's device buffers.
"""

import ctypes
import os
import sys

import numpy as np
import pytest

from pyq2.lib import cpu as host
from pyq2.lib import native as _native
from pyq2.spec import formats, reference

from ..conftest import FOLD_TOL, import_ctypes_example, keyed_rng, needs_gpu

if not _native.available() and not os.environ.get("PYQ2_REQUIRE_NATIVE"):
    pytest.skip(
        "libpq2 not loadable (set PYQ2_REQUIRE_NATIVE=1 to make this an error)",
        allow_module_level=True,
    )

ffi, lib = _native.load()
STRUCTS = ("pq2_weights", "pq2_q8", "pq2_rotation", "pq2_matmul_config")
ex = import_ctypes_example()


def c_name(t) -> str:
    """The C spelling cffi gives a type (no const), of a ctypes type."""
    names = {
        ctypes.c_int8: "int8_t",
        ctypes.c_int32: "int32_t",
        ctypes.c_uint32: "uint32_t",
        ctypes.c_int64: "int64_t",
        ctypes.c_size_t: "size_t",
        ctypes.c_float: "float",
        ctypes.c_void_p: "void *",
        ctypes.c_char_p: "char *",
    }
    if t in names:
        return names[t]
    if issubclass(t, ctypes._Pointer):
        return c_name(t._type_) + " *"
    assert issubclass(t, ctypes.Structure), t
    return t.__name__


# ---- no GPU ---------------------------------------------------------------------------------


def test_imports_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    mod = import_ctypes_example()
    assert callable(mod.rotated_projection) and mod.ABI_VERSION == lib.pq2_abi_version()


@pytest.mark.parametrize("name", STRUCTS)
def test_structs_are_the_headers(name):
    ours, theirs = getattr(ex, name), ffi.typeof(name)
    assert ctypes.sizeof(ours) == ffi.sizeof(theirs)
    assert ctypes.alignment(ours) == ffi.alignof(theirs)
    want = [(f, c.type.cname, c.offset) for f, c in theirs.fields]
    got = [(f, c_name(t), getattr(ours, f).offset) for f, t in ours._fields_]
    assert got == want


@pytest.mark.parametrize("name", sorted(ex.SIGNATURES))
def test_signatures_are_the_headers(name):
    fn = ffi.typeof(getattr(lib, name))
    assert fn.result.cname == "pq2_status" and ffi.sizeof(fn.result) == 4  # declared as int32
    assert [c_name(t) for t in ex.SIGNATURES[name]] == [a.cname for a in fn.args]


def test_host_conversion_through_ctypes():
    n, k = 300, 768  # n not a whole number of tiles: the padding rows are written too
    raw = formats.pq2_quantize(keyed_rng("tiles").standard_normal((n, k)))
    want = host.convert_layout(raw, n, k, "raw", "tiles", 0, 2)
    c = ex.load(_native.library_path())
    assert bytes(ex.to_tiles(c, raw, n, k)) == want.tobytes()
    assert bytes(ex.to_tiles(ex.load(), raw.tobytes(), n, k, rt=4)) == (
        host.convert_layout(raw, n, k, "raw", "tiles", 0, 4).tobytes()
    )  # load() finds the library as pyq2 does ($PYQ2_LIBRARY or the bundled copy)


def test_a_failing_call_raises_with_the_status_and_message():
    c = ex.load(_native.library_path())
    with pytest.raises(RuntimeError, match=r"^PQ2_ERR_SHAPE: pq2_layout_bytes: k=100 is not"):
        ex.to_tiles(c, np.zeros(34, np.uint8), 1, 100)
    with pytest.raises(RuntimeError, match=r"^PQ2_ERR_NULL_POINTER: pq2_convert_layout: src"):
        c.pq2_convert_layout(None, None, 0, ex.PQ2_LAYOUT_TILES, 2)


# ---- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])  # bit slices, token records, none; GEMM at 33
@pytest.mark.parametrize(
    "n,k,block,identity",
    [(300, 768, 128, False), (512, 5120, 1024, False), (257, 1024, 256, True)],
    ids=["300x768-B128", "512x5120-B1024", "257x1024-B256-identity"],
)
@pytest.mark.parametrize("x_dtype", ["float32", "bfloat16"])
def test_rotated_projection_is_pyq2_gpus(m, n, k, block, identity, x_dtype):
    import torch

    from pyq2.lib import cuda as pgpu

    r = keyed_rng("ctypes", m, n, k, block, identity, x_dtype)
    signs = None if identity else r.choice(np.array([-1, 1], np.int8), k)
    raw = formats.pq2_quantize(reference.fold(r.standard_normal((n, k)), block, signs))
    x = torch.from_numpy(r.standard_normal((m, k))).to(getattr(torch, x_dtype)).cuda()
    s = None if signs is None else torch.from_numpy(signs).cuda()

    y = ex.rotated_projection(_native.library_path(), raw, n, k, x, block, s)

    want = torch.full((m, n), float("nan"), device="cuda")
    weights = pgpu.PQ2Weights.from_host(raw, n, k, "tiles", 2)
    weights.matmul_q8(pgpu.rotate_q8(x, pgpu.DeviceRotation(block, s)), want)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert torch.equal(y, want), "the ctypes host and pyq2.lib.cuda differ"

    w = reference.unfold(formats.pq2_dequantize(raw, n, k), block, signs)
    ref = x.double().cpu().numpy() @ w.T
    err = reference.rel_rms(y.cpu().numpy(), ref)
    assert err <= FOLD_TOL, f"rel RMS {err:.3g}; {reference.worst_element(y.cpu().numpy(), ref)}"


@pytest.mark.gpu
@needs_gpu
def test_main_prints_the_error(capsys):
    ex.main([str(_native.library_path())])
    out = capsys.readouterr().out
    assert out.startswith("y[4, 512]: max |error|") and "relative RMS" in out
    rel = float(out.split("relative RMS ")[1].split()[0])
    assert rel <= FOLD_TOL
