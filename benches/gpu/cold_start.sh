#!/usr/bin/env bash
# One device call on one H200 (the first-hour table's first row, the multi-node tools on a GPU): time to the
# first step of ResNet-50 bf16 b256 channels-last, fresh and with burn-ddp's kernel caches,
# and where it goes; device memory beside PyTorch's, in the same call; `--profile-steps` and
# `burn-ddp doctor` on the GPU machine.
#   cold      empty cache directory (a fresh machine: nothing compiled, nothing tuned)
#   warm      the same directory again (the second run on a machine)
#   minimal   a fresh directory with CUBECL_AUTOTUNE_LEVEL=minimal (how much of cold is autotune)
# Binaries: carry/bins.txz with burn-vision and burn-ddp (release, --features cuda).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/cold-start.log; SHOW="RESULT|first_step|^(pass|WARN|FAIL|info)|trace|rror|panick"; SHOW_LINES=12
B=${B:-carry}
rm -f "$B"/cubecl-cache.tgz "$B"/kernel-cache.tgz   # nothing from earlier calls: cold runs start empty
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp
rm -rf target/autotune /tmp/kc-*
BENCH=("$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --precision bf16 --warmup 3 --steps 20)
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee -a "$LOG"
step doctor 60 "$B"/burn-ddp doctor --nproc-per-node 1 --all-reduce-mib 64
step ours_cold 240 env BURN_DDP_CACHE_DIR=/tmp/kc-a "${BENCH[@]}"
step ours_warm 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "${BENCH[@]}"
step ours_warm2 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "${BENCH[@]}"
step ours_minimal_cold 240 env BURN_DDP_CACHE_DIR=/tmp/kc-b CUBECL_AUTOTUNE_LEVEL=minimal "${BENCH[@]}"
step torch_eager_1 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
step torch_eager_2 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
du -sh /tmp/kc-a /tmp/kc-a/* 2>/dev/null | tee -a "$LOG"
# A trace of three steps on the GPU (the bundled images, a small ResNet; warm caches).
step trace 180 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$B"/burn-vision train --gpus 0 --epochs 1 --max-steps-per-epoch 12 --profile-steps 8..11 --quiet --out /tmp/run-trace
cp /tmp/run-trace/trace.json "$OUT"/trace-gpu.json 2>/dev/null
python3 - "$OUT"/trace-gpu.json <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys, collections
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
per = collections.defaultdict(list)
for e in ev:
    per[e["name"].split(" ")[0] if e["name"].startswith("step") else e["name"]].append(e["dur"] / 1e3)
print("trace spans:", {k: f"{len(v)} x {sum(v) / len(v):.2f} ms" for k, v in per.items()})
EOF
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/cold_start_summary.py "$LOG" | tee -a "$LOG"
# The warm caches for later calls (carry/kernel-cache.tgz).
BURN_DDP_CACHE_DIR=/tmp/kc-a save_cache
