"""The C ABI as a host sees it: exported symbols, version, status names, the thread-local last
error, and what the GPU entry points answer on a machine without a GPU or a build without CUDA."""

import importlib.resources
import importlib.util
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pyq2.lib import native as _native

from ..conftest import fake_q8

if not _native.available() and not os.environ.get("PYQ2_REQUIRE_NATIVE"):
    pytest.skip(
        "libpq2 not loadable (set PYQ2_REQUIRE_NATIVE=1 to make this an error)",
        allow_module_level=True,
    )

ffi, lib = _native.load()

FUNCTIONS = re.findall(r"\b(pq2_\w+)\s*\(", _native._cdef_and_abi()[0])


def has_gpu():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def test_every_declared_function_is_exported():
    assert len(FUNCTIONS) >= 19  # the header declares 19 today; a broken regex finds far fewer
    missing = [name for name in FUNCTIONS if not hasattr(lib, name)]
    assert not missing


def test_cdef_is_derived_from_the_installed_header():
    # bindings/gen_cdef.py turned pq2.h into pyq2/_cdef.py at build time; both are installed.
    header = Path(str(importlib.resources.files("pyq2") / "include" / "pq2.h"))
    if not header.is_file():
        pytest.skip("running from a source tree without an installed header")
    gen = Path(__file__).resolve().parents[2] / "bindings" / "gen_cdef.py"
    spec = importlib.util.spec_from_file_location("gen_cdef", gen)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cdef, abi = _native._cdef_and_abi()
    assert mod.cdef_from_header(header.read_text()) == cdef
    assert mod.abi_version_from_header(header.read_text()) == abi == lib.pq2_abi_version()


def test_version_and_status_names():
    assert lib.pq2_abi_version() == lib.PQ2_ABI_VERSION
    version = ffi.string(lib.pq2_version_string()).decode()
    assert version.startswith("0.1.0")
    assert ffi.string(lib.pq2_status_name(lib.PQ2_ERR_SHAPE)) == b"PQ2_ERR_SHAPE"
    assert ffi.string(lib.pq2_status_name(12345)) == b"PQ2_STATUS_UNKNOWN"


def test_last_error_names_values_and_clears_on_success():
    out = ffi.new("size_t *")
    assert lib.pq2_layout_bytes(lib.PQ2_LAYOUT_RAW, 3, 100, 0, out) == lib.PQ2_ERR_SHAPE
    assert b"100" in ffi.string(lib.pq2_last_error())
    assert lib.pq2_layout_bytes(lib.PQ2_LAYOUT_RAW, 3, 128, 0, out) == lib.PQ2_OK
    assert ffi.string(lib.pq2_last_error()) == b""
    assert out[0] == 3 * 34


def test_last_error_is_thread_local():
    out = ffi.new("size_t *")
    assert lib.pq2_layout_bytes(lib.PQ2_LAYOUT_RAW, 3, 100, 0, out) == lib.PQ2_ERR_SHAPE
    seen = {}

    def other():
        seen["before"] = ffi.string(lib.pq2_last_error())
        lib.pq2_layout_bytes(lib.PQ2_LAYOUT_TILES, 3, 128, 3, out)
        seen["after"] = ffi.string(lib.pq2_last_error())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == b""
    assert b"rt=3" in seen["after"]
    assert b"100" in ffi.string(lib.pq2_last_error())  # this thread's message is untouched


