#!/usr/bin/env bash
# One device call on one H200: where the GPU logits' error comes from. PyTorch's own
# f32 GPU logits against the f64 golden ones (TF32 off; cudnn.benchmark on and off; NCHW and
# channels_last), then ours with cuDNN off, and with TF32 off + deterministic algorithms.
# Binary: carry/bins.txz with weights_check (see benches/gpu/weights.sh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; LOG=$OUT/diag.log; SHOW="^\|"; SHOW_LINES=30
source benches/gpu/lib.sh
chmod +x "$B"/weights_check
W=/tmp/w; mkdir -p $W/f $W/full
python3 benches/weights/make_weights.py fixtures $W/f > /dev/null
python3 benches/weights/make_weights.py full $W/full > /dev/null
step torch_fixtures 200 python3 benches/weights/make_weights.py torch_gpu $W/f
step torch_full 200 python3 benches/weights/make_weights.py torch_gpu $W/full
step ours_nocudnn 200 env BURN_DDP_CUDNN=0 "$B"/weights_check $W/f --gpu
step ours_det 200 env BURN_DDP_CUDNN_TF32=0 BURN_DDP_CUDNN_DETERMINISTIC=1 "$B"/weights_check $W/f --gpu
