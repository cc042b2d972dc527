#!/usr/bin/env bash
# Training time blocked by checkpoints, synchronous vs `checkpoint.async = true`, on
# experiments/bench-async-ckpt.toml (a 6-layer dim-512 gpt saving every 3 steps): the two runs
# interleaved RUNS times (default 3), medians of summary.json's `checkpoint.blocked_seconds`,
# `checkpoint.background_seconds` and `wall_seconds`, and whether the final parameters agree.
#   bash scripts/bench-async-ckpt.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cargo build --release --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$runs"); do
  for mode in false true; do
    ./target/release/kiln run experiments/bench-async-ckpt.toml --quiet \
      --run-dir "$out/$mode-$i" --set checkpoint.async=$mode >/dev/null
  done
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows = {}
for mode in ("false", "true"):
    s = [json.load(open(f"{out}/{mode}-{i}/summary.json")) for i in range(1, runs + 1)]
    med = lambda f: statistics.median(f(x) for x in s)
    rows[mode] = dict(
        blocked=med(lambda x: x["checkpoint"]["blocked_seconds"]),
        background=med(lambda x: x["checkpoint"]["background_seconds"]),
        wall=med(lambda x: x["wall_seconds"]),
        saves=s[0]["checkpoint"]["saves"],
        sha={x["params_sha256"] for x in s},
    )
print("| checkpoint.async | saves | blocked s | background s | wall s |")
print("|---|---|---|---|---|")
for mode, r in rows.items():
    print(f"| {mode} | {r['saves']} | {r['blocked']:.2f} | {r['background']:.2f} | {r['wall']:.1f} |")
ratio = rows["true"]["blocked"] / rows["false"]["blocked"]
same = rows["true"]["sha"] == rows["false"]["sha"] and len(rows["true"]["sha"]) == 1
print(f"blocked async / sync: {ratio:.2f}x; final parameters {'the same bits' if same else 'DIFFER'}")
PY
