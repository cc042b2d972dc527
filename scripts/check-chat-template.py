#!/usr/bin/env python3
"""transformers' chat rows and loss, for tests/it/sft.rs: makes DIR (a copy of the
tests/fixtures/hf-llama weights) a chat model: a word-level tokenizer.json of the fixture's 300
ids (each space and newline a token of its own, so that whitespace shows) with ChatML's
`<|im_start|>` and `<|im_end|>` as special tokens and a BOS-adding post-processor, saved by PreTrainedTokenizerFast with `eos_token`, and a chat_template.jinja
(transformers 5 writes it beside the tokenizer) that marks the assistant's turns with
`{% generation %}` and uses what real templates use (namespace, loop, loop controls,
raise_exception, string methods, the special-token variables). Writes DIR/chats.jsonl
(40 conversations) and DIR/pc.jsonl (prompt-completion records), the same as DIR/chats.parquet
and DIR/pc.parquet (pyarrow), and prints as JSON:

- `chats`: for each conversation, `apply_chat_template(messages, tokenize=True,
  return_dict=True, return_assistant_tokens_mask=True)`'s `input_ids` and `assistant_masks`;
- `pc`: for each record, tokenizer(prompt) + tokenizer(completion, add_special_tokens=False) +
  EOS, and the completion's (and EOS's) mask;
- `generated`: greedy `generate` after a system message, "w9 w10 w11" and the generation
  prompt, to `</s>` or `<|im_end|>`, at most 12 ids;
- `loss`, `tokens`: the Llama's mean loss over the conversations' assistant tokens (labels =
  input_ids where the mask is 1, else -100), computed conversation by conversation and weighed
  by their target tokens.

    python3 scripts/check-chat-template.py DIR
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
# every space and newline is a token of its own: a rendering that differs in whitespace
# differs in ids
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, " ": 3, "\n": 4, "system": 5, "user": 6, "assistant": 7}
for i in range(8, 298):
    vocab[f"w{i}"] = i
vocab["<|im_start|>"] = 298
vocab["<|im_end|>"] = 299
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s|\S+"), behavior="isolated")
tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
)
TEMPLATE = """{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set ns.system = messages[0]['content'] | trim -%}
{%- endif -%}
{{ bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if not loop.first %}{{ raise_exception('a system message must come first') }}{% endif %}
        {%- continue %}
    {%- endif %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('roles are user and assistant, not ' + message['role']) }}
    {%- endif %}
{{ '<|im_start|>' + message['role'] }}
    {% if message['role'] == 'assistant' %}
        {%- generation -%}
        {{ message['content'].strip() }}<|im_end|>
        {%- endgeneration %}
    {% else %}
        {%- if loop.index0 == 1 and ns.system %}{{ ns.system }} {% endif -%}
        {{ message['content'].strip() }}<|im_end|>
    {% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{ '<|im_start|>assistant' }}
{% endif %}"""
fast.chat_template = TEMPLATE
fast.save_pretrained(out)
# conversations run to 97 tokens: the fixture's config says 32 positions (its rotary
# frequencies do not depend on it)
with open(f"{out}/config.json") as f:
    config = json.load(f)
config["max_position_embeddings"] = 128
with open(f"{out}/config.json", "w") as f:
    json.dump(config, f, indent=2)


def words(seed, n):
    return " ".join(f"w{8 + (seed * 31 + k * 17) % 290}" for k in range(n))


chats = []
for c in range(40):
    msgs = []
    if c % 3 == 0:
        msgs.append({"role": "system", "content": "  " + words(c + 100, 1 + c % 4) + " "})
    for t in range(1 + c % 3):
        msgs.append({"role": "user", "content": words(c * 7 + t, 1 + (c + t) % 6)})
        msgs.append({"role": "assistant", "content": words(c * 11 + t, 1 + (c * 3 + t) % 7)})
    chats.append(msgs)
with open(f"{out}/chats.jsonl", "w") as f:
    for m in chats:
        f.write(json.dumps({"messages": m, "id": len(m)}) + "\n")
pcs = [{"prompt": words(p, 1 + p % 5), "completion": " " + words(p + 50, 1 + p % 4)} for p in range(10)]
with open(f"{out}/pc.jsonl", "w") as f:
    for r in pcs:
        f.write(json.dumps(r) + "\n")
# the same records as parquet, as `datasets` writes them: messages a list of structs, in row
# groups of 16
pq.write_table(pa.Table.from_pylist([{"messages": m} for m in chats]), f"{out}/chats.parquet", row_group_size=16)
pq.write_table(pa.Table.from_pylist(pcs), f"{out}/pc.parquet")

tok = AutoTokenizer.from_pretrained(out)
result = {"chats": [], "pc": []}
for m in chats:
    o = tok.apply_chat_template(m, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    result["chats"].append({"ids": list(o["input_ids"]), "mask": list(o["assistant_masks"])})
for r in pcs:
    p = tok(r["prompt"])["input_ids"]
    c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    result["pc"].append({"ids": p + c, "mask": [0] * len(p) + [1] * len(c)})

model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
total, count = 0.0, 0
with torch.no_grad():
    for c in result["chats"]:
        ids, mask = c["ids"], c["mask"]
        assert len(ids) <= 97, len(ids)
        labels = [t if k else -100 for t, k in zip(ids, mask)]
        n = sum(1 for l in labels[1:] if l != -100)
        if n == 0:
            continue
        loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item()
        total += loss * n
        count += n
result["loss"] = total / count
result["tokens"] = count
# greedy generation after a rendered user turn and the generation prompt, to the EOS or the end
# of turn
prompt = tok.apply_chat_template(
    [{"role": "system", "content": "w40 w41"}, {"role": "user", "content": "w9 w10 w11"}],
    add_generation_prompt=True,
    tokenize=True,
    return_dict=True,
)["input_ids"]
with torch.no_grad():
    g = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=12,
        eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")],
        pad_token_id=0,
    )
result["generated"] = g[0, len(prompt):].tolist()

# templates in the style of Llama 3.1's, Qwen2.5's and Mistral's
# (tests/fixtures/chat-templates), rendered to text, or the error they raise
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat-templates")
call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2.5}}}
convs = [
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "1 + 2?"},
     {"role": "assistant", "content": " 3 "}],
    [{"role": "user", "content": "Add 1 and 2.5"}, {"role": "assistant", "content": None, "tool_calls": [call]},
     {"role": "tool", "content": "3.5"}, {"role": "assistant", "content": "It is 3.5."}],
    [{"role": "user", "content": "Ünïcode ☃ and \"quotes\""}],
]
result["specials"] = dict(tok.special_tokens_map)
result["templates"] = []
for name in sorted(os.listdir(here)):
    if not name.endswith(".jinja"):
        continue
    with open(os.path.join(here, name)) as f:
        template = f.read()
    for i, conv in enumerate(convs):
        for prompt in (False, True):
            case = {"template": name, "conversation": conv, "prompt": prompt}
            try:
                case["text"] = tok.apply_chat_template(
                    conv, chat_template=template, tokenize=False, add_generation_prompt=prompt
                )
            except Exception as e:  # the template's raise_exception
                case["error"] = str(e)
            result["templates"].append(case)
print(json.dumps(result))
