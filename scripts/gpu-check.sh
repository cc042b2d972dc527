#!/usr/bin/env bash
# kiln's GPU check, built for a 10-minute window on a machine with an NVIDIA GPU. It builds
# nothing: it runs a kiln binary built elsewhere with the `cuda` feature.
#
#   cargo build --release --features cuda
#   mkdir -p .carry && strip -o .carry/kiln target/release/kiln   # .carry/ is git-ignored
#   # on the GPU machine, in the repository root:
#   bash scripts/gpu-check.sh            # or KILN=/path/to/kiln bash scripts/gpu-check.sh
#   bash scripts/gpu-check.sh --dry-run  # every step with its timeout; needs no GPU
#
# - A preflight (driver, GPU, toolkit, NVRTC, NCCL) stops early with the reason.
# - Each step runs under its own `timeout` and prints PASS or FAIL as it ends; a FAIL prints
#   the tail of the step's output and of its rank log.
# - Everything is written under $OUT/gpu-check when OUT is set (the device runner brings $OUT
#   back): metrics, rank logs, summaries, the `kiln env` report, each step's output.
# - The throughput comparison is last. The timeouts add up to 539 s on one GPU (each step is
#   killed at most 1 s after its timeout); with two GPUs the NCCL overlap step gets 120 s more.
# - Exact resume on CUDA is checked by the f16 run (AdamW, its loss scale saved and restored).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
KILN=${KILN:-./.carry/kiln}
if [ -n "${OUT:-}" ]; then WORK=$OUT/gpu-check
elif [ "$DRY" = 1 ]; then WORK=${WORK:-/tmp/kiln-gpu-check}
else WORK=${WORK:-$(mktemp -d /tmp/kiln-gpu-check.XXXX)}; fi
[ "$DRY" = 1 ] || mkdir -p "$WORK"
# kiln's kernel cache lives with the results, so its size can be checked
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$WORK/cache}
Q=experiments/quickstart.toml
pass=0
fail=0
total=0
n=0

