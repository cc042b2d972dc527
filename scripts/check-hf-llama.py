#!/usr/bin/env python3
"""Checks a `kiln export --format hf-llama` with Hugging Face transformers: loads the directory
with `AutoModelForCausalLM.from_pretrained` (LlamaForCausalLM, or Qwen2ForCausalLM for a model
with attn_bias), which must find no missing, unexpected or mis-shaped keys, runs it on the input
kiln saved with `--probe`, and compares the language-model loss (the ids as their own labels)
with kiln's; with --prompt and --greedy, also that `generate(do_sample=False)` continues the
prompt with exactly those ids (what `kiln sample --prompt-ids P --ids --temperature 0` printed).

  bash scripts/torch-up.sh          # a venv with torch and transformers; prints its python
  kiln export runs/<llama run> --format hf-llama -o llama-export --probe probe.safetensors
  python scripts/check-hf-llama.py llama-export probe.safetensors [--prompt 1,2,3 --greedy 4,5,6]

Exit 0 when everything agrees (losses within --tol, 1e-4 absolute), 1 otherwise.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("export_dir")
ap.add_argument("probe")
ap.add_argument("--tol", type=float, default=1e-4)
ap.add_argument("--prompt", help="comma-separated prompt ids")
ap.add_argument("--greedy", help="comma-separated ids kiln generated greedily after --prompt")
a = ap.parse_args()

model, info = AutoModelForCausalLM.from_pretrained(a.export_dir, output_loading_info=True)
model = model.eval()
ok = True
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
    if info.get(kind):
        print(f"{kind}: {sorted(info[kind])}")
        ok = False
p = load_file(a.probe)
ids = p["input"].to(torch.long)
n, t = ids.shape
vocab = model.config.vocab_size
kiln_logits = p["logits"].reshape(n, t, -1)
with torch.no_grad():
    out = model(ids, labels=ids)
kiln_loss = F.cross_entropy(kiln_logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)).item()
hf_loss = out.loss.item()
diff = (out.logits - kiln_logits).abs().max().item()
print(f"{type(model).__name__}, {n} x {t} tokens, vocab {vocab}: loss transformers {hf_loss:.7f}, "
      f"kiln {kiln_loss:.7f} (difference {abs(hf_loss - kiln_loss):.2e}, tolerance {a.tol:g}); "
      f"largest logit difference {diff:.2e}")
ok &= abs(hf_loss - kiln_loss) <= a.tol
if a.prompt and a.greedy:
    prompt = torch.tensor([[int(i) for i in a.prompt.split(",")]])
    want = [int(i) for i in a.greedy.split(",")]
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=len(want),
                             min_new_tokens=len(want), do_sample=False, pad_token_id=0)
    got = gen[0, prompt.shape[1]:].tolist()
    print(f"greedy: transformers {got}, kiln {want}: {'equal' if got == want else 'DIFFERENT'}")
    ok &= got == want
sys.exit(0 if ok else 1)
