#!/usr/bin/env bash
# One device call on one H200: where the device time of one ResNet-50 training step goes,
# burn-vision next to PyTorch.
#  burn_ncu:   Nsight Compute times every kernel of one timed step (clocks left alone), summed by
#              kernel by benches/gpu/ncu_summary.py;
#  torch_prof: torch.profiler on one PyTorch step of the same model, batch and size;
#  burn_split: the step without a profiler, with the host's waits on the cuDNN path
#              (the switches of earlier versions that compared variants are gone: set
#              `burn_ddp::nn::CudnnOptions` in code to compare them).
# BURN_EXTRA adds options to burn-vision's bench (e.g. "--precision bf16", or "--channels-first":
# the bench, like train, keeps GPU activations channels-last by default),
# TORCH_CL=1 and TORCH_DTYPE=bf16 profile PyTorch channels_last / autocast bf16.
# MODEL / TORCH_MODEL pick the model (default resnet50; e.g. MODEL=vit_b16 TORCH_MODEL=vit_b_16).
# Binaries carried in carry/ (see cudnn.sh). Writes raw logs to $OUT, summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/profile.log
SHOW="NCU|img_per_s|error|panic"
SHOW_LINES=${SHOW_LINES:-45}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision
BATCH=${BATCH:-256}
MODEL=${MODEL:-resnet50}; TORCH_MODEL=${TORCH_MODEL:-$MODEL}
R50="--model $MODEL --batch-size $BATCH --image-size 224 --classes 1000 --gpus 0 ${BURN_EXTRA:-}"
for s in ${STEPS:-burn_split burn_ncu torch_prof}; do
  case $s in
    burn_split) step burn_split ${T_R50:-150} "$B"/burn-vision bench $R50 --warmup 3 --steps 5 ;;
    burn_ncu)
      step burn_ncu_run ${T_NCU:-240} env BURN_DDP_CUDA_PROFILER=1 ncu --clock-control none --cache-control none \
        --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu_burn.csv" \
        "$B"/burn-vision bench $R50 --warmup 2 --steps 1
      step burn_ncu 30 python3 benches/gpu/ncu_summary.py "$OUT/ncu_burn.csv" ${TOP:-40} burn-$MODEL-b$BATCH ;;
    torch_prof) step torch_prof 120 python3 benches/pytorch_profile.py $TORCH_MODEL $BATCH 224 ${TORCH_CL:-0} 30 ${TORCH_DTYPE:-f32} ;;
  esac
done
save_cache
echo; echo "SUMMARY"
grep -E "^NCU .*(kernels|stream)|img_per_s" "$LOG" | cut -c1-400
