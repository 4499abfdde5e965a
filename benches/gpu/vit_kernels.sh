#!/usr/bin/env bash
# What burn-ddp's own ViT kernels buy, in one device call on one H200 — the fused bias + GELU of
# the MLPs (`burn_ddp::nn::linear_gelu`, `BURN_DDP_GELU`) and the layer norms' forward kernel
# (`BURN_DDP_LN_KERNEL`), both on by default since 2026-12-04 (`=0` turns each off):
#   1. `burn-ddp-gpu-checks bias-gelu layer-norm relu products patch-embed linear-epilogue`
#      (each against f64; NO_CHECKS=1 leaves them out);
#   2. ViT-B/16 bf16 b128 and ViT-S/16 bf16 b256, synthetic 224², SGD, the variants alternated
#      twice — `base` (both off: cuDNN's layer norm, burn's addition, gelu and its backward;
#      each linear layer as separate operations), `gelu` (the GELU kernel), `gelu_ln` (both
#      kernels), `linear` (both, and each linear layer one operation each way:
#      `BURN_DDP_FUSED_LINEAR`, on by default), `patch` (all of them, and the patch embedding
#      as one product: `BURN_DDP_PATCH_GEMM`, on by default; the others run the convolution),
#      `epilogue` (all of that, and the linear layers' biases in cuBLASLt's epilogues:
#      `BURN_DDP_LT_EPILOGUE=1`, experimental, off by default) — beside PyTorch 2.11 eager and
#      torch.compile (the same batch, optimizer and step count); VARIANTS="..." picks some
#      (`VARIANTS="linear patch epilogue"`: the two newest steps alone);
#      MODELS=vitb16 (or vits16) runs one model, MODELS=none neither: a cold machine compiles and tunes each
#      variant's kernels in its first run, which can take the two past one call's 10 minutes;
#   3. with HOST_PROFILE=1, where the host's time goes in ViT-B/16's step with both on
#      (`bench --host-profile`); with PROFILE=1, ViT-B/16's step by class of kernel with both on
#      (benches/gpu/step_profile.sh PART=2, ours only), beside 2026-12-04's table in
#      docs/benchmarks.md.
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks; release, CUDA; for HOST_PROFILE a
# burn-vision built with `--features host-profile`, not stripped — build burn-ddp-gpu-checks in a
# cargo invocation of its own: one shared with that feature changes dependencies' features, and
# the `sgd` / `adamw` checks of such a build differed at random on 2026-12-04,
# benches/results/2026-12-04-h200-final-checks/). Raw log
# $OUT/vit_kernels.log; each pair's ratios last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/vit_kernels.log; SHOW="RESULT|img_per_s|rror|panick|FAIL"; SHOW_LINES=${SHOW_LINES:-12}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks 2>/dev/null
[ -n "${NO_CHECKS:-}" ] || step checks 300 "$B"/burn-ddp-gpu-checks bias-gelu layer-norm relu products patch-embed linear-epilogue
# The switches of each variant (`step` runs a program under `timeout`, not a shell function).
envs() {
  case $1 in
    base) echo "BURN_DDP_GELU=0 BURN_DDP_LN_KERNEL=0 BURN_DDP_FUSED_LINEAR=0 BURN_DDP_PATCH_GEMM=0" ;;
    gelu) echo "BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=0 BURN_DDP_FUSED_LINEAR=0 BURN_DDP_PATCH_GEMM=0" ;;
    gelu_ln) echo "BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=1 BURN_DDP_FUSED_LINEAR=0 BURN_DDP_PATCH_GEMM=0" ;;
    linear) echo "BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=1 BURN_DDP_FUSED_LINEAR=1 BURN_DDP_PATCH_GEMM=0" ;;
    patch) echo "BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=1 BURN_DDP_FUSED_LINEAR=1 BURN_DDP_PATCH_GEMM=1" ;;
    epilogue) echo "BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=1 BURN_DDP_FUSED_LINEAR=1 BURN_DDP_PATCH_GEMM=1 BURN_DDP_LT_EPILOGUE=1" ;;
  esac
}
VARIANTS=${VARIANTS:-base gelu gelu_ln linear patch epilogue}
for model in ${MODELS:-vitb16 vits16}; do
  [ $model = none ] && continue
  if [ $model = vitb16 ]; then ARGS=("${VB[@]}"); TORCH="vit_b_16 128"; else ARGS=("${VS[@]}"); TORCH="timm:vit_small_patch16_224 256"; fi
  # The first run of each variant fills the kernel caches; it is not one of the pairs.
  for v in $VARIANTS; do step ${model}_warm_$v 300 env $(envs $v) "$B"/burn-vision "${ARGS[@]}"; done
  for i in 1 2; do
    for v in $VARIANTS; do step ${model}_${v}_$i 150 env $(envs $v) "$B"/burn-vision "${ARGS[@]}"; done
  done
  step ${model}_torch 150 python3 benches/pytorch_baseline.py synthetic $TORCH 224 3 1000 0 5 "$STEPS" bf16 nchw eager
  step ${model}_compile 300 python3 benches/pytorch_baseline.py synthetic $TORCH 224 3 1000 0 5 "$STEPS" bf16 nchw compile
