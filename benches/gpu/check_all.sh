#!/usr/bin/env bash
# One device call: every burn-ddp-gpu-checks --skip nccl at once (convolutions, batch norms, uploads, cuBLAS,
# fused attention, layer norm — and that every cuDNN/cuBLAS call was ordered on the device),
# with time enough for all of them; then the ViT recipe's RandAugment on the GPU: vit-mini
# trained one epoch with --randaugment 2,9 in bf16.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/check_all.log; SHOW="RESULT cud|FAIL|rror|panick|done:|epoch 1/"; SHOW_LINES=8
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
step check 420 "$B"/burn-ddp-gpu-checks --skip nccl
rm -rf /tmp/vit-ra
step vit_randaugment 120 "$B"/burn-vision train --gpus 0 --model vit-mini --precision bf16 --epochs 1 --randaugment 2,9 --out /tmp/vit-ra
grep -h "^RESULT check" "$LOG" | grep -c " ok$" | sed 's/^/checks ok: /' | tee -a "$LOG"
grep -h "^RESULT check" "$LOG" | grep -v " ok$" | tee -a "$LOG"
save_cache
