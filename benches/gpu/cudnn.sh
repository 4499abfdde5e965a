#!/usr/bin/env bash
# One device call on one H200: the cuDNN convolution path of burn-vision next to PyTorch.
#  1. cudnn_check: correctness against an f64 reference (cuDNN fp32, TF32, burn's kernels), then
#     every distinct ResNet-50 convolution shape at batch 256 (forward, forward+backward);
#  2. the same shapes timed by PyTorch (benches/pytorch_conv_shapes.py);
#  3. ResNet-50 training throughput, 224², batch 256, synthetic data: burn-vision vs PyTorch.
# Binaries built on the development machine and carried in carry/ (B=...):
#   cargo build --release -p burn-vision --features cuda --example cudnn_check --bin burn-vision
# Writes raw logs to $OUT and prints summary tables last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/cudnn.log
SHOW="FAIL|cudnn_check=|img_per_s|error|panic"
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/cudnn_check
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$LOG"
for s in ${STEPS:-check shapes torch_shapes burn_r50 torch_r50}; do
  case $s in
    check)        step cudnn_check ${T_CHECK:-120} "$B"/cudnn_check check ;;
    shapes)       step burn_shapes ${T_SHAPES:-180} "$B"/cudnn_check bench --batch 256 --iters 10 ;;
    torch_shapes) step torch_shapes 120 python3 benches/pytorch_conv_shapes.py 256 10 ;;
    burn_r50)     step burn_r50_synth ${T_R50:-240} "$B"/burn-vision bench --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --warmup 3 --steps 10 --gpus 0 ;;
    torch_r50)    step torch_r50_synth 90 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 2 10 ;;
  esac
done
save_cache

echo; echo "SUMMARY per ResNet-50 convolution shape, batch 256, fp32 NCHW (TF32 allowed), ms per call"
python3 - "$LOG" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
rows = {}
for fw, shape, f, fb in re.findall(r"RESULT framework=(\S+) shape=(\S+) .*?fwd_ms=(\S+) fwdbwd_ms=(\S+)", log):
    rows.setdefault(shape, {})[fw] = (float(f), float(fb))
print(f"{'shape':22} {'burn fwd':>9} {'torch fwd':>9} {'ratio':>6} {'burn f+b':>9} {'torch f+b':>9} {'ratio':>6} {'strided f+b':>11}")
tot = [0.0, 0.0, 0.0, 0.0, 0.0]
for shape, r in rows.items():
    b, t, st = r.get("burn-cudnn"), r.get("pytorch"), r.get("burn-cudnn-strided", (float("nan"),) * 2)
    if not (b and t):
        print(f"{shape:22} incomplete: {r}"); continue
    tot = [tot[0] + b[0], tot[1] + t[0], tot[2] + b[1], tot[3] + t[1], tot[4] + st[1]]
    print(f"{shape:22} {b[0]:9.3f} {t[0]:9.3f} {t[0]/b[0]:6.2f} {b[1]:9.3f} {t[1]:9.3f} {t[1]/b[1]:6.2f} {st[1]:11.3f}")
if tot[0]:
    print(f"{'sum':22} {tot[0]:9.3f} {tot[1]:9.3f} {tot[1]/tot[0]:6.2f} {tot[2]:9.3f} {tot[3]:9.3f} {tot[3]/tot[2]:6.2f} {tot[4]:11.3f}")
print("(ratio = PyTorch time / burn time: >= 1 means burn-vision is as fast or faster)")
m = re.findall(r'"img_per_s":\s*([0-9.]+)', log)
for name in ["burn_r50_synth", "torch_r50_synth"]:
    body = re.search(rf"=== {name}: .*?\n(.*?)=== {name} rc", log, re.S)
    v = re.search(r'"img_per_s":\s*([0-9.]+)', body.group(1)) if body else None
    print(f"ResNet-50 train 224² b256 synthetic {name:16} img/s: {v.group(1) if v else 'n/a'}")
PY
