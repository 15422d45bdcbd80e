"""One weight's walk through the repacker and through the loader: the modules whose code it runs.

Both consume one conversion, pyq2.gguf.weights.convert (rows read a slice or a block at a time,
every scale checked, converted, split into the target Layout's regions and placed), so a
weight's walk runs the driver (pyq2.offline.repack.convert_weight, pyq2.runtime.load's
_upload_weight), pyq2.gguf.weights, the file (pyq2.gguf.io), the geometry (pyq2.spec.layouts)
and the conversion (libpq2's wrapper pyq2.lib.cpu, or in numpy pyq2.spec.formats) and nothing
else: at most WALK_MAX modules. A library entry point is not followed inside (pyq2.lib.cpu's own
helpers: its cffi handle, pyq2.lib.native, and its view of a buffer).
"""

import sys

import pytest

from pyq2.gguf import io as gguf_io
from pyq2.gguf import weights as weight_io
from pyq2.gguf.contents import read_contents
from pyq2.lib import native
from pyq2.offline import repack as repack_mod
from pyq2.runtime import load
from pyq2.spec.layouts import Layout

WALK_MAX = 5
LIBRARY = "pyq2.lib.cpu"  # a library entry point: its own calls are not followed
COMMON = {"pyq2.gguf.weights", "pyq2.gguf.io", "pyq2.spec.layouts"}
CONVERSION = {"native": {LIBRARY}, "numpy": {"pyq2.spec.formats"}}
BACKENDS = [
    "numpy",
    pytest.param(
        "native", marks=pytest.mark.skipif(not native.available(), reason="libpq2 not found")
    ),
]


def walk(fn) -> set[str]:
    """The pyq2 modules whose functions run while fn() runs (not followed into LIBRARY)."""
    seen: set[str] = set()
    depth = [0]  # frames of LIBRARY on the stack

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event not in ("call", "return") or not module.startswith("pyq2."):
            return
        if event == "call":
            if not depth[0]:
                seen.add(module)
            depth[0] += module == LIBRARY
        else:
            depth[0] -= module == LIBRARY

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def check_walk(seen: set[str], driver: str, backend: str) -> None:
    """The driver, pyq2.gguf.weights, the file and the Layout, and at most the conversion."""
    assert seen - CONVERSION[backend] == {driver, *COMMON}, seen
    assert len(seen) <= WALK_MAX


def one_weight(gf):
    e = next(e for e in read_contents(gf).entries if e.name == "blk.0.ffn_down.weight")
    assert e.info is not None
    return e


@pytest.mark.parametrize("blocks", [False, True], ids=["slices", "blocks"])
@pytest.mark.parametrize("name,rt", [("raw", 0), ("planes", 0), ("tiles", 2)])
@pytest.mark.parametrize("stored", ["raw", "planes", "tiles"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weight_through_repack(demo_stored, monkeypatch, backend, stored, name, rt, blocks):
    if blocks:  # less than one row: the block path of a very wide row
        monkeypatch.setattr(weight_io, "CONVERT_CHUNK", 128)
    ops = weight_io.Backend(backend)
    with gguf_io.open_gguf(demo_stored[stored]) as gf:
        e = one_weight(gf)
        target = Layout(name, e.info.n, e.info.k, rt)
        out = []
        seen = walk(lambda: out.extend(repack_mod.convert_weight(ops, gf, [e], target)))
    check_walk(seen, "pyq2.offline.repack", backend)
    assert sum(len(c) for c in out) == target.bytes


@pytest.mark.parametrize("stored", ["raw", "tiles"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weight_through_the_loader(demo_stored, backend, stored):
    torch = pytest.importorskip("torch")
    ops = weight_io.Backend(backend)
    with gguf_io.open_gguf(demo_stored[stored]) as gf:
        e = one_weight(gf)
        target = Layout("tiles", e.info.n, e.info.k, 2)
        out = []
        seen = walk(lambda: out.append(load._upload_weight(torch, ops, gf, e, target, None, "cpu")))
    check_walk(seen, "pyq2.runtime.load", backend)
    assert out[0].numel() == target.bytes
