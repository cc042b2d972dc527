"""What scripts/torch_gpt_step.py and scripts/torch_llama_step.py share: PyTorch's training step
with `torch.optim.AdamW` (weight decay on the matrices only, parameters of 2 or more
dimensions: kiln's `optim.decay = "matrices"`) and `clip_grad_norm_`, timed after warm-up
steps, and the JSON line both print.
"""
import json
import statistics
import time

import torch


def run(model, loss_of, a, tokens_per_step, **extra):
    """Trains `model` for `a.warmup` then `a.steps` timed steps, each on `loss_of(generator)`
    (the step's loss from random tokens drawn with the generator seeded by `a.seed`), with
    `a.lr`, `a.beta2`, `a.weight_decay` and `a.clip` (0: no clipping); prints one JSON line:
    the median and mean ms per step, `extra`, and the last step's loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2))
    gen = torch.Generator().manual_seed(a.seed)

    def step():
        loss = loss_of(gen)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "torch": torch.__version__,
        **extra,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in params),
        "ms_per_step_median": 1e3 * statistics.median(times),
        "ms_per_step_mean": 1e3 * statistics.fmean(times),
        "tokens_per_step": tokens_per_step,
        "loss": float(loss.detach()),
    }))
