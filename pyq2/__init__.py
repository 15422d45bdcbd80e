"""pyq2: ternary-weight (PQ2_0) language-model kernels for NVIDIA GPUs, and a runtime over them.

The package's folders are its layers (none imports from one listed after it; tests/test_layers.py
enforces it):

- pyq2.spec: numpy definitions of the block formats, the resident layouts (the Layout value), the
  Q8 reference arithmetic, the rotation contract and the qwen35 reference model.
- pyq2.lib: the native library (its CPU half, its CUDA kernels over torch tensors, torch ops).
- pyq2.text: the tokenizer, chat template and sampling.
- pyq2.gguf: GGUF reading and writing, the pyq2.* keys, a file's contents (fused members as their
  original tensors) and the one streaming weight conversion (pyq2.gguf.weights).
- pyq2.plan: the decode plan of an architecture and the tensor-parallel split.
- pyq2.offline: repack, fuse, shard, verify, info and the demo model.
- pyq2.runtime: loading, the decode step's weight path, the whole-model runner (mixers, decode
  kernels, generation) and the benchmarks.
- pyq2.cli, pyq2.atomic, pyq2.interrupts, pyq2.errors: the `pyq2` command, atomic output files,
  signal handling, the error types.

Importing pyq2 loads nothing heavy; the native library is loaded on first use.
"""

__version__ = "0.1.0"

from .errors import FormatError, LibraryError, Pq2Error, RepackError

__all__ = ["FormatError", "LibraryError", "Pq2Error", "RepackError", "__version__"]
