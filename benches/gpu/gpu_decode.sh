#!/usr/bin/env bash
# JPEGs decoded on the GPU (nvJPEG, crop/resize/flip/normalise in one kernel) against the CPU
# decode, on ImageNet-size photos, with PyTorch's DataLoader beside:
#   benches/make_photos.py: 9,600 photos, 500x375 JPEG q90, 8 classes (scikit-image's samples)
#   burn-ddp-gpu-checks crop-resize jpeg-decode (the photos added to the decode check's JPEGs)
#   burn-vision bench-data b256, 30 batches, RandomResizedCrop 224 + flip + normalise, to GPU 0:
#     --decode cpu / gpu alternated twice
#   ResNet-50 bf16 b256 SGD: `bench` on synthetic batches, then `train` 3 epochs on the photos
#     with --decode gpu and --decode cpu (steady img/s, data wait, accuracy), each under a
#     wrapper that reports the host cores busy (CPU seconds / wall seconds)
#   PyTorch 2.11: the same model on the same folder, DataLoader(16 workers), bf16 autocast,
#     channels_last, SGD (benches/pytorch_baseline.py folder), and on synthetic batches
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/gpu_decode.log; SHOW="img_per_s|RESULT|CORES|rror|panick|val loss|^ok|^FAIL|passed|decoding"; SHOW_LINES=${SHOW_LINES:-6}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
D=/tmp/photos
echo "host: $(nproc) cores" | tee -a "$LOG"
cores() {
  python3 -c '
import resource, subprocess, sys, time
t = time.time(); rc = subprocess.call(sys.argv[1:]); wall = time.time() - t
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"CORES busy {(u.ru_utime + u.ru_stime) / wall:.2f} over {wall:.1f} s wall (user {u.ru_utime:.1f} s, system {u.ru_stime:.1f} s)", flush=True)
sys.exit(rc)' "$@"
}
step photos 300 python3 benches/make_photos.py $D/folder 1200
BURN_DDP_CHECK_JPEGS=$D/folder step checks 200 "$B"/burn-ddp-gpu-checks crop-resize jpeg-decode
for i in 1 2; do
  SHOW_LINES=2 step "data_cpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode cpu
  SHOW_LINES=2 step "data_gpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
done
step r50_synthetic 200 "$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30
T="train --gpus 0 --model resnet50 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data $D/folder"
step train_gpu_decode 300 cores "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu
step train_cpu_decode 300 cores "$B"/burn-vision $T --decode cpu --out $OUT/run-cpu
step torch_folder 300 cores python3 benches/pytorch_baseline.py folder $D/folder 256 30 nhwc bf16 16
step torch_synthetic 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 8 0 5 30 bf16 nhwc eager
save_cache
grep -hE "img_per_s|RESULT check|CORES|after warm-up|^=== .*rc=" "$LOG" | cut -c1-300 > "$OUT/summary.txt"
cat "$OUT/summary.txt"
