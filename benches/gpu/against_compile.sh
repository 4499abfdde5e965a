#!/usr/bin/env bash
# One GPU's training speed against PyTorch 2.11 eager and torch.compile (default mode), every
# workload in one device call: synthetic 224² batches, bf16 autocast, the same batch, optimizer
# and step count on both sides (5 warm-up and $STEPS timed steps), cudnn.benchmark on,
# channels_last for ResNet.
#   PART=1 (default): first the checks the newest code needs (`linear-epilogue` with the
#     epilogue on and off, `layer-norm`, `nccl`); then, each after one warm run of ours and
#     alternated twice, ours beside eager and torch.compile: ResNet-50 b256 SGD, ViT-B/16 b128
#     SGD, ViT-B/16 b128 AdamW (ours FusedAdamW, PyTorch's fused=True), ViT-S/16 b256 AdamW
#     (timm's model on PyTorch's side; ours once more with BURN_DDP_LT_EPILOGUE=0).
#     WORKLOADS="r50 vits16_adamw" picks workloads; NO_CHECKS=1 leaves the checks out.
#   PART=2: the tutorial's job (`train --preset tutorial`, ResNet-34 b16 f32, EPOCHS epochs,
#     default 5, on the bundled images as a 224² JPEG folder), then PyTorch's same job scoring
#     the very images ours held out (its `validation.txt`) with 16 loader workers; then DDP's
#     cost inside one process on the defaults (`bench --ddp --ddp-interleave`: ResNet-18 28²
#     twice, ResNet-50 and ViT-B/16 once), the hand-over's parts timed. (Until 2026-12-05,
#     evening, these rows ran with BURN_DDP_DIRECT_FENCES=0: the flags, no longer the default.)
#   PART=4: PART=2's DDP rows alone.
#   PART=3: the GPU checks of every layer but the convolutions' and the decoders' (NCCL's,
#     SyncBatchNorm's and the same-stream path's among them), those three again with
#     BURN_DDP_DIRECT_FENCES=0 (collectives ordered by flags and fence kernels instead of CUDA
#     events), then PART=2's DDP rows each way (ddp_cost.sh PART=6 is the fuller comparison).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/against-compile-PART.log; the summary (benches/gpu/open_goals_summary.py) last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
P=${PART:-1}
LOG=$OUT/against-compile-$P.log; SHOW="img_per_s|RESULT check|rror|panick|^FAIL|passed"; SHOW_LINES=${SHOW_LINES:-3}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
BV="$B"/burn-vision
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$LOG"
# Ours and PyTorch's arguments per workload (pytorch_baseline.py synthetic MODEL BATCH SIZE
# CHANNELS CLASSES SMALL WARMUP STEPS PRECISION LAYOUT, then MODE and OPTIMIZER).
workload() {
  case $1 in
    r50) OURS=("${R50[@]}"); TORCH="resnet50 256 224 3 1000 0 5 $STEPS bf16 nhwc"; OPT=sgd ;;
    vitb16) OURS=("${VB[@]}"); TORCH="vit_b_16 128 224 3 1000 0 5 $STEPS bf16 nchw"; OPT=sgd ;;
    vitb16_adamw) OURS=("${VB[@]}" --optimizer adamw); TORCH="vit_b_16 128 224 3 1000 0 5 $STEPS bf16 nchw"; OPT=adamw ;;
    vits16_adamw) OURS=("${VS[@]}" --optimizer adamw); TORCH="timm:vit_small_patch16_224 256 224 3 1000 0 5 $STEPS bf16 nchw"; OPT=adamw ;;
  esac
}

# DDP over a one-rank NCCL group against plain steps, inside one process, the collectives
# ordered by CUDA events (the default); `ddp_rows flags` by flags and fence kernels
# (BURN_DDP_DIRECT_FENCES=0; the rows named `*_flags_*`).
ddp_rows() {
  local run=(env BURN_DDP_DIRECT_FENCES=$([ "${1:-}" = flags ] && echo 0 || echo 1) "$BV") tag=${1:+_$1}
  for i in 1 2; do step r18s${tag}_interleaved_$i 150 "${run[@]}" "${R18B[@]}" --ddp --ddp-interleave 25; done
  step r50${tag}_interleaved 150 "${run[@]}" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16${tag}_interleaved 150 "${run[@]}" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
}

if [ "$P" = 3 ]; then
  SHOW_LINES=60 step checks 300 "$B"/burn-ddp-gpu-checks same-stream nccl sgd adamw attention layer-norm relu bias-gelu \
    products patch-embed linear-epilogue cross-entropy mean-over max-pool cudnn-ordering conv-bn-relu bn-add-relu \
    batch-norm warp-fold sync-batch-norm
  SHOW_LINES=20 step checks_flags 200 env BURN_DDP_DIRECT_FENCES=0 "$B"/burn-ddp-gpu-checks same-stream nccl sync-batch-norm
  ddp_rows flags
  ddp_rows
elif [ "$P" = 4 ]; then
  ddp_rows
elif [ "$P" = 1 ]; then
  [ -n "${NO_CHECKS:-}" ] || SHOW_LINES=40 step checks 300 "$B"/burn-ddp-gpu-checks linear-epilogue layer-norm nccl
  for w in ${WORKLOADS:-r50 vitb16 vitb16_adamw vits16_adamw}; do
    workload $w
    step ${w}_warm 300 "$BV" "${OURS[@]}"
    for i in 1 2; do step ${w}_ours_$i 150 "$BV" "${OURS[@]}"; done
    [ $w = vits16_adamw ] && step ${w}_ours_no_epilogue 150 env BURN_DDP_LT_EPILOGUE=0 "$BV" "${OURS[@]}"
    step ${w}_eager 150 python3 benches/pytorch_baseline.py synthetic $TORCH eager $OPT
    step ${w}_compile 300 python3 benches/pytorch_baseline.py synthetic $TORCH compile $OPT
  done
else
  E=${EPOCHS:-5}
  fm224
  rm -rf /tmp/tut
  step tut_ours 300 python3 benches/cores_busy.py "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --out /tmp/tut
  sed "s/^/METRICS tut_ours /" /tmp/tut/metrics.jsonl >>"$LOG"; cp /tmp/tut/metrics.jsonl "$OUT/tut_ours.metrics.jsonl"
  cp /tmp/tut/validation.txt "$OUT/tut_validation.txt"
  step tut_torch 300 python3 benches/cores_busy.py python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc 16 /tmp/tut/validation.txt
  ddp_rows
fi
save_cache
python3 benches/gpu/open_goals_summary.py "$LOG" | tee "$OUT/summary-$P.txt"
