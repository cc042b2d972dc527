#!/usr/bin/env bash
# kiln against PyTorch eager on the same GPT and Llama shapes, in one sitting: rounds interleaved (kiln,
# then PyTorch, shape by shape), 2 threads each, the steady-state milliseconds per step of each
# run (kiln: `kiln bench`'s ms/step, the median gap between step ends, the first step not
# counted; PyTorch: scripts/torch_gpt_step.py's median after 5 warm-up steps), then per shape the
# median of the rounds and kiln's tokens/s as a multiple of PyTorch's (PyTorch ms / kiln ms).
#
#   bash scripts/bench-vs-torch.sh            # 3 rounds
#   ROUNDS=5 SHAPES="baby" bash scripts/bench-vs-torch.sh
#
# KILN: the kiln binary (default target/release/kiln, built when missing); PYTHON: a python
# with torch (default ~/.cache/kiln/torch-venv/bin/python, else python3); THREADS (default 2);
# KILN_SET: extra `--set` for kiln (e.g. "backend.fused=false", to compare with Burn's ops).
#
# The shapes: nanoGPT's CPU baby GPT (experiments/bench-baby-gpt.toml), its shakespeare-char
# GPT at batch 4 (experiments/bench-gpt-6x384.toml) and experiments/bench-gpt.toml; the
# PyTorch model is nanoGPT's architecture (scripts/torch_gpt_step.py) with the same settings;
# and a llama (experiments/bench-llama.toml: 4 layers of 256, 8 heads over 4 key/value heads,
# SwiGLU of 704, context 256, batch 4, vocabulary 2000) against transformers' LlamaForCausalLM
# with eager attention (scripts/torch_llama_step.py), both with AdamW and clipping.
# The first lines say which CPU ran it, whether cpu0 shares its core with another (hyperthreads),
# and which instructions kiln's kernels used.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-2}"
SHAPES="${SHAPES:-baby 6x384 bench-gpt llama}"
KILN="${KILN:-target/release/kiln}"
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    [[ -x "$HOME/.cache/kiln/torch-venv/bin/python" ]] && PYTHON="$HOME/.cache/kiln/torch-venv/bin/python"
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "bench-vs-torch: $PYTHON has no torch (python3 -m venv ~/.cache/kiln/torch-venv && ~/.cache/kiln/torch-venv/bin/pip install torch)" >&2
    exit 2
fi
[[ -x "$KILN" ]] || cargo build --release >&2

# shape -> kiln config, kiln steps, PyTorch arguments
config() { case "$1" in
    baby) echo experiments/bench-baby-gpt.toml ;;
    6x384) echo experiments/bench-gpt-6x384.toml ;;
    bench-gpt) echo experiments/bench-gpt.toml ;;
    llama) echo experiments/bench-llama.toml ;;
    *) echo "bench-vs-torch: unknown shape $1 (baby, 6x384, bench-gpt, llama)" >&2; exit 2 ;;
esac; }
steps() { case "$1" in 6x384|llama) echo 12 ;; *) echo 30 ;; esac; }
torch_script() { case "$1" in llama) echo scripts/torch_llama_step.py ;; *) echo scripts/torch_gpt_step.py ;; esac; }
torch_args() { case "$1" in
    baby) echo "--layers 4 --heads 4 --dim 128 --block 64 --batch 12 --vocab 65" ;;
    6x384) echo "--layers 6 --heads 6 --dim 384 --block 256 --batch 4 --vocab 65 --steps 12" ;;
    bench-gpt) echo "--layers 4 --heads 4 --dim 128 --block 128 --batch 8 --vocab 256 --bias --beta2 0.999 --weight-decay 0 --clip 0" ;;
    llama) echo "--layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn 704 --block 256 --batch 4 --vocab 2000 --steps 12" ;;
esac; }

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || uname -m)"
# two threads on one core's hyperthreads share its FMA units and caches: a 2-vCPU VM may be that
echo "cpus: $(nproc); cpu0's core holds cpus $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null || echo '?')"
"$KILN" bench "$(config "${SHAPES%% *}")" --cpu flex --steps 1 --repeats 1 --set "backend.threads=$THREADS" \
    | grep '^cpu:' | sed 's/^cpu: .*; //'
sets=(--set "backend.threads=$THREADS")
for s in ${KILN_SET:-}; do sets+=(--set "$s"); done

declare -A KMS TMS
for round in $(seq 1 "$ROUNDS"); do
    for shape in $SHAPES; do
        k=$("$KILN" bench "$(config "$shape")" --cpu flex --steps "$(steps "$shape")" --repeats 1 "${sets[@]}" \
            | awk '$1 == "flex" { print $6 }')
        # shellcheck disable=SC2046
        t=$("$PYTHON" "$(torch_script "$shape")" $(torch_args "$shape") --threads "$THREADS" \
            | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["ms_per_step_median"])')
        KMS[$shape]="${KMS[$shape]:-} $k"
        TMS[$shape]="${TMS[$shape]:-} $t"
        printf 'round %d  %-9s  kiln %8.2f ms/step  torch %8.2f ms/step\n' "$round" "$shape" "$k" "$t"
    done
done

med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo
printf '%-9s  %14s  %14s  %s\n' shape "kiln ms/step" "torch ms/step" "kiln tokens/s vs torch's"
for shape in $SHAPES; do
    k=$(echo "${KMS[$shape]}" | med)
    t=$(echo "${TMS[$shape]}" | med)
    printf '%-9s  %14.2f  %14.2f  %.2fx\n' "$shape" "$k" "$t" "$(awk -v t="$t" -v k="$k" 'BEGIN { print t / k }')"
done
echo "(medians of $ROUNDS interleaved rounds, $THREADS threads each; torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
