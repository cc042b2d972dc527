#!/usr/bin/env python3
"""Converts scikit-learn's copy of the UCI optical digits (1797 8x8 images, pixels 0..16) into
gzipped IDX files for `data.kind = "idx"`: experiments/data/digits/{train,eval}-{images,labels}.

The source is `sklearn/datasets/data/digits.csv.gz` (64 pixels then the label per line), taken
from an installed scikit-learn or from its wheel (no numpy needed):

    pip download --no-deps -d /tmp/sk scikit-learn && python3 scripts/make_digits_idx.py /tmp/sk/*.whl

Pixels are scaled from 0..16 to 0..255 (round(v * 255 / 16)). Every 6th image (in file order,
starting with the first) is held out for evaluation (300 images), the other 1497 are for
training. The output is byte-for-byte reproducible (gzip mtime 0).
"""

import csv
import gzip
import io
import struct
import sys
import zipfile
from pathlib import Path

MEMBER = "sklearn/datasets/data/digits.csv.gz"
OUT = Path(__file__).resolve().parent.parent / "experiments" / "data" / "digits"
EVERY = 6


def source(arg):
    if arg is None:
        import sklearn  # noqa: F401  (only to find the installed copy)

        return (Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz").read_bytes()
    p = Path(arg)
    if p.suffix == ".whl":
        with zipfile.ZipFile(p) as z:
            return z.read(MEMBER)
    return p.read_bytes()


def write_gz(path, payload):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as g:
        g.write(payload)
    path.write_bytes(buf.getvalue())


def main():
    raw = gzip.decompress(source(sys.argv[1] if len(sys.argv) > 1 else None)).decode()
    rows = [list(map(int, r)) for r in csv.reader(io.StringIO(raw)) if r]
    assert len(rows) == 1797 and all(len(r) == 65 for r in rows), "unexpected digits.csv"
    images = [bytes(round(v * 255 / 16) for v in r[:64]) for r in rows]
    labels = [r[64] for r in rows]
    OUT.mkdir(parents=True, exist_ok=True)
    held = [i % EVERY == 0 for i in range(len(rows))]
    for name, keep in (("train", False), ("eval", True)):
        idx = [i for i in range(len(rows)) if held[i] == keep]
        n = len(idx)
        write_gz(OUT / f"{name}-images-idx3-ubyte.gz",
                 struct.pack(">IIII", 0x00000803, n, 8, 8) + b"".join(images[i] for i in idx))
        write_gz(OUT / f"{name}-labels-idx1-ubyte.gz",
                 struct.pack(">II", 0x00000801, n) + bytes(labels[i] for i in idx))
        print(f"{name}: {n} images -> {OUT}")


if __name__ == "__main__":
    main()
