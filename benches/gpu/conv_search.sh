#!/usr/bin/env bash
# ResNet-50 bf16 b256 (synthetic 224², SGD, 5 warm-up and $STEPS timed steps) with the
# convolutions' plan search timing N of cuDNN's heuristics' candidates
# (`BURN_DDP_CONV_CANDIDATES=N`), the runs alternated, beside PyTorch eager and torch.compile
# in the same call. First the GPU checks of the code this touches (`cast-packed`, the
# convolutions, max-pool). With a build from before in $B/before/bins.txz (burn-vision
# alone), its runs alternate with the others as `before`. CANDIDATES="8 16 32" picks the
# settings. Raw log $OUT/conv-search.log; the summary, then each run's first step, last.
# (Its run of 2026-12-05 timed a search that also took cuDNN's fallback list and the median
# of three runs: benches/results/2026-12-05-h100-packed-input/.)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/conv-search.log; SHOW="img_per_s|RESULT check|rror|panick|^FAIL|passed"; SHOW_LINES=${SHOW_LINES:-3}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
BV="$B"/burn-vision
OLD=
if [ -f "$B"/before/bins.txz ]; then
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$B"/before/bins.txz "$B"/before
  chmod +x "$B"/before/burn-vision; OLD="$B"/before/burn-vision
  echo "before: built from $(cat "$B"/before/BUILT_FROM 2>/dev/null || echo '?')" | tee -a "$LOG"
fi
echo "this build: from $(cat "$B"/BUILT_FROM 2>/dev/null || echo '?')" | tee -a "$LOG"
SHOW_LINES=40 step checks 300 "$B"/burn-ddp-gpu-checks cast-packed convolution convolution-accumulate max-pool
TORCH="resnet50 256 224 3 1000 0 5 $STEPS bf16 nhwc"
step r50_warm 300 "$BV" "${R50[@]}"
[ -n "$OLD" ] && step r50_warm_before 300 "$OLD" "${R50[@]}"
for i in 1 2; do
  [ -n "$OLD" ] && step r50_ours_before_$i 150 "$OLD" "${R50[@]}"
  for n in ${CANDIDATES:-8 16 32}; do
    step r50_ours_c${n}_$i 150 env BURN_DDP_CONV_CANDIDATES=$n "$BV" "${R50[@]}"
  done
done
step r50_eager 150 python3 benches/pytorch_baseline.py synthetic $TORCH eager sgd
step r50_compile 300 python3 benches/pytorch_baseline.py synthetic $TORCH compile sgd
save_cache
python3 benches/gpu/open_goals_summary.py "$LOG" | tee "$OUT/summary.txt"
# The first step's plan searches: cuDNN's share of each run's first step.
python3 - "$LOG" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
name = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("=== ") and line.split()[1].endswith(":"):
        name = line.split()[1].rstrip(":")
    elif name and name.startswith("r50_ours") and '"first_step"' in line:
        r = json.loads(line[line.index("{"):])
        fs = r["first_step"]
        print(f"FIRST {name}: first step {fs['step_s']:.2f} s, of it cuDNN {fs['cudnn_s']:.2f} s; {r['img_per_s']:.0f} img/s")
PY
