#!/usr/bin/env bash
# One device call on one H200: `eval` and `predict` on the GPU. A short ResNet-34
# training run on 224² JPEG class folders (the bundled 10k Fashion-MNIST images, 20 % held out
# = 2,000 validation images) makes the checkpoint; then `eval` on the checkpoint's own GPU (no
# flag), `eval --gpus 0`, and `predict --gpus 0` on a class folder with one broken file.
# Binary built on the development machine and carried in carry/:
#   cargo build --release --features burn-vision/cuda -p burn-vision --bin burn-vision
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/inference.log
SHOW="images|error|done:|not predicted|could not"
SHOW_LINES=4
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
D=datasets/fashion-mnist-10k
[ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
rm -rf /tmp/r34
step train_r34 300 "$B"/burn-vision train --data /tmp/fm224 --model resnet34 --epochs 1 --max-steps-per-epoch 10 --batch-size 64 --val-fraction 0.2 --gpus 0 --quiet --out /tmp/r34
step eval_default 200 "$B"/burn-vision eval --checkpoint /tmp/r34/best.ckpt
step eval_gpu0 200 "$B"/burn-vision eval --gpus 0 --checkpoint /tmp/r34/best.ckpt
mkdir -p /tmp/pred && cp /tmp/fm224/Bag/*.jpg /tmp/pred/ && echo "not a jpeg" > /tmp/pred/broken.jpg
step predict_gpu0 200 "$B"/burn-vision predict --gpus 0 --checkpoint /tmp/r34/best.ckpt /tmp/pred
echo; echo "SUMMARY (wall seconds per step, the eval lines)"
grep -E "^=== .* rc=|images \(" "$LOG"
