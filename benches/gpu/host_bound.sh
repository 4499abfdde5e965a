#!/usr/bin/env bash
# One device call on one H200: where a host-bound training step stands, old build against new
# build against PyTorch, all in the same call (the lent machines' CPUs differ by ~10 %).
#   check      burn-ddp-gpu-checks --skip nccl (new binaries): correctness of every cuDNN / kernel path
#   NAME_new / NAME_old  `burn-vision bench` of the new build (carry/) or the old one
#              (carry/old/), printing img/s and each host thread's CPU seconds per step
#   NAME_torch benches/pytorch_baseline.py on the same workload
# NAME: r50_bf16_cl r50_f32_cl r50_f32 (ResNet-50 224² b256; _cl channels-last),
#       r50_bf16_cl_b128, r34_b16 r34_b16_cl r34_b16_bf16_cl (ResNet-34 224², the tutorial's
#       16 per GPU), r18s r18s_cl (ResNet-18 small-input stem, 28² 1-channel, b256);
#       r50_bf16_cl_compile: PyTorch with torch.compile (the stretch anchor; compile time not
#       counted: it is in the warm-up steps); plain_gpu: burn-ddp's plain-Burn example on GPU 0
#       (its log names the convolution path); vitb16_bf16 (ViT-B/16 224² b128; PyTorch:
#       torchvision's vit_b_16, eager and _compile) and vits16_bf16 (ViT-S/16 b256; timm's
#       vit_small_patch16_224), bf16 autocast, SGD as for the ResNets.
# burn-vision's bench (like train) keeps GPU activations channels-last unless told
# --channels-first; binaries built before 2026-12-01 (before that default) run NCHW without flags.
# STEPS picks steps (default below). Binaries built on the development machine:
#   cargo build --release --features burn-vision/cuda,burn-ddp/cuda -p burn-vision --bin burn-vision -p burn-ddp-gpu-checks --example plain_burn
# and packed as carry/bins.txz or bins.tgz (burn-vision, burn-ddp-gpu-checks; old/burn-vision for the
# old build); benches/gpu/lib.sh unpacks them.
# Raw output in $OUT/host_bound.log; the summary table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/host_bound.log
SHOW="FAIL|passed, |img_per_s|error|panic|convolutions:|RESULT rank"
SHOW_LINES=3
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks "$B"/old/burn-vision 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee -a "$LOG"
nproc | sed 's/^/host cores: /' | tee -a "$LOG"
grep -m1 "model name" /proc/cpuinfo | tee -a "$LOG"
DEFAULT="check r50_bf16_cl_new r50_bf16_cl_old r50_bf16_cl_torch r50_f32_cl_new r50_f32_cl_torch"
W=${STEPS_TIMED:-20}
bench() { # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  step "$name" "${T_BENCH:-150}" "$bin" bench --warmup 3 --steps "$W" --gpus 0 "$@"
}
torch() { # NAME MODEL BATCH PRECISION LAYOUT [SIZE CHANNELS CLASSES SMALL]
  step "$1" 120 python3 benches/pytorch_baseline.py synthetic "$2" "$3" "${6:-224}" "${7:-3}" "${8:-1000}" "${9:-0}" 3 "$W" "$4" "$5"
}
R50="--model resnet50 --batch-size 256 --image-size 224 --classes 1000"
R18S="--model resnet18 --batch-size 256 --image-size 28 --channels 1 --classes 10 --small-input"
R34="--model resnet34 --batch-size 16 --image-size 224 --classes 1000"
VITB="--model vit_b16 --batch-size 128 --image-size 224 --classes 1000"
VITS="--model vit_s16 --batch-size 256 --image-size 224 --classes 1000"
for s in ${STEPS:-$DEFAULT}; do
  case $s in
    check) step burn-ddp-gpu-checks "${T_CHECK:-200}" "$B"/burn-ddp-gpu-checks --skip nccl ;;
    r50_bf16_cl_new) bench "$s" "$B"/burn-vision $R50 --precision bf16 --channels-last ;;
    r50_bf16_cl_old) bench "$s" "$B"/old/burn-vision $R50 --precision bf16 --channels-last ;;
    r50_bf16_cl_compile) step "$s" 400 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 1000 0 6 "$W" bf16 nhwc compile ;;
    vitb16_bf16_new) bench "$s" "$B"/burn-vision $VITB --precision bf16 ;;
    vitb16_bf16_torch) torch "$s" vit_b_16 128 bf16 nchw ;;
    vitb16_bf16_compile) step "$s" 400 python3 benches/pytorch_baseline.py synthetic vit_b_16 128 224 3 1000 0 6 "$W" bf16 nchw compile ;;
    vits16_bf16_new) bench "$s" "$B"/burn-vision $VITS --precision bf16 ;;
    vits16_bf16_torch) torch "$s" timm:vit_small_patch16_224 256 bf16 nchw ;;
    plain_gpu) chmod +x "$B"/plain_burn; step "$s" 120 "$B"/plain_burn --gpu --steps 30 --channels-last ;;
    r50_bf16_cl_torch) torch "$s" resnet50 256 bf16 nhwc ;;
    r50_f32_cl_new) bench "$s" "$B"/burn-vision $R50 --channels-last ;;
    r50_f32_cl_old) bench "$s" "$B"/old/burn-vision $R50 --channels-last ;;
    r50_f32_cl_torch) torch "$s" resnet50 256 f32 nhwc ;;
    r50_f32_new) bench "$s" "$B"/burn-vision $R50 --channels-first ;;
    r50_f32_torch) torch "$s" resnet50 256 f32 nchw ;;
    r50_bf16_cl_b128_new) bench "$s" "$B"/burn-vision --model resnet50 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --channels-last ;;
    r50_bf16_cl_b128_torch) torch "$s" resnet50 128 bf16 nhwc ;;
    r34_b16_new) bench "$s" "$B"/burn-vision $R34 --channels-first ;;
    r34_b16_old) bench "$s" "$B"/old/burn-vision $R34 ;;
    r34_b16_torch) torch "$s" resnet34 16 f32 nchw ;;
    r34_b16_cl_new) bench "$s" "$B"/burn-vision $R34 --channels-last ;;
    r34_b16_cl_torch) torch "$s" resnet34 16 f32 nhwc ;;
    r34_b16_bf16_cl_new) bench "$s" "$B"/burn-vision $R34 --precision bf16 --channels-last ;;
    r34_b16_bf16_cl_torch) torch "$s" resnet34 16 bf16 nhwc ;;
    r18s_new) bench "$s" "$B"/burn-vision $R18S --channels-first ;;
    r18s_torch) torch "$s" resnet18 256 f32 nchw 28 1 10 1 ;;
    r18s_cl_new) bench "$s" "$B"/burn-vision $R18S --channels-last ;;
    r18s_cl_torch) torch "$s" resnet18 256 f32 nhwc 28 1 10 1 ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
