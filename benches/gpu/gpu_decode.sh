#!/usr/bin/env bash
# JPEGs decoded on the GPU (nvJPEG, crop/resize/flip/normalise in one kernel) against the CPU
# decode, on ImageNet-size photos, with PyTorch's DataLoader beside:
#   benches/make_photos.py: 9,600 photos, 500x375 JPEG q90, 8 classes (scikit-image's samples)
#   burn-ddp-gpu-checks crop-resize jpeg-decode (the photos added to the decode check's JPEGs)
#   burn-vision bench-data b256, 30 batches, RandomResizedCrop 224 + flip + normalise, to GPU 0:
#     --decode cpu / gpu alternated twice
#   ResNet-50 bf16 b256 SGD: `bench` on synthetic batches, then `train` 3 epochs on the photos
#     with --decode gpu, cpu, gpu (steady img/s, data wait, accuracy), each under a
#     wrapper that reports the host cores busy (CPU seconds / wall seconds)
#   PyTorch 2.11: the same model on the same folder, DataLoader(16 workers), bf16 autocast,
#     channels_last, SGD (benches/pytorch_baseline.py folder), and on synthetic batches
# PART=2 leaves out the checks and bench-data (the training rows alone).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/gpu_decode.log; SHOW="img_per_s|RESULT|CORES|rror|panick|val loss|^ok|^FAIL|passed|decoding"; SHOW_LINES=${SHOW_LINES:-6}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
D=/tmp/photos
echo "host: $(nproc) cores" | tee -a "$LOG"
CORES="python3 benches/cores_busy.py"   # reports the host cores a command kept busy
step photos 300 python3 benches/make_photos.py $D/folder 1200
if [ "${PART:-1}" = 1 ]; then
BURN_DDP_CHECK_JPEGS=$D/folder step checks 200 "$B"/burn-ddp-gpu-checks crop-resize jpeg-decode
for i in 1 2; do
  SHOW_LINES=2 step "data_cpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode cpu
  SHOW_LINES=2 step "data_gpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
done
fi
step r50_synthetic 200 "$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30
T="train --gpus 0 --model resnet50 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data $D/folder"
step train_gpu_decode 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu
step train_cpu_decode 300 $CORES "$B"/burn-vision $T --decode cpu --out $OUT/run-cpu
step train_gpu_decode_2 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu-2
step torch_folder 300 $CORES python3 benches/pytorch_baseline.py folder $D/folder 256 30 nhwc bf16 16
step torch_synthetic 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 8 0 5 30 bf16 nhwc eager
save_cache
grep -hE "img_per_s|RESULT check|CORES|after warm-up|^=== .*rc=" "$LOG" | cut -c1-300 > "$OUT/summary.txt"
cat "$OUT/summary.txt"
