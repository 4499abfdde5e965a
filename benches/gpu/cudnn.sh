#!/usr/bin/env bash
# One device call on one H200: the cuDNN convolution path of burn-vision next to PyTorch.
#  1. burn-ddp-gpu-checks: correctness against an f64 reference (cuDNN fp32, TF32, bf16, f16, burn's
#     kernels), batch norm and fused convolution + batch norm in f32/bf16/f16, the upload;
#  2. every distinct ResNet-50 convolution shape at batch 256 (forward, forward+backward), timed
#     per call (`latency`) and back to back (`pipelined`), f32 and bf16, by burn-vision and by
#     PyTorch (benches/pytorch_conv_shapes.py; bf16 also channels_last);
#  3. ResNet-50 training throughput, 224², batch 256, synthetic data, f32 and bf16:
#     burn-vision vs PyTorch (bf16: autocast, NCHW and channels_last).
# STEPS picks steps (default: all).
# Binaries built on the development machine and carried in carry/ (B=...):
#   cargo build --release --features burn-vision/cuda,burn-ddp/cuda -p burn-vision --bin burn-vision -p burn-ddp-gpu-checks --example plain_burn
# Writes raw logs to $OUT and prints summary tables last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/cudnn.log
SHOW="FAIL|passed, |img_per_s|error|panic"
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$LOG"
ALL="check shapes shapes_pipe shapes_bf16 shapes_bf16_pipe shapes_bf16_nhwc_pipe torch_shapes torch_shapes_pipe torch_shapes_bf16 torch_shapes_bf16_pipe torch_shapes_bf16_nhwc_pipe burn_r50 burn_r50_bf16 burn_r50_bf16_cl torch_r50 torch_r50_bf16 torch_r50_bf16_nhwc"
R50="bench --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 10 --gpus 0"
TR50="benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 3 10"
SH="$B/burn-ddp-gpu-checks --bench convolution --batch 256 --iters 10"
TSH="benches/pytorch_conv_shapes.py 256 10"
for s in ${STEPS:-$ALL}; do
  case $s in
    check)        step burn-ddp-gpu-checks ${T_CHECK:-180} "$B"/burn-ddp-gpu-checks --skip nccl ;;
    shapes)       step burn_shapes ${T_SHAPES:-180} $SH ;;
    shapes_pipe)  step burn_shapes_pipe ${T_SHAPES:-180} $SH --pipelined ;;
    shapes_nhwc_pipe) step burn_shapes_nhwc_pipe ${T_SHAPES:-180} $SH --pipelined --nhwc ;;
    shapes_bf16)  step burn_shapes_bf16 ${T_SHAPES:-180} $SH --dtype bf16 ;;
    shapes_bf16_pipe) step burn_shapes_bf16_pipe ${T_SHAPES:-180} $SH --dtype bf16 --pipelined ;;
    shapes_bf16_nhwc_pipe) step burn_shapes_bf16_nhwc_pipe ${T_SHAPES:-180} $SH --dtype bf16 --pipelined --nhwc ;;
    shapes_bf16_nhwc) step burn_shapes_bf16_nhwc ${T_SHAPES:-180} $SH --dtype bf16 --nhwc ;;
    torch_shapes) step torch_shapes 120 python3 $TSH f32 latency ;;
    torch_shapes_pipe) step torch_shapes_pipe 120 python3 $TSH f32 pipelined ;;
    torch_shapes_nhwc_pipe) step torch_shapes_nhwc_pipe 120 python3 $TSH f32 pipelined nhwc ;;
    torch_shapes_bf16) step torch_shapes_bf16 120 python3 $TSH bf16 latency ;;
    torch_shapes_bf16_pipe) step torch_shapes_bf16_pipe 120 python3 $TSH bf16 pipelined ;;
    torch_shapes_bf16_nhwc_pipe) step torch_shapes_bf16_nhwc_pipe 120 python3 $TSH bf16 pipelined nhwc ;;
    torch_shapes_bf16_nhwc) step torch_shapes_bf16_nhwc 120 python3 $TSH bf16 latency nhwc ;;
    burn_r50)     step burn_r50_synth ${T_R50:-240} "$B"/burn-vision $R50 --channels-first ;;
    burn_r50_cl)  step burn_r50_synth_cl ${T_R50:-240} "$B"/burn-vision $R50 --channels-last ;;
    burn_r50_bf16) step burn_r50_synth_bf16 ${T_R50:-240} "$B"/burn-vision $R50 --precision bf16 --channels-first ;;
    burn_r50_bf16_cl) step burn_r50_synth_bf16_cl ${T_R50:-240} "$B"/burn-vision $R50 --precision bf16 --channels-last ;;
    torch_r50)    step torch_r50_synth 90 python3 $TR50 f32 nchw ;;
    torch_r50_nhwc) step torch_r50_synth_nhwc 90 python3 $TR50 f32 nhwc ;;
    torch_r50_bf16) step torch_r50_synth_bf16 90 python3 $TR50 bf16 nchw ;;
    torch_r50_bf16_nhwc) step torch_r50_synth_bf16_nhwc 90 python3 $TR50 bf16 nhwc ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
save_cache

echo; echo "SUMMARY per ResNet-50 convolution shape, batch 256, ms per call"
python3 - "$LOG" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
rows = {}
pat = r"RESULT framework=(\S+) dtype=(\S+) mode=(\S+) shape=(\S+) .*?fwd_ms=(\S+) fwdbwd_ms=(\S+)"
for fw, dt, mode, shape, f, fb in re.findall(pat, log):
    rows.setdefault((dt, mode), {}).setdefault(shape, {})[fw] = (float(f), float(fb))
pairs = [("NCHW", "burn-cudnn", "pytorch"), ("NHWC", "burn-cudnn-nhwc", "pytorch-nhwc")]
for (dt, mode), shapes in rows.items():
    for layout, burn, torch in pairs:
        have = [s for s, r in shapes.items() if burn in r and torch in r]
        if not have:
            continue
        print(f"\n[{dt}, {mode}, {layout}]  ratio = PyTorch time / burn time (>= 1: burn-vision as fast or faster)")
        print(f"{'shape':22} {'burn fwd':>9} {'torch fwd':>9} {'ratio':>6} {'burn f+b':>9} {'torch f+b':>9} {'ratio':>6}")
        tot = [0.0] * 4
        for shape in have:
            b, t = shapes[shape][burn], shapes[shape][torch]
            tot = [tot[0] + b[0], tot[1] + t[0], tot[2] + b[1], tot[3] + t[1]]
            print(f"{shape:22} {b[0]:9.3f} {t[0]:9.3f} {t[0]/b[0]:6.2f} {b[1]:9.3f} {t[1]:9.3f} {t[1]/b[1]:6.2f}")
        print(f"{'sum':22} {tot[0]:9.3f} {tot[1]:9.3f} {tot[1]/tot[0]:6.2f} {tot[2]:9.3f} {tot[3]:9.3f} {tot[3]/tot[2]:6.2f}")
print()
for name in ["burn_r50_synth", "burn_r50_synth_cl", "torch_r50_synth", "torch_r50_synth_nhwc", "burn_r50_synth_bf16", "burn_r50_synth_bf16_cl", "torch_r50_synth_bf16", "torch_r50_synth_bf16_nhwc"]:
    body = re.search(rf"=== {name}: .*?\n(.*?)=== {name} rc", log, re.S)
    if not body:
        continue
    v = re.search(r'"img_per_s":\s*([0-9.]+)', body.group(1))
    print(f"ResNet-50 train 224² b256 synthetic {name:26} img/s: {v.group(1) if v else 'n/a (see log)'}")
PY
