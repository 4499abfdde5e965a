#!/usr/bin/env bash
# One device call on one H200: the full-size weight files (torchvision resnet50 and vit_b_16,
# timm resnet50 and vit_small_patch16_224) against PyTorch's f64 logits on the CPU, exported,
# and loaded back by PyTorch with strict=True; plus the CI fixtures (fixtures.tgz).
# Binary: carry/bins.txz with weights_check (see benches/gpu/weights.sh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; LOG=$OUT/weights-vit.log; SHOW="^\||check|rror"; SHOW_LINES=30
source benches/gpu/lib.sh
chmod +x "$B"/weights_check
W=/tmp/weights; rm -rf $W; mkdir -p $W/fixtures $W/full $W/export
step fixtures 100 python3 benches/weights/make_weights.py fixtures $W/fixtures
tar czf "$OUT/fixtures.tgz" -C $W fixtures
step full 100 python3 benches/weights/make_weights.py full $W/full
step ours_full_cpu 100 "$B"/weights_check $W/full --export $W/export
step torch_loads_ours 100 python3 benches/weights/make_weights.py check $W/full tv_vit_b16=$W/export/tv_vit_b16.pth tv_vit_b16=$W/export/tv_vit_b16.safetensors timm_vit_s16=$W/export/timm_vit_s16.pth timm_vit_s16=$W/export/timm_vit_s16.safetensors tv_resnet50=$W/export/tv_resnet50.pth timm_resnet50=$W/export/timm_resnet50.safetensors
