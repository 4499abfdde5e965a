#!/usr/bin/env bash
# Does `train --preset tutorial` learn on this machine with its JPEGs decoded on the GPU, and if
# not, which part stops it? First the GPU checks of the decode path (crop-resize, jpeg-decode,
# decode-ahead, decode-behind-busy-stream, with 64 of the run's JPEGs among theirs; the last
# also with BURN_DDP_DECODE_REUSE=device: a slot's reuse ordered on the decoder's stream only,
# as before 2026-12-06), then one epoch (ResNet-34, batch 16, f32, 500 steps) on the bundled
# images as 224² JPEGs per variant (see `variant` below: `--decode gpu`, `--decode cpu`, the
# reuse order, cold kernel caches, the device synchronised at every phase, fences, after the
# ResNet-18 28² bench, OLD's binary). VARIANTS picks them, in
# order; ROUNDS repeats the list. A run that learns reaches 35-45 % training and 65-72 %
# validation accuracy after its epoch (PyTorch's same recipe: 66-69 %); one that does not stays
# near 10 % (chance). Before 2026-12-06 the failures came on hosts that ran this preset at about
# 1,800 img/s or more; slower ones learned in every variant.
# Raw log $OUT/tutorial-learning.log, the summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/tutorial-learning.log
SHOW="epoch 1/1|rror|panick"; SHOW_LINES=2
B=${B:-carry}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
fm224
# The decode checks with 64 of the run's own JPEGs among theirs.
export BURN_DDP_CHECK_JPEGS=/tmp/fm224
SHOW_LINES=8 step decode_checks 300 "$B"/burn-ddp-gpu-checks crop-resize jpeg-decode decode-ahead decode-behind-busy-stream
SHOW_LINES=12 step busy_check_reuse_on_device 300 env BURN_DDP_DECODE_REUSE=device "$B"/burn-ddp-gpu-checks decode-behind-busy-stream
unset BURN_DDP_CHECK_JPEGS
TUT=(train --data /tmp/fm224 --preset tutorial --epochs 1 --gpus 0 --quiet)
# `run NAME [env VAR=VALUE] BINARY [TRAIN FLAGS...]`
run() {
  local name=$1; shift
  local pre=()
  while [ "$1" = env ] || [[ "$1" == *=* ]]; do pre+=("$1"); shift; done
  local bin=$1; shift
  rm -rf /tmp/tl-$name
  step "$name" 300 "${pre[@]}" "$bin" "${TUT[@]}" "$@" --out /tmp/tl-$name
  sed "s/^/METRICS $name /" /tmp/tl-$name/metrics.jsonl >>"$LOG" 2>/dev/null
}
GPU=(--decode gpu)
OLD_ORDER=(env BURN_DDP_DECODE_REUSE=device)
# `variant NAME SUFFIX`: one epoch of the variant NAME, recorded as NAME$SUFFIX.
variant() {
  local n=$1$2
  case $1 in
    gpu_decode) run $n "$B"/burn-vision "${GPU[@]}" ;;
    reuse_on_device) run $n "${OLD_ORDER[@]}" "$B"/burn-vision "${GPU[@]}" ;;
    cpu_decode) run $n "$B"/burn-vision --decode cpu ;;
    cold_caches) run $n env BURN_DDP_CACHE_DIR=/tmp/tl-cold-cache-$n "$B"/burn-vision "${GPU[@]}" ;;
    step_sync) run $n env BURN_VISION_STEP_SYNC=1 "$B"/burn-vision "${GPU[@]}" ;;
    fenced) run $n env BURN_DDP_SAME_STREAM=0 "$B"/burn-vision "${GPU[@]}" ;;
    # As in the DDP-cost goals' call, where it did not learn: right after the host-bound bench.
    gpu_after_bench) step r18s_bench$2 150 "$B"/burn-vision "${R18B[@]}"; run $n "$B"/burn-vision "${GPU[@]}" ;;
    old_build)
      [ -f "$OLD"/bins.txz ] && python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$OLD"/bins.txz "$OLD"
      chmod +x "$OLD"/burn-vision
      run $n "$OLD"/burn-vision "${GPU[@]}" ;;
    *) echo "unknown variant $1" | tee -a "$LOG" ;;
  esac
}
# VARIANTS picks some, in order (default below; old_build needs OLD=DIR); ROUNDS repeats them.
for r in $(seq 1 "${ROUNDS:-1}"); do
  suffix=""; [ "${ROUNDS:-1}" -gt 1 ] && suffix=_r$r
  for v in ${VARIANTS:-gpu_decode reuse_on_device cpu_decode cold_caches step_sync fenced gpu_after_bench}; do
    variant "$v" "$suffix"
  done
done
save_cache
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, sys
print("| variant | train loss | train acc | val acc | steady img/s |")
print("|---|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    if line.startswith("METRICS "):
        _, name, rec = line.split(" ", 2)
        r = json.loads(rec)
        loss = r.get('train_loss')
        loss = "NaN (null)" if loss is None else f"{loss:.3f}"
        print(f"| {name} | {loss} | {100 * r['train_acc']:.2f} % | {100 * r['val_acc']:.2f} % | {r.get('steady_img_per_s', 0):.0f} |")
PY
