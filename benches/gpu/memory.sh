#!/usr/bin/env bash
# One device call on one H200 (issues 15 and 17): where burn-cuda's GPU memory goes. `bench`
# reports cubecl's pools per stream (live tensors vs reserved blocks) after the warm-up and,
# once the warm-up's unused blocks are handed back, after the timed steps.
# PART=1 (2026-12-02): ViT-B/16 b128 and ResNet-50 b256 bf16 with cubecl's sub-allocated
# pages, with one cubecl stream for every thread, and with exact-size blocks (then experiment
# switches, BURN_DDP_CUBECL_MAX_STREAMS=1 and BURN_DDP_CUBECL_PERSISTENT=enforced; exact-size
# blocks are now the default and BURN_DDP_ALLOCATOR=pages the old way), a short ViT-B/16 run
# with cubecl's memory log (every page it reserves), cold kernel caches; PyTorch eager beside.
# PART=2: the exact-size allocator as the default, against the pages, ViT-B/16, ViT-S/16 and
# ResNet-50 beside PyTorch; every burn-ddp-gpu-checks --skip nccl with it (and cuDNN's plans written to the
# plan cache), then the transformer checks again on plans restored from it; a ViT trained
# from the CLI for three epochs (a partial last batch, validation) to see its memory hold.
# PART=3: the build bound to CUDA 12.8's driver API on the H200's CUDA 13 driver: `burn-ddp
# doctor`, every burn-ddp-gpu-checks --skip nccl, ViT-B/16 and ResNet-50 beside PyTorch, a ViT trained from
# the CLI and its checkpoint evaluated on the GPU.
# PART=4: ResNet blocks rectifying their residual sum with burn_ddp::nn::relu (its backward
# reads the output): `burn-ddp-gpu-checks relu max-pool` (bit-identical to burn's relu), ResNet-50 twice
# (the first warms the kernel caches) beside PyTorch.
# PART=5 (2026-12-03): cubecl's memory log (BURN_DDP_MEMORY_LOG: every reservation, the blocks
# by size at each new one) of short ResNet-50 bf16 b256 and ResNet-34 b16 f32 runs with the
# exact-size blocks, then ResNet-50 timed beside PyTorch (the memory figures the log explains).
# PART=6 (2026-12-03; its build had an `add_relu` removed the same day, see
# docs/benchmarks.md): the residual block's end as one operation (its
# backward masks the incoming gradient in place), the stem's max-pool keeping only its indices
# (burn_ddp::nn::max_pool2d), and the channels-last batch norm's backward writing over an
# unshared incoming gradient: `burn-ddp-gpu-checks relu max-pool` (both against f64), the memory log
# again, ResNet-50 bf16 and f32 and ResNet-34 b16 beside PyTorch, every burn-ddp-gpu-checks --skip nccl.
# PART=7 (2026-12-03; needs PART=6's binaries as A): A/B, alternated in one call: A = PART=6's build (ResNet blocks end in
# add_relu, the channels-last batch norm's backward may write over its incoming gradient),
# B = carry/burn-vision-b.xz (ResNet blocks end in relu(out + identity), batch norm as before;
# both keep the max-pool change): ResNet-50 bf16 b256 and ResNet-34 b16 f32 (speed, memory),
# then the tutorial's job (2 epochs of the fm224 folder) with each; PyTorch beside.
# PART=8 (2026-12-03, the committed code): `burn-ddp-gpu-checks relu max-pool` (the max-pool against f64),
# ResNet-50 bf16 b256 twice beside PyTorch (speed, memory). Not run on 2026-12-03 (no device
# time left).
# PART=9 (2026-12-03): queued cuDNN jobs hold buffer bindings instead of tensor handles (burn
# may write a buffer in place once its tensors are gone), and a convolution whose input
# already has a gradient adds its share into it (cuDNN's β = 1): `burn-ddp-gpu-checks convolution-accumulate`
# (an input feeding two and three convolutions, against f64), every burn-ddp-gpu-checks --skip nccl, the
# memory log, ResNet-50 bf16 b256 beside PyTorch.
# Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/memory${PART:-2}.log; SHOW="img_per_s|device_used|restored|plans built|checks|GPU memory|rror|panick|FAIL"; SHOW_LINES=${SHOW_LINES:-8}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/burn-ddp-gpu-checks
BIN=$(realpath "$B"/burn-vision)
BB="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 3 --steps 20"
R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
if [ "${PART:-2}" = 9 ]; then
  SHOW="RESULT check=conv_input|rror|panick" SHOW_LINES=8 step check_accumulate 120 "$B"/burn-ddp-gpu-checks convolution-accumulate
  step r50_memlog 150 env BURN_DDP_MEMORY_LOG="$OUT"/mem-r50.log "$BIN" bench $(echo $R | sed 's/--warmup 5 --steps 30/--warmup 2 --steps 3/')
  python3 benches/gpu/memory_log_summary.py "$OUT"/mem-r50.log > "$OUT"/mem-r50-summary.txt
  head -12 "$OUT"/mem-r50-summary.txt | tee -a "$LOG"
  xz_files "$OUT"/mem-r50.log
  step r50_1 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  SHOW="passed, |RESULT cuDNN calls|FAIL|rror|panick" SHOW_LINES=8 step check_all 420 "$B"/burn-ddp-gpu-checks --skip nccl