step() { # timeout-seconds, name, command...
  local limit=$1 name=$2; shift 2
  n=$((n + 1)); total=$((total + limit))
  if [ "$DRY" = 1 ]; then
    printf 'step %2d  %3ss  %s\n         %s\n' "$n" "$limit" "$name" "$*"
    return 0
  fi
  local log
  log=$WORK/step-$(printf %02d $n).log
  local t0=$SECONDS
  # `timeout` runs programs, not shell functions: each step runs in a child bash that has this
  # script's functions and variables (exported below)
  if timeout --kill-after=1 "$limit" bash -c '"$@"' step "$@" >"$log" 2>&1; then
    printf 'PASS  %2d  %-60s %4ss\n' "$n" "$name" "$((SECONDS - t0))"; pass=$((pass + 1))
  else
    local rc=$?
    printf 'FAIL  %2d  %-60s %4ss (exit %s%s)\n' "$n" "$name" "$((SECONDS - t0))" "$rc" "$([ "$rc" = 124 ] && echo ", timed out after ${limit}s")"
    fail=$((fail + 1))
    echo "----- output (tail)"; tail -n 15 "$log"
    local rank_log
    rank_log=$(ls -t "$WORK"/*/logs/rank-0.log 2>/dev/null | head -1)
    [ -n "$rank_log" ] && { echo "----- $rank_log (tail)"; tail -n 10 "$rank_log"; }
    echo "-----"
  fi
}

run() { # run-dir name, extra --set args...
  local dir=$1; shift
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  "$KILN" run "$Q" --quiet --run-dir "$WORK/$dir" --set train.max_steps=30 --set train.log_every=1 "${args[@]}"
}

docs_run() { # run-dir name, extra --set args...: a small llama (experiments/llama-tiny.toml, 1
  # layer of 32) on jsonl documents packed into rows (attention, positions and targets kept
  # inside each document: Burn's ops with a block-diagonal mask on CUDA, the fused kernel on CPU)
  local dir=$1; shift
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  "$KILN" run experiments/llama-tiny.toml --quiet --run-dir "$WORK/$dir" --set train.max_steps=3 \
    --set train.log_every=1 --set train.eval_every=0 --set train.batch_size=4 \
    --set model.layers=1 --set model.dim=32 --set model.heads=2 --set model.kv_heads=1 \
    --set model.ffn_dim=64 --set model.block_size=32 --set 'data.kind="jsonl"' --set data.dtype= \
    --set 'data.path="experiments/data/jsonl/rust-book/train-*.jsonl"' \
    --set data.eval_path= "${args[@]}"
}

docs_cpu_and_compare() { # the same on the CPU, then its losses against CUDA's (rel 1e-3)
  docs_run cpu-docs && compare_losses cuda-docs cpu-docs 1e-3
}

lora_cpu_and_compare() { # LoRA on the CPU, its losses against CUDA's (rel 1e-3), and only the
  # adapters trained there (summary.json's trainable_params)
  docs_run cpu-lora model.lora.rank=4 'model.lora.targets=["all-linear"]' \
    && compare_losses cuda-lora cpu-lora 1e-3 \
    && python3 -c "import json,sys; s=json.load(open('$WORK/cuda-lora/summary.json')); print('trainable', s['trainable_params'], 'of', s['num_params']); sys.exit(0 if 0 < s['trainable_params'] < s['num_params'] else 1)"
}

archs_cuda_and_cpu() { # Gemma 3 (a sliding window of 8 in a block of 32: Burn's ops with the
  # window's mask on CUDA) and Mixtral (4 routed experts, the load-balancing loss) on CUDA and the
  # CPU, their losses within rel 1e-3
  for a in gemma3 mixtral; do
    local keys=(model.sliding_window=8)
    [ "$a" = mixtral ] && keys=(model.experts=4 model.experts_per_token=2)
    docs_run "cuda-$a" backend.device=cuda "model.kind=\"$a\"" "${keys[@]}" \
      && docs_run "cpu-$a" "model.kind=\"$a\"" "${keys[@]}" \
      && compare_losses "cuda-$a" "cpu-$a" 1e-3 || return 1
  done
}

compare_losses() { # dir a, dir b, relative tolerance
  python3 - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
print(f"losses: {len(a)} steps, first {a[0]:.6f} vs {b[0]:.6f}, last {a[-1]:.6f} vs {b[-1]:.6f}, max relative diff {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if len(a) == len(b) and worst <= tol else 1)
PY
}

stays_on_device() { # dir: the parameters crossed to the device once, no gradient or optimizer
  # state crossed at all (summary.json's host_transfers, counted by the engine)
  python3 - "$WORK/$1/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
once = 4 * s["num_params"]
ok = True
for m in s["memory"]:
    t = m.get("host_transfers")
    print(f"rank {m['rank']}: {t}")
    ok = ok and t is not None and t["params_to_device"] == once and t["grads_to_host"] == 0 \
        and t["grads_to_device"] == 0 and t["state_to_device"] == 0
print(f"expected: params_to_device == {once} (one copy), no gradient or optimizer state to the device or gradient to the host")
sys.exit(0 if ok else 1)
PY
}

preflight() {
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: no NVIDIA driver here"; return 1; }
  nvidia-smi -L || { echo "nvidia-smi -L failed: the driver sees no GPU"; return 1; }
  "$KILN" env | tee "$WORK/env.txt"
  grep -q "^gpu 0: " "$WORK/env.txt" || { echo "kiln sees no GPU (see above)"; return 1; }
  grep -q "^cuda toolkit: not found" "$WORK/env.txt" && { echo "no CUDA toolkit (see above)"; return 1; }
  grep -q "^nvrtc: not loadable" "$WORK/env.txt" && { echo "NVRTC does not load (see above)"; return 1; }
  grep -q "^nccl: not loadable" "$WORK/env.txt" && { echo "NCCL does not load (see above)"; return 1; }
  return 0
}

cache_filled() { # the first CUDA run left compiled kernels for the next processes
  local files
  files=$(find "$KILN_CACHE_DIR" -type f 2>/dev/null | wc -l)
  echo "kernel cache $KILN_CACHE_DIR: $files files"
  [ "$files" -gt 0 ]
}

outlier_run() { # run dir, extra --set args...: the f16 loss-scaling experiment of
  # tests/it/precision.rs (blobs.csv with one far outlier, in step 4 of 7; checkpoints at 3, 6)
  local dir=$1; shift
  python3 - "$WORK" <<'PY' || return 1
import os, sys
work = sys.argv[1]
rows = open("experiments/data/blobs.csv").read().splitlines()
rows[1 + 50] = "3000,-3000,3000,-3000,1"
open(os.path.join(work, "outlier.csv"), "w").write("\n".join(rows) + "\n")
open(os.path.join(work, "f16.toml"), "w").write(f"""extends = ["{os.path.abspath('templates/csv.toml')}"]
[data]
path = "outlier.csv"
[sampler]
shuffle = false
[train]
max_steps = 7
log_every = 1
batch_size = 16
[backend]
precision = "f16"
[backend.loss_scale]
growth_interval = 3
[checkpoint]
every_steps = 3
keep_last = 5
""")
PY
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  "$KILN" run "$WORK/f16.toml" --quiet --run-dir "$WORK/$dir" "${args[@]}"
}

scales_as_torch() { # dir: step 4 skipped at 2^17, the scale backed off to 2^16 and grown after
  # every 3 good steps, as on the CPU (tests/it/precision.rs)
  python3 - "$WORK/$1/metrics.jsonl" <<'PY'
import json, sys
got = [(l["loss_scale"], l.get("skipped", False)) for l in map(json.loads, open(sys.argv[1]))]
want = [(65536.0, False)] * 3 + [(131072.0, True)] + [(65536.0, False)] * 3
print("loss scale, skipped per step:", got)
sys.exit(0 if got == want else 1)
PY
}

same_run() { # dir a, dir b: the same losses, scales and final parameters, bit for bit
  python3 - "$WORK/$1" "$WORK/$2" <<'PY'
import json, sys
def lines(d):
    by = {}
    for l in map(json.loads, open(d + "/metrics.jsonl")):
        by[l["step"]] = (l["loss"], l.get("loss_scale"), l.get("skipped", False))
    return by, json.load(open(d + "/summary.json"))["params_sha256"]
a, b = lines(sys.argv[1]), lines(sys.argv[2])
print("steps", sorted(a[0]), "sha", a[1][:12], b[1][:12])
sys.exit(0 if a == b else 1)
PY
}

two_gpu_overlap() { # NCCL's own stream beside the compute: ddp(2) and fsdp(2) by layer over two
  # GPUs give the losses of the same runs without overlap, and their communication ran
  if [ "$(nvidia-smi -L | grep -c '^GPU ')" -lt 2 ]; then
    echo "SKIP: one GPU here; NCCL refuses two ranks on one GPU (needs 2 GPUs)"
    return 0
  fi
  local kind
  for kind in ddp fsdp; do
    for o in true false; do
      run "cuda-$kind-2-overlap-$o" backend.device=cuda strategy.kind=$kind strategy.devices=2 strategy.unit=layer strategy.collective=nccl strategy.overlap=$o train.batch_size=16 || return 1
    done
    compare_losses "cuda-$kind-2-overlap-true" "cuda-$kind-2-overlap-false" 1e-6 || return 1
    python3 - "$WORK/cuda-$kind-2-overlap-true/summary.json" <<'PY' || return 1
import json, sys
c = json.load(open(sys.argv[1]))["time"]["mean"]["comm"]
print("communication per rank (s):", c)
# the all-reduces and gathers ran on NCCL's stream, device-timed (how much the compute waited
# for, `exposed_s`, depends on the model: printed, not checked)
sys.exit(0 if c["total_s"] > 0 else 1)
PY
  done
}

refused_with_message() { # the nccl placement of two ranks on one GPU is refused, and says why
  local out
  out=$("$KILN" check "$Q" --set backend.device=cuda --set strategy.kind=ddp --set "strategy.devices=[0, 0]" --set strategy.collective=nccl 2>&1)
  local rc=$?
  echo "$out"
  [ "$rc" = 2 ] && grep -q "puts two ranks on one GPU, which NCCL refuses" <<<"$out"
}

diverges_on_the_device() { # a NaN gradient on the GPU (device buffers, NCCL) stops the run
  local out
  out=$(run cuda-diverge backend.device=cuda strategy.kind=ddp strategy.devices=1 strategy.collective=nccl optim.lr=1e30 2>&1)
  local rc=$?
  echo "$out"
  [ "$rc" = 1 ] && grep -q "training diverged at step" <<<"$out"
}

throughput() {
  local BIG=(--set model.input_size=1024 --set data.features=1024 --set "model.hidden_sizes=[4096,4096,4096,4096]" --set data.samples=8192 --set train.batch_size=512 --set backend.device=cuda)
  "$KILN" bench "$Q" --steps 50 --repeats 3 "${BIG[@]}"
  python3 - <<'PY'
import time
try:
    import torch, torch.nn as nn
except ImportError:
    print("pytorch: not installed, skipped"); raise SystemExit(0)
if not torch.cuda.is_available():
    print("pytorch: no CUDA, skipped"); raise SystemExit(0)
sizes = [1024, 4096, 4096, 4096, 4096, 10]
layers = []
for i in range(len(sizes) - 1):
    layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append(nn.ReLU())
m = nn.Sequential(*layers).to("cuda")
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(512, 1024, device="cuda"); y = torch.randint(0, 10, (512,), device="cuda")
loss_fn = nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); loss_fn(m(x), y).backward(); opt.step()
for _ in range(10): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(50): step()
torch.cuda.synchronize(); dt = time.perf_counter() - t
print(f"pytorch {torch.__version__} eager: {50 / dt:.1f} steps/s, {50 * 512 / dt:.0f} samples/s")
PY
}

export KILN WORK Q
export -f run docs_run docs_cpu_and_compare lora_cpu_and_compare archs_cuda_and_cpu compare_losses stays_on_device preflight cache_filled refused_with_message diverges_on_the_device throughput outlier_run scales_as_torch same_run two_gpu_overlap
if [ "$DRY" = 0 ]; then
  [ -x "$KILN" ] || { echo "no kiln binary at $KILN (see the top of this script)"; exit 2; }
  echo "work dir: $WORK"
fi
step 16 "preflight: driver, GPU, toolkit, NVRTC, NCCL (kiln env)" preflight
if [ "$DRY" = 0 ] && [ "$fail" -gt 0 ]; then
  echo "preflight failed: stopping here (the reason is above)"
  exit 1
fi
step 90 "quickstart single on CUDA (compiles the kernels)" run cuda-single backend.device=cuda
step 5 "the kernel cache holds the compiled kernels" cache_filled
step 15 "quickstart single on CPU" run cpu-single
step 5 "CUDA vs CPU losses (rel 1e-3)" compare_losses cuda-single cpu-single 1e-3
step 5 "single on CUDA: parameters, gradients, optimizer stay on the device (counted)" stays_on_device cuda-single
step 30 "single on CUDA with strategy.offload=cpu" run cuda-offload backend.device=cuda strategy.offload=cpu
step 5 "offload == device-resident (rel 1e-5)" compare_losses cuda-offload cuda-single 1e-5
step 30 "ddp world 1 over NCCL" run cuda-ddp1 backend.device=cuda strategy.kind=ddp strategy.devices=1 strategy.collective=nccl
step 5 "ddp world 1 over NCCL: nothing but the first copy crossed (counted)" stays_on_device cuda-ddp1
step 5 "ddp(1) over NCCL == single on CUDA (rel 1e-5)" compare_losses cuda-ddp1 cuda-single 1e-5
step 30 "fsdp world 1 over NCCL (device all-gather and reduce-scatter)" run cuda-fsdp1 backend.device=cuda strategy.kind=fsdp strategy.devices=1 strategy.collective=nccl strategy.unit=layer
step 5 "fsdp(1) over NCCL == single on CUDA (rel 1e-5)" compare_losses cuda-fsdp1 cuda-single 1e-5
step 5 "fsdp(1): shards, gradient shards, optimizer on the device (counted)" stays_on_device cuda-fsdp1
step 30 "bf16 with f32 masters, ddp world 1 over NCCL" run cuda-bf16-ddp1 backend.device=cuda backend.precision=bf16 strategy.kind=ddp strategy.devices=1 strategy.collective=nccl
step 5 "bf16 == f32 on CUDA (rel 2e-2)" compare_losses cuda-bf16-ddp1 cuda-ddp1 2e-2
step 5 "bf16: f32 masters and optimizer state stay on the device (counted)" stays_on_device cuda-bf16-ddp1
step 35 "f16 with loss scaling on CUDA: an overflowing step" outlier_run cuda-f16 backend.device=cuda
step 5 "f16: exactly step 4 skipped, the scale backed off and grown as torch's GradScaler" scales_as_torch cuda-f16
step 25 "f16: resume from step 3, before the skip" bash -c "rm -rf '$WORK/cuda-f16-resumed' && cp -r '$WORK/cuda-f16' '$WORK/cuda-f16-resumed' && '$KILN' resume '$WORK/cuda-f16-resumed' --from step-00000003 --quiet"
step 5 "f16 resumed == uninterrupted (bits, loss scales)" same_run cuda-f16 cuda-f16-resumed
step 35 "ddp 2 ranks on one GPU, host collective" run cuda-ddp2 backend.device=cuda strategy.kind=ddp strategy.devices=2 strategy.collective=host train.batch_size=16
step 5 "ddp(2) == single(32) on CUDA (rel 1e-3)" compare_losses cuda-ddp2 cuda-single 1e-3
step 6 "two ranks on one GPU with nccl is refused, saying why" refused_with_message
step 22 "a NaN gradient on the device stops the run as diverged" diverges_on_the_device
step 15 "packed llama on CUDA (jsonl documents, document attention)" docs_run cuda-docs backend.device=cuda
step 4 "packed llama on CPU, losses vs CUDA (rel 1e-3)" docs_cpu_and_compare
step 10 "LoRA llama on CUDA (adapters on every projection, the base frozen)" docs_run cuda-lora backend.device=cuda model.lora.rank=4 'model.lora.targets=["all-linear"]'
step 4 "LoRA on CPU: losses vs CUDA (rel 1e-3), only the adapters train" lora_cpu_and_compare
step 20 "Gemma 3 (sliding window) and Mixtral (routed experts) on CUDA and CPU: losses (rel 1e-3)" archs_cuda_and_cpu
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')
step "$([ "$gpus" -ge 2 ] && echo 120 || echo 5)" "overlap on NCCL's own stream (2 GPUs: ddp/fsdp(2) == overlap off; else SKIP)" two_gpu_overlap
step 52 "throughput: MLP 1024 -> 4096 x 4 -> 10, batch 512, SGD; kiln vs PyTorch" throughput

if [ "$DRY" = 1 ]; then
  echo "$n steps; timeouts add up to ${total}s"
  exit 0
fi
echo
echo "=== $pass passed, $fail failed; results in $WORK"
grep -h "samples" "$WORK"/step-*.log 2>/dev/null | tail -3
[ "$fail" -eq 0 ]
