#!/usr/bin/env bash
# One device call on one H200: the ViT weight files on the GPU after attention_f32 / linear_f32
# (f32 products f32-accurate on burn-cuda): timm vit_small_patch16_224, torchvision vit_b_16 and
# the small ViT fixtures, against PyTorch's f64 logits, with BURN_DDP_CUDNN_TF32=0.
# Binary: carry/bins.txz with weights_check (see benches/gpu/weights.sh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/weights-vit-gpu.log; SHOW="^\||rror"; SHOW_LINES=30
source benches/gpu/lib.sh
chmod +x "$B"/weights_check
W=/tmp/weights; rm -rf $W; mkdir -p $W/fixtures $W/full
keep_vits() { python3 -c "import json,sys; p=sys.argv[1]+'/golden.json'; m=json.load(open(p)); m['models']={k:v for k,v in m['models'].items() if 'vit' in k}; json.dump(m, open(p,'w'))" "$1"; }
step fixtures 60 python3 benches/weights/make_weights.py fixtures $W/fixtures
step full 60 python3 benches/weights/make_weights.py full $W/full
keep_vits $W/fixtures; keep_vits $W/full
step ours_vit_full 200 env BURN_DDP_CUDNN_TF32=0 "$B"/weights_check $W/full --gpu
step ours_vit_fixtures 100 env BURN_DDP_CUDNN_TF32=0 "$B"/weights_check $W/fixtures --gpu
