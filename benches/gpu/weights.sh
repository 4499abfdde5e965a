#!/usr/bin/env bash
# One device call on one H200: the PyTorch weight import/export proof.
# 1. make_weights.py writes the CI fixtures (small torchvision/timm ResNets, golden logits) and
#    the full-size models (torchvision resnet50 .pth, timm resnet50 .safetensors, random init
#    with random BatchNorm statistics) with PyTorch's float64 eval-mode logits;
# 2. weights_check loads each into our model and compares logits on the CPU and on the GPU
#    (NCHW and channels-last; TF32 off for the f32 comparison, then on, as PyTorch's default),
#    and exports the full-size ones as .pth and .safetensors;
# 3. PyTorch loads our exports with load_state_dict(strict=True) and compares its logits.
# Binary built on the development machine and carried in carry/bins.txz:
#   cargo build --release --features cuda -p burn-vision --example weights_check
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/weights.log
SHOW="^\||check|rror|FAIL|bytes"
SHOW_LINES=12
source benches/gpu/lib.sh
chmod +x "$B"/weights_check
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
python3 -c "import torch, torchvision, timm; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__)" | tee -a "$LOG"
W=/tmp/weights; rm -rf $W; mkdir -p $W/fixtures $W/full $W/export
step fixtures 200 python3 benches/weights/make_weights.py fixtures $W/fixtures
step full 300 python3 benches/weights/make_weights.py full $W/full
step ours_fixtures 200 env BURN_DDP_CUDNN_TF32=0 "$B"/weights_check $W/fixtures --gpu
step ours_full 300 env BURN_DDP_CUDNN_TF32=0 "$B"/weights_check $W/full --gpu --export $W/export
step ours_full_tf32 300 "$B"/weights_check $W/full --gpu
step torch_loads_ours 200 python3 benches/weights/make_weights.py check $W/full \
  tv_resnet50=$W/export/tv_resnet50.pth tv_resnet50=$W/export/tv_resnet50.safetensors \
  timm_resnet50=$W/export/timm_resnet50.pth timm_resnet50=$W/export/timm_resnet50.safetensors
tar czf "$OUT/fixtures.tgz" -C $W fixtures
echo; echo "SUMMARY"
grep -E "^=== .* rc=|^\| |^check " "$LOG"
