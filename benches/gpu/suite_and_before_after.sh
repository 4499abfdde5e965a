#!/usr/bin/env bash
# PART=1  The GPU check suite, then ResNet-50 bf16 b256 training speed of this tree's binary
#         against a binary built from an earlier commit, alternated in one call, with PyTorch
#         eager beside them: what a change that moves code (no new computation) must leave as it was.
#           `burn-ddp-gpu-checks` (every check, NCCL's included: a line per check, `N passed, N failed`)
#           `burn-vision bench` ResNet-50 bf16 b256, before / after, alternated three times, and
#           `benches/pytorch_baseline.py ... eager` (SGD on both sides) once
# PART=2  ViT-B/16 bf16 b128 with AdamW: `burn-vision bench --optimizer adamw` twice beside
#         PyTorch's AdamW(fused=True), eager and torch.compile; then `burn-vision train --gpus 0`
#         for one short epoch (the command line after its rewrite)
# PART=3  The host-bound DDP row: ResNet-18 on 28² images, b256 bf16, 300 steps, `bench` plain
#         and `--ddp` (a one-rank NCCL group) alternated twice, then each once under
#         `--host-profile` (burn-vision-host-profile: built with --features host-profile, its
#         symbols kept) to see where the DDP run's extra host time goes
# Binaries: carry/bins.txz (burn-vision, burn-vision-before, burn-ddp-gpu-checks);
# kernel caches carry/kernel-cache.tgz. BEFORE names the earlier commit in the log.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/suite_and_before_after${PART:-1}.log; SHOW="^ok |^FAIL |passed, |img_per_s|done:|rror|panick"; SHOW_LINES=${SHOW_LINES:-30}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-vision-before "$B"/burn-ddp-gpu-checks "$B"/burn-vision-host-profile 2>/dev/null
echo "before: ${BEFORE:-unknown commit}; after: $(git rev-parse --short HEAD 2>/dev/null || echo this tree)" | tee -a "$LOG"
R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
V="--gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
if [ "${PART:-1}" = 1 ]; then
  step suite 420 "$B"/burn-ddp-gpu-checks
  for i in 1 2 3; do
    SHOW_LINES=2 step "r50_before_$i" 150 "$B"/burn-vision-before bench $R
    SHOW_LINES=2 step "r50_after_$i" 150 "$B"/burn-vision bench $R
  done
  SHOW_LINES=2 step r50_torch_eager 150 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 30 bf16 nhwc eager
elif [ "${PART:-1}" = 4 ]; then
  step checks 200 "$B"/burn-ddp-gpu-checks adamw sgd
  S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
  SHOW_LINES=2 step vitb_fused_adamw_1 150 "$B"/burn-vision bench $V --optimizer adamw
  SHOW_LINES=2 step vitb_burn_adamw_1 150 "$B"/burn-vision bench $V --optimizer adamw --burn-optimizer
  SHOW_LINES=2 step vitb_fused_adamw_2 150 "$B"/burn-vision bench $V --optimizer adamw
  SHOW_LINES=2 step vitb_burn_adamw_2 150 "$B"/burn-vision bench $V --optimizer adamw --burn-optimizer
  SHOW_LINES=2 step vitb_torch_eager 150 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 30 bf16 nchw eager adamw
  SHOW_LINES=2 step vitb_torch_compile 300 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 30 bf16 nchw compile adamw
  SHOW_LINES=2 step vits_fused_adamw 150 "$B"/burn-vision bench $S --optimizer adamw
  SHOW_LINES=2 step vits_torch_eager 150 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 5 30 bf16 nchw eager adamw
  SHOW_LINES=2 step vits_torch_compile 300 python3 benches/pytorch_baseline.py synthetic timm:vit_small_patch16_224 256 224 3 1000 0 5 30 bf16 nchw compile adamw
elif [ "${PART:-1}" = 3 ]; then
  for i in 1 2; do
    SHOW_LINES=1 step "r18_plain_$i" 150 "$B"/burn-vision "${R18B[@]}"
    SHOW_LINES=1 step "r18_ddp_$i" 150 "$B"/burn-vision "${R18B[@]}" --ddp
  done
  for run in plain ddp; do
    extra=""; [ $run = ddp ] && extra="--ddp"
    SHOW_LINES=1 step "r18_profiled_$run" 200 "$B"/burn-vision-host-profile "${R18B[@]}" $extra --host-profile "$OUT/host-profile-r18-$run"
    head -c 4000 "$OUT/host-profile-r18-$run/host-profile.txt" 2>/dev/null | tee -a "$LOG"
  done
else
  for i in 1 2; do
    SHOW_LINES=2 step "vitb_adamw_ours_$i" 150 "$B"/burn-vision bench $V --optimizer adamw
  done
  SHOW_LINES=2 step vitb_adamw_torch_eager 150 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 30 bf16 nchw eager adamw
  SHOW_LINES=2 step vitb_adamw_torch_compile 300 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 30 bf16 nchw compile adamw
  SHOW_LINES=3 step train_cli 240 "$B"/burn-vision train --gpus 0 --epochs 1 --max-steps-per-epoch 40 --quiet --out "$OUT/run"
fi
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
log = open(sys.argv[1]).read()
rows = {}
for name, body in re.findall(r"=== ((?:r50|r18|vitb|vits)_\w+): .*?\n(.*?)=== \1 rc", log, re.S):
    m = re.search(r'"img_per_s":\s*([0-9.]+)', body) or re.search(r"img_per_s[=: ]+([0-9.]+)", body)
    rows[name] = float(m.group(1)) if m else None
print("summary (img/s):")
for k, v in rows.items():
    print(f"  {k:<18} {v}")
b = [v for k, v in rows.items() if k.startswith("r50_before") and v]
a = [v for k, v in rows.items() if k.startswith("r50_after") and v]
if a and b:
    print(f"  after / before: {sum(a) / len(a) / (sum(b) / len(b)):.4f} (means of {len(a)} and {len(b)} runs)")
s = re.findall(r"^(\d+) passed, (\d+) failed.*$", log, re.M)
print("  GPU checks:", s[-1] if s else "no summary line")
PY
save_cache
