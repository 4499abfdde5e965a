#!/usr/bin/env bash
# What running cuDNN, cuBLAS and burn-ddp's kernels on burn's own CUDA stream buys
# (`BURN_DDP_SAME_STREAM=1`, the default since 2026-12-05: no fence kernels; the stream found
# through CUPTI) against burn-ddp's stream behind four fence kernels per call
# (`BURN_DDP_SAME_STREAM=0`), in one device call on one H200:
#   1. `burn-ddp-gpu-checks burn-stream same-stream attention sgd adamw products patch-embed`
#      (NO_CHECKS=1 leaves them out): the stream found and ordered, a small model trained
#      either way, and the checks changed alongside (attention on the projections' shapes; the
#      optimizers on the same gradients; ViT's patch embedding as one product, on by default);
#   2. per model of MODELS (default `r50 vitb16`): ResNet-50 bf16 b256 channels-last, ViT-B/16
#      bf16 b128, synthetic 224², SGD — same stream and fenced alternated twice after one warm
#      run each, beside PyTorch 2.11 torch.compile (NO_TORCH=1 leaves it out; eager with
#      EAGER=1), the same batch, optimizer and step count.
# libcupti: benches/gpu/env.sh puts the folder of PyTorch's `nvidia-cuda-cupti` wheel on the
# library path (BURN_DDP_CUPTI names another). Binaries: carry/bins.txz (burn-vision,
# burn-ddp-gpu-checks; release, CUDA). Raw log $OUT/same_stream.log; the ratios last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/same_stream.log; SHOW="RESULT|img_per_s|rror|panick|FAIL|burn's own stream|fences"; SHOW_LINES=${SHOW_LINES:-4}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
[ -n "${NO_CHECKS:-}" ] || step checks 300 "$B"/burn-ddp-gpu-checks burn-stream same-stream attention sgd adamw products patch-embed
for model in ${MODELS:-r50 vitb16}; do
  if [ $model = r50 ]; then ARGS=("${R50[@]}"); TORCH="resnet50 256 224 3 1000 0 5 $STEPS bf16 nhwc"
  else ARGS=("${VB[@]}"); TORCH="vit_b_16 128 224 3 1000 0 5 $STEPS bf16 nchw"; fi
  for v in same fenced; do step ${model}_warm_$v 300 env BURN_DDP_SAME_STREAM=$([ $v = same ] && echo 1 || echo 0) "$B"/burn-vision "${ARGS[@]}"; done
  for i in 1 2; do
    step ${model}_same_$i 150 env BURN_DDP_SAME_STREAM=1 "$B"/burn-vision "${ARGS[@]}"
    step ${model}_fenced_$i 150 env BURN_DDP_SAME_STREAM=0 "$B"/burn-vision "${ARGS[@]}"
  done
  [ -z "${EAGER:-}" ] || step ${model}_torch 150 python3 benches/pytorch_baseline.py synthetic $TORCH eager
  [ -n "${NO_TORCH:-}" ] || step ${model}_compile 300 python3 benches/pytorch_baseline.py synthetic $TORCH compile
done
save_cache
echo; echo SUMMARY | tee -a "$LOG"
python3 benches/gpu/same_stream_summary.py "$LOG" | tee -a "$LOG"
