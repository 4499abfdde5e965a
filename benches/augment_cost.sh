#!/usr/bin/env bash
# What each training augmentation costs the host's loader threads: `burn-vision bench-data` on a
# class folder of photos (to host memory, CPU decode) with the plain recipe (RandomResizedCrop
# 224 + flip), each augmentation alone, and the ViT preset's (RandAugment 2,9, colour jitter
# 0.4, random erasing 0.25), the configurations alternated REPEATS times; then a table of img/s
# and the loader's milliseconds per image (decode; transforms, which include the augmentation),
# also written to $OUT/summary.txt beside the raw log.
#
#   bash benches/augment_cost.sh [BIN] [DATA] [REPEATS] [BATCH] [BATCHES]
#
# Defaults: target/release/burn-vision, /tmp/photos/folder (`python3 benches/make_photos.py
# /tmp/photos/folder 150` writes 1,200 photos), 2 repeats, batch 128, 7 batches.
set -uo pipefail
BIN=${1:-target/release/burn-vision}
DATA=${2:-/tmp/photos/folder}
REPEATS=${3:-2}
BATCH=${4:-128}
BATCHES=${5:-7}
OUT=${OUT:-/tmp/augment_cost}; mkdir -p "$OUT"
LOG=$OUT/augment_cost.log
echo "$(date -u +%FT%TZ) host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" | tee "$LOG"
echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')" | tee -a "$LOG"
CONFIGS=("plain|" "color-jitter|--color-jitter 0.4" "randaugment|--randaugment 2,9" "random-erasing|--random-erasing 0.25"
  "vit-preset|--preset vit")
for r in $(seq "$REPEATS"); do
  for c in "${CONFIGS[@]}"; do
    name=${c%%|*}; flags=${c#*|}
    # shellcheck disable=SC2086
    line=$("$BIN" bench-data --data "$DATA" --batch-size "$BATCH" --batches "$BATCHES" $flags 2>>"$OUT/stderr.log")
    echo "RUN $name $r $line" | tee -a "$LOG"
  done
done
python3 - "$LOG" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("RUN "):
        _, name, _, js = line.split(" ", 3)
        rows.setdefault(name, []).append(json.loads(js))
print(f"{'config':16} {'img/s':>14} {'decode ms':>10} {'transform ms':>13}  threads")
for name, runs in rows.items():
    ips = ", ".join(str(round(r["img_per_s"])) for r in runs)
    dec = sum(r["decode_ms_per_image"] for r in runs) / len(runs)
    tr = sum(r["transform_ms_per_image"] for r in runs) / len(runs)
    print(f"{name:16} {ips:>14} {dec:10.3f} {tr:13.3f}  {runs[0]['threads']}")
EOF
