#!/usr/bin/env bash
# The first-hour table, re-measured with PyTorch beside every row in the same call (one H200).
#   PART=1  the tutorial's recipe (`train --preset tutorial`: ResNet-34, batch 16, SGD, f32) for
#           EPOCHS (default 5) on a 10-class 224² JPEG folder (the bundled 10k Fashion-MNIST
#           images; 8,000 train, 2,000 validation): burn-vision on a fresh machine (empty kernel
#           caches), then again (the second run), then PyTorch's same job (benches/pytorch_baseline.py
#           tutorial, channels_last and NCHW, cudnn.benchmark); then `eval --gpus 0` of the checkpoint.
#   PART=2  ResNet-50 bf16 b256 channels-last, time to the first step: burn-vision with empty caches
#           (a fresh machine) and again, PyTorch eager twice and torch.compile; peak memory of
#           ResNet-50 fp32 beside PyTorch's.
#   PART=3  where the tutorial job's host time goes: 2 epochs with and without weight decay, the
#           bench step of ResNet-34 b16 fp32 (memory beside PyTorch's), PyTorch's job with 16
#           loader workers.
#   PART=4  ResNet-34 b16's bench step: cubecl's pages vs exact-size blocks vs a 32 MiB cuDNN
#           workspace vs NCHW, alternated, PyTorch beside.
#   PART=5  ResNet-50 bf16 b256 with cuDNN workspace limits of 512, 128 and 64 MiB (memory and
#           speed), the epoch log's GPU memory line, `bench-data` to host memory and to GPU 0,
#           PyTorch eager beside.
#   PART=6  the whole table in one call (2026-12-03): ResNet-50 bf16 b256 from a fresh machine and
#           again (first step, speed, memory), PyTorch eager's first run beside; ResNet-50 f32 and
#           ResNet-34 b16 memory beside PyTorch's; the tutorial's job for EPOCHS (default 5) from a
#           fresh machine beside PyTorch's (channels_last, 16 loader workers); `eval --gpus 0` and
#           `predict --gpus 0` of its checkpoint; the job again (second run); `burn-ddp-gpu-checks
#           check-accumulate`; torch.compile's ResNet-50 bf16 (the stretch row).
#   PART=7  the tutorial's job alone, alternated with PyTorch's (16 loader workers) twice: ours from a
#           fresh machine, PyTorch, ours again, PyTorch again (the steady ratio's spread in one call).
# Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/first-hour-PART.log, metrics.jsonl of each training run; the summary table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-1}
LOG=$OUT/first-hour-$PART.log
SHOW="RESULT|first_step|device_used|rror|panick|top-1|images \(|GPU memory|delivered_to"; SHOW_LINES=8
B=${B:-carry}
rm -f "$B"/cubecl-cache.tgz "$B"/kernel-cache.tgz   # nothing from earlier calls: fresh runs start empty
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp 2>/dev/null
rm -rf /tmp/kc-*
nproc | sed 's/^/host cores: /' | tee -a "$LOG"
BV="$B"/burn-vision
if [ "$PART" = 1 ]; then
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  E=${EPOCHS:-5}
  TUT=(train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet)
  for run in fresh second; do
    rm -rf /tmp/tut-$run
    step tut_ours_$run 420 env BURN_DDP_CACHE_DIR=/tmp/kc-t RUST_LOG=info,cubecl_cuda::compute::context=trace "$BV" "${TUT[@]}" --out /tmp/tut-$run
    echo "kernels compiled by NVRTC so far: $(grep -c 'Compiling kernel' "$LOG")" | tee -a "$LOG"
    cp /tmp/tut-$run/metrics.jsonl "$OUT"/tut-ours-$run.metrics.jsonl 2>/dev/null
    sed 's/^/METRICS /' /tmp/tut-$run/metrics.jsonl >>"$LOG" 2>/dev/null
  done
  step tut_torch_nhwc 420 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc
  step tut_torch_nchw 420 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nchw
  step eval_ours 120 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" eval --gpus 0 --checkpoint /tmp/tut-second/best.ckpt
elif [ "$PART" = 6 ]; then
  R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 20)
  step r50_ours_fresh 200 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}" --precision bf16
  step r50_ours_second 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}" --precision bf16
  step r50_torch_1 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
  step r50_f32_ours 150 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}"
  step r50_f32_torch 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 f32 nhwc eager
  R34=(bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 3 --steps 100)
  step r34_b16_ours 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R34[@]}"
  step r34_b16_torch 90 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 3 100 f32 nhwc eager
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  E=${EPOCHS:-5}
  rm -rf /tmp/tut-fresh
  step tut_ours_fresh 300 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --out /tmp/tut-fresh
  cp /tmp/tut-fresh/metrics.jsonl "$OUT"/tut-ours-fresh.metrics.jsonl 2>/dev/null
  sed 's/^/METRICS /' /tmp/tut-fresh/metrics.jsonl >>"$LOG" 2>/dev/null
  step tut_torch_nhwc_w16 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc 16
  step eval_ours 120 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" eval --gpus 0 --checkpoint /tmp/tut-fresh/best.ckpt
  step predict_ours 120 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" predict --gpus 0 --checkpoint /tmp/tut-fresh/best.ckpt /tmp/fm224/Bag /tmp/no-such-image.jpg
  rm -rf /tmp/tut-second
  step tut_ours_second 300 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --out /tmp/tut-second
  sed 's/^/METRICS /' /tmp/tut-second/metrics.jsonl >>"$LOG" 2>/dev/null
  chmod +x "$B"/burn-ddp-gpu-checks
  SHOW="RESULT check=conv_input|FAIL|rror|panick" step check_accumulate 120 "$B"/burn-ddp-gpu-checks convolution-accumulate
  step r50_torch_compile 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 6 20 bf16 nhwc compile
