#!/usr/bin/env bash
# Where a fresh machine's first step goes (the cold-start row of the first-hour table): ResNet-50 bf16 b256
# channels-last, `bench`, each run from an empty kernel cache unless it says `warm`.
#   profile   `--host-profile-first-step`: every host thread sampled over the first step
#             (cubecl's kernel compilation, NVRTC, autotuning, cuDNN's engine timing)
#   kernels   `BURN_DDP_KERNEL_LOG`: every kernel compiled (name, CUDA source) and every
#             autotune result, summarised by benches/gpu/kernel_log_summary.py
#   warm      the profile run's cache again (the second run on a machine)
#   clean     (CLEAN=1) two more runs from empty caches with nothing logged or sampled (the
#             figure), PyTorch eager's first run twice beside them, then the steady step with
#             warm caches against PyTorch eager (50 steps), and `burn-ddp-gpu-checks cross-entropy mean-over`
#   vit       (VIT=1) ViT-B/16 bf16 b128 fresh and again, PyTorch's vit_b_16 beside, then
#             ResNet-50's steady step against torch.compile (first steps included)
#   tutorial  (TUTORIAL=1) the tutorial's job (ResNet-34 f32 b16, 1 epoch on the fm224 JPEG
#             folder) from an empty cache with the kernel log, and PyTorch's beside it
# Binaries: carry/bins.txz (burn-vision built with --features host-profile).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/first-step.log; SHOW="first_step|img_per_s|rror|panick|host profile"; SHOW_LINES=4
B=${B:-carry}
rm -f "$B"/kernel-cache.tgz "$B"/cubecl-cache.tgz   # cold runs start empty
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp 2>/dev/null
nproc | sed 's/^/host cores: /' | tee -a "$LOG"
BENCH=("$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --precision bf16 --warmup 2 --steps 10)
rm -rf /tmp/kc-*
step profile 300 env BURN_DDP_CACHE_DIR=/tmp/kc-p "${BENCH[@]}" --host-profile "$OUT"/first-step-profile --host-profile-first-step
step kernels 300 env BURN_DDP_CACHE_DIR=/tmp/kc-k BURN_DDP_KERNEL_LOG="$OUT"/kernels.log "${BENCH[@]}"
step warm 120 env BURN_DDP_CACHE_DIR=/tmp/kc-p "${BENCH[@]}"
if [ "${CLEAN:-0}" = 1 ]; then
  step check_ce 120 "$B"/burn-ddp-gpu-checks cross-entropy mean-over
  for i in 1 2; do
    step clean_$i 300 env BURN_DDP_CACHE_DIR=/tmp/kc-c$i "${BENCH[@]}"
    step torch_first_$i 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
  done
  STEADY=("$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --precision bf16 --warmup 5 --steps 50)
  for i in 1 2; do
    step steady_ours_$i 120 env BURN_DDP_CACHE_DIR=/tmp/kc-c1 "${STEADY[@]}"
    step steady_torch_$i 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 50 bf16 nhwc eager
  done
fi
if [ "${VIT:-0}" = 1 ]; then
  VB=("$B"/burn-vision bench --gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20)
  step vitb16_fresh 300 env BURN_DDP_CACHE_DIR=/tmp/kc-v BURN_DDP_KERNEL_LOG="$OUT"/kernels-vit.log "${VB[@]}"
  step vitb16_second 120 env BURN_DDP_CACHE_DIR=/tmp/kc-v "${VB[@]}"
  step vitb16_torch 120 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step r50_ours 120 env BURN_DDP_CACHE_DIR=/tmp/kc-p "$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --precision bf16 --warmup 5 --steps 50
  step r50_compile 400 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 8 50 bf16 nhwc compile
fi
if [ "${TUTORIAL:-0}" = 1 ]; then
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  rm -rf /tmp/tut-k
  step tutorial_cold 300 env BURN_DDP_CACHE_DIR=/tmp/kc-t BURN_DDP_KERNEL_LOG="$OUT"/kernels-tutorial.log "$B"/burn-vision train --data /tmp/fm224 --preset tutorial --epochs 1 --gpus 0 --quiet --out /tmp/tut-k
  sed 's/^/METRICS /' /tmp/tut-k/metrics.jsonl >>"$LOG" 2>/dev/null
  step tutorial_torch 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 1 f32 nhwc 16
fi
du -sh /tmp/kc-p/* 2>/dev/null | tee -a "$LOG"
echo "=== summary" | tee -a "$LOG"
grep -h '"first_step"' "$LOG" | grep -v '^=== ' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line[line.index("{"):])
    f = r.get("first_step")
    if r.get("framework") == "pytorch":
        print("pytorch: first step %s; steady %.0f img/s, device %.2f GiB" % (json.dumps(r["first_step"]), r["img_per_s"], r["device_used_gib"]))
        continue
    print("first step %.1f s (setup %.1f, step %.1f, cuDNN %.1f); steady %.0f img/s, device %.2f GiB" % (f["total_s"], f["setup_s"], f["step_s"], f["cudnn_s"], r["img_per_s"], r["device_used_gib"]))
' | tee -a "$LOG"
python3 benches/gpu/kernel_log_summary.py "$OUT"/kernels.log | tee -a "$LOG"
head -60 "$OUT"/first-step-profile/host-profile.txt 2>/dev/null | tee -a "$LOG"
[ -f "$OUT"/kernels-vit.log ] && python3 benches/gpu/kernel_log_summary.py "$OUT"/kernels-vit.log | head -8 | tee -a "$LOG"
[ -f "$OUT"/kernels-tutorial.log ] && python3 benches/gpu/kernel_log_summary.py "$OUT"/kernels-tutorial.log | tee -a "$LOG"
for f in "$OUT"/kernels*.log; do xz -9 "$f" 2>/dev/null || gzip -9 "$f"; done
