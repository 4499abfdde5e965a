#!/usr/bin/env bash
# One device call on one H200 (2026-12-01): matrix products on cuBLAS. burn-ddp-gpu-checks's checks
# (cuBLAS products and gradients against f64 beside the cuDNN ones), its bench-gemm (forward
# products at ViT-B/16 shapes, cuBLAS against burn's kernels), then ViT-B/16 b128 bf16 training
# with cuBLAS (default) and without (BURN_DDP_CUBLAS=0, burn's matmul kernels: the path
# before this change) in the same call, and torchvision's vit_b_16 eager beside them.
# PART=2 runs the second half: ViT-S/16 b256 against timm eager, ResNet-50 bf16 b256 (its f32
# head is the only product that moved) against PyTorch eager, ViT-B/16 torch.compile, and an
# Nsight Compute profile of two ViT-B/16 steps (kernel time by kernel).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/vit_cublas${PART:-1}.log; SHOW="RESULT|img_per_s|rror|panick|FAIL|NCU"; SHOW_LINES=${SHOW_LINES:-14}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
BB="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
if [ "${PART:-1}" = 1 ]; then
  step check 200 "$B"/burn-ddp-gpu-checks --skip nccl
  [ "${GEMM:-1}" = 1 ] && step bench_gemm 90 "$B"/burn-ddp-gpu-checks --bench products --iters 20
  step vitb16_cublas 150 "$B"/burn-vision bench $BB
  # burn's matmul kernels autotune every ViT product shape first: over 120 s on a fresh cache.
  [ -n "${BURN_MATMUL:-}" ] && step vitb16_burn_matmul 400 env BURN_DDP_CUBLAS=0 "$B"/burn-vision bench $BB
  step vitb16_cublas_again 90 "$B"/burn-vision bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step vits16_ours 240 "$B"/burn-vision bench $S
  step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
else
  step vits16_ours 240 "$B"/burn-vision bench $S
  step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
  step r50_ours 120 "$B"/burn-vision bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  step vitb16_compile 200 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 6 20 bf16 nchw compile
  # Where a ViT-B/16 step's device time goes now: every kernel of a warm-up step and a timed step.
  step vitb16_ncu_run 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
    --log-file "$OUT/ncu_vitb16.csv" "$B"/burn-vision bench $(echo $BB | sed 's/--warmup 3 --steps 20/--warmup 1 --steps 1/')
  SHOW_LINES=40 step vitb16_ncu 30 python3 benches/gpu/ncu_summary.py "$OUT/ncu_vitb16.csv" 40 burn-vitb16-2steps
  xz -9 "$OUT/ncu_vitb16.csv"
fi
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/cold_start_summary.py "$LOG" | tee -a "$LOG"
save_cache
