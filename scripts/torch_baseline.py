#!/usr/bin/env python3
"""PyTorch reference for kiln's speed comparisons: the same workloads, on the same machine.

Workloads (--model):
  mlp  (quickstart): Linear(in,hidden...) -> ReLU -> ... -> Linear(.., classes), CrossEntropyLoss,
       synthetic TensorDataset(randn(N, in), randint(0, classes, (N,))).
  cnn: per stage Conv2d(c_in, c, 3, padding=1) -> ReLU -> MaxPool2d(2), then Flatten ->
       Linear(.., hidden) -> ReLU -> Linear(hidden, classes); images randn(N, C, H, W).
  gpt: decoder-only transformer (nanoGPT layout): token + learned position embeddings, pre-LN
       blocks x + attn(ln_1(x)), x + mlp(ln_2(x)) with causal self-attention, MLP 4*dim with
       GELU, final LayerNorm, lm_head tied to the token embedding; next-token cross-entropy over
       random byte tokens (vocab 256). samples = sequences of --block tokens.
SGD(lr=0.01) or AdamW, DistributedSampler + DataLoader(num_workers=0).

The modules are kiln's families as `scripts/torch_reference.py` defines them.

  pip install torch          # CPU use; about a minute
  python3 torch_baseline.py --mode plain --threads 1 --batch 32
  torchrun --nproc_per_node=2 torch_baseline.py --mode ddp --batch 32            # gloo
  torchrun --nproc_per_node=2 torch_baseline.py --mode ddp --batch 32 --accum 4 --no-sync
  torchrun --nproc_per_node=2 torch_baseline.py --mode fsdp --batch 32           # FSDP1, CPU
  python3 torch_baseline.py --model cnn --image 1,28,28 --channels 32,64 --hidden 128 --batch 32
  python3 torch_baseline.py --model gpt --layers-n 4 --heads 4 --dim 128 --block 128 --batch 8 --optim adamw

Prints one JSON line (rank 0): samples/s over the timed micro-steps, after warm-up.
Each process uses --threads threads (default 1 under torchrun, so ranks do not share cores).
Measure kiln and this script in the same sitting and compare ratios, never absolute times.
"""
import argparse, json, os, sys, time
import torch, torch.nn as nn
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import Gpt, cnn, mlp  # noqa: E402  (kiln's families as PyTorch modules)

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["plain", "ddp", "fsdp"], default="plain")
p.add_argument("--batch", type=int, default=32, help="per-process micro-batch")
p.add_argument("--accum", type=int, default=1)
p.add_argument("--no-sync", action="store_true", help="skip all-reduce on non-boundary micro-steps")
p.add_argument("--steps", type=int, default=2000, help="timed micro-steps")
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--threads", type=int, default=None)
p.add_argument("--optim", choices=["sgd", "adamw"], default="sgd")
p.add_argument("--layers", default="1000,500,10", help="input,hidden...,classes")
p.add_argument("--samples", type=int, default=32768)
p.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
p.add_argument("--image", default="1,28,28", help="cnn: C,H,W")
p.add_argument("--channels", default="32,64", help="cnn: output channels per conv stage")
p.add_argument("--hidden", type=int, default=128, help="cnn: width of the hidden linear layer")
p.add_argument("--classes", type=int, default=10, help="cnn: classes")
p.add_argument("--layers-n", type=int, default=4, help="gpt: transformer blocks")
p.add_argument("--heads", type=int, default=4, help="gpt: attention heads")
p.add_argument("--dim", type=int, default=128, help="gpt: embedding width")
p.add_argument("--block", type=int, default=128, help="gpt: sequence length")
p.add_argument("--vocab", type=int, default=256, help="gpt: vocabulary size")
a = p.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
torch.set_num_threads(a.threads or (1 if world > 1 else torch.get_num_threads()))
if a.mode != "plain":
    dist.init_process_group("gloo")
torch.manual_seed(0)

if a.model == "mlp":
    sizes = [int(x) for x in a.layers.split(",")]
    model = mlp(sizes)
    xs, ys = torch.randn(a.samples, sizes[0]), torch.randint(0, sizes[-1], (a.samples,))
elif a.model == "cnn":
    c, h0, w0 = (int(x) for x in a.image.split(","))
    model = cnn((c, h0, w0), [int(x) for x in a.channels.split(",")], a.hidden, a.classes)
    xs, ys = torch.randn(a.samples, c, h0, w0), torch.randint(0, a.classes, (a.samples,))
else:
    model = Gpt(a.vocab, a.block, a.layers_n, a.heads, a.dim, init=True)
    toks = torch.randint(0, a.vocab, (a.samples, a.block + 1))
    xs, ys = toks[:, :-1], toks[:, 1:]
if a.mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(model)
elif a.mode == "fsdp":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(model, device_id=torch.device("cpu"))
opt = (torch.optim.SGD(model.parameters(), lr=0.01) if a.optim == "sgd"
       else torch.optim.AdamW(model.parameters(), lr=1e-3))
crit = nn.CrossEntropyLoss()
ds = TensorDataset(xs, ys)
sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, drop_last=True)

def batches():
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for b in loader:
            yield b
        epoch += 1

it = batches()
def micro(i):
    x, y = next(it)
    boundary = (i + 1) % a.accum == 0
    ctx = model.no_sync() if (a.no_sync and not boundary and a.mode == "ddp") else torch.enable_grad()
    with ctx:
        loss = crit(model(x), y.flatten()) / a.accum
        loss.backward()
    if boundary:
        opt.step(); opt.zero_grad(set_to_none=True)
    return loss

for i in range(a.warmup):
    micro(i)
if world > 1: dist.barrier()
t0 = time.perf_counter()
for i in range(a.steps):
    loss = micro(i)
if world > 1: dist.barrier()
dt = time.perf_counter() - t0
if rank == 0:
    print(json.dumps({"torch": torch.__version__, "mode": a.mode, "world": world, "batch": a.batch,
                      "accum": a.accum, "no_sync": a.no_sync, "optim": a.optim, "model": a.model,
                      "layers": a.layers, "params": sum(p.numel() for p in model.parameters()),
                      "threads": torch.get_num_threads(), "steps": a.steps,
                      "samples_per_sec": world * a.batch * a.steps / dt,
                      "tokens_per_sec": world * a.batch * a.steps * (a.block if a.model == "gpt" else 1) / dt,
                      "loss": float(loss.detach()) * a.accum}))
if world > 1:
    dist.destroy_process_group()
