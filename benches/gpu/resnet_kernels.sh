#!/usr/bin/env bash
# What burn-ddp's ResNet kernels buy on ResNet-50 bf16 b256 channels-last (synthetic 224², SGD),
# in one device call on one H200, beside PyTorch 2.11 eager and torch.compile (the same batch,
# optimizer and step count):
#   1. the GPU checks of the paths the variants touch (NO_CHECKS=1 leaves them out):
#      `bn-add-relu batch-norm conv-bn-relu sync-batch-norm warp-fold convolution`;
#   2. the variants, each run once warm and then alternated twice:
#      `unfused` — the residual block's end as the batch norm, burn's addition and `nn::relu`
#                  (`BURN_DDP_FUSE_ADD=0`);
#      `base`    — the defaults (the block's end fused into the batch-norm kernels);
#      `fold`    — and the batch norm's sums folded by the coalesced fold
#                  (`BURN_DDP_COALESCED_FOLD=1`, experimental);
#      `filter`  — and each convolution's filter reordered and cast by one kernel each way
#                  (`BURN_DDP_FILTER_KERNEL=1`, experimental);
#      `both`    — fold and filter together;
#      VARIANTS="..." picks some (default: base fold filter both; 2026-12-04's comparison of
#      the fused block end was VARIANTS="base unfused");
#   3. with PROFILE=1, the step by class of kernel with both experimental kernels on
#      (benches/gpu/step_profile.sh PART=1, ours only).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/resnet_kernels.log; each round's ratios to `base` and to torch.compile last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/resnet_kernels.log; SHOW="RESULT|img_per_s|rror|panick|FAIL"; SHOW_LINES=${SHOW_LINES:-4}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
[ -n "${NO_CHECKS:-}" ] || step checks 400 "$B"/burn-ddp-gpu-checks bn-add-relu batch-norm conv-bn-relu sync-batch-norm warp-fold convolution
# The switches of each variant (`step` runs a program under `timeout`, not a shell function).
envs() {
  case $1 in
    unfused) echo "BURN_DDP_FUSE_ADD=0 BURN_DDP_COALESCED_FOLD=0 BURN_DDP_FILTER_KERNEL=0" ;;
    base) echo "BURN_DDP_FUSE_ADD=1 BURN_DDP_COALESCED_FOLD=0 BURN_DDP_FILTER_KERNEL=0" ;;
    fold) echo "BURN_DDP_FUSE_ADD=1 BURN_DDP_COALESCED_FOLD=1 BURN_DDP_FILTER_KERNEL=0" ;;
    filter) echo "BURN_DDP_FUSE_ADD=1 BURN_DDP_COALESCED_FOLD=0 BURN_DDP_FILTER_KERNEL=1" ;;
    both) echo "BURN_DDP_FUSE_ADD=1 BURN_DDP_COALESCED_FOLD=1 BURN_DDP_FILTER_KERNEL=1" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
VARIANTS=${VARIANTS:-base fold filter both}
for v in $VARIANTS; do step warm_$v 300 env $(envs "$v") "$B"/burn-vision "${R50[@]}"; done
for i in 1 2; do
  for v in $VARIANTS; do step ${v}_$i 150 env $(envs "$v") "$B"/burn-vision "${R50[@]}"; done
done
[ -n "${NO_TORCH:-}" ] || {
  step torch 150 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc eager
  step compile 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc compile
}
[ -z "${PROFILE:-}" ] || OUT=$OUT/profile OURS_ONLY=1 BURN_DDP_COALESCED_FOLD=1 BURN_DDP_FILTER_KERNEL=1 PART=1 \
  bash benches/gpu/step_profile.sh
save_cache
echo; echo SUMMARY | tee -a "$LOG"
python3 - "$LOG" $VARIANTS <<'PY' | tee -a "$LOG"
import json, re, sys
sys.path.insert(0, "benches/gpu")
from bench_log import verdict
log, variants = sys.argv[1], sys.argv[2:]
runs, name, checks = {}, None, [0, 0]
for line in open(log, errors="replace"):
    m = re.match(r"=== (\S+): ", line)
    if m:
        name = m.group(1); continue
    if re.match(r"=== \S+ rc=", line):
        name = None; continue
    line = line.strip()
    if name and (line.startswith("{") or line.startswith("RESULT {")) and "img_per_s" in line:
        runs[name] = json.loads(line[line.index("{"):])
    if name == "checks" and line.startswith("RESULT check="):
        if verdict(line):
            checks[0 if verdict(line) == "ok" else 1] += 1
        if "filter_kernel" in line or "bn_add_relu" in line or not line.endswith(" ok"):
            print(line)
print(f"checks: {checks[0]} ok, {checks[1]} failed")
for n, r in runs.items():
    mem = r.get("device_used_gib") or r.get("peak_mem_gib")
    first = (r.get("first_step") or {}).get("total_s")
    mem = f", GPU memory {mem:.2f} GiB" if mem else ""
    first = f", first step done {first:.1f} s after start" if first else ""
    o = r.get("gpu_options") or {}
    paths = (f", coalesced_fold={o.get('coalesced_fold')} filter_kernel={o.get('filter_kernel')}"
             f" (filter kernel passes {r.get('filter_kernel_passes')})") if o else ""
    print(f"{n}: {r['img_per_s']:.0f} img/s{mem}{first}{paths}")
comp = runs.get("compile", {}).get("img_per_s")
for i in (1, 2):
    base = runs.get(f"base_{i}", {}).get("img_per_s")
    parts = []
    for v in variants:
        s = runs.get(f"{v}_{i}", {}).get("img_per_s")
        if not s:
            continue
        rel = f" = {s / base:.3f}× base" if base and v != "base" else ""
        vs = f", {s / comp:.3f}× torch.compile" if comp else ""
        parts.append(f"{v} {s:.0f}{rel}{vs}")
    if parts:
        print(f"round {i}: " + "; ".join(parts))
PY
