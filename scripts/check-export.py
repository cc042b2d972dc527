#!/usr/bin/env python3
"""Checks a `kiln export` from PyTorch: loads it into the reference module of
`scripts/torch_reference.py` (mlp, cnn or gpt, sized from the file) with strict=True, runs a
forward on the input kiln saved with `--probe`, and compares the logits with kiln's.

  pip install torch safetensors
  kiln export runs/<run> -o model.safetensors --probe probe.safetensors
  python3 scripts/check-export.py model.safetensors probe.safetensors

Exit 0 when every logit is within --tol (1e-4) of kiln's, 1 otherwise.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import ACTS, Gpt  # noqa: E402  (kiln's families as PyTorch modules)

def linears(sd, start):
    """Indices of the `<i>.weight` 2-d tensors of an nn.Sequential, in order, from `start`."""
    idx = sorted(int(k.split(".")[0]) for k, v in sd.items() if k.endswith(".weight") and v.dim() == 2)
    return [i for i in idx if i >= start]


def sequential(sd, cfg, input_shape):  # input_shape: [C, H, W] for a cnn, the features for an mlp
    """The mlp or cnn of torch_reference.py, as kiln numbers its modules."""
    act = ACTS[cfg.get("activation", "relu")]
    drop = cfg.get("dropout", 0.0)
    mods = {}
    convs = sorted(int(k.split(".")[0]) for k, v in sd.items() if v.dim() == 4)
    for i in convs:
        out_c, in_c, k, _ = sd[f"{i}.weight"].shape
        mods[i] = nn.Conv2d(in_c, out_c, k, padding=k // 2)
        mods[i + 1], mods[i + 2] = act(), nn.MaxPool2d(2)
    start = 0
    if convs:
        start = convs[-1] + 3
        mods[start] = nn.Flatten()
        start += 1
    lins = linears(sd, start)
    for n, i in enumerate(lins):
        out_f, in_f = sd[f"{i}.weight"].shape
        mods[i] = nn.Linear(in_f, out_f)
        if n < len(lins) - 1:
            mods[i + 1] = act()
            if drop > 0:
                mods[i + 2] = nn.Dropout(drop)
    assert sorted(mods) == list(range(len(mods))), f"module indices {sorted(mods)} leave gaps"
    return nn.Sequential(*[mods[i] for i in range(len(mods))])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="the file `kiln export` wrote (--format pytorch)")
    p.add_argument("probe", help="the file `kiln export --probe` wrote")
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()

    with safe_open(a.export, "pt") as f:
        meta = f.metadata() or {}
    if meta.get("kiln.format", "pytorch") != "pytorch":
        sys.exit(f"{a.export} holds {meta.get('kiln.format')} names; export with --format pytorch")
    kind, cfg = meta["kiln.kind"], json.loads(meta["kiln.model"])
    input_shape = json.loads(meta["kiln.input_shape"])
    sd = load_file(a.export)
    probe = load_file(a.probe)
    x, want = probe["input"], probe["logits"]

    if kind == "gpt":
        vocab, d = sd["wte.weight"].shape
        block = sd["wpe.weight"].shape[0]
        layers = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
        bias = "ln_f.bias" in sd
        tie = cfg.get("tie_embeddings", True)
        model = Gpt(vocab, block, layers, cfg.get("heads", 4), d, bias=bias, tie=tie)
        x = x.long()
    elif kind in ("mlp", "cnn"):
        model = sequential(sd, cfg, input_shape)
        if kind == "mlp":
            x = x.flatten(1)  # kiln's mlp takes samples of any shape flattened
    else:
        sys.exit(f"no PyTorch reference module for model.kind = {kind!r} (built in: mlp, cnn, gpt)")

    missing, unexpected = model.load_state_dict(sd, strict=True)
    model.eval()
    with torch.no_grad():
        got = model(x)
    diff = (got - want).abs().max().item()
    ok = got.shape == want.shape and diff <= a.tol
    print(json.dumps({"kind": kind, "tensors": len(sd), "logits": list(got.shape),
                      "max_abs_diff": diff, "tol": a.tol, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
