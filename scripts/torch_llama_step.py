#!/usr/bin/env python3
"""transformers' LlamaForCausalLM steady-state training step on random tokens: the PyTorch side
of `scripts/bench-vs-torch.sh`'s llama shape (experiments/bench-llama.toml).

The model is transformers' own `LlamaForCausalLM` (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU, untied output layer) with `attn_implementation` eager or sdpa (default
eager, the issue's comparison), the loss transformers computes from `labels`, and
`torch.optim.AdamW` with weight decay on the matrices (parameters of 2 or more dimensions) and
`clip_grad_norm_` — kiln's `optim.decay = "matrices"`.

  python3 scripts/torch_llama_step.py --layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn 704 \
      --block 256 --batch 4 --vocab 2000

Prints one JSON line like scripts/torch_gpt_step.py's.
"""
import argparse

import torch

from torch_step import run

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--dim", type=int, default=256)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--kv-heads", type=int, default=4)
p.add_argument("--ffn", type=int, default=704)
p.add_argument("--block", type=int, default=256)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--vocab", type=int, default=2000)
p.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--beta2", type=float, default=0.95)
p.add_argument("--weight-decay", type=float, default=0.1)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

cfg = LlamaConfig(
    vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn, num_hidden_layers=a.layers,
    num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=a.block,
    rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    attn_implementation=a.attn, use_cache=False,
)
model = LlamaForCausalLM(cfg).train()


def loss_of(gen):
    toks = torch.randint(0, a.vocab, (a.batch, a.block), generator=gen)
    return model(input_ids=toks, labels=toks).loss


run(model, loss_of, a, a.batch * a.block, attn=a.attn)
