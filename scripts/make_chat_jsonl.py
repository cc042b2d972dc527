#!/usr/bin/env python3
"""Writes experiments/data/chat/: a small chat dataset made up here (no license applies) and
a tokenizer for it, for experiments/sft-llama-chat.toml.

- tokenizer.json: a word-level tokenizer of 300 ids (the Llama fixture's vocabulary size):
  the numbers 0 to 198, a few words, each space and newline a token of its own, ChatML's
  `<|im_start|>` and `<|im_end|>` as special tokens, `<s>` added in front of a text;
- tokenizer_config.json (`bos_token`, `eos_token`, `unk_token`) and chat_template.jinja
  (ChatML, the assistant's turns marked with `{% generation %}`);
- train.jsonl (2,000 conversations) and eval.jsonl (200): a user asks for the sum or the
  difference of two numbers below 100 ("97 plus 8"), the assistant answers ("105"); a third
  of them start with a system message, a third go on for a second question. Each fits the
  fixture's 32 positions.

Only the Python standard library: the tokenizer.json is written as JSON.

    python3 scripts/make_chat_jsonl.py
"""
import json
import os
import random

OUT = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "chat")
os.makedirs(OUT, exist_ok=True)

words = ["<unk>", "<s>", "</s>", " ", "\n", "system", "user", "assistant"]
words += [str(n) for n in range(199)]
words += ["what", "is", "plus", "minus", "?", "you", "add", "and", "subtract", "numbers", "."]
words += ["the", "answer", "then", "ok", "sure", "please", "answer", "with", "a", "number"]
vocab = {}
for w in words:
    vocab.setdefault(w, len(vocab))
assert len(vocab) <= 298, len(vocab)
vocab["<|im_start|>"] = 298
vocab["<|im_end|>"] = 299
added = [
    {"id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True}
    for w, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2), ("<|im_start|>", 298), ("<|im_end|>", 299)]
]
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": None,
    "pre_tokenizer": {
        "type": "Split",
        "pattern": {"Regex": "\\s|\\?|\\.|[^\\s?.]+"},
        "behavior": "Isolated",
        "invert": False,
    },
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    },
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
}
with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f, indent=1)
with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
with open(os.path.join(OUT, "chat_template.jinja"), "w") as f:
    f.write(
        "{%- for message in messages %}\n"
        "{{- '<|im_start|>' + message['role'] + '\\n' }}\n"
        "{%- if message['role'] == 'assistant' %}\n"
        "{%- generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}\n"
        "{%- else %}\n"
        "{{- message['content'] + '<|im_end|>' }}\n"
        "{%- endif %}\n"
        "{{- '\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"
    )


def question(rng):
    a, b = rng.randrange(100), rng.randrange(100)
    if rng.random() < 0.5:
        return f"{a} plus {b}", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"{a} minus {b}", str(a - b)


def conversation(rng):
    # (each fits the fixture's 32 positions: a row of 33 tokens)
    m = []
    r = rng.random()
    if r < 1 / 3:
        m.append({"role": "system", "content": "add ."})
    q, a = question(rng)
    m += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if r > 2 / 3:
        q, a = question(rng)
        m += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return m


for name, n, seed in [("train.jsonl", 2000, 1), ("eval.jsonl", 200, 2)]:
    rng = random.Random(seed)
    with open(os.path.join(OUT, name), "w") as f:
        for _ in range(n):
            f.write(json.dumps({"messages": conversation(rng)}) + "\n")
print(f"wrote {OUT}")
