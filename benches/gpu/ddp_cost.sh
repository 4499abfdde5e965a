#!/usr/bin/env bash
# What DistributedDataParallel costs on one GPU: each workload plain and through DDP over a
# one-rank NCCL group — every bucket goes through NCCL, there is no world-size-1 shortcut for
# DDP's buckets — with PyTorch's DDP over a one-rank NCCL group beside it, pairs alternated.
#   PART=1  `cudnn_check check-nccl` (NCCL ordered on the device; DDP against plain training;
#           bf16-compressed DDP within bf16 rounding; DDP's host time per step), then
#           ResNet-50 bf16 channels-last b256 and ViT-B/16 bf16 b128 on synthetic batches:
#           ours plain, ours `bench --ddp`, PyTorch eager, PyTorch DDP — twice in that order.
#   PART=2  ResNet-18 on the bundled 28² data b256 (host-bound): the synthetic step plain,
#           `--ddp` and `--ddp --no-overlap` (DDP without gradient hooks), then training for 6
#           epochs; and the tutorial preset (ResNet-34, batch 16, SyncBatchNorm) on 224² JPEGs
#           for 1 epoch — each plain and under `burn-ddp launch --nproc-per-node 1`, alternated
#           twice; ResNet-50 with bf16-compressed gradients.
#   OLD=DIR also runs DIR's binaries (an earlier build) the same way, where they can.
# Binaries: carry/bins.txz (burn-vision, burn-ddp, cudnn_check; release, CUDA). Raw log
# $OUT/ddp-cost-PART.log; the summary table last (benches/gpu/ddp_cost_summary.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-1}
LOG=$OUT/ddp-cost-$PART.log
SHOW="RESULT|rror|panick|FAIL"; SHOW_LINES=3
B=${B:-carry}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/cudnn_check 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv | tee -a "$LOG"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee -a "$LOG"
BV="$B"/burn-vision
STEPS=${STEPS:-30}
# A training run's metrics.jsonl into the log, each line prefixed with the run's name.
metrics() { sed "s/^/METRICS $1 /" "$2/metrics.jsonl" >>"$LOG" 2>/dev/null; }
if [ "$PART" = 1 ]; then
  step check_nccl 300 "$B"/cudnn_check check-nccl
  R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
  VIT=(bench --gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
  for i in 1 2; do
    step r50_plain_$i 150 "$BV" "${R50[@]}"
    step r50_ddp_$i 150 "$BV" "${R50[@]}" --ddp
    step r50_torch_$i 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc eager
    step r50_torch_ddp_$i 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc ddp
  done
  for i in 1 2; do
    step vitb16_plain_$i 150 "$BV" "${VIT[@]}"
    step vitb16_ddp_$i 150 "$BV" "${VIT[@]}" --ddp
    step vitb16_torch_$i 120 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw eager
    step vitb16_torch_ddp_$i 120 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw ddp
  done
elif [ "$PART" = 2 ]; then
  L=("$B"/burn-ddp launch --standalone --nproc-per-node 1)
  R18B=(bench --gpus 0 --model resnet18 --batch-size 256 --image-size 28 --channels 1 --classes 10 --small-input --precision bf16 --warmup 5 --steps 300)
  for i in 1 2; do
    step r18s_plain_$i 150 "$BV" "${R18B[@]}"
    step r18s_ddp_$i 150 "$BV" "${R18B[@]}" --ddp
    step r18s_ddp_no_overlap_$i 150 "$BV" "${R18B[@]}" --ddp --no-overlap
  done
  R18=(train --model resnet18 --batch-size 256 --epochs 6 --optimizer sgd --precision bf16 --gpus 0 --quiet)
  for i in 1 2; do
    rm -rf /tmp/r18-*-$i
    step r18_plain_$i 300 "$BV" "${R18[@]}" --out /tmp/r18-plain-$i
    metrics r18_plain_$i /tmp/r18-plain-$i
    step r18_ddp_$i 300 "${L[@]}" "$BV" "${R18[@]}" --out /tmp/r18-ddp-$i
    metrics r18_ddp_$i /tmp/r18-ddp-$i
  done
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  TUT=(train --data /tmp/fm224 --preset tutorial --epochs 1 --gpus 0 --quiet)
  for i in 1 2; do
    rm -rf /tmp/tut-*-$i
    step tut_plain_$i 300 "$BV" "${TUT[@]}" --out /tmp/tut-plain-$i
    metrics tut_plain_$i /tmp/tut-plain-$i
    step tut_ddp_$i 300 "${L[@]}" "$BV" "${TUT[@]}" --out /tmp/tut-ddp-$i
    metrics tut_ddp_$i /tmp/tut-ddp-$i
  done
  R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
  step r50_ddp_bf16 300 "$BV" "${R50[@]}" --ddp --grad-compression bf16
  step r50_plain_3 300 "$BV" "${R50[@]}"
  step r50_ddp_3 300 "$BV" "${R50[@]}" --ddp
fi
if [ -n "${OLD:-}" ] && [ "$PART" = 2 ]; then
  # The earlier build's DDP (its bench has no --ddp): the training rows only.
  chmod +x "$OLD"/burn-vision "$OLD"/burn-ddp
  for i in 1; do
    rm -rf /tmp/old-r18-*
    step old_r18_plain_$i 300 "$OLD"/burn-vision "${R18[@]}" --out /tmp/old-r18-plain
    metrics old_r18_plain_$i /tmp/old-r18-plain
    step old_r18_ddp_$i 300 "$OLD"/burn-ddp launch --standalone --nproc-per-node 1 "$OLD"/burn-vision "${R18[@]}" --out /tmp/old-r18-ddp
    metrics old_r18_ddp_$i /tmp/old-r18-ddp
  done
fi
save_cache
python3 benches/gpu/ddp_cost_summary.py "$LOG" | tee -a "$LOG"