save_cache

echo; echo "SUMMARY (img/s; ratio = burn-vision / PyTorch of the same workload in this call; CPU ms per step per host thread)"
python3 - "$LOG" "$W" <<'PY'
import json, re, sys
log, steps = open(sys.argv[1]).read(), int(sys.argv[2])
runs = {}
for name, body in re.findall(r"=== (\S+): .*?\n(.*?)=== \1 rc", log, re.S):
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("RESULT "):
            line = line[len("RESULT "):]
        if line.startswith("{") and "img_per_s" in line:
            try:
                runs[name] = json.loads(line)
            except ValueError:
                pass
ok = re.findall(r"(\d+ passed, \d+ failed)", log)
print(f"GPU checks: {ok[-1] if ok else 'not run'}")
for name, r in runs.items():
    if name.endswith("_torch") or name.endswith("_compile"):
        continue
    work = name.rsplit("_", 1)[0]
    t = runs.get(work + "_torch")
    c = runs.get(work + "_compile")
    if c:
        print(f"{work + '_compile':24} {c['img_per_s']:9.1f}  (torch.compile; burn-vision {name} / compile = {r['img_per_s'] / c['img_per_s']:.2f}x)")
    ratio = f"{r['img_per_s'] / t['img_per_s']:.2f}x" if t else "-"
    threads = ", ".join(f"{x['name']} {1000 * x['cpu_s'] / steps:.0f}" for x in r.get("threads", [])[:4])
    host = r.get("host", {})
    print(f"{name:24} {r['img_per_s']:9.1f}  torch {t['img_per_s'] if t else float('nan'):9.1f}  {ratio:>6}  wall {1000 * r['seconds'] / steps:5.1f} ms/step  fwd {1000 * host.get('forward_s', 0) / steps:4.1f} bwd {1000 * host.get('backward_s', 0) / steps:4.1f} opt {1000 * host.get('optimizer_s', 0) / steps:4.1f}  threads: {threads}")
PY
