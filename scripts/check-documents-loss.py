#!/usr/bin/env python3
"""transformers' loss on documents, for tests/it/documents.rs: makes DIR (a copy of the
tests/fixtures/hf-llama weights) a model with a tokenizer (a word-level tokenizer.json of the
fixture's 300 ids whose post-processor adds a BOS, saved by PreTrainedTokenizerFast with
`eos_token`), writes DIR/docs.jsonl (documents of 1 to 30 words), and prints transformers'
mean loss over every target token, computed document by document: each document's ids are
tokenizer(text)["input_ids"] and the EOS id, the loss the causal LM's own (labels = ids).

    python3 scripts/check-documents-loss.py DIR
"""
import json
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for i in range(3, 300):
    vocab[f"w{i}"] = i
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
)
fast.save_pretrained(out)

docs = []
for d in range(24):
    n = 1 + (d * 7) % 30
    docs.append(" ".join(f"w{3 + (d * 31 + k * 17) % 297}" for k in range(n)))
with open(f"{out}/docs.jsonl", "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")

tok = AutoTokenizer.from_pretrained(out)
model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
total, count = 0.0, 0
with torch.no_grad():
    for d in docs:
        ids = tok(d)["input_ids"] + [tok.eos_token_id]
        assert len(ids) <= 33, len(ids)
        x = torch.tensor([ids])
        # the model's own loss (a mean over the document's targets), weighed by its targets
        loss = model(input_ids=x, labels=x).loss.item()
        total += loss * (len(ids) - 1)
        count += len(ids) - 1
print(json.dumps({"loss": total / count, "tokens": count}))
