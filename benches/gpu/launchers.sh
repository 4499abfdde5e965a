#!/usr/bin/env bash
# One device call (the launchers' open item, and a GPU smoke run of 2026-12-01's changes): whether
# the GPU machine has OpenMPI's mpirun and torchrun, a 2-process CPU `train` under each (the world
# comes from the launcher's variables), and `train --gpus 0` of vit-mini in bf16 with
# mixup/cutmix (cuBLAS products, soft-target loss) for a few steps.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/launchers.log; SHOW="done:|rror|panick|epoch 1/|version|mpirun|torchrun"; SHOW_LINES=6
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision
step which 10 bash -c 'command -v mpirun torchrun; mpirun --version 2>&1 | head -1'
T="train --cpu --epochs 1 --max-steps-per-epoch 3 --batch-size 16 --quiet"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=29531
step mpirun 90 mpirun --allow-run-as-root --oversubscribe -np 2 "$B"/burn-vision $T --out "$OUT/mpi"
step torchrun 90 torchrun --standalone --nproc-per-node 2 --no-python "$B"/burn-vision $T --out "$OUT/torchrun"
step vit_gpu_mixup 150 "$B"/burn-vision train --gpus 0 --model vit-mini --precision bf16 --mixup 0.8 --cutmix 1.0 --epochs 1 --max-steps-per-epoch 20 --quiet --out "$OUT/vit"
rm -rf "$OUT"/mpi "$OUT"/torchrun "$OUT"/vit
