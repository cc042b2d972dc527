#!/usr/bin/env python3
"""Regenerates tests/fixtures/hf-gpt2/: a small Hugging Face GPT2LMHeadModel (random init from a
GPT2Config with torch's seed 0, nothing downloaded) saved with
`save_pretrained(safe_serialization=True)`, and expected.safetensors: fixed token ids and the
logits transformers computes for them, with the loss (labels = the ids) in its metadata
(`expected`, JSON).

  pip install torch transformers
  python3 scripts/make-hf-gpt2-fixture.py [OUT_DIR]

The same torch and transformers versions write the same bytes (both are in the metadata).
`tests/it/hf.rs` loads the model with `model.init_from` and matches the loss within 1e-4.
"""
import json
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf-gpt2"
torch.manual_seed(0)
# GPT-2's architecture (gelu_new, tied head, biases) at a test's size
config = GPT2Config(
    vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
)
model = GPT2LMHeadModel(config).eval()
model.save_pretrained(out, safe_serialization=True)
ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    o = model(ids, labels=ids)
meta = {
    "loss": repr(o.loss.item()),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
}
# one metadata key: safetensors writes a map's keys in no fixed order
save_file(
    {"ids": ids.to(torch.float32), "logits": o.logits.contiguous()},
    f"{out}/expected.safetensors",
    metadata={"expected": json.dumps(meta, sort_keys=True)},
)
print(json.dumps(meta))
