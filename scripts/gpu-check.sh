#!/usr/bin/env bash
# kiln's GPU check. Builds nothing: it runs a kiln binary built elsewhere with the `cuda` feature
# on a machine with an NVIDIA GPU, and prints a summary. Well under 10 minutes on one H200.
#
# Carry the binary (the GPU machine needs no Rust toolchain):
#   cargo build --release --features cuda
#   mkdir -p .carry && cp target/release/kiln .carry/      # .carry/ is git-ignored
#   # on the GPU machine, in the repository root:
#   bash scripts/gpu-check.sh                             # or KILN=/path/to/kiln bash scripts/gpu-check.sh
#
# NCCL: kiln finds the pip wheel's nvidia/nccl/lib/libnccl.so.2 by itself (see `kiln env`);
# KILN_NCCL_LIBRARY=/path/to/libnccl.so.2 overrides the search.
set -uo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-./.carry/kiln}
WORK=${WORK:-$(mktemp -d /tmp/kiln-gpu-check.XXXX)}
Q=experiments/quickstart.toml
results=()
pass=0
fail=0

step() { # name, command...
  local name=$1; shift
  echo "=== $name"
  local t0=$(date +%s.%N)
  if "$@"; then
    results+=("PASS  $name ($(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?')s)"); pass=$((pass+1))
  else
    results+=("FAIL  $name"); fail=$((fail+1))
  fi
}

run() { # run-dir name, extra --set args...
  local dir=$1; shift
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  "$KILN" run "$Q" --quiet --run-dir "$WORK/$dir" --set train.max_steps=30 --set train.log_every=1 "${args[@]}"
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

[ -x "$KILN" ] || { echo "no kiln binary at $KILN (see the top of this script)"; exit 2; }
step "kiln env" "$KILN" env
step "quickstart single on CUDA" run cuda-single backend.device=cuda
step "quickstart single on CPU" run cpu-single
step "CUDA vs CPU losses (rel 1e-3)" compare_losses cuda-single cpu-single 1e-3
step "ddp world 1 over NCCL" run cuda-ddp1 backend.device=cuda strategy.kind=ddp strategy.devices=1 strategy.collective=nccl
step "ddp world 1: NCCL ran on the device gradient buffers" grep -q "gradients: accumulated and reduced on the device" "$WORK/cuda-ddp1/logs/rank-0.log"
step "ddp(1) over NCCL == single on CUDA (rel 1e-5)" compare_losses cuda-ddp1 cuda-single 1e-5
step "fsdp world 1 over NCCL (device all-gather and reduce-scatter)" run cuda-fsdp1 backend.device=cuda strategy.kind=fsdp strategy.devices=1 strategy.collective=nccl strategy.unit=layer
step "fsdp(1) over NCCL == single on CUDA (rel 1e-5)" compare_losses cuda-fsdp1 cuda-single 1e-5
step "bf16 ddp world 1 over NCCL" run cuda-bf16-ddp1 backend.device=cuda backend.precision=bf16 strategy.kind=ddp strategy.devices=1 strategy.collective=nccl
step "single on CUDA keeps parameters and optimizer on the device" grep -q "parameters and optimizer state: on the device" "$WORK/cuda-single/logs/rank-0.log"
step "CUDA checkpoint at step 15 of 30" run cuda-ckpt backend.device=cuda optim.kind=adamw checkpoint.every_steps=15
step "CUDA resume from step 15 repeats steps 16-30 (rel 1e-5)" bash -c "cp -r '$WORK/cuda-ckpt' '$WORK/cuda-resumed' && '$KILN' resume '$WORK/cuda-resumed' --from step-00000015 --quiet"
step "resumed losses == uninterrupted losses" compare_losses cuda-ckpt cuda-resumed 1e-5
step "dp 2 ranks on one GPU, host collective" run cuda-dp2 backend.device=cuda strategy.kind=dp strategy.devices=2 strategy.collective=host train.batch_size=16
step "ddp 2 ranks on one GPU, host collective" run cuda-ddp2 backend.device=cuda strategy.kind=ddp strategy.devices=2 strategy.collective=host train.batch_size=16
step "fsdp 2 ranks on one GPU, host-staged" run cuda-fsdp2 backend.device=cuda strategy.kind=fsdp strategy.devices=2 strategy.collective=host train.batch_size=16
step "dp(2) == single(32) on CUDA (rel 1e-3)" compare_losses cuda-dp2 cuda-single 1e-3
step "ddp(2) == single(32) on CUDA (rel 1e-3)" compare_losses cuda-ddp2 cuda-single 1e-3
step "fsdp(2) == single(32) on CUDA (rel 1e-3)" compare_losses cuda-fsdp2 cuda-single 1e-3
step "bf16 single on CUDA" run cuda-bf16 backend.device=cuda backend.precision=bf16
step "two ranks on one GPU with nccl is refused" bash -c "! '$KILN' check $Q --set backend.device=cuda --set strategy.kind=ddp --set strategy.devices=2 --set strategy.collective=nccl"

echo "=== throughput: MLP 1024 -> 4096 x 4 -> 10, batch 512, SGD"
BIG=(--set model.input_size=1024 --set data.features=1024 --set "model.hidden_sizes=[4096,4096,4096,4096]" --set data.samples=8192 --set train.batch_size=512 --set backend.device=cuda)
"$KILN" bench "$Q" --steps 50 --repeats 3 "${BIG[@]}" | tee "$WORK/kiln-bench.txt"
python3 - <<'PY' | tee "$WORK/torch-bench.txt"
import time
try:
    import torch, torch.nn as nn
except ImportError:
    print("pytorch: not installed, skipped"); raise SystemExit(0)
if not torch.cuda.is_available():
    print("pytorch: no CUDA, skipped"); raise SystemExit(0)
dev = "cuda"
sizes = [1024, 4096, 4096, 4096, 4096, 10]
layers = []
for i in range(len(sizes) - 1):
    layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append(nn.ReLU())
m = nn.Sequential(*layers).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(512, 1024, device=dev); y = torch.randint(0, 10, (512,), device=dev)
loss_fn = nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); loss_fn(m(x), y).backward(); opt.step()
for _ in range(10): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(50): step()
torch.cuda.synchronize(); dt = time.perf_counter() - t
print(f"pytorch {torch.__version__} eager: {50 / dt:.1f} steps/s, {50 * 512 / dt:.0f} samples/s")
PY

echo
echo "=== summary ($pass passed, $fail failed; work dir $WORK)"
printf '%s\n' "${results[@]}"
grep -h "samples" "$WORK/kiln-bench.txt" "$WORK/torch-bench.txt" 2>/dev/null | tail -3
[ "$fail" -eq 0 ]
