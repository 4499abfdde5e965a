#!/usr/bin/env bash
# What fusing a residual block's end buys on ResNet-50: `relu(bn(x) + identity)` as one pass of
# burn-ddp's channels-last batch-norm kernels each way (`nn::batch_norm_add_relu`, on by default;
# `BURN_DDP_FUSE_ADD=0` runs the batch norm, burn's addition and `nn::relu` instead), in one
# device call on one H200:
#   1. `burn-ddp-gpu-checks bn-add-relu batch-norm conv-bn-relu sync-batch-norm` (NO_CHECKS=1
#      leaves them out): the fused end against burn on the CPU, and the batch-norm paths the
#      change touched;
#   2. ResNet-50 bf16 b256 channels-last, synthetic 224², SGD: fused and unfused alternated
#      twice after one warm run each, beside PyTorch 2.11 eager and torch.compile (the same
#      batch, optimizer and step count).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/resnet_block_end.log; each pair's ratios last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/resnet_block_end.log; SHOW="RESULT|img_per_s|rror|panick|FAIL"; SHOW_LINES=${SHOW_LINES:-4}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv | tee -a "$LOG"
STEPS=${STEPS:-30}
R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
[ -n "${NO_CHECKS:-}" ] || step checks 300 "$B"/burn-ddp-gpu-checks bn-add-relu batch-norm conv-bn-relu sync-batch-norm
for v in fused unfused; do step warm_$v 300 env BURN_DDP_FUSE_ADD=$([ $v = fused ] && echo 1 || echo 0) "$B"/burn-vision "${R50[@]}"; done
for i in 1 2; do
  step fused_$i 150 env BURN_DDP_FUSE_ADD=1 "$B"/burn-vision "${R50[@]}"
  step unfused_$i 150 env BURN_DDP_FUSE_ADD=0 "$B"/burn-vision "${R50[@]}"
done
[ -n "${NO_TORCH:-}" ] || {
  step torch 150 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc eager
  step compile 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc compile
}
save_cache
echo; echo SUMMARY | tee -a "$LOG"
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
runs, name, checks = {}, None, [0, 0]
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"=== (\S+): ", line)
    if m:
        name = m.group(1); continue
    if re.match(r"=== \S+ rc=", line):
        name = None; continue
    line = line.strip()
    if name and (line.startswith("{") or line.startswith("RESULT {")) and "img_per_s" in line:
        runs[name] = json.loads(line[line.index("{"):])
    if name == "checks" and line.startswith("RESULT check="):
        checks[0 if line.endswith(" ok") else 1] += 1
        if "bn_add_relu" in line or not line.endswith(" ok"):
            print(line)
print(f"checks: {checks[0]} ok, {checks[1]} failed")
for n, r in runs.items():
    mem = r.get("device_used_gib") or r.get("peak_mem_gib")
    first = (r.get("first_step") or {}).get("total_s")
    print(f"{n}: {r['img_per_s']:.0f} img/s, GPU memory {mem:.2f} GiB, first step done {first:.1f} s after start")
comp = runs.get("compile", {}).get("img_per_s")
for i in (1, 2):
    f, u = (runs.get(f"{v}_{i}", {}).get("img_per_s") for v in ("fused", "unfused"))
    if f and u:
        extra = f", fused / torch.compile {f / comp:.3f}, unfused / torch.compile {u / comp:.3f}" if comp else ""
        print(f"round {i}: fused / unfused {f / u:.3f}{extra}")
PY
