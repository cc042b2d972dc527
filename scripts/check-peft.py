#!/usr/bin/env python3
"""kiln's LoRA against PEFT's (tests/it/lora.rs), on a Hugging Face base model directory:

  check-peft.py make BASE OUT --rank R --alpha A --targets q_proj,v_proj
      a PEFT adapter with non-zero A and B (`init_lora_weights=False`), saved in OUT, for kiln's
      `model.lora.init_from` (--targets with a "(" is one pattern, as PEFT takes a string).
  check-peft.py check BASE --probe P [--adapter DIR] [--merged DIR] [--trainable N --rank R
                      --alpha A --targets ...]
      --adapter: `PeftModel.from_pretrained(BASE, DIR)` (kiln's `export --format peft`, or an
      adapter `make` wrote) gives the logits and the loss kiln's probe holds (its input as its
      own labels), and with --prompt / --greedy that `generate(do_sample=False)` continues the
      prompt with kiln's ids (`kiln sample --prompt-ids P --ids --temperature 0`); --merged: kiln's `export --format hf-llama` of the run has the weights of
      PEFT's `merge_and_unload` and its logits; --trainable: PEFT's
      `get_nb_trainable_parameters()` for the same LoraConfig is kiln's count.

Exit 0 when everything agrees within --tol (1e-4, absolute), 1 otherwise.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["make", "check"])
ap.add_argument("base")
ap.add_argument("out", nargs="?")
ap.add_argument("--probe")
ap.add_argument("--adapter")
ap.add_argument("--merged")
ap.add_argument("--trainable", type=int)
ap.add_argument("--rank", type=int, default=8)
ap.add_argument("--alpha", type=float, default=8.0)
ap.add_argument("--targets", default="q_proj,v_proj")
ap.add_argument("--tol", type=float, default=1e-4)
ap.add_argument("--prompt", help="comma-separated prompt ids (with --greedy)")
ap.add_argument("--greedy", help="comma-separated ids kiln generated greedily after --prompt")
a = ap.parse_args()
torch.manual_seed(0)


def base():
    return AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32).eval()


def config(**kw):
    # (a pattern, which PEFT matches against whole module names, is passed as it is)
    targets = a.targets if "(" in a.targets else a.targets.split(",")
    return LoraConfig(r=a.rank, lora_alpha=a.alpha, target_modules=targets,
                      task_type="CAUSAL_LM", **kw)


if a.mode == "make":
    m = get_peft_model(base(), config(init_lora_weights=False))
    m.save_pretrained(a.out)
    sys.exit(0)

out, ok = {}, True
p = load_file(a.probe)
ids = p["input"].to(torch.long)
n, t = ids.shape
want = p["logits"].reshape(n, t, -1)


def compare(name, model):
    global ok
    with torch.no_grad():
        logits = model(ids).logits
    diff = (logits - want).abs().max().item()
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    kiln = F.cross_entropy(want[:, :-1].reshape(-1, want.shape[-1]), ids[:, 1:].reshape(-1)).item()
    out[name] = {"max_logit_diff": diff, "loss": loss, "kiln_loss": kiln}
    if diff > a.tol or abs(loss - kiln) > a.tol:
        ok = False


if a.adapter:
    pm = PeftModel.from_pretrained(base(), a.adapter).eval()
    compare("adapter", pm)
    if a.prompt:
        prompt = torch.tensor([[int(i) for i in a.prompt.split(",")]])
        greedy = [int(i) for i in a.greedy.split(",")]
        with torch.no_grad():
            gen = pm.generate(input_ids=prompt, do_sample=False, max_new_tokens=len(greedy),
                              attention_mask=torch.ones_like(prompt))
        theirs = gen[0, prompt.shape[1]:].tolist()
        out["greedy"] = {"peft": theirs, "kiln": greedy}
        ok = ok and theirs == greedy
    if a.merged:
        merged = pm.merge_and_unload()
        theirs = {k: v for k, v in merged.state_dict().items()}
        ours_model, info = AutoModelForCausalLM.from_pretrained(a.merged, output_loading_info=True)
        if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
            out["merged_loading"] = {k: sorted(info[k]) for k in ("missing_keys", "unexpected_keys")}
            ok = False
        ours = ours_model.state_dict()
        diff = max((theirs[k] - ours[k]).abs().max().item() for k in theirs)
        out["merged_max_weight_diff"] = diff
        ok = ok and diff <= a.tol
        compare("merged", ours_model.eval())
if a.trainable is not None:
    count = get_peft_model(base(), config()).get_nb_trainable_parameters()[0]
    out["peft_trainable"], out["kiln_trainable"] = count, a.trainable
    ok = ok and count == a.trainable
print(json.dumps(out))
sys.exit(0 if ok else 1)