@pytest.mark.skipif(has_gpu(), reason="checks the answer without a usable GPU")
def test_gpu_entry_points_fail_cleanly_without_a_gpu():
    """A CPU-only build says it was built without CUDA; a CUDA build on a machine without a
    GPU returns a CUDA status naming the runtime error. Never a crash."""
    w = ffi.new("pq2_weights *")
    w.data = ffi.cast("void *", 16)  # never dereferenced: the device check comes first
    w.n, w.k, w.layout, w.rt = 64, 128, lib.PQ2_LAYOUT_TILES, 2
    size = ffi.new("size_t *")
    assert lib.pq2_layout_bytes(w.layout, w.n, w.k, w.rt, size) == lib.PQ2_OK
    w.bytes = size[0]
    expected = "PQ2_ERR_CUDA" if lib.pq2_built_with_cuda() else "PQ2_ERR_NO_CUDA"
    for status in (lib.pq2_cuda_init(), lib.pq2_matmul_workspace_size(w, 1, ffi.NULL, size)):
        assert ffi.string(lib.pq2_status_name(status)).decode() == expected
        assert ffi.string(lib.pq2_last_error())


@pytest.mark.skipif(
    has_gpu() or not lib.pq2_built_with_cuda(), reason="a CUDA build on a machine without a GPU"
)
def test_gpu_entry_points_check_arguments_before_the_device():
    """Bad arguments get their own status and a message naming the entry point, even where no
    device could be reached."""
    fake = ffi.cast("void *", 256)  # never dereferenced
    out = fake_q8(ffi)
    w = ffi.new("pq2_weights *")
    w.data, w.bytes, w.n, w.k, w.layout, w.rt = fake, 10, 64, 128, lib.PQ2_LAYOUT_TILES, 2
    cases = [
        (
            "pq2_quantize_q8_cuda",
            "PQ2_ERR_INVALID_ARGUMENT",
            lambda: lib.pq2_quantize_q8_cuda(fake, 9, 1, 128, out, ffi.NULL),
        ),
        (
            "pq2_matmul_cuda",
            "PQ2_ERR_SHAPE",
            lambda: lib.pq2_matmul_cuda(w, fake, 0, fake, 0, 1, ffi.NULL, fake, 1 << 20, ffi.NULL),
        ),
        (
            "pq2_rotate_cuda",
            "PQ2_ERR_NULL_POINTER",
            lambda: lib.pq2_rotate_cuda(fake, 0, fake, 7, 1, 128, ffi.NULL, 0, ffi.NULL),
        ),
        (
            "pq2_dequantize_cuda",
            "PQ2_ERR_SHAPE",
            lambda: lib.pq2_dequantize_cuda(w, fake, 0, ffi.NULL),
        ),
    ]
    for fn, status, call in cases:
        got = ffi.string(lib.pq2_status_name(call())).decode()
        msg = ffi.string(lib.pq2_last_error()).decode()
        assert got == status and msg.startswith(fn + ":"), (fn, got, msg)


def test_python_constants_match_the_header():
    from pyq2.gguf import metadata
    from pyq2.spec import formats

    assert metadata.FORMAT_VERSION == lib.PQ2_FORMAT_VERSION
    assert (formats.PQ2_BLOCK_BYTES, formats.PTQ1_BLOCK_BYTES, formats.TQ2_BLOCK_BYTES) == (
        lib.PQ2_BLOCK_BYTES,
        lib.PTQ1_BLOCK_BYTES,
        lib.TQ2_BLOCK_BYTES,
    )
    assert (formats.PQ2_BLOCK_WEIGHTS, formats.TQ2_BLOCK_WEIGHTS) == (
        lib.PQ2_BLOCK_WEIGHTS,
        lib.TQ2_BLOCK_WEIGHTS,
    )


def test_import_from_the_source_tree_says_what_to_do():
    """Run from the repository root, `import pyq2` finds the source folder, which holds no
    library: the error says so and how to get the installed package, not to reinstall."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyq2" / _native.library_name()).exists():
        pytest.skip("this source tree holds a built library")
    env = {k: v for k, v in os.environ.items() if k not in ("PYQ2_LIBRARY", "PYTHONPATH")}
    code = (
        "import pyq2.lib.native as n\ntry:\n    n.library_path()\n"
        "except Exception as e:\n    print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )
    assert "imported from its source tree" in out.stdout and "PYQ2_LIBRARY" in out.stdout, out
