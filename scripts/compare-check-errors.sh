#!/usr/bin/env bash
# `kiln check`'s output and exit code for thousands of one-key changes of the shipped
# experiments, from two kiln binaries: a change that should leave every error text and its
# order alone shows no difference (but for the memory a "does not fit" error sees free).
#   scripts/compare-check-errors.sh OLD_KILN NEW_KILN
# Each key `kiln check` prints for an experiment is set, one at a time, to each of a set of
# values (0, -1, 300, 5000, 1e12, "bad", true, [], 2, 1.5, "cuda", [0, 0], "f16", "nccl",
# "wgpu").
set -euo pipefail
cd "$(dirname "$0")/.."
OLD="$1" NEW="$2"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
python3 - "$NEW" > "$OUT/cases" <<'PY'
import re, subprocess, sys
for exp in ["quickstart", "tiny-gpt", "digits-cnn", "csv-blobs", "fsdp-wide-mlp", "sweep-lr", "tokens-gpt"]:
    f = f"experiments/{exp}.toml"
    out = subprocess.run([sys.argv[1], "check", f], capture_output=True, text=True).stdout
    sec = None
    for l in out.splitlines():
        m = re.match(r"^\[([\w.]+)\]", l)
        if m:
            sec = m.group(1)
            continue
        m = re.match(r"^#?\s*(\w+) = ", l)
        if m and sec:
            for v in ["0", "-1", "300", "5000", "1e12", '"bad"', "true", "[]", "2", "1.5",
                      '"cuda"', "[0, 0]", '"f16"', '"nccl"', '"wgpu"']:
                print(f"{f}\t{sec}.{m.group(1)}={v}")
PY
run() {
  while IFS=$'\t' read -r f c; do
    out=$("$1" check "$f" --set "$c" 2>&1 >/dev/null) && rc=0 || rc=$?
    printf '### %s %s rc=%s\n%s\n' "$f" "$c" "$rc" "$out"
  done < "$OUT/cases"
}
run "$OLD" > "$OUT/old"
run "$NEW" > "$OUT/new"
echo "$(wc -l < "$OUT/cases") cases, $(grep -c 'rc=2' "$OUT/new") of them errors"
diff "$OUT/old" "$OUT/new" | grep -v 'but the machine has .* available' | grep '^[<>]' || echo "no difference"
