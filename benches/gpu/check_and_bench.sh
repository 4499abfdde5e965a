#!/usr/bin/env bash
# Every GPU check, then ResNet-50 and ViT-B/16 training speed beside PyTorch eager — what a
# change that moves code (no new computation) must leave as it was.
#   PART=1  every `burn-ddp-gpu-checks --skip nccl` (convolutions, batch norms, uploads, cuBLAS, attention,
#           layer norm, accumulation; every cuDNN/cuBLAS call ordered on the device), and
#           `burn-ddp-gpu-checks nccl` (DDP over a one-rank NCCL group against plain training)
#   PART=2  ResNet-50 bf16 b256 and ViT-B/16 bf16 b128, `burn-vision bench` and
#           `benches/pytorch_baseline.py ... eager`, alternated twice (SGD on both sides)
# Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/check_and_bench${PART:-1}.log; SHOW="RESULT cud|RESULT cuDNN|img_per_s|FAIL|rror|panick"; SHOW_LINES=${SHOW_LINES:-6}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/burn-ddp-gpu-checks
BIN=$(realpath "$B"/burn-vision)
R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
V="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
if [ "${PART:-1}" = 1 ]; then
  step check 420 "$B"/burn-ddp-gpu-checks --skip nccl
  SHOW="RESULT|FAIL|rror|panick" step check_nccl 150 "$B"/burn-ddp-gpu-checks nccl
  grep -h "^RESULT check" "$LOG" | grep -c " ok$" | sed 's/^/checks ok: /' | tee -a "$LOG"
  grep -h "^RESULT check" "$LOG" | grep -v " ok$" | grep -v " info$" | sed 's/^/not ok: /' | tee -a "$LOG"
else
  for i in 1 2; do
    step "r50_ours_$i" 150 "$BIN" bench $R
    step "r50_torch_$i" 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
    step "vitb_ours_$i" 150 "$BIN" bench $V
    step "vitb_torch_$i" 120 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 30 bf16 nchw eager
  done
fi
save_cache