elif [ "${PART:-2}" = 8 ]; then
  SHOW="RESULT check|rror|panick" SHOW_LINES=8 step check_relu 120 "$B"/burn-ddp-gpu-checks relu max-pool
  step r50_1 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  step r50_2 150 "$BIN" bench $R
elif [ "${PART:-2}" = 7 ]; then
  python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.decompress(open(sys.argv[1], 'rb').read()))" "$B"/burn-vision-b.xz "$B"/burn-vision-b
  chmod +x "$B"/burn-vision-b
  BINB=$(realpath "$B"/burn-vision-b)
  R34="--gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 5 --steps 200"
  for i in 1 2; do
    step r50_a_$i 150 "$BIN" bench $R
    step r50_b_$i 150 "$BINB" bench $R
  done
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  for i in 1 2; do
    step r34_a_$i 150 "$BIN" bench $R34
    step r34_b_$i 150 "$BINB" bench $R34
  done
  step r34_torch 120 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 5 200 f32 nhwc eager
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  SHOW="RESULT|rror|panick|top-1|images \\(" step tut_a 300 "$BIN" train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet --out /tmp/tut-a
  SHOW="RESULT|rror|panick|top-1|images \\(" step tut_b 300 "$BINB" train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet --out /tmp/tut-b
  step tut_torch_w16 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 2 f32 nhwc 16
elif [ "${PART:-2}" = 6 ]; then
  SHOW="RESULT check|rror|panick" SHOW_LINES=12 step check_relu 120 "$B"/burn-ddp-gpu-checks relu max-pool
  step r50_memlog 150 env BURN_DDP_MEMORY_LOG="$OUT"/mem-r50.log "$BIN" bench $(echo $R | sed 's/--warmup 5 --steps 30/--warmup 2 --steps 3/')
  xz_files "$OUT"/mem-r50.log
  step r50_exact 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  step r50_exact_2 150 "$BIN" bench $R
  step r50_f32 150 "$BIN" bench $(echo $R | sed 's/--precision bf16/--precision f32/')
  step r50_f32_torch 120 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 f32 nhwc eager
  R34="--gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 5 --steps 200"
  step r34_b16 150 "$BIN" bench $R34
  step r34_b16_torch 120 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 5 200 f32 nhwc eager
  SHOW="passed, |FAIL|rror|panick" SHOW_LINES=8 step check_all 420 "$B"/burn-ddp-gpu-checks --skip nccl
  grep -h "^RESULT check" "$LOG" | grep -c " ok$" | sed 's/^/checks ok: /' | tee -a "$LOG"
  grep -h "^RESULT check" "$LOG" | grep -v " ok$" | grep -v "info:" | tee -a "$LOG"
elif [ "${PART:-2}" = 5 ]; then
  step r50_memlog 150 env BURN_DDP_MEMORY_LOG="$OUT"/mem-r50.log "$BIN" bench $(echo $R | sed 's/--warmup 5 --steps 30/--warmup 2 --steps 3/')
  step r34_memlog 150 env BURN_DDP_MEMORY_LOG="$OUT"/mem-r34.log "$BIN" bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 2 --steps 3
  grep -c "Allocated a new memory page" "$OUT"/mem-r50.log "$OUT"/mem-r34.log | tee -a "$LOG"
  xz_files "$OUT"/mem-r50.log "$OUT"/mem-r34.log
  step r50_exact 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
