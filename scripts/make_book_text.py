#!/usr/bin/env python3
"""Extracts the prose of "The Rust Programming Language" (the Rust book, MIT OR Apache-2.0) from
the HTML that rustup installs with the `rust-docs` component, into
experiments/data/text/rust-book.txt: the text of every <p> of chapters 1 to 10 (but the page's keyboard help), paragraphs
separated by blank lines, cut at the last paragraph that fits in MAX bytes. No code blocks.

    python3 scripts/make_book_text.py ~/.rustup/toolchains/1.95.0-*/share/doc/rust/html/book
"""

import html.parser
import re
import sys
from pathlib import Path

MAX = 400_000
OUT = Path(__file__).resolve().parent.parent / "experiments" / "data" / "text" / "rust-book.txt"


class Paragraphs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.depth, self.buf, self.out, self.skip = 0, [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "script", "style", "nav"):
            self.skip += 1
        elif tag == "p" and not self.skip:
            self.depth, self.buf = 1, []

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style", "nav"):
            self.skip -= 1
        elif tag == "p" and self.depth:
            self.depth = 0
            text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
            # skip the page's keyboard help ("Press S or / to search ...")
            if text and not text.startswith("Press "):
                self.out.append(text)

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.buf.append(data)


def main():
    book = Path(sys.argv[1])
    chapters = sorted(p for p in book.glob("ch*.html") if re.match(r"ch(0\d|10)-", p.name))
    paras = []
    for ch in chapters:
        p = Paragraphs()
        p.feed(ch.read_text(encoding="utf-8"))
        paras.extend(p.out)
    text, size = [], 0
    for para in paras:
        b = len(para.encode()) + 2
        if size + b > MAX:
            break
        text.append(para)
        size += b
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n\n".join(text) + "\n", encoding="utf-8")
    print(f"{len(text)} paragraphs, {OUT.stat().st_size} bytes -> {OUT}")


if __name__ == "__main__":
    main()
