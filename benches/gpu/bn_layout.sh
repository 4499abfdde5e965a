#!/usr/bin/env bash
# One device call on one H200: why channels-last ResNet-50 training is slow (session 5).
#  1. batch norm + ReLU, forward + backward, on ResNet-50's activation shapes, bf16, NCHW
#     (cuDNN) vs NHWC (`nn::batch_norm_nhwc`; in call d, before it existed, cuDNN's NHWC kernels);
#  2. the same with cuDNN ordered on the host (in call d: cuDNN's persistent NHWC kernels, a path
#     since removed; now the NCHW half differs only in ordering);
#  3. ResNet-50 bf16 channels-last training with BURN_VISION_CUDNN_BN=0;
#  4. the same, cuDNN ordered on the host;
#  5. bn_<order> / r50_<order>: batch_norm_nhwc's reduction orders (BURN_VISION_BN_NHWC_REDUCE),
#     bench-bn and ResNet-50 bf16 channels-last, next to PyTorch channels_last (torch_r50);
#  6. bn_ops / r50_ops: channels-last batch norm from burn's operations instead of burn-vision's
#     own kernels (BURN_VISION_BN_KERNELS=0, session 6), to compare with `bn` / `r50_nhw`.
# Binaries as for cudnn.sh (carry/bins.tgz). Writes raw logs to $OUT, summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/bn_layout.log
SHOW="FAIL|img_per_s|error|panic|RESULT bn"
SHOW_LINES=20
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/cudnn_check
R50="bench --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 10 --gpus 0 --precision bf16 --channels-last"
for s in ${STEPS:-bn bn_whn bn_flat bn_matmul r50_nhw torch_r50}; do
  case $s in
    bn)          step bn_device 120 "$B"/cudnn_check bench-bn ;;
    bn_host)     step bn_host 120 env BURN_VISION_CUDNN_HOST_SYNC=1 "$B"/cudnn_check bench-bn ;;
    r50_burn_bn) step r50_bf16_cl_burn_bn ${T_R50:-150} env BURN_VISION_CUDNN_BN=0 "$B"/burn-vision $R50 ;;
    r50_host)    step r50_bf16_cl_host ${T_R50:-150} env BURN_VISION_CUDNN_HOST_SYNC=1 "$B"/burn-vision $R50 ;;
    bn_ops)      step bn_ops 120 env BURN_VISION_BN_KERNELS=0 "$B"/cudnn_check bench-bn ;;
    r50_ops)     step r50_bf16_cl_ops ${T_R50:-150} env BURN_VISION_BN_KERNELS=0 "$B"/burn-vision $R50 ;;
    bn_whn|bn_nhw|bn_flat|bn_matmul) step "$s" 120 env BURN_VISION_BN_NHWC_REDUCE=${s#bn_} "$B"/cudnn_check bench-bn ;;
    r50_whn|r50_nhw|r50_flat|r50_matmul) step "r50_bf16_cl_${s#r50_}" ${T_R50:-150} env BURN_VISION_BN_NHWC_REDUCE=${s#r50_} "$B"/burn-vision $R50 ;;
    torch_r50) step torch_r50_bf16_nhwc 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 10 bf16 nhwc ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
save_cache
echo; echo "SUMMARY"
grep -E "^=== |RESULT bn|img_per_s" "$LOG" | sed -E 's/.*"img_per_s":([0-9.]+).*/img_per_s \1/' | cut -c1-160
