"""Find, load and check libpq2 (cffi ABI mode).

The library is bundled inside the package by `pip install .` (CMake installs libpq2 next to this
file). PYQ2_LIBRARY=/path/to/libpq2.so overrides it. The cffi declarations come from
pyq2/_cdef.py, generated at build time from native/include/pq2.h by bindings/gen_cdef.py; in a
source checkout without a build they are derived from the header directly.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
import threading
from pathlib import Path

from ..errors import LibraryError, Pq2Error

ENV_LIBRARY = "PYQ2_LIBRARY"
_LIB_NAMES = {"linux": "libpq2.so", "darwin": "libpq2.dylib", "win32": "pq2.dll"}

_lock = threading.Lock()
_loaded = None  # (ffi, lib) once loaded


def library_name() -> str:
    return _LIB_NAMES.get(sys.platform, "libpq2.so")


def _cdef_and_abi():
    try:
        from .._cdef import ABI_VERSION, CDEF  # generated at build time
    except ImportError:
        pass
    else:
        return CDEF, ABI_VERSION
    # Source checkout: derive from the header with the same code the build uses.
    root = Path(__file__).resolve().parents[2]
    header, gen = root / "native" / "include" / "pq2.h", root / "bindings" / "gen_cdef.py"
    if not (header.is_file() and gen.is_file()):
        raise LibraryError(
            "pyq2 is not built: pyq2/_cdef.py is missing and no source checkout is around it. "
            "Install the package with `pip install .` from the pyq2 source tree."
        )
    import importlib.util

    spec = importlib.util.spec_from_file_location("_pyq2_gen_cdef", gen)
    assert spec is not None and spec.loader is not None  # gen is an existing .py file
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = header.read_text(encoding="utf-8")
    return mod.cdef_from_header(text), mod.abi_version_from_header(text)


def library_path() -> Path:
    """Where the library is loaded from: $PYQ2_LIBRARY, else the copy bundled in the package."""
    override = os.environ.get(ENV_LIBRARY)
    if override:
        p = Path(override)
        if not p.is_file():
            raise LibraryError(
                f"{ENV_LIBRARY}={override!r} is not a file. Point it at a built "
                f"{library_name()} or unset it to use the bundled library."
            )
        return p
    p = Path(str(importlib.resources.files("pyq2") / library_name()))
    root = p.parent.parent
    if not p.is_file() and (root / "native" / "include" / "pq2.h").is_file():
        raise LibraryError(
            f"pyq2 was imported from its source tree ({p.parent}), which holds no built "
            f"{library_name()}: run from another directory to use the installed package, or set "
            f"{ENV_LIBRARY} to a built copy (e.g. {root}/build/<wheel tag>/{library_name()})."
        )
    if not p.is_file():
        raise LibraryError(
            f"the bundled {library_name()} is missing from {p.parent}. Reinstall pyq2 with "
            f"`pip install .` (it builds the library), or set {ENV_LIBRARY} to a built copy."
        )
    return p


def load():
    """(ffi, lib) for libpq2, loaded once per process. Raises LibraryError with what to do."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        import cffi

        cdef, abi = _cdef_and_abi()
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        path = library_path()
        try:
            lib = ffi.dlopen(str(path))
        except OSError as e:
            raise LibraryError(
                f"cannot load {path}: {e}. If it names a missing CUDA driver library "
                "(libcuda), install the NVIDIA driver or build the CPU half only "
                "(PQ2_CUDA=OFF pip install .)."
            ) from e
        got = lib.pq2_abi_version()
        if got != abi:
            raise LibraryError(
                f"{path} has ABI version {got} but this pyq2 expects {abi}: the "
                f"library and the Python package come from different builds. "
                f"Reinstall with `pip install .` or fix {ENV_LIBRARY}."
            )
        _loaded = (ffi, lib)
        return _loaded


def available() -> bool:
    try:
        load()
        return True
    except LibraryError:
        return False


def check(status: int) -> None:
    """Raise Pq2Error for a non-zero status, with the library's thread-local message."""
    if status == 0:
        return
    ffi, lib = load()
    name = ffi.string(lib.pq2_status_name(status)).decode()
    msg = ffi.string(lib.pq2_last_error()).decode(errors="replace")
    raise Pq2Error(name, msg, status)