elif [ "${PART:-2}" = 4 ]; then
  SHOW="RESULT check|img_per_s|rror|panick" step check_relu 120 "$B"/burn-ddp-gpu-checks relu max-pool
  step r50_first 150 "$BIN" bench $R
  step r50_second 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  step vitb16_exact 150 "$BIN" bench $BB
elif [ "${PART:-2}" = 3 ]; then
  SHOW_LINES=12 step doctor 60 "$B"/burn-ddp doctor --nproc-per-node 1 --all-reduce-mib 64
  SHOW_LINES=4 step check 420 "$B"/burn-ddp-gpu-checks --skip nccl
  grep -h "^RESULT check" "$LOG" | grep -c " ok$" | sed 's/^/checks ok: /' | tee -a "$LOG"
  grep -h "^RESULT check" "$LOG" | grep -v " ok$" | tee -a "$LOG"
  step vitb16_exact 150 "$BIN" bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step r50_exact 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  rm -rf /tmp/vit-run
  SHOW_LINES=4 step vit_cli_train 120 "$BIN" train --gpus 0 --model vit-mini --precision bf16 --epochs 1 --out /tmp/vit-run
  SHOW="accuracy|acc|img/s|rror|panick" SHOW_LINES=4 step vit_cli_eval 120 "$BIN" eval --gpus 0 --checkpoint /tmp/vit-run/best.ckpt
elif [ "${PART:-2}" = 2 ]; then
  SHOW_LINES=6 step check 420 "$B"/burn-ddp-gpu-checks --skip nccl
  echo "cuDNN plans kept: $(ls "$BURN_DDP_CACHE_DIR"/*/cudnn-plans 2>/dev/null | wc -l)" | tee -a "$LOG"
  SHOW_LINES=6 step check_transformer_restored 200 "$B"/burn-ddp-gpu-checks attention layer-norm
  echo "plans restored in check_transformer_restored: $(sed -n '/=== check_transformer_restored:/,/=== check_transformer_restored rc/p' "$LOG" | grep -c 'plan restored')" | tee -a "$LOG"
  step vitb16_exact 150 "$BIN" bench $BB
  step vitb16_exact_restored 150 "$BIN" bench $BB
  step vitb16_pages 150 env BURN_DDP_ALLOCATOR=pages "$BIN" bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step vits16_exact 150 "$BIN" bench $S
  step vits16_pages 150 env BURN_DDP_ALLOCATOR=pages "$BIN" bench $S
  step vits16_torch 90 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 3 20 bf16 nchw eager
  step r50_exact 150 "$BIN" bench $R
  step r50_pages 150 env BURN_DDP_ALLOCATOR=pages "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  rm -rf /tmp/vit-mem-run
  SHOW_LINES=12 step vit_cli_3_epochs 240 "$BIN" train --gpus 0 --model vit-mini --precision bf16 --epochs 3 --out /tmp/vit-mem-run
else
  step vitb16_pages 150 env BURN_DDP_ALLOCATOR=pages "$BIN" bench $BB
  step vitb16_exact 150 "$BIN" bench $BB
  step vitb16_torch 90 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 3 20 bf16 nchw eager
  step r50_pages 150 env BURN_DDP_ALLOCATOR=pages "$BIN" bench $R
  step r50_exact 150 "$BIN" bench $R
  step r50_torch 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
  # cubecl's memory log (a cubecl.toml in the working directory; it names the warm caches and
  # the old allocator too, as a cubecl file decides both).
  KC=$(ls -d "$BURN_DDP_CACHE_DIR"/*/ | head -1)
  mkdir -p /tmp/memlog && cat > /tmp/memlog/cubecl.toml <<EOF
[autotune]
cache = { file = "$KC" }
[compilation]
cache = { file = "$KC" }
[memory.logger]
level = "full"
file = "$OUT/cubecl-memory-vitb16.log"
EOF
  (cd /tmp/memlog && step vitb16_memlog 150 "$BIN" bench $(echo $BB | sed 's/--warmup 3 --steps 20/--warmup 2 --steps 2/'))
  grep -c "Allocated a new memory page" "$OUT/cubecl-memory-vitb16.log" | tee -a "$LOG"
  xz -9 "$OUT/cubecl-memory-vitb16.log"
  step vitb16_cold 300 env BURN_DDP_CACHE_DIR=/tmp/cold-cache BURN_DDP_ALLOCATOR=pages "$BIN" bench $BB
fi
echo "=== summary" | tee -a "$LOG"
python3 benches/gpu/memory_summary.py "$LOG" | tee -a "$LOG"
save_cache
