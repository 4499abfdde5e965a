#!/usr/bin/env bash
# One device call on one H200 (2026-12-02): NCCL summing on the device, ordered after
# burn's stream with nobody waiting, and SyncBatchNorm on the channels-last kernels.
# - burn-ddp-gpu-checks nccl: a one-rank NCCL group; the ordered sum (pre-multiplied by 2) behind
#   24 running products, and DDP over it against plain training (bit-identical parameters).
# - burn-ddp-gpu-checks --skip nccl: every earlier check (stream_bridge's flags now come per channel) plus
#   check-sync-bn (2 ranks over TCP on the GPU against burn's BatchNorm on the CPU).
# - burn-vision train under `burn-ddp launch --nproc-per-node 1` (DDP over one-rank NCCL, so
#   every bucket really goes through NCCL), with and without --sync-bn, against the same run
#   without the launcher and with BURN_DDP_NCCL_HOST_SYNC=1 (the old blocking path); a
#   Perfetto trace of steps 20..24 of the SyncBatchNorm run (device-timed NCCL spans).
# Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks); kernel caches carry/kernel-cache.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/nccl_ordered.log; SHOW="RESULT check|epoch [0-9]+/|ranks from|rror|panick|FAIL|buckets|sync|collective"; SHOW_LINES=${SHOW_LINES:-8}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/burn-ddp-gpu-checks
BIN=$(realpath "$B"/burn-vision)
T="train --gpus 0 --model resnet18 --data bundled --batch-size 256 --epochs 3 --lr 0.05 --quiet"
run() { # name, timeout, command...
  local name=$1 t=$2; shift 2
  rm -rf /tmp/run_$name
  step "$name" "$t" "$@" --out /tmp/run_$name
  cp /tmp/run_$name/metrics.jsonl "$OUT/${name}_metrics.jsonl" 2>/dev/null
  cp /tmp/run_$name/trace.json "$OUT/${name}_trace.json" 2>/dev/null
}
LAUNCH="$B/burn-ddp launch --standalone --nproc-per-node 1 --"
if [ "${PART:-1}" = 1 ]; then
  step check_nccl 120 "$B"/burn-ddp-gpu-checks nccl
  SHOW_LINES=40 step check 420 "$B"/burn-ddp-gpu-checks --skip nccl
  grep -h "^RESULT check" "$LOG" | grep -c " ok$" | sed 's/^/checks ok: /' | tee -a "$LOG"
  grep -h "^RESULT check" "$LOG" | grep -v " ok$" | tee -a "$LOG"
  run plain 150 "$BIN" $T
  run ddp1 150 $LAUNCH "$BIN" $T
  run ddp1_hostsync 150 env BURN_DDP_NCCL_HOST_SYNC=1 $LAUNCH "$BIN" $T
  run ddp1_syncbn 150 $LAUNCH "$BIN" $T --sync-bn --profile-steps 20..24
  run ddp1_syncbn_hostsync 150 env BURN_DDP_NCCL_HOST_SYNC=1 $LAUNCH "$BIN" $T --sync-bn
elif [ "${PART:-1}" = 2 ]; then
  SHOW_LINES=12 step check_nccl 180 "$B"/burn-ddp-gpu-checks nccl
  run plain 150 "$BIN" $T
  run ddp1 150 $LAUNCH "$BIN" $T
  run ddp1_flush 150 env BURN_DDP_SIDE_FLUSH=1 $LAUNCH "$BIN" $T  # (knob since removed)
  run ddp1_hostsync 150 env BURN_DDP_NCCL_HOST_SYNC=1 $LAUNCH "$BIN" $T
  run ddp1_syncbn 150 $LAUNCH "$BIN" $T --sync-bn --profile-steps 20..24
  run ddp1_syncbn_hostsync 150 env BURN_DDP_NCCL_HOST_SYNC=1 $LAUNCH "$BIN" $T --sync-bn
elif [ "${PART:-1}" = 3 ]; then
  SHOW_LINES=12 step check_nccl 180 "$B"/burn-ddp-gpu-checks nccl
  SHOW_LINES=12 step check_nccl_pages 180 env BURN_DDP_ALLOCATOR=pages "$B"/burn-ddp-gpu-checks nccl
  run plain 150 "$BIN" $T
  run ddp1 150 $LAUNCH "$BIN" $T
  run ddp1_pages 150 env BURN_DDP_ALLOCATOR=pages $LAUNCH "$BIN" $T
  run ddp1_hostsync 150 env BURN_DDP_NCCL_HOST_SYNC=1 $LAUNCH "$BIN" $T
elif [ "${PART:-1}" = 4 ]; then
  # Does the DDP bench compile new kernels every step? The kernel cache's size around it.
  echo "kernel cache before: $(du -sk "$BURN_DDP_CACHE_DIR" | cut -f1) KiB" | tee -a "$LOG"
  SHOW_LINES=12 step check_nccl 180 "$B"/burn-ddp-gpu-checks nccl
  echo "kernel cache after check-nccl: $(du -sk "$BURN_DDP_CACHE_DIR" | cut -f1) KiB" | tee -a "$LOG"
  SHOW_LINES=12 step check_nccl_again 180 "$B"/burn-ddp-gpu-checks nccl
  echo "kernel cache after a second check-nccl: $(du -sk "$BURN_DDP_CACHE_DIR" | cut -f1) KiB" | tee -a "$LOG"
  run ddp1 150 $LAUNCH "$BIN" $T --profile-steps 40..50
  run plain 150 "$BIN" $T
fi
save_cache
echo; echo "SUMMARY (last epoch's img/s, validation accuracy)"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for name in ["plain", "ddp1", "ddp1_pages", "ddp1_flush", "ddp1_hostsync", "ddp1_syncbn", "ddp1_syncbn_hostsync"]:
    p = os.path.join(out, f"{name}_metrics.jsonl")
    recs = [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []
    recs = [r for r in recs if "img_per_s" in r]
    if recs:
        r = recs[-1]
        steady = r.get("steady_img_per_s") or r["img_per_s"]
        phases = {k: round(v, 3) for k, v in r.get("phases_s", [])}
        print(f"{name:22} img/s {r['img_per_s']:9.0f}  steady {steady:9.0f}  val_acc {100 * r.get('val_acc', float('nan')):6.2f}%  phases_s {phases}")
    else:
        print(f"{name:22} (no metrics)")
for t in [os.path.join(out, "ddp1_syncbn_trace.json"), os.path.join(out, "ddp1_trace.json")]:
  if os.path.exists(t):
    ev = json.load(open(t))["traceEvents"]
    comm = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "comm"]
    dev = [e for e in comm if "device" in str(e.get("args", {}).get("clock", ""))]
    print(f"trace {os.path.basename(t)}: {len(comm)} comm spans, {len(dev)} device-timed; names: {sorted(set(e['name'] for e in comm))[:6]}")
    tot = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("ddp", "phase"):
            tot[e["name"]] = tot.get(e["name"], 0) + e["dur"] / 1e3
    print("  host ms over the recorded steps:", {k: round(v, 1) for k, v in sorted(tot.items())})
PY
