#!/usr/bin/env python3
"""experiments/data/jsonl/rust-book/: the paragraphs of experiments/data/text/rust-book.txt as
JSON Lines documents ({"id": n, "text": paragraph}), every 20th paragraph in eval.jsonl and the
others in two training shards (the first and second half), byte for byte reproducible:

    python3 scripts/make_book_jsonl.py
"""
import json
from pathlib import Path

root = Path(__file__).resolve().parent.parent
text = (root / "experiments/data/text/rust-book.txt").read_text(encoding="utf-8")
paragraphs = [p for p in text.split("\n") if p.strip()]
out = root / "experiments/data/jsonl/rust-book"
out.mkdir(parents=True, exist_ok=True)
train = [(i, p) for i, p in enumerate(paragraphs) if i % 20 != 19]
evals = [(i, p) for i, p in enumerate(paragraphs) if i % 20 == 19]
half = len(train) // 2


def write(name, rows):
    with open(out / name, "w", encoding="utf-8", newline="\n") as f:
        for i, p in rows:
            f.write(json.dumps({"id": i, "text": p}, ensure_ascii=False) + "\n")


write("train-00000.jsonl", train[:half])
write("train-00001.jsonl", train[half:])
write("eval.jsonl", evals)