elif [ "$PART" = 7 ]; then
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  E=${EPOCHS:-5}
  for run in 1 2; do
    rm -rf /tmp/tut-$run
    step tut_ours_$run 300 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" train --data /tmp/fm224 --preset tutorial --epochs "$E" --gpus 0 --quiet --out /tmp/tut-$run
    sed 's/^/METRICS /' /tmp/tut-$run/metrics.jsonl >>"$LOG" 2>/dev/null
    step tut_torch_w16_$run 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 "$E" f32 nhwc 16 /tmp/tut-$run/validation.txt
  done
elif [ "$PART" = 3 ]; then
  # Where the tutorial job's host time per step goes: train without weight decay, the bench
  # step (no data, no weight decay) and PyTorch with 16 loader workers (an expert's tuning).
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  TUT=(train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet)
  for v in default:--weight-decay=5e-3 no_wd:--weight-decay=0; do
    rm -rf /tmp/tut-$v
    step tut_ours_${v%%:*} 300 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" "${TUT[@]}" "${v#*:}" --out /tmp/tut-${v%%:*}
    sed 's/^/METRICS /' /tmp/tut-${v%%:*}/metrics.jsonl >>"$LOG" 2>/dev/null
  done
  R34=(bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 3 --steps 100)
  step r34_b16_ours 200 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" "${R34[@]}"
  step r34_b16_torch 120 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 3 100 f32 nhwc eager
  step tut_torch_nhwc_w16 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 2 f32 nhwc 16
elif [ "$PART" = 4 ]; then
  # ResNet-34 b16's step, 1263 img/s on 2026-12-01 and 1037 in PART=3: cubecl's pages against
  # the exact-size blocks (the default since 2026-12-02), and a small cuDNN workspace, alternated.
  R34=(bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 5 --steps 200)
  step r34_warm_caches 200 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" "${R34[@]}"
  for i in 1 2; do
    step r34_exact_$i 100 env BURN_DDP_CACHE_DIR=/tmp/kc-t BURN_DDP_ALLOCATOR=exact "$BV" "${R34[@]}"
    step r34_pages_$i 100 env BURN_DDP_CACHE_DIR=/tmp/kc-t BURN_DDP_ALLOCATOR=pages "$BV" "${R34[@]}"
    step r34_ws32_$i 100 env BURN_DDP_CACHE_DIR=/tmp/kc-t BURN_DDP_CUDNN_WORKSPACE_MIB=32 "$BV" "${R34[@]}"
    step r34_nchw_$i 100 env BURN_DDP_CACHE_DIR=/tmp/kc-t "$BV" "${R34[@]}" --channels-first
  done
  step r34_b16_torch 120 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 5 200 f32 nhwc eager
elif [ "$PART" = 5 ]; then
  # The cuDNN workspace limit against ResNet-50's memory and speed (bf16 b256), and the epoch
  # log's GPU memory line.
  R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 20 --precision bf16)
  step r50_ws512_fresh 300 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}"
  for ws in 128 64 512 128 64; do
    step r50_ws$ws 60 env BURN_DDP_CACHE_DIR=/tmp/kc-a BURN_DDP_CUDNN_WORKSPACE_MIB=$ws "$BV" "${R50[@]}"
  done
  step train_log 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" train --gpus 0 --epochs 1 --max-steps-per-epoch 20 --quiet --out /tmp/run-log
  step bench_data_host 60 "$BV" bench-data --batch-size 256 --batches 20
  step bench_data_gpu0 60 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" bench-data --batch-size 256 --batches 20 --gpus 0
  step r50_torch 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
else
  R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 20)
  # cubecl's trace of its compiler: one "Compiling kernel" line per kernel NVRTC compiles.
  step r50_ours_fresh 300 env BURN_DDP_CACHE_DIR=/tmp/kc-a RUST_LOG=info,cubecl_cuda::compute::context=trace "$BV" "${R50[@]}" --precision bf16
  echo "kernels compiled by NVRTC in r50_ours_fresh: $(grep -c 'Compiling kernel' "$LOG")" | tee -a "$LOG"
  step r50_ours_second 120 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}" --precision bf16
  step r50_torch_1 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
  step r50_torch_2 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 bf16 nhwc eager
  step r50_f32_ours 200 env BURN_DDP_CACHE_DIR=/tmp/kc-a "$BV" "${R50[@]}"
  step r50_f32_torch 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 20 f32 nhwc eager
  step r50_torch_compile 400 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 6 20 bf16 nhwc compile
fi
du -sh /tmp/kc-* 2>/dev/null | tee -a "$LOG"
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/first_hour_summary.py "$LOG" | tee -a "$LOG"
