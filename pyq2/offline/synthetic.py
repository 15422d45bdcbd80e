"""A GGUF file of a preset's shapes (pyq2.plan.decode.PRESETS) with random ternary weights: a
27B-shaped model for `pyq2 generate` without a download (tools/bench/synthetic_gguf.py writes
one).

Every projection, the embedding and the head are PQ2_0 with codes uniform in 0..2 (windows of a
64 MiB pool of random code bytes) and block scales 0.01 (the weights
pyq2.runtime.load.synthetic builds on the GPU for `pyq2 bench`), stored
as folded weights: the rotation contract with random signs per input width, in blocks of 1024
where 1024 divides every width, else 128. The dense tensors and the tokenizer (the byte-level BPE
padded to the preset's vocabulary) are the demo model's (pyq2.offline.demo). The file is written
tensor by tensor, so memory holds one tensor; it appears only when complete.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import atomic
from ..gguf import io as gguf_io
from ..gguf.io import OutTensor
from ..gguf.types import F32, PQ2_0
from ..plan.decode import PRESETS, Dims
from ..spec import formats
from .demo import dense_values, model_records

SCALE = 0.01  # every PQ2_0 block's scale
ROTATION_BLOCK = 1024  # where it divides every input width, else 128
ROWS_PER_PIECE = 4096  # PQ2_0 rows made and written at a time
POOL_BYTES = 1 << 26  # the code bytes the blocks' windows are cut from

# the 81 code bytes whose four 2-bit codes are each 0, 1 or 2 (weights -1, 0, +1)
_TERNARY_BYTES = np.array(
    [a | b << 2 | c << 4 | d << 6 for a in range(3) for b in range(3) for c in range(3)
     for d in range(3)],
    dtype=np.uint8,
)  # fmt: skip


def _ternary_bytes(count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` code bytes drawn uniformly from the 81 ternary ones: random bytes below 243
    (three times 81), taken modulo 81."""
    out = np.empty(0, np.uint8)
    while out.size < count:
        need = count - out.size
        raw = rng.bit_generator.random_raw(-(-need * 17 // 16 // 8) + 1).view(np.uint8)
        out = np.concatenate([out, raw[raw < 243][:need]])
    return _TERNARY_BYTES[out % 81]


class _Codes:
    """Code bytes for the blocks: windows at random offsets of a pool of POOL_BYTES uniform
    ternary code bytes (drawing every byte afresh would take minutes for the 27B)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.pool = _ternary_bytes(POOL_BYTES, rng)

    def take(self, count: int) -> np.ndarray:
        out = np.empty(count, np.uint8)
        at = 0
        while at < count:
            n = min(count - at, POOL_BYTES // 2)
            start = int(self.rng.integers(0, POOL_BYTES - n + 1))
            out[at : at + n] = self.pool[start : start + n]
            at += n
        return out


def _pq2_rows(rows: int, k: int, codes: _Codes) -> np.ndarray:
    """Raw PQ2_0 bytes of `rows` ternary rows of k weights."""
    n_blocks = rows * (k // formats.PQ2_BLOCK_WEIGHTS)
    blocks = np.empty((n_blocks, formats.PQ2_BLOCK_BYTES), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(SCALE).astype("<f2").tobytes(), np.uint8)
    blocks[:, 2:] = codes.take(n_blocks * 32).reshape(n_blocks, 32)
    return blocks.reshape(-1)


def write_synthetic_model(
    path: Any,
    preset: str,
    seed: int = 0,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write the preset's model to `path` (the same seed gives the same bytes) and return it;
    progress(bytes written, total) after each piece of tensor data."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not one of {', '.join(sorted(PRESETS))}")
    dims: Dims = PRESETS[preset]
    rng = np.random.default_rng(seed)
    codes = _Codes(rng)
    specs = dims.tensors()
    widths = sorted({ne[0] for _, kind, ne in specs if kind == "pq2"})
    block = ROTATION_BLOCK if all(w % ROTATION_BLOCK == 0 for w in widths) else 128
    signs = {w: rng.choice(np.array([-1, 1], np.int32), w) for w in widths}
    tensors: list[OutTensor] = []
    folded: list[str] = []
    for name, kind, ne in specs:
        if kind == "pq2":
            k, n = ne
            tensors.append(OutTensor(name, PQ2_0, ne, formats.pq2_matrix_bytes(n, k)))
            if name != "token_embd.weight":
                folded.append(name)
        else:
            tensors.append(OutTensor(name, F32, ne, 4 * int(np.prod(ne))))
    total = sum(t.nbytes for t in tensors)
    done = 0

    def data(i: int, t: OutTensor):
        nonlocal done

        def pieces() -> Iterator[np.ndarray]:
            if t.type_id == F32:
                yield dense_values(t.name, t.ne, rng).astype("<f4")
                return
            k, n = t.ne
            for r in range(0, n, ROWS_PER_PIECE):
                yield _pq2_rows(min(ROWS_PER_PIECE, n - r), k, codes)

        for piece in pieces():
            yield piece
            done += piece.nbytes
            if progress is not None:
                progress(done, total)

    name = f"pyq2 synthetic {preset} (random ternary weights)"
    records = model_records(dims, name, block, signs, folded)
    atomic.check_output(os.fspath(path), force)
    with atomic.atomic_output(path, force=force) as staged:
        gguf_io.write_gguf(staged, records, tensors, data)
    return Path(path)
