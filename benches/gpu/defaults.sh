#!/usr/bin/env bash
# The GPU layers' defaults against the same build with the newest three turned off, beside
# PyTorch 2.11 torch.compile, in one device call on one H200 — then the GPU check suite on those
# defaults. The three (on by default since 2026-12-05): cuDNN, cuBLAS and burn-ddp's kernels on
# burn's own stream (`BURN_DDP_SAME_STREAM`), the batch norm's coalesced fold
# (`BURN_DDP_COALESCED_FOLD`) and the filter kernel (`BURN_DDP_FILTER_KERNEL`):
#   1. ResNet-50 bf16 b256 channels-last and ViT-B/16 bf16 b128 (synthetic 224², SGD):
#      `default` and `before` (the three off) alternated twice after one warm run each;
#      ViT-B/16 also `epilogue` (`BURN_DDP_LT_EPILOGUE=1`, experimental); each model's
#      torch.compile run beside (the same batch, optimizer and step count; EAGER=1 adds eager);
#      ViT-B/16 with AdamW too, ours and torch.compile's (NO_ADAMW=1 leaves it out);
#   2. DDP's cost inside one process on those defaults (`bench --ddp --ddp-interleave`):
#      ResNet-18 28² b256 twice, ResNet-50 and ViT-B/16 once (benches/gpu/ddp_cost.sh PART=5
#      is the longer version);
#   3. `burn-ddp-gpu-checks` — every check, NCCL's too, in two runs: the first after the
#      SGD rows, the second last (NO_CHECKS=1 leaves them out; CHECKS="a b" runs those alone,
#      in the first; CHECKS_TIMEOUT=S limits each run, default 300 s).
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/defaults.log; the summary table last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/defaults.log; SHOW="RESULT|img_per_s|rror|panick|FAIL|passed"; SHOW_LINES=${SHOW_LINES:-3}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
# The switches of each variant (`step` runs a program under `timeout`, not a shell function).
envs() {
  case $1 in
    default) echo "BURN_DDP_LT_EPILOGUE=0" ;;
    before) echo "BURN_DDP_SAME_STREAM=0 BURN_DDP_COALESCED_FOLD=0 BURN_DDP_FILTER_KERNEL=0" ;;
    epilogue) echo "BURN_DDP_LT_EPILOGUE=1" ;;
  esac
}
for model in r50 vitb16; do
  if [ $model = r50 ]; then ARGS=("${R50[@]}"); V="default before"; TORCH="resnet50 256 224 3 1000 0 5 $STEPS bf16 nhwc"
  else ARGS=("${VB[@]}"); V="default before epilogue"; TORCH="vit_b_16 128 224 3 1000 0 5 $STEPS bf16 nchw"; fi
  for v in $V; do step ${model}_warm_$v 300 env $(envs $v) "$B"/burn-vision "${ARGS[@]}"; done
  for i in 1 2; do
    for v in $V; do step ${model}_${v}_$i 150 env $(envs $v) "$B"/burn-vision "${ARGS[@]}"; done
  done
  [ -z "${EAGER:-}" ] || step ${model}_eager 150 python3 benches/pytorch_baseline.py synthetic $TORCH eager
  step ${model}_compile 300 python3 benches/pytorch_baseline.py synthetic $TORCH compile
done
# Every check, in two runs: the first holds those the defaults change most and runs before
# the AdamW and DDP rows, the second (the convolution cases, the longest) last, so a call that
# runs out of time still has the first.
FIRST="same-stream nccl sgd adamw attention layer-norm relu bias-gelu products patch-embed linear-epilogue
  cross-entropy mean-over max-pool cudnn-ordering conv-bn-relu bn-add-relu batch-norm warp-fold sync-batch-norm"
REST="convolution convolution-accumulate upload crop-resize jpeg-decode decode-ahead burn-stream"
[ -n "${NO_CHECKS:-}" ] || step checks_1 "${CHECKS_TIMEOUT:-300}" "$B"/burn-ddp-gpu-checks ${CHECKS:-$FIRST}
# ViT-B/16 with AdamW, the optimizer ViTs train with (ours FusedAdamW, PyTorch's fused=True).
[ -n "${NO_ADAMW:-}" ] || {
  for i in 1 2; do step vitb16_adamw_$i 150 "$B"/burn-vision "${VB[@]}" --optimizer adamw; done
  step vitb16_adamw_compile 300 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw compile adamw
}
for i in 1 2; do step r18s_interleaved_$i 150 "$B"/burn-vision "${R18B[@]}" --ddp --ddp-interleave 25; done
step r50_interleaved 150 "$B"/burn-vision "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
step vitb16_interleaved 150 "$B"/burn-vision "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
save_cache
[ -n "${NO_CHECKS:-}${CHECKS:-}" ] || step checks_2 "${CHECKS_TIMEOUT:-300}" "$B"/burn-ddp-gpu-checks $REST
echo; echo SUMMARY | tee -a "$LOG"
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import re, sys
sys.path.insert(0, "benches/gpu")
from bench_log import results, verdict
log = sys.argv[1]
runs = {name: r for name, _, r in results(log)}
for n, r in runs.items():
    mem = r.get("device_used_gib") or r.get("peak_mem_gib")
    first = (r.get("first_step") or {}).get("total_s")
    o = r.get("gpu_options") or {}
    on = ",".join(k for k in ("same_stream", "coalesced_fold", "filter_kernel", "lt_epilogue") if o.get(k))
    stream = (r.get("cudnn") or {}).get("on_burns_stream")
    line = f"{n}: {r['img_per_s']:.0f} img/s"
    line += f", GPU memory {mem:.2f} GiB" if mem else ""
    line += f", first step done {first:.1f} s after start" if first else ""
    line += f", on: {on or 'none'}, calls on burn's stream {stream}" if o else ""
    inter = r.get("interleaved")
    if inter:
        line += f", DDP / plain (blocks in one process): median pair {inter['median_pair_ratio']:.3f}"
    print(line)
for model, variants in (("r50", ["default", "before"]), ("vitb16", ["default", "before", "epilogue"])):
    comp = runs.get(f"{model}_compile", {}).get("img_per_s")
    for i in (1, 2):
        before = runs.get(f"{model}_before_{i}", {}).get("img_per_s")
        parts = []
        for v in variants:
            s = runs.get(f"{model}_{v}_{i}", {}).get("img_per_s")
            if s:
                rel = f" = {s / before:.3f}× before" if before and v != "before" else ""
                parts.append(f"{v} {s:.0f}{rel}" + (f", {s / comp:.3f}× torch.compile" if comp else ""))
        print(f"{model} round {i}: " + "; ".join(parts))
comp = runs.get("vitb16_adamw_compile", {}).get("img_per_s")
adamw = [runs[k]["img_per_s"] for k in ("vitb16_adamw_1", "vitb16_adamw_2") if k in runs]
if adamw:
    print("vitb16 AdamW: " + ", ".join(f"{s:.0f}" + (f" = {s / comp:.3f}× torch.compile" if comp else "") for s in adamw))
text = open(log, errors="replace").read()
verdicts = [verdict(l) for l in text.splitlines() if l.startswith("RESULT check=")]
print(f"checks: {verdicts.count('ok')} ok, {verdicts.count('FAIL')} failed")
for line in re.findall(r"^(?:RESULT check=\S+ .* FAIL|\d+ passed.*)$", text, re.M):
    print(line)
PY
python3 benches/gpu/ddp_cost_summary.py "$LOG" | tee -a "$LOG"
