#!/usr/bin/env python3
"""Checks a `kiln export --format hf-gpt2` with Hugging Face transformers: loads the directory
with `GPT2LMHeadModel.from_pretrained`, runs it on the input kiln saved with `--probe`, and
compares the language-model loss (the ids as their own labels) and the logits with kiln's.

  pip install torch transformers
  kiln export runs/<gpt run> --format hf-gpt2 -o gpt2-export --probe probe.safetensors
  python3 scripts/check-hf-gpt2.py gpt2-export probe.safetensors

Exit 0 when the losses agree within --tol (1e-4, relative), 1 otherwise.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("export_dir")
ap.add_argument("probe")
ap.add_argument("--tol", type=float, default=1e-4)
a = ap.parse_args()

model = GPT2LMHeadModel.from_pretrained(a.export_dir).eval()
p = load_file(a.probe)
ids = p["input"].to(torch.long)
n, t = ids.shape
vocab = model.config.vocab_size
kiln_logits = p["logits"].reshape(n, t, -1)
with torch.no_grad():
    out = model(ids, labels=ids)
# kiln's loss from kiln's logits, as transformers takes it: position i predicts id i + 1
kiln_loss = F.cross_entropy(kiln_logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)).item()
hf_loss = out.loss.item()
rel = abs(kiln_loss - hf_loss) / abs(hf_loss)
diff = (out.logits - kiln_logits).abs().max().item()
print(f"{n} x {t} tokens, vocab {vocab}: loss transformers {hf_loss:.7f}, kiln {kiln_loss:.7f} "
      f"(relative difference {rel:.2e}, tolerance {a.tol:g}); largest logit difference {diff:.2e}")
sys.exit(0 if rel <= a.tol else 1)
