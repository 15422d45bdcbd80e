"""Open a model file for generation: its tokenizer, chat template and a backend on the GPU or
the CPU (pyq2.runtime.generate runs them).

`open_model(path, device="auto")` reads the file's metadata first and refuses what pyq2 cannot
run before loading any weight: another architecture, metadata a qwen35 model needs and lacks, a
tokenizer it cannot build. "auto" takes the GPU when torch sees one and libpq2 has its CUDA
half, else the CPU (the numpy reference: small models only). A GPU backend is warmed up before
it is returned (GpuModel.warm_up), so that a first generation's timings are a later one's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FormatError
from ..gguf import io as gguf_io
from ..spec import qwen35
from ..text.tokenizer import Tokenizer

DEFAULT_CONTEXT = 4096  # positions a sequence may hold unless --ctx says otherwise


@dataclass
class OpenModel:
    backend: Any  # a pyq2.runtime.generate.ModelBackend
    tokenizer: Tokenizer
    chat_template: str | None
    config: qwen35.Config
    device: str  # "cpu" or "gpu"


def gpu_usable() -> str | None:
    """None when a generation can run on the GPU, else why not (one line)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    from ..lib import native

    if not native.available():
        return "libpq2 does not load"
    _, lib = native.load()
    if not lib.pq2_built_with_cuda():
        return "libpq2 was built without its CUDA half"
    return None


def read_metadata(gf: gguf_io.GGUFFile) -> dict[str, Any]:
    return {k: gf.value(k) for k in gf.keys()}


def open_model(
    path: str, device: str = "auto", context: int | None = None, batch: int = 1
) -> OpenModel:
    """The model at `path` ready to generate (module docstring)."""
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device {device!r} is not auto, cpu or gpu")
    with gguf_io.open_gguf(path) as gf:
        kv = read_metadata(gf)
        arch = kv.get("general.architecture")
        if arch != qwen35.ARCH:
            raise FormatError(
                f"{path}: architecture {arch!r}: pyq2 generate runs {qwen35.ARCH} models "
                "(Qwen3.5, Ternary-Bonsai-2)"
            )
        config = qwen35.Config.from_metadata(kv)
        tokenizer = Tokenizer(kv)
        template = kv.get("tokenizer.chat_template")
        ctx = min(config.context_length, DEFAULT_CONTEXT) if context is None else context
        if ctx > config.context_length:
            raise ValueError(
                f"--ctx {ctx} is more than the model's context_length {config.context_length}"
            )
        why = gpu_usable() if device != "cpu" else "--device cpu"
        if device == "gpu" and why is not None:
            raise ValueError(f"--device gpu: {why}")
        if why is None:
            from .gpu_model import GpuModel

            backend: Any = GpuModel(path, config, ctx, batch)
            backend.warm_up()
            return OpenModel(backend, tokenizer, template, config, "gpu")
        from .cpu_model import CpuModel

        backend = CpuModel(gf, config, ctx)
        if device == "auto":
            backend.name = f"cpu (numpy reference; {why})"
        return OpenModel(backend, tokenizer, template, config, "cpu")
