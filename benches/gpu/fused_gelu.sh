#!/usr/bin/env bash
# What the fused bias + GELU (`burn_ddp::nn::linear_gelu`, one kernel each way) buys a ViT's MLP,
# in one device call on one H200:
#   1. `burn-ddp-gpu-checks bias-gelu relu products` (the kernel against f64, f32/bf16/f16);
#   2. ViT-B/16 bf16 b128 and ViT-S/16 bf16 b256, synthetic 224², SGD: ours with the kernel
#      (`BURN_DDP_GELU=1`) and without (the default while the kernel is new: burn's addition,
#      gelu and its backward), alternated twice, beside
#      PyTorch 2.11 eager and torch.compile (the same batch, optimizer and step count);
#   3. with PROFILE=1, ViT-B/16's step by class of kernel (benches/gpu/step_profile.sh PART=2,
#      ours only), to set beside 2026-12-04's table in docs/benchmarks.md.
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/fused_gelu.log; the img/s lines last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/fused_gelu.log; SHOW="RESULT|img_per_s|rror|panick|FAIL"; SHOW_LINES=${SHOW_LINES:-12}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv | tee -a "$LOG"
STEPS=${STEPS:-30}
VB=(bench --gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
VS=(bench --gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
step checks 300 "$B"/burn-ddp-gpu-checks bias-gelu relu products
# The first runs of each model and variant fill the kernel caches; they are not in the pairs.
step vitb16_warm 300 env BURN_DDP_GELU=1 "$B"/burn-vision "${VB[@]}"
step vitb16_warm_burn_gelu 300 "$B"/burn-vision "${VB[@]}"
for i in 1 2; do
  step vitb16_fused_$i 150 env BURN_DDP_GELU=1 "$B"/burn-vision "${VB[@]}"
  step vitb16_burn_gelu_$i 150 "$B"/burn-vision "${VB[@]}"
done
step vitb16_torch 120 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw eager
step vitb16_compile 300 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw compile
step vits16_warm 300 env BURN_DDP_GELU=1 "$B"/burn-vision "${VS[@]}"
step vits16_warm_burn_gelu 300 "$B"/burn-vision "${VS[@]}"
for i in 1 2; do
  step vits16_fused_$i 150 env BURN_DDP_GELU=1 "$B"/burn-vision "${VS[@]}"
  step vits16_burn_gelu_$i 150 "$B"/burn-vision "${VS[@]}"
done
step vits16_torch 120 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 5 "$STEPS" bf16 nchw eager
step vits16_compile 300 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 5 "$STEPS" bf16 nchw compile
save_cache
if [ -n "${PROFILE:-}" ]; then
  BURN_DDP_GELU=1 PART=2 OURS_ONLY=1 bash benches/gpu/step_profile.sh
fi
echo; echo SUMMARY | tee -a "$LOG"
# Per run: img/s, GPU memory, the fused kernel's passes (ours) or peak memory (PyTorch); then
# each pair's ratio and ours against torch.compile.
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
runs, name = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"=== (\S+): ", line)
    if m:
        name = m.group(1); continue
    if re.match(r"=== \S+ rc=", line):
        name = None; continue
    line = line.strip()
    if name and (line.startswith("{") or line.startswith("RESULT {")) and "img_per_s" in line:
        runs[name] = json.loads(line[line.index("{"):])
    if name == "checks" and line.startswith("RESULT check=bias_gelu"):
        print(line)
for n, r in runs.items():
    extra = f"gelu_kernel_passes={r.get('gelu_kernel_passes')} device_used_gib={r.get('device_used_gib')}" if "gelu_kernel_passes" in r else f"peak_mem_gib={r.get('peak_mem_gib')}"
    print(f"{n}: {r['img_per_s']:.0f} img/s {extra}")
for model in ("vitb16", "vits16"):
    comp = runs.get(f"{model}_compile", {}).get("img_per_s")
    for i in (1, 2):
        f, b = runs.get(f"{model}_fused_{i}"), runs.get(f"{model}_burn_gelu_{i}")
        if f and b:
            vs = f" ; fused / torch.compile {f['img_per_s'] / comp:.3f}, burn's gelu / torch.compile {b['img_per_s'] / comp:.3f}" if comp else ""
            print(f"{model} pair {i}: fused / burn's gelu {f['img_per_s'] / b['img_per_s']:.3f}{vs}")
PY
