"""pyq2: ternary-weight (PQ2_0) language-model kernels for NVIDIA GPUs.

- pyq2.formats / pyq2.layouts / pyq2.reference: numpy definitions of the block formats, the
  resident layouts and the Q8 reference arithmetic (the oracle every kernel is tested against).
- pyq2.host: the C library's CPU half (fast layout and format conversion, reference matmul).
- pyq2.gpu: the CUDA kernels over torch tensors (optional).
- pyq2.gguf_io / pyq2.repack / pyq2.cli: GGUF reading, streaming repacking, the `pyq2` command.

Importing pyq2 loads nothing heavy; the native library is loaded on first use.
"""
__version__ = "0.1.0"

from .errors import FormatError, LibraryError, Pq2Error  # noqa: F401
