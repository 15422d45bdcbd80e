"""pyq2: ternary-weight (PQ2_0) language-model kernels for NVIDIA GPUs.

- pyq2.spec.formats / pyq2.spec.layouts / pyq2.spec.reference: numpy definitions of the block
formats, the
  resident layouts and the Q8 reference arithmetic (the oracle every kernel is tested against).
- pyq2.lib.cpu: the C library's CPU half (fast layout and format conversion, reference matmul).
- pyq2.lib.cuda: the CUDA kernels over torch tensors (optional).
- pyq2.gguf.types / pyq2.gguf.io / pyq2.gguf.metadata: the ggml types pyq2 adds to `gguf`, GGUF
  reading and streaming writing, and the pyq2.* keys that describe repacked weights.
- pyq2.offline.repack / pyq2.offline.verify / pyq2.offline.info: repacking a GGUF file into a
resident layout, proving a
  repacked file holds the same weights, summarising a file (pyq2.gguf.weights is what they share;
  pyq2.offline.fuse reads a file with fused sibling tensors as its original tensors).
- pyq2.spec.rotation: the Prism Hadamard rotation contract of a folded file.
- pyq2.plan.decode / pyq2.runtime.load / pyq2.runtime.step / pyq2.runtime.bench: a whole model on
the GPU for a host (the
  architecture map, loading, one decode step's weight path, `pyq2 bench`).
- pyq2.lib.torch_ops: the kernels as PyTorch custom operators and PQ2Linear (needs torch).
- pyq2.atomic / pyq2.interrupts: atomic output files and signal handling.
- pyq2.cli / pyq2.offline.demo: the `pyq2` command and its self-contained demo.

Importing pyq2 loads nothing heavy; the native library is loaded on first use.
"""

__version__ = "0.1.0"

from .errors import FormatError, LibraryError, Pq2Error, RepackError

__all__ = ["FormatError", "LibraryError", "Pq2Error", "RepackError", "__version__"]
