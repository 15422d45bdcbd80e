"""The loader's upload of a weight (pyq2.runtime.load._upload_weight) without a GPU, into host
memory: from every stored layout to every layout the matmul reads, in slices of rows and in
blocks of rows and columns, it gives the bytes of one whole conversion (pyq2.spec.layouts)."""

import numpy as np
import pytest

from pyq2.gguf import io as gguf_io
from pyq2.gguf import weights as weight_io
from pyq2.gguf.contents import read_contents
from pyq2.runtime import load
from pyq2.spec.layouts import Layout

torch = pytest.importorskip("torch")

TARGETS = [("planes", 0), ("tiles", 1), ("tiles", 2), ("tiles", 4)]


def raw_weights(path):
    """name -> PQ2_0 raw bytes of every weight of the file."""
    backend = weight_io.Backend("numpy")
    with gguf_io.open_gguf(path) as gf:
        return {
            e.name: np.concatenate([r for _, r in e.slices(backend, gf, 1 << 20)])
            for e in read_contents(gf).entries
            if e.info is not None
        }


@pytest.mark.parametrize("chunk", [16 << 20, 128], ids=["slices", "blocks"])
@pytest.mark.parametrize("stored", ["raw", "planes", "tiles"])
def test_upload_gives_the_whole_conversion(demo_stored, monkeypatch, stored, chunk):
    monkeypatch.setattr(weight_io, "CONVERT_CHUNK", chunk)  # 128 B: less than one row
    raws = raw_weights(demo_stored["raw"])
    backend = weight_io.Backend()
    with gguf_io.open_gguf(demo_stored[stored]) as gf:
        for e in read_contents(gf).entries:
            if e.info is None:
                continue
            for name, rt in TARGETS:
                target = Layout(name, e.info.n, e.info.k, rt)
                got = load._upload_weight(torch, backend, gf, e, target, None, "cpu")
                want = target.from_raw(raws[e.name])
                assert np.array_equal(got.numpy(), want), (e.name, name, rt)


def test_upload_through_a_staging_buffer(demo_stored, monkeypatch):
    """The GPU's path: every piece copied through the (here unpinned) staging buffer, the
    stream synchronised before the buffer is reused."""
    synced = []

    class Stream:
        def synchronize(self):
            synced.append(1)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    raws = raw_weights(demo_stored["raw"])
    staging = torch.zeros(1 << 20, dtype=torch.uint8)
    with gguf_io.open_gguf(demo_stored["tiles"]) as gf:
        e = next(e for e in read_contents(gf).entries if e.info is not None)
        target = Layout("tiles", e.info.n, e.info.k, 2)
        got = load._upload_weight(torch, weight_io.Backend(), gf, e, target, staging, "cpu")
    assert np.array_equal(got.numpy(), target.from_raw(raws[e.name]))
    assert len(synced) >= 2 and staging.any()  # codes and scales, each through the buffer
