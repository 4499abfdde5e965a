#!/usr/bin/env bash
# The fused optimizers after a change to their shared code: the GPU checks `sgd` and `adamw`
# (FusedSgd / FusedAdamW against burn's Sgd / AdamW on the GPU), then one training benchmark
# each: ResNet-50 bf16 b256 with SGD and ViT-S/16 bf16 b256 with AdamW (30 steps after 5).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/optimizers.log; SHOW="^ok |^FAIL |passed, |img_per_s|rror|panick"; SHOW_LINES=${SHOW_LINES:-6}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
step checks 200 "$B"/burn-ddp-gpu-checks sgd adamw
R="--gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
S="--gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps 30"
SHOW_LINES=1 step r50_sgd 150 "$B"/burn-vision bench $R --optimizer sgd
SHOW_LINES=1 step vits_adamw 150 "$B"/burn-vision bench $S --optimizer adamw
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and "img_per_s" in line:
        r = json.loads(line)
        c = r.get("config", {})
        print(f"{c.get('model')} {c.get('optimizer', '')}: {r['img_per_s']:.0f} img/s")
PY
