#!/usr/bin/env python3
"""Regenerates tests/fixtures/hf-{qwen3,gemma3,gemma3vl,phi3,mixtral}/: small Hugging Face decoders of
the architectures kiln's llama family computes besides Llama (random weights from torch's seed 0,
nothing downloaded), each saved with `save_pretrained` as transformers writes it (transformers
5 keeps Mixtral's experts in fused tensors), and expected.safetensors: fixed token ids with the
logits and loss transformers computes for them, a prompt with the 12 ids
`generate(do_sample=False)` appends, and (Mixtral) the training loss of one 15-token window
with the load-balancing loss of `output_router_logits`, in its metadata (`expected`, JSON).

  bash scripts/torch-up.sh
  python3 scripts/make-hf-arch-fixtures.py [OUT_ROOT [ARCH...]]

Shapes where kiln could go wrong quietly: Qwen3's head_dim is not hidden / heads; Gemma 3's
window (4) is shorter than the 16-token block, its layers alternate sliding and global with
two rotary bases, and query_pre_attn_scalar is not head_dim; Phi-3's q/k/v and gate/up are
fused; Mixtral routes each token to 2 of 4 experts. gemma3vl is a Gemma 3 vision-language model
(`Gemma3ForConditionalGeneration`, as Gemma 3 4B-27B): a tiny SigLIP vision tower beside the
language model, whose global layers scale their rotary positions linearly (factor 8); its
expected values are the text-only forward's. Weights are drawn wider than the
initializers (norms away from their identity) so that a wrong norm, rotation or routing shows
in the loss. `tests/it/architectures.rs` loads each directory with only `model.init_from`.
"""
import json
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
only = set(sys.argv[2:])
common = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=16, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
configs = {
    "qwen3": transformers.Qwen3Config(**common, num_hidden_layers=2, head_dim=12,
                                      rms_norm_eps=1e-6, rope_theta=10000.0,
                                      tie_word_embeddings=False),
    "gemma3": transformers.Gemma3TextConfig(
        **common, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        tie_word_embeddings=True),
    "gemma3vl": transformers.Gemma3Config(
        text_config=dict(
            **common, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=16, patch_size=8),
        # (the image token outside the vocabulary: no text id is taken for one)
        mm_tokens_per_image=4, image_token_index=1000, boi_token_index=297,
        eoi_token_index=298, tie_word_embeddings=True),
    "phi3": transformers.Phi3Config(**common, num_hidden_layers=2, rope_theta=10000.0,
                                    tie_word_embeddings=False),
    "mixtral": transformers.MixtralConfig(**common, num_hidden_layers=2, num_local_experts=4,
                                          num_experts_per_tok=2, router_aux_loss_coef=0.02,
                                          rope_theta=10000.0, tie_word_embeddings=False),
}
for name, config in configs.items():
    if only and name not in only:
        continue
    torch.manual_seed(0)
    if name == "gemma3vl":
        model = transformers.Gemma3ForConditionalGeneration(config).eval()
    else:
        model = AutoModelForCausalLM.from_config(config).eval()
    gemma = name.startswith("gemma3")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    out = f"{root}/hf-{name}"
    model.save_pretrained(out, safe_serialization=True)
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__}
    with torch.no_grad():
        o = model(ids, labels=ids)
        prompt = ids[:1, :5]
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                             min_new_tokens=12, do_sample=False, pad_token_id=0)
        if name == "mixtral":
            # one window as kiln trains on it: 15 tokens in, the next 15 as targets
            one = model(ids[:1, :15], output_router_logits=True)
            lm = torch.nn.functional.cross_entropy(one.logits[0], ids[0, 1:16])
            meta["aux_loss"] = repr(one.aux_loss.item())
            meta["loss_with_aux"] = repr((lm + config.router_aux_loss_coef * one.aux_loss).item())
    meta["loss"] = repr(o.loss.item())
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
    print(name, json.dumps(meta))
