#!/usr/bin/env bash
# One device call on one H200 (the ViT table's first rows): ViT-S/16 (b256) and ViT-B/16
# (b128), 224², bf16, synthetic data, SGD as for the ResNets — burn-vision (attention on burn's
# matmul + softmax + matmul: no fused kernel yet) against timm's vit_small_patch16_224 and
# torchvision's vit_b_16 (both on scaled_dot_product_attention), eager and torch.compile.
# burn-vision runs twice per model: the first fills the kernel caches (its first step is the
# cold start), the second is the steady measurement with warm caches.
# Binaries: carry/bins.txz (burn-vision, release, --features cuda); carry/kernel-cache.tgz
# from benches/gpu/cold_start.sh when present.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/vit.log; SHOW="RESULT|img_per_s|rror|panick"; SHOW_LINES=4
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision
S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
BB="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
step vits16_ours_first 240 "$B"/burn-vision bench $S
step vits16_ours 120 "$B"/burn-vision bench $S
step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
step vits16_compile 200 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 6 20 bf16 nchw compile
step vitb16_ours_first 240 "$B"/burn-vision bench $BB
step vitb16_ours 120 "$B"/burn-vision bench $BB
step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/cold_start_summary.py "$LOG" | tee -a "$LOG"
save_cache
