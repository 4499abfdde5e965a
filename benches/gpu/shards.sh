#!/usr/bin/env bash
# The input pipeline on ImageNet-size JPEGs read from a class folder against the same images
# as WebDataset tar shards (CPU decode both), then a short training run on each.
#   benches/make_photos.py: 9,600 photos, 500x375 JPEG q90, 8 classes (scikit-image's samples)
#   xtask data shards: the same images as 20 shards of 480 (classes mixed)
#   burn-vision bench-data b256, 30 batches, RandomResizedCrop 224 + flip + normalise:
#     folder / shards alternated twice to host memory, then once each up to GPU 0
#   burn-vision train --gpus 0 --decode cpu, ResNet-18 bf16 b128, 3 epochs, on each (speed,
#     accuracy; the CPU decode, as the comparison is of reading, not decoding)
# PART=2: after the photos and shards, bench-data folder / shards alternated three times to
#   host memory, then benches/gpu_decode_probe.py: nvJPEG through torchvision on the same
#   photos (GPU decode alone, and with RandomResizedCrop + flip + normalise on the GPU).
# Binaries: carry/bins.txz (burn-vision, xtask).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/shards${PART:-1}.log; SHOW="img_per_s|wrote|rror|panick|val_acc|epoch [0-9]"; SHOW_LINES=${SHOW_LINES:-4}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/xtask
D=/tmp/photos
echo "host: $(nproc) cores; $(git rev-parse --short HEAD 2>/dev/null || echo this tree)" | tee -a "$LOG"
step photos 300 python3 benches/make_photos.py $D/folder 1200
step shards 200 "$B"/xtask data shards $D/folder $D/shards 480
du -sh $D/folder $D/shards | tee -a "$LOG"
if [ "${PART:-1}" = 2 ]; then
  for i in 1 2 3; do
    SHOW_LINES=1 step "folder_host_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30
    SHOW_LINES=1 step "shards_host_$i" 150 "$B"/burn-vision bench-data --data $D/shards --batches 30
  done
  SHOW="img_per_s" SHOW_LINES=3 step nvjpeg_probe 200 python3 benches/gpu_decode_probe.py $D/folder 256 30
else
  for i in 1 2; do
    SHOW_LINES=1 step "folder_host_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30
    SHOW_LINES=1 step "shards_host_$i" 150 "$B"/burn-vision bench-data --data $D/shards --batches 30
  done
  SHOW_LINES=1 step folder_gpu 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0
  SHOW_LINES=1 step shards_gpu 150 "$B"/burn-vision bench-data --data $D/shards --batches 30 --gpus 0
  T="train --gpus 0 --model resnet18 --epochs 3 --batch-size 128 --precision bf16 --optimizer sgd --lr 0.1 --decode cpu"
  step train_folder 300 "$B"/burn-vision $T --data $D/folder --out $OUT/run-folder
  step train_shards 300 "$B"/burn-vision $T --data $D/shards --out $OUT/run-shards
fi
save_cache
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
rows = []
name = None
for line in open(sys.argv[1]):
    m = re.match(r"=== (\S+):", line)
    if m:
        name = m.group(1)
    if line.startswith("{") and "img_per_s" in line and name:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        rows.append((r.get("what", name), r.get("img_per_s")))
print("summary (img/s):")
for n, v in rows:
    print(f"  {n:60s} {v:9.0f}" if isinstance(v, (int, float)) else f"  {n:16s} {v}")
PY
