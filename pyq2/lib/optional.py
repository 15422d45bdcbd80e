"""The optional dependencies of the GPU side, imported on first use with an error that says what
to install (the CPU half, the repacker and the CPU demo need none of them)."""

from __future__ import annotations

from typing import Any


def require_torch() -> Any:
    """The torch module; RuntimeError naming the package when it is not installed."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("this needs PyTorch with CUDA (pip install torch)") from e
    return torch
