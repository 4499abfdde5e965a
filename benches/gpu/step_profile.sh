#!/usr/bin/env bash
# Where the device time of one training step goes, by class of kernel (convolutions and
# products, normalisation, element-wise, reductions, optimizer, copies, fences), burn-vision
# beside PyTorch eager and torch.compile: Nsight Compute times every kernel of two of our
# steps; torch.profiler every kernel of one of PyTorch's; benches/gpu/kernel_classes.py sums them.
#   PART=1  ResNet-50 bf16 b256 channels-last        PART=2  ViT-B/16 bf16 b128
#   PART=3  ViT-S/16 bf16 b256 with AdamW (timm's model on PyTorch's side, fused AdamW)
# SGD on both sides, except PART=3. Binaries: carry/bins.txz (burn-vision); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/step_profile${PART:-1}.log; SHOW="CLASSES|PLANS|rror|panick"; SHOW_LINES=${SHOW_LINES:-14}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision
if [ "${PART:-1}" = 1 ]; then
  OURS="--model resnet50 --batch-size 256"; TORCH="resnet50 256 224 1"; NAME=resnet50
elif [ "${PART:-1}" = 2 ]; then
  OURS="--model vit_b16 --batch-size 128"; TORCH="vit_b_16 128 224 0"; NAME=vit_b16
else
  OURS="--model vit_s16 --batch-size 256 --optimizer adamw"; TORCH="timm:vit_small_patch16_224 256 224 0"; NAME=vit_s16; OPT=adamw
fi
# ncu times the kernels of the 2 timed steps only (bench opens the profiler's range after the
# warm-up): the warm-up's cuDNN plan searches run unprofiled, so they keep the engines a run
# without the profiler keeps (a search timed under ncu measures ncu's cost per kernel:
# plan_choices.py reads that off a profile that holds one). A run without ncu first fills the
# kernel caches, so the profiled run does not autotune.
step ours_warm 200 "$B"/burn-vision bench $OURS --image-size 224 --classes 1000 --gpus 0 --precision bf16 --warmup 2 --steps 2
step ours_ncu 280 env BURN_DDP_CUDA_PROFILER=1 ncu --profile-from-start off --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu_${NAME}.csv" \
  "$B"/burn-vision bench $OURS --image-size 224 --classes 1000 --gpus 0 --precision bf16 --warmup 3 --steps 2
grep -qF "cuProfilerStart on GPU 0: Ok(())" "$LOG" \
  || echo "ERROR: the profiler range did not start: ncu_${NAME}.csv holds the whole run, searches included" | tee -a "$LOG"
step ours_plans 30 python3 benches/gpu/plan_choices.py "$OUT/ncu_${NAME}.csv"
step ours_classes 30 python3 benches/gpu/kernel_classes.py "$OUT/ncu_${NAME}.csv" "ours-$NAME" 2
# The same step without the profiler: how much of it the GPU spends waiting (step time minus
# the profile's device time; the fence kernels count as device time).
step ours_time 200 "$B"/burn-vision bench $OURS --image-size 224 --classes 1000 --gpus 0 --precision bf16 --warmup 5 --steps 30
python3 - "$LOG" "$NAME" <<'PY' | tee -a "$LOG"
import re, sys
sys.path.insert(0, "benches/gpu")
from bench_log import results
log, name = sys.argv[1], sys.argv[2]
device = [float(m.group(1)) for m in re.finditer(rf"CLASSES ours-{name}: ([0-9.]+) ms of device time per step", open(log).read())]
run = [r for step, _, r in results(log) if step == "ours_time"]
if device and run:
    r = run[-1]
    step_ms = 1e3 * r["seconds"] / r["config"]["steps"]
    print(f"CLASSES ours-{name}: a step takes {step_ms:.2f} ms without the profiler ({r['img_per_s']:.0f} img/s): "
          f"{device[-1]:.2f} ms of kernels, the GPU waits {step_ms - device[-1]:.2f} ms")
PY
[ -n "${OURS_ONLY:-}" ] && { xz_files "$OUT/ncu_${NAME}.csv"; echo; echo SUMMARY; grep -E "^(CLASSES|PLANS|ERROR)" "$LOG"; exit 0; }
step torch_eager 150 python3 benches/pytorch_profile.py $TORCH 0 bf16 eager ${OPT:-sgd}
grep "^NCU torch-.*-bf16:" "$LOG" > "$OUT/torch_eager_$NAME.txt"
step torch_eager_classes 30 python3 benches/gpu/kernel_classes.py "$OUT/torch_eager_$NAME.txt" "torch-eager-$NAME"
step torch_compile 240 python3 benches/pytorch_profile.py $TORCH 0 bf16 compile ${OPT:-sgd}
grep "^NCU torch-.*-compile:" "$LOG" > "$OUT/torch_compile_$NAME.txt"
step torch_compile_classes 30 python3 benches/gpu/kernel_classes.py "$OUT/torch_compile_$NAME.txt" "torch-compile-$NAME"
xz_files "$OUT/ncu_${NAME}.csv"
echo; echo SUMMARY; grep -E "^(CLASSES|PLANS|ERROR)" "$LOG"
