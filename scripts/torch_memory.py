"""Peak memory of a gpt under PyTorch eager, DDP and FSDP (one unit per block), for comparing
kiln's peak RSS with PyTorch's on the same model. Prints the sum over ranks of each process's peak
RSS and of its start-up RSS (import torch + process group), in MB: compare deltas.

  python torch_memory.py --mode plain
  torchrun --nproc-per-node 2 torch_memory.py --mode ddp
  torchrun --nproc-per-node 2 torch_memory.py --mode fsdp
Shape defaults: 8 blocks, dim 512, 8 heads, block 64, vocab 256, batch 2, AdamW, 3 steps."""
import argparse, json, os, resource, sys
import torch, torch.nn as nn, torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import Block, Gpt  # noqa: E402  (kiln's gpt as a PyTorch module)

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["plain", "ddp", "fsdp"], default="plain")
p.add_argument("--layers", type=int, default=8); p.add_argument("--dim", type=int, default=512)
p.add_argument("--heads", type=int, default=8); p.add_argument("--block", type=int, default=64)
p.add_argument("--vocab", type=int, default=256); p.add_argument("--batch", type=int, default=2)
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
torch.set_num_threads(1)
if world > 1: dist.init_process_group("gloo")
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

torch.manual_seed(0)
m = Gpt(a.vocab, a.block, a.layers, a.heads, a.dim); n = sum(p.numel() for p in m.parameters())
if a.mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(m)
elif a.mode == "fsdp":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    m = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"),
             sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
for _ in range(a.steps):
    x = torch.randint(0, a.vocab, (a.batch, a.block + 1))
    loss = nn.functional.cross_entropy(m(x[:, :-1]), x[:, 1:].flatten())
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
t = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, start], dtype=torch.float64)
if world > 1: dist.all_reduce(t)
if rank == 0:
    print(json.dumps({"mode": a.mode, "world": world, "params": n, "peak_mb": round(t[0].item() / 1024, 1),
                      "startup_mb": round(t[1].item() / 1024, 1), "delta_mb": round((t[0] - t[1]).item() / 1024, 1)}))
if world > 1: dist.destroy_process_group()
