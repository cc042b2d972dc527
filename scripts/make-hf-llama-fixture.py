#!/usr/bin/env python3
"""Regenerates tests/fixtures/hf-llama/: a small Hugging Face LlamaForCausalLM (random weights
from torch's seed 0, nothing downloaded: 4 heads over 2 key/value heads, Llama 3's rope scaling,
an untied head) saved with `save_pretrained` as sharded safetensors (an index and several
shards), and expected.safetensors: fixed token ids with the logits transformers computes for
them, a prompt with the 20 ids `generate(do_sample=False)` appends, and the loss (labels = the
ids) in its metadata (`expected`, JSON).

  pip install torch transformers
  python3 scripts/make-hf-llama-fixture.py [OUT_DIR]

The weights are drawn wider than Llama's initializer_range (and the norms' weights away from 1)
so that a wrong rotation, head grouping or norm shows in the loss, not only in the last digits.
`tests/it/hf_llama.rs` loads the directory with `model.init_from` and matches the loss within
1e-4 and the greedy ids exactly.
"""
import json
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf-llama"
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        else:
            p.copy_(0.3 * torch.randn_like(p))
model.save_pretrained(out, safe_serialization=True, max_shard_size="60KB")
ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    o = model(ids, labels=ids)
    prompt = ids[:1, :5]
    gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                         do_sample=False, pad_token_id=0)
meta = {
    "loss": repr(o.loss.item()),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
}
# one metadata key: safetensors writes a map's keys in no fixed order
save_file(
    {
        "ids": ids.to(torch.float32),
        "logits": o.logits.contiguous(),
        "prompt": prompt.to(torch.float32),
        "greedy": gen[:, prompt.shape[1]:].to(torch.float32).contiguous(),
    },
    f"{out}/expected.safetensors",
    metadata={"expected": json.dumps(meta, sort_keys=True)},
)
print(json.dumps(meta))
