"""Lab: what building a prompt-remainder DecodeStep costs (cProfile), on the synthetic 27B."""
import cProfile, pstats, sys, time
import torch
from pyq2.runtime.load import synthetic
from pyq2.runtime.gpu_model import GpuModel  # noqa: F401
from pyq2.runtime.step import DecodeStep
preset = sys.argv[1] if len(sys.argv) > 1 else "bonsai-2-27b"
t = time.perf_counter(); model = synthetic(preset); torch.cuda.synchronize()
print(f"synthetic {preset}: {time.perf_counter() - t:.1f} s", flush=True)
for m in (2048, 37, 38):
    t = time.perf_counter()
    s = DecodeStep(model, m, shared=True, last_rows=1)
    torch.cuda.synchronize()
    print(f"DecodeStep m={m}: {1e3 * (time.perf_counter() - t):.1f} ms", flush=True)
pr = cProfile.Profile(); pr.enable()
s = DecodeStep(model, 39, shared=True, last_rows=1); torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(22)
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
