#!/usr/bin/env python3
"""The heaviest ops of the cnn and gpt workloads in PyTorch (2 threads), forward + backward, at
the shapes `cargo bench --bench bare_burn` times on Burn flex. `python3 benches/torch_ops.py`"""
import time, torch, torch.nn.functional as F
torch.set_num_threads(2)
torch.manual_seed(0)
def t(name, f, n=30):
    for _ in range(3): f()
    s=time.perf_counter()
    for _ in range(n): f()
    print(f"{name:<40} {1e3*(time.perf_counter()-s)/n:8.3f} ms")
x1=torch.randn(32,1,28,28,requires_grad=True); w1=torch.randn(32,1,3,3,requires_grad=True)
x2=torch.randn(32,32,14,14,requires_grad=True); w2=torch.randn(64,32,3,3,requires_grad=True)
t("conv2d 1->32 28x28 fwd", lambda: F.conv2d(x1,w1,padding=1))
t("conv2d 1->32 28x28 fwd+bwd", lambda: F.conv2d(x1,w1,padding=1).sum().backward())
t("conv2d 32->64 14x14 fwd", lambda: F.conv2d(x2,w2,padding=1))
t("conv2d 32->64 14x14 fwd+bwd", lambda: F.conv2d(x2,w2,padding=1).sum().backward())
y=torch.randn(32,32,28,28,requires_grad=True)
t("max_pool2d 32x32x28x28 fwd+bwd", lambda: F.max_pool2d(y,2).sum().backward())
a=torch.randn(1024,128,requires_grad=True); b=torch.randn(128,384,requires_grad=True)
t("matmul 1024x128 @ 128x384 fwd+bwd", lambda: (a@b).sum().backward())
q=torch.randn(8,4,128,32,requires_grad=True); k=torch.randn(8,4,128,32,requires_grad=True)
t("attention scores+softmax 8x4x128x128 fwd+bwd", lambda: torch.softmax(q@k.transpose(-1,-2)/5.6,dim=-1).sum().backward())
h=torch.randn(8,128,128,requires_grad=True); ln=torch.nn.LayerNorm(128)
t("layer_norm 8x128x128 fwd+bwd", lambda: ln(h).sum().backward())
g=torch.randn(1024,512,requires_grad=True)
t("gelu 1024x512 fwd+bwd", lambda: F.gelu(g).sum().backward())
