#!/usr/bin/env python3
"""PyTorch eager's steady-state training step of a GPT with nanoGPT's architecture, on random
tokens: the PyTorch side of `scripts/bench-vs-torch.sh`.

The model is nanoGPT's `model.py` written out: token + learned position embeddings, pre-LN blocks
with LayerNorm (bias optional, `--bias`), causal self-attention through
`scaled_dot_product_attention(is_causal=True)`, an MLP of 4 x dim with exact GELU, a final
LayerNorm and an output layer tied to the token embedding. nanoGPT's initialisation (normal
0.02, residual projections 0.02 / sqrt(2 x layers)) and its optimizer: `torch.optim.AdamW`
with weight decay on the matrices only (parameters of 2 or more dimensions) and
`clip_grad_norm_`.

  python3 scripts/torch_gpt_step.py --layers 4 --heads 4 --dim 128 --block 64 --batch 12 --vocab 65

Prints one JSON line: the median and mean ms per step over `--steps` timed steps after
`--warmup` steps, and the loss of the last step. `--threads` (default 2) sets
`torch.set_num_threads`.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_step import run

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--block", type=int, default=64)
p.add_argument("--batch", type=int, default=12)
p.add_argument("--vocab", type=int, default=65)
p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm (GPT-2)")
p.add_argument("--gelu", choices=["none", "tanh"], default="none", help="F.gelu's approximate")
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--beta2", type=float, default=0.99)
p.add_argument("--weight-decay", type=float, default=0.1)
p.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_'s max norm (0: none)")
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(a.dim, 3 * a.dim, bias=a.bias)
        self.c_proj = nn.Linear(a.dim, a.dim, bias=a.bias)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(a.dim, dim=2)
        q, k, v = (z.view(b, t, a.heads, c // a.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(a.dim, 4 * a.dim, bias=a.bias)
        self.c_proj = nn.Linear(4 * a.dim, a.dim, bias=a.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=a.gelu))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(a.dim, bias=a.bias)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(a.dim, bias=a.bias)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.dim)
        self.wpe = nn.Embedding(a.block, a.dim)
        self.h = nn.ModuleList([Block() for _ in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.dim, bias=a.bias)
        self.lm_head = nn.Linear(a.dim, a.vocab, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, w in self.named_parameters():
            if w.dim() >= 2:
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(w, 0.0, std)
            elif "ln" not in name:
                nn.init.zeros_(w)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


model = GPT()


def loss_of(gen):
    toks = torch.randint(0, a.vocab, (a.batch, a.block + 1), generator=gen)
    return model(toks[:, :-1], toks[:, 1:])


run(model, loss_of, a, a.batch * a.block)
