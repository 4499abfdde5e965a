#!/usr/bin/env bash
# Where a small-batch step's host time goes (the tutorial row of the first-hour table): ResNet-34, batch 16, f32,
# channels-last, the bench step (synthetic data, SGD momentum 0.9), PyTorch eager beside it.
#   PART=1  caches warmed, the step twice, then once under `--host-profile` (every host thread
#           sampled; the binary built with --features host-profile, its symbol table kept);
#           the profile's files land in $OUT/host-profile-*/; then benches/gpu/nvrtc_headers.py
#           (what NVRTC spends per kernel with the headers cubecl includes, and without).
#   PART=3  `burn-ddp-gpu-checks sgd`, the tutorial's job (2 epochs) and PyTorch's (16 workers)
#           alternated twice, the bench step with burn's Sgd and FusedSgd alternated 3 times.
#   PART=4  every `burn-ddp-gpu-checks --skip nccl`, the tutorial's job (2 epochs) from a fresh kernel cache
#           and again, PyTorch's with 16 workers after each, the bench step again.
#   PART=2  burn's Sgd (`--burn-sgd`) against burn-ddp's FusedSgd (the default), alternated
#           twice (after `burn-ddp-gpu-checks sgd`: the kernel against burn's Sgd), then the step
#           under `--host-profile` with FusedSgd, then the tutorial's job for 2 epochs on the
#           fm224 JPEG folder against PyTorch's with 16 loader workers; PyTorch beside.
# Binaries: carry/bins.txz (burn-vision, burn-ddp). Raw log $OUT/host-time-PART.log; summary last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-1}
LOG=$OUT/host-time-$PART.log
SHOW="RESULT|img_per_s|rror|panick|host profile"; SHOW_LINES=4
B=${B:-carry}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp 2>/dev/null
BV="$B"/burn-vision
STEPS=${STEPS:-200}
R34=(bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 1000 --warmup 5 --steps "$STEPS")
step r34_warm_caches 300 "$BV" "${R34[@]}"
if [ "$PART" = 4 ]; then
  # Every GPU check but NCCL (FusedSgd and the fused cross-entropy among them), then the
  # tutorial's job (2 epochs) from empty kernel caches and again, PyTorch's beside each.
  step check_all 300 "$B"/burn-ddp-gpu-checks --skip nccl
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  for i in fresh 2; do
    [ "$i" = fresh ] && rm -rf "$BURN_DDP_CACHE_DIR"
    rm -rf /tmp/tut-$i
    step tut_ours_$i 300 "$BV" train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet --out /tmp/tut-$i
    sed 's/^/METRICS /' /tmp/tut-$i/metrics.jsonl >>"$LOG" 2>/dev/null
    step tut_torch_w16_$i 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 2 f32 nhwc 16
  done
  step r34_ours_2 120 "$BV" "${R34[@]}"
elif [ "$PART" = 3 ]; then
  # The fused SGD kernel against burn's Sgd on the GPU, then the tutorial's job (2 epochs)
  # and PyTorch's with 16 loader workers, alternated twice, and the bench step A/B again.
  step check_sgd 180 "$B"/burn-ddp-gpu-checks sgd
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  for i in 1 2; do
    rm -rf /tmp/tut-$i
    step tut_ours_$i 300 "$BV" train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet --out /tmp/tut-$i
    sed 's/^/METRICS /' /tmp/tut-$i/metrics.jsonl >>"$LOG" 2>/dev/null
    step tut_torch_w16_$i 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 2 f32 nhwc 16
  done
  for i in 1 2 3; do
    step r34_burn_sgd_$i 120 "$BV" "${R34[@]}" --burn-sgd
    step r34_fused_sgd_$i 120 "$BV" "${R34[@]}"
  done
elif [ "$PART" = 1 ]; then
  for i in 1 2; do step r34_ours_$i 120 "$BV" "${R34[@]}"; done
  step r34_ours_profiled 180 "$BV" "${R34[@]}" --host-profile "$OUT"/host-profile-r34
  head -c 6000 "$OUT"/host-profile-r34/host-profile.txt 2>/dev/null
  # The cold start's compile cost: NVRTC with and without the headers cubecl includes.
  SHOW_LINES=8 step nvrtc_headers 180 python3 benches/gpu/nvrtc_headers.py 5
else
  step check_sgd 180 "$B"/burn-ddp-gpu-checks sgd
  for i in 1 2; do
    step r34_burn_sgd_$i 120 "$BV" "${R34[@]}" --burn-sgd
    step r34_fused_sgd_$i 120 "$BV" "${R34[@]}"
  done
  step r34_fused_profiled 180 "$BV" "${R34[@]}" --host-profile "$OUT"/host-profile-r34-fused
  head -c 6000 "$OUT"/host-profile-r34-fused/host-profile.txt 2>/dev/null
  # The tutorial's job (2 epochs of the fm224 folder) with FusedSgd, PyTorch with 16 workers.
  D=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
  rm -rf /tmp/tut
  SHOW="RESULT|rror|panick|top-1|images \\(" step tut_ours 300 "$BV" train --data /tmp/fm224 --preset tutorial --epochs 2 --gpus 0 --quiet --out /tmp/tut
  sed 's/^/METRICS /' /tmp/tut/metrics.jsonl >>"$LOG" 2>/dev/null
  cp /tmp/tut/metrics.jsonl "$OUT"/tut-ours.metrics.jsonl 2>/dev/null
  step tut_torch_w16 300 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 2 f32 nhwc 16
fi
step r34_torch 180 python3 benches/pytorch_baseline.py synthetic resnet34 16 224 3 1000 0 5 "$STEPS" f32 nhwc eager
save_cache
echo "=== summary" | tee -a "$LOG"
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
name = None
print(f"{'run':28} {'img/s':>8} {'fwd ms':>7} {'bwd ms':>7} {'opt ms':>7} {'GiB':>6}")
for line in open(sys.argv[1]):
    m = re.match(r"=== (\S+): ", line)
    if m: name = m.group(1)
    if line.startswith("{") and '"img_per_s"' in line:
        r = json.loads(line); n = r["config"]["steps"]; h = r["host"]
        print(f"{name:28} {r['img_per_s']:8.0f} {1e3*h['forward_s']/n:7.2f} {1e3*h['backward_s']/n:7.2f} {1e3*h['optimizer_s']/n:7.2f} {r['device_used_gib'] or 0:6.2f}")
    if line.startswith("RESULT {"):
        r = json.loads(line[6:])
        if r.get("mode") == "synthetic":
            print(f"{name:28} {r['img_per_s']:8.0f} {'':7} {'':7} {'':7} {r['device_used_gib']:6.2f}")
        elif r.get("mode") == "tutorial":
            print(f"{name:28} epoch {r['epoch']}: steady {r['steady_img_per_s']:.0f} img/s, {r['seconds']:.1f} s, top-1 {100 * r['val_acc']:.2f} %")
        elif r.get("mode") == "tutorial_job":
            print(f"{name:28} job wall {r['wall_s']:.1f} s, {r['device_used_gib']:.2f} GiB")
    if line.startswith("METRICS "):
        r = json.loads(line[8:])
        print(f"{name:28} epoch {r['epoch']}: steady {r['steady_img_per_s']:.0f} img/s, {r['seconds']:.1f} s, top-1 {100 * r['val_acc']:.2f} %")
    m = re.match(r"=== (tut_ours\S*) rc=\d+ wall=([\d.]+)s", line)
    if m: print(f"{m.group(1):28} job wall {m.group(2)} s (process)")
PY
