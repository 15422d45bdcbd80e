"""pyq2: ternary-weight (PQ2_0) language-model kernels for NVIDIA GPUs.

- pyq2.formats / pyq2.layouts / pyq2.reference: numpy definitions of the block formats, the
  resident layouts and the Q8 reference arithmetic (the oracle every kernel is tested against).
- pyq2.host: the C library's CPU half (fast layout and format conversion, reference matmul).
- pyq2.gpu: the CUDA kernels over torch tensors (optional).
- pyq2.gguf_types / pyq2.gguf_io / pyq2.metadata: the ggml types pyq2 adds to `gguf`, GGUF
  reading and streaming writing, and the pyq2.* keys that describe repacked weights.
- pyq2.repack / pyq2.verify / pyq2.info: repacking a GGUF file into a resident layout, proving a
  repacked file holds the same weights, summarising a file (pyq2.weight_io is what they share;
  pyq2.fuse reads a file with fused sibling tensors as its original tensors).
- pyq2.rotation: the Prism Hadamard rotation contract of a folded file.
- pyq2.arch / pyq2.model / pyq2.step / pyq2.bench: a whole model on the GPU for a host (the
  architecture map, loading, one decode step's weight path, `pyq2 bench`).
- pyq2.torch_ops: the kernels as PyTorch custom operators and PQ2Linear (needs torch).
- pyq2.output / pyq2.interrupts: atomic output files and signal handling.
- pyq2.cli / pyq2.demo: the `pyq2` command and its self-contained demo.

Importing pyq2 loads nothing heavy; the native library is loaded on first use.
"""

__version__ = "0.1.0"

from .errors import FormatError, LibraryError, Pq2Error, RepackError

__all__ = ["FormatError", "LibraryError", "Pq2Error", "RepackError", "__version__"]
