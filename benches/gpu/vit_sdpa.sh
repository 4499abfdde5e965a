#!/usr/bin/env bash
# One device call on one H200 (2026-12-02): cuDNN's fused attention. burn-ddp-gpu-checks's checks (the
# fused attention forward and backward against f64 in bf16/f16 at 197, 50 and 65 tokens, beside
# the cuDNN and cuBLAS checks), the attention op alone at ViT-B/16's shape against PyTorch's
# scaled_dot_product_attention, then ViT-B/16 b128 bf16 training with the fused attention
# (default) and without (BURN_DDP_SDPA=0) against torchvision's vit_b_16 eager, all in one call.
# PART=2: ViT-S/16 b256 against timm eager, a ViT trained from the CLI on the GPU with mixup,
# cutmix and stochastic depth at another image size than it was built for (fixed 2026-12-01),
# and an Nsight Compute profile of two ViT-B/16 steps. PART=3: the layer norm on cuDNN (below).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/vit_sdpa${PART:-1}.log; SHOW="RESULT|img_per_s|peak|rror|panick|FAIL|NCU|attention"; SHOW_LINES=${SHOW_LINES:-16}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
BB="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
# Where a ViT-B/16 step's device time goes: every kernel of a warm-up step and a timed step.
ncu_vitb16() {
  step vitb16_ncu_run 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
    --log-file "$OUT/ncu_vitb16.csv" "$B"/burn-vision bench $(echo $BB | sed 's/--warmup 3 --steps 20/--warmup 1 --steps 1/')
  SHOW_LINES=40 step vitb16_ncu 30 python3 benches/gpu/ncu_summary.py "$OUT/ncu_vitb16.csv" 40 burn-vitb16-2steps
  xz -9 "$OUT/ncu_vitb16.csv"
}
if [ "${PART:-1}" = 4 ]; then
  # What the cuDNN layer norm alone gains (PART=3's BURN_DDP_CUDNN_LN=0 run was not honoured:
  # the variable was missing from the parser), and ResNet-50 after the graph plumbing moved.
  R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
  step vitb16_ln 120 "$B"/burn-vision bench $BB
  step vitb16_burn_ln 120 env BURN_DDP_CUDNN_LN=0 "$B"/burn-vision bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step r50_ours 120 "$B"/burn-vision bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
elif [ "${PART:-1}" = 3 ]; then
  # The layer norm on cuDNN too: its check beside the attention's, ViT-B/16 and ViT-S/16 with
  # both (default) and with burn's f32 layer norm (BURN_DDP_CUDNN_LN=0), PyTorch eager and
  # torch.compile beside them, and where the ViT-B/16 step's time goes now.
  SHOW_LINES=20 step check_transformer 200 "$B"/burn-ddp-gpu-checks attention layer-norm
  step vitb16_ln 120 "$B"/burn-vision bench $BB
  step vitb16_burn_ln 120 env BURN_DDP_CUDNN_LN=0 "$B"/burn-vision bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step vits16_ln 120 "$B"/burn-vision bench $S
  step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
  ncu_vitb16
  step vitb16_compile 200 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 6 20 bf16 nchw compile
elif [ "${PART:-1}" = 1 ]; then
  SHOW_LINES=24 step check 400 "$B"/burn-ddp-gpu-checks --skip nccl
  step bench_sdpa 90 "$B"/burn-ddp-gpu-checks --bench attention --iters 20
  step torch_sdpa 90 python3 benches/pytorch_sdpa.py 20
  step vitb16_fused 150 "$B"/burn-vision bench $BB
  step vitb16_unfused 120 env BURN_DDP_SDPA=0 "$B"/burn-vision bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
else
  step check_transformer 200 "$B"/burn-ddp-gpu-checks attention layer-norm
  step vits16_ours 200 "$B"/burn-vision bench $S
  step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
  rm -rf /tmp/vit-gpu-run
  step vit_cli_gpu 150 "$B"/burn-vision train --gpus 0 --model vit-mini --precision bf16 --epochs 1 --mixup 0.8 --cutmix 1.0 --drop-path 0.1 --out /tmp/vit-gpu-run
  ncu_vitb16
fi
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/cold_start_summary.py "$LOG" | tee -a "$LOG"
save_cache
