#!/usr/bin/env bash
# One device call on one H200: why channels-last ResNet-50 training is slow (session 5).
#  1. batch norm + ReLU, forward + backward, on ResNet-50's activation shapes, bf16, NCHW vs
#     NHWC (cuDNN ordered on the device: plain spatial kernels);
#  2. the same with the host ordering cuDNN (persistent kernels for NHWC);
#  3. ResNet-50 bf16 channels-last training with burn's batch norm instead of cuDNN's;
#  4. ResNet-50 bf16 channels-last training with host ordering (persistent batch norm);
#  5. (after nn::batch_norm_nhwc) its reduction orders: bench-bn and ResNet-50 bf16
#     channels-last per BURN_VISION_BN_NHWC_REDUCE value, next to PyTorch channels_last.
# Binaries as for cudnn.sh (carry/bins.tgz). Writes raw logs to $OUT, summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/bn_layout.log
SHOW="FAIL|img_per_s|error|panic|RESULT bn"
SHOW_LINES=20
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/cudnn_check
R50="bench --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 10 --gpus 0 --precision bf16 --channels-last"
for s in ${STEPS:-bn bn_host r50_burn_bn r50_host}; do
  case $s in
    bn)          step bn_device 120 "$B"/cudnn_check bench-bn ;;
    bn_host)     step bn_host 120 env BURN_VISION_CUDNN_HOST_SYNC=1 "$B"/cudnn_check bench-bn ;;
    r50_burn_bn) step r50_bf16_cl_burn_bn ${T_R50:-150} env BURN_VISION_CUDNN_BN=0 "$B"/burn-vision $R50 ;;
    r50_host)    step r50_bf16_cl_host ${T_R50:-150} env BURN_VISION_CUDNN_HOST_SYNC=1 "$B"/burn-vision $R50 ;;
    bn_whn|bn_nhw|bn_flat|bn_matmul) step "$s" 120 env BURN_VISION_BN_NHWC_REDUCE=${s#bn_} "$B"/cudnn_check bench-bn ;;
    r50_whn|r50_nhw|r50_flat|r50_matmul) step "r50_bf16_cl_${s#r50_}" ${T_R50:-150} env BURN_VISION_BN_NHWC_REDUCE=${s#r50_} "$B"/burn-vision $R50 ;;
    torch_r50) step torch_r50_bf16_nhwc 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 10 bf16 nhwc ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
save_cache
echo; echo "SUMMARY"
grep -E "^=== |RESULT bn|img_per_s" "$LOG" | sed -E 's/.*"img_per_s":([0-9.]+).*/img_per_s \1/' | cut -c1-160
