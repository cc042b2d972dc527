#!/usr/bin/env bash
# The losses and params_sha256 of the quickstart and every shipped experiment, one line each,
# to show that a change left training bit-identical:
#   scripts/experiment-fingerprints.sh [KILN] > now.txt
#   diff tests/fixtures/experiment-fingerprints.txt now.txt
# Each experiment trains at most STEPS steps (default 12; the quickstart family in full), in a
# scratch directory. gpt2-finetune's 124M weights are not shipped: it runs from a random start,
# with 1 block of width 32 and a 32-token window. The sweep runs every trial. KILN_SET: extra
# `--set`s for every run (`KILN_SET="backend.fused=false"`: Burn's own ops, as when the fixture
# was recorded; the fused cross-entropy and the gpt kernels round otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="${1:-target/release/kiln}"
KILN="$(cd "$(dirname "$KILN")" && pwd)/$(basename "$KILN")"
STEPS="${STEPS:-12}"
extra=()
for s in ${KILN_SET:-}; do extra+=(--set "$s"); done
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
print() { # name run_dir
  python3 - "$1" "$2" <<'PY'
import json, sys
name, d = sys.argv[1], sys.argv[2]
losses = [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if l.strip()]
s = json.load(open(f"{d}/summary.json"))
print(name, s["status"], s["steps"], s.get("params_sha256"), " ".join(repr(x) for x in losses))
PY
}
for f in experiments/*.toml; do
  name="$(basename "$f" .toml)"
  sets=()
  case "$name" in
    quickstart*) ;;
    sweep-lr) continue ;;
    gpt2-finetune)
      grep -v '^init_from\|^init_format' "$f" > "$OUT/$name.toml"
      f="$OUT/$name.toml"
      d="$PWD/experiments/data/text/book-gpt2"
      sets=(--set "data.path=\"$d/train.bin\"" --set "data.eval_path=\"$d/val.bin\""
            --set model.layers=1 --set model.heads=4 --set model.dim=32
            --set model.block_size=32 --set "train.max_steps=$STEPS") ;;
    *) sets=(--set "train.max_steps=$STEPS") ;;
  esac
  "$KILN" run "$f" --quiet --run-dir "$OUT/$name" "${sets[@]}" ${extra[@]+"${extra[@]}"} >/dev/null 2>"$OUT/$name.err" \
    || { echo "$name failed:"; cat "$OUT/$name.err"; exit 1; }
  print "$name" "$OUT/$name"
done
"$KILN" sweep experiments/sweep-lr.toml --quiet --set "experiment.output_dir=\"$OUT/sweep\"" ${extra[@]+"${extra[@]}"} \
  >/dev/null 2>"$OUT/sweep.err" || { echo "sweep-lr failed:"; cat "$OUT/sweep.err"; exit 1; }
# a trial's directory name hashes its config, scratch directory included: the trials are
# told apart by their results, in sorted order
for s in $(cd "$OUT/sweep" && find . -name summary.json); do
  print "sweep-lr/trial" "$OUT/sweep/$(dirname "$s")"
done | LC_ALL=C sort