done
save_cache
if [ -n "${HOST_PROFILE:-}" ]; then
  # Where the host's time goes in a ViT-B/16 step with both kernels on (a burn-vision built
  # with `--features host-profile`, not stripped): DIR/host-profile.txt per thread.
  step host_profile 150 "$B"/burn-vision "${VB[@]}" --host-profile "$OUT/host-profile-vitb16"
  rm -f "$OUT/host-profile-vitb16/host-profile.svg"
  [ -f "$OUT/host-profile-vitb16/host-profile.folded" ] && xz_files "$OUT/host-profile-vitb16/host-profile.folded"
fi
if [ -n "${PROFILE:-}" ]; then
  BURN_DDP_GELU=1 BURN_DDP_LN_KERNEL=1 PART=2 OURS_ONLY=1 bash benches/gpu/step_profile.sh
fi
echo; echo SUMMARY | tee -a "$LOG"
# Per run: img/s, GPU memory, the fused kernel's passes (ours) or peak memory (PyTorch); then
# each pair's ratio and ours against torch.compile.
python3 - "$LOG" <<'PY' | tee -a "$LOG"
import json, re, sys
runs, name = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"=== (\S+): ", line)
    if m:
        name = m.group(1); continue
    if re.match(r"=== \S+ rc=", line):
        name = None; continue
    line = line.strip()
    if name and (line.startswith("{") or line.startswith("RESULT {")) and "img_per_s" in line:
        runs[name] = json.loads(line[line.index("{"):])
    if name == "checks" and line.startswith("RESULT check=") and any(k in line for k in ("bias_gelu", "layer_norm", "patch_embed", "linear_epilogue")):
        print(line)
for n, r in runs.items():
    extra = (f"gelu_kernel_passes={r.get('gelu_kernel_passes')} layer_norm_kernel_passes={r.get('layer_norm_kernel_passes')} "
             f"device_used_gib={r.get('device_used_gib')}" if "gelu_kernel_passes" in r else f"peak_mem_gib={r.get('peak_mem_gib')}")
    print(f"{n}: {r['img_per_s']:.0f} img/s {extra}")
for model in ("vitb16", "vits16"):
    comp = runs.get(f"{model}_compile", {}).get("img_per_s")
    for i in (1, 2):
        got = {v: runs.get(f"{model}_{v}_{i}", {}).get("img_per_s") for v in ("base", "gelu", "gelu_ln", "linear", "patch", "epilogue")}
        got = {v: x for v, x in got.items() if x}
        if got:
            first = next(iter(got))
            parts = [f"{v} / {first} {x / got[first]:.3f}" for v, x in got.items() if v != first]
            parts += [f"{v} / torch.compile {x / comp:.3f}" for v, x in got.items() if comp]
            print(f"{model} round {i}: " + ", ".join(parts))
PY
