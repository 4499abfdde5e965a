#!/usr/bin/env bash
# The rows the open goals still lacked on 2026-12-05, in one device call, PyTorch beside:
#   1. the GPU checks the newest code needs first: `nccl` (and again with BURN_DDP_ENQUEUE_THREAD=1),
#      `convolution`, and the decode checks with ImageNet-size photos (`pixel-ops` — RandAugment,
#      colour jitter and random erasing on GPU-decoded batches against the host's bytes —
#      `crop-resize`, `jpeg-decode`, `decode-ahead`);
#   2. DDP's cost inside one process (`bench --ddp --ddp-interleave`), each row without and with
#      the enqueue thread, alternated: ResNet-18 28² b256 three times, ResNet-50 and ViT-B/16 once;
#   3. ViT-S/16 bf16 b256 with AdamW, twice, beside timm's model under PyTorch eager and
#      torch.compile (fused AdamW);
#   4. the tutorial's job (`train --preset tutorial`, ResNet-34 b16 f32, EPOCHS epochs, default 5,
#      on the bundled images as a 224² JPEG folder) alternated TUT_PAIRS times (default 2) with PyTorch's same job
#      (channels_last, 16 loader workers): steady img/s and each epoch's validation accuracy;
#   5. the ViT recipe's input (`--preset vit`: RandAugment 2,9, colour jitter 0.4, random erasing
#      0.25): `bench-data` with the GPU decode twice, the CPU decode once and the plain recipe on
#      the GPU once; PyTorch's DataLoader alone with the same recipe (16 workers); ViT-S/16 bf16
#      b256 `train --preset vit` for 3 epochs on the photos with --decode gpu, cpu, gpu;
#   6. (not by default) what the 2026-12-05 runs left open: `layer-norm` (with its padded 3-D
#      case) and `linear-epilogue` checks; ViT-S/16 bf16 b256 AdamW with and without
#      BURN_DDP_LT_EPILOGUE=1, alternated twice, beside torch.compile; the tutorial's job with
#      --decode gpu, then --decode cpu, then PyTorch's (the 5-epoch accuracy, either decoder).
# PARTS="6" picks parts (default "1 2 3 4 5"); SKIP="3 4" leaves parts out. Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks;
# release, CUDA). Raw log $OUT/open-goals.log, each training run's metrics.jsonl, the summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/open-goals.log; SHOW="img_per_s|RESULT|CORES|rror|panick|^ok|^FAIL|passed"; SHOW_LINES=${SHOW_LINES:-3}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/burn-ddp-gpu-checks 2>/dev/null
BV="$B"/burn-vision
CORES="python3 benches/cores_busy.py"   # reports the host cores a command kept busy
D=/tmp/photos
skip() { [[ " ${SKIP:-} " == *" $1 "* || " ${PARTS:-1 2 3 4 5} " != *" $1 "* ]]; }
# A training run's metrics.jsonl into the log (METRICS NAME {...}) and beside it in $OUT.
metrics() { sed "s/^/METRICS $1 /" "$2/metrics.jsonl" >>"$LOG" 2>/dev/null; cp "$2/metrics.jsonl" "$OUT/$1.metrics.jsonl" 2>/dev/null; }
# ViT-S/16 bf16 b256 with AdamW: ours (VSA) and timm's under PyTorch (VS_TORCH MODE adamw).
VSA=("${VS[@]}" --optimizer adamw)
VS_TORCH="synthetic timm:vit_small_patch16_224 256 224 3 1000 0 5 $STEPS bf16 nchw"
E=${EPOCHS:-5}   # the tutorial job's epochs
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee -a "$LOG"
echo "host: $(nproc) cores" | tee -a "$LOG"
step photos 300 python3 benches/make_photos.py $D/folder 1200

if ! skip 1; then
  SHOW_LINES=8 step checks_nccl 200 "$B"/burn-ddp-gpu-checks nccl
  SHOW_LINES=8 step checks_nccl_enqueue_thread 200 env BURN_DDP_ENQUEUE_THREAD=1 "$B"/burn-ddp-gpu-checks nccl
  BURN_DDP_CHECK_JPEGS=$D/folder SHOW_LINES=8 step checks_decode 200 "$B"/burn-ddp-gpu-checks pixel-ops crop-resize jpeg-decode decode-ahead
  SHOW_LINES=4 step checks_convolution 200 "$B"/burn-ddp-gpu-checks convolution
fi

if ! skip 2; then
  for i in 1 2 3; do
    step r18s_interleaved_$i 150 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25
    step r18s_interleaved_enqueue_$i 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25
  done
  step r50_interleaved 150 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step r50_interleaved_enqueue 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved 150 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved_enqueue 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
fi

if ! skip 3; then
  step vits_adamw_1 150 "$BV" "${VSA[@]}"
  step vits_adamw_2 150 "$BV" "${VSA[@]}"
  step vits_torch_eager 150 python3 benches/pytorch_baseline.py $VS_TORCH eager adamw
  step vits_torch_compile 300 python3 benches/pytorch_baseline.py $VS_TORCH compile adamw
fi

if ! skip 4; then
  fm224
  for run in $(seq "${TUT_PAIRS:-2}"); do
    rm -rf /tmp/tut-$run
    step tut_ours_$run 300 $CORES "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --out /tmp/tut-$run
    metrics tut_ours_$run /tmp/tut-$run
    step tut_torch_w16_$run 300 $CORES python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc 16 /tmp/tut-$run/validation.txt
  done
fi

if ! skip 5; then
  DATA="bench-data --data $D/folder --batches 30 --gpus 0"
  for i in 1 2; do SHOW_LINES=2 step data_vit_gpu_$i 90 $CORES "$BV" $DATA --preset vit --decode gpu; done
  SHOW_LINES=2 step data_vit_cpu 150 $CORES "$BV" $DATA --preset vit --decode cpu
  SHOW_LINES=2 step data_plain_gpu 90 $CORES "$BV" $DATA --decode gpu
  step torch_loader_vit 200 $CORES python3 benches/pytorch_baseline.py loader $D/folder 256 30 16 vit
  T="train --preset vit --gpus 0 --model vit_s16 --epochs 3 --warmup-epochs 1 --batch-size 256 --precision bf16 --data $D/folder"
  for run in gpu cpu gpu_2; do
    rm -rf /tmp/vit-$run
    step train_vit_$run 300 $CORES "$BV" $T --decode ${run%_2} --out /tmp/vit-$run
    metrics train_vit_$run /tmp/vit-$run
  done
fi

if ! skip 6; then
  SHOW_LINES=12 step checks_layer_norm 200 "$B"/burn-ddp-gpu-checks layer-norm linear-epilogue
  for i in 1 2; do
    step vits_adamw_$i 150 "$BV" "${VSA[@]}"
    step vits_adamw_epilogue_$i 150 env BURN_DDP_LT_EPILOGUE=1 "$BV" "${VSA[@]}"
  done
  step vits_torch_compile 300 python3 benches/pytorch_baseline.py $VS_TORCH compile adamw
  fm224
  for decode in gpu cpu; do
    rm -rf /tmp/tut-$decode
    step tut_ours_$decode 300 $CORES "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --decode $decode --out /tmp/tut-$decode
    metrics tut_ours_$decode /tmp/tut-$decode
  done
  step tut_torch_w16 300 $CORES python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc 16 /tmp/tut-gpu/validation.txt
fi

save_cache
python3 benches/gpu/open_goals_summary.py "$LOG" | tee "$OUT/summary.txt"
