"""LAB: one batch-16 attention decode layer (27B shape, span 2304), run 6 times eagerly, for ncu."""
import torch

from pyq2.runtime.mixers import Attention, Dims, Rope

D27 = Dims(n_head=24, n_head_kv=4, head_dim=256, rope_dim=64, rope_base=1e7, eps=1e-6,
           conv_kernel=4, k_heads=16, v_heads=48, k_dim=128, v_dim=128)
dev = torch.device("cuda")
b = 16
g = torch.Generator(device="cpu").manual_seed(b)
rope = Rope(D27, 4096, dev)
w = {"q_norm": (1 + 0.1 * torch.randn(256, generator=g)).to(dev),
     "k_norm": (1 + 0.1 * torch.randn(256, generator=g)).to(dev)}
m = Attention(D27, w, b, 4096, rope, dev, torch.bfloat16, kernels=True)
m.k.normal_(), m.v.normal_()
q_gate = torch.randn(b, 24 * 2 * 256, generator=g).to(dev)
k = torch.randn(b, 4 * 256, generator=g).to(dev)
v = torch.randn(b, 4 * 256, generator=g).to(dev)
pos = torch.full((b,), 2300, dtype=torch.long, device=dev) - torch.arange(b, device=dev) * 37
out = torch.empty(b, 24 * 256, device=dev)
for _ in range(6):
    m.decode(q_gate, k, v, pos, 2304, out)
torch.cuda.synchronize()
print("ok")
