#!/usr/bin/env bash
# Where a fresh machine's first step goes (issue 17's cold-start row): ResNet-50 bf16 b256
# channels-last, `bench`, each run from an empty kernel cache unless it says `warm`.
#   profile   `--host-profile-first-step`: every host thread sampled over the first step
#             (cubecl's kernel compilation, NVRTC, autotuning, cuDNN's engine timing)
#   kernels   `BURN_DDP_KERNEL_LOG`: every kernel compiled (name, CUDA source) and every
#             autotune result, summarised by benches/gpu/kernel_log_summary.py
#   warm      the profile run's cache again (the second run on a machine)
# Binaries: carry/bins.txz (burn-vision built with --features host-profile).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/first-step.log; SHOW="first_step|img_per_s|rror|panick|host profile"; SHOW_LINES=4
B=${B:-carry}
rm -f "$B"/kernel-cache.tgz "$B"/cubecl-cache.tgz   # cold runs start empty
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv | tee -a "$LOG"
nproc | sed 's/^/host cores: /' | tee -a "$LOG"
BENCH=("$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --precision bf16 --warmup 2 --steps 10)
rm -rf /tmp/kc-*
step profile 300 env BURN_DDP_CACHE_DIR=/tmp/kc-p "${BENCH[@]}" --host-profile "$OUT"/first-step-profile --host-profile-first-step
step kernels 300 env BURN_DDP_CACHE_DIR=/tmp/kc-k BURN_DDP_KERNEL_LOG="$OUT"/kernels.log "${BENCH[@]}"
step warm 120 env BURN_DDP_CACHE_DIR=/tmp/kc-p "${BENCH[@]}"
du -sh /tmp/kc-p/* 2>/dev/null | tee -a "$LOG"
echo "=== summary" | tee -a "$LOG"
grep -h '"first_step"' "$LOG" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line[line.index("{"):])
    f = r["first_step"]
    print(f"first step {f[\"total_s\"]:.1f} s (setup {f[\"setup_s\"]:.1f}, step {f[\"step_s\"]:.1f}, cuDNN {f[\"cudnn_s\"]:.1f}); steady {r[\"img_per_s\"]:.0f} img/s")
' | tee -a "$LOG"
python3 benches/gpu/kernel_log_summary.py "$OUT"/kernels.log | tee -a "$LOG"
head -60 "$OUT"/first-step-profile/host-profile.txt 2>/dev/null | tee -a "$LOG"
xz -9 "$OUT"/kernels.log 2>/dev/null || gzip -9 "$OUT"/kernels.log
