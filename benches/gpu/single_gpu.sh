#!/usr/bin/env bash
# One device call on one H200: burn-vision (CUDA) next to PyTorch on the same GPU.
# Usage (repo root on the GPU machine, binary carried in carry/): bash benches/gpu/single_gpu.sh
# Writes raw logs to $OUT (or /tmp/out) and prints a summary table last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/single_gpu.log
SHOW="RESULT|img_per_s|epoch |done:|error"
SHOW_LINES=5
source benches/gpu/lib.sh
BIN=${BIN:-$B/burn-vision}
chmod +x "$BIN"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$LOG"
D=datasets/fashion-mnist-10k

R50B=${R50_BATCH:-256}
# Workloads, run in the order given by $STEPS (default: all). Timeouts leave room for Burn's
# first-time autotuning, which dominates a fresh machine (see docs/benchmarks.md).
burn_r50_synth()  { step burn_r50_synth ${T_R50:-270} $BIN bench --model resnet50 --batch-size $R50B --image-size 224 --classes 1000 --warmup 2 --steps 10 --gpus 0 --channels-first; }
burn_r50_upload() { step burn_r50_synth_upload ${T_R50:-270} $BIN bench --model resnet50 --batch-size $R50B --image-size 224 --classes 1000 --warmup 2 --steps 10 --gpus 0 --host-input --channels-first; }
bench_data()      { make_folder; step bench_data 120 $BIN bench-data --data /tmp/fm256 --batch-size $R50B --batches 10; }
torch_r50_synth() { step torch_r50_synth 90 python3 benches/pytorch_baseline.py synthetic resnet50 $R50B 224 3 1000 0 2 10; }
burn_r18_synth()  { step burn_r18_fmnist_synth ${T_R18:-150} $BIN bench --model resnet18 --batch-size 256 --image-size 28 --channels 1 --classes 10 --small-input --warmup 2 --steps 20 --gpus 0 --channels-first; }
torch_r18_synth() { step torch_r18_fmnist_synth 60 python3 benches/pytorch_baseline.py synthetic resnet18 256 28 1 10 1 2 20; }
burn_r18_train()  { rm -rf /tmp/run_r18; step burn_r18_fmnist_train ${T_R18T:-120} $BIN train --data bundled --model resnet18 --batch-size 256 --epochs 1 --max-steps-per-epoch 30 --val-fraction 0.05 --lr 0.002 --gpus 0 --quiet --out /tmp/run_r18; cp /tmp/run_r18/metrics.jsonl "$OUT/burn_r18_fmnist_metrics.jsonl" 2>/dev/null; }
make_folder()     { [ -d /tmp/fm256 ] || python3 benches/pytorch_baseline.py make-folder $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz /tmp/fm256 256 >>"$LOG" 2>&1; }
burn_r50_folder() { make_folder; rm -rf /tmp/run_r50; step burn_r50_folder_train 180 $BIN train --data /tmp/fm256 --model resnet50 --batch-size $R50B --epochs 1 --max-steps-per-epoch ${R50_STEPS:-30} --val-fraction 0.05 --optimizer sgd --momentum 0.9 --weight-decay 0 --lr 0.01 --gpus 0 --quiet --out /tmp/run_r50; cp /tmp/run_r50/metrics.jsonl "$OUT/burn_r50_folder_metrics.jsonl" 2>/dev/null; }
# The same run with the default optimizer (AdamW, weight decay 5e-4), for its cost per step.
burn_r50_folder_adamw() { make_folder; rm -rf /tmp/run_r50a; step burn_r50_folder_adamw 180 $BIN train --data /tmp/fm256 --model resnet50 --batch-size $R50B --epochs 1 --max-steps-per-epoch ${R50_STEPS:-30} --val-fraction 0.05 --gpus 0 --quiet --out /tmp/run_r50a; cp /tmp/run_r50a/metrics.jsonl "$OUT/burn_r50_folder_adamw_metrics.jsonl" 2>/dev/null; }
torch_r50_folder(){ make_folder; step torch_r50_folder 120 python3 benches/pytorch_baseline.py folder /tmp/fm256 $R50B ${R50_STEPS:-30}; }
torch_r50_folder_cl(){ make_folder; step torch_r50_folder_cl 120 python3 benches/pytorch_baseline.py folder /tmp/fm256 $R50B ${R50_STEPS:-30} nhwc; }
for s in ${STEPS:-burn_r18_synth torch_r18_synth burn_r18_train burn_r50_synth torch_r50_synth burn_r50_folder torch_r50_folder}; do $s; done
save_cache

echo; echo "SUMMARY (img/s; burn = burn-vision on burn-cuda 0.21 autotune+fusion, f32)"
python3 - "$LOG" "$OUT" <<'PY'
import json, re, sys, glob, os
log = open(sys.argv[1]).read()
rows = {}
for name, body in re.findall(r"=== (\w+): .*?\n(.*?)=== \1 rc", log, re.S):
    for line in body.splitlines():
        line = line.replace("RESULT ", "")
        if line.startswith("{"):
            try: rows[name] = json.loads(line)["img_per_s"]
            except Exception: pass
for f, name in [("burn_r18_fmnist_metrics.jsonl", "burn_r18_fmnist_train"), ("burn_r50_folder_metrics.jsonl", "burn_r50_folder_train"), ("burn_r50_folder_adamw_metrics.jsonl", "burn_r50_folder_adamw")]:
    p = os.path.join(sys.argv[2], f)
    if os.path.exists(p):
        recs = [json.loads(l) for l in open(p)]
        # After the first step (one-time tuning excluded), as PyTorch's figure is after warm-up.
        rows[name] = recs[-1].get("steady_img_per_s") or recs[-1]["img_per_s"]
        if "r18" in f: rows[name + "_val_acc"] = recs[-1]["val_acc"]
        print(f"{name}: data_wait_s={recs[-1].get('data_wait_s')} seconds={recs[-1]['seconds']} phases_s={recs[-1].get('phases_s')}")
pairs = [("ResNet-50 224² synthetic", "burn_r50_synth", "torch_r50_synth"),
         ("ResNet-50 224² synthetic, host upload", "burn_r50_synth_upload", "torch_r50_synth"),
         ("input pipeline alone (bench-data)", "bench_data", None),
         ("ResNet-18 28² 1ch synthetic", "burn_r18_fmnist_synth", "torch_r18_fmnist_synth"),
         ("ResNet-50 224² JPEG folder (SGD; burn's GPU default layout: channels-last)", "burn_r50_folder_train", "torch_r50_folder"),
         ("  same, against PyTorch channels_last", "burn_r50_folder_train", "torch_r50_folder_cl"),
         ("ResNet-50 224² JPEG folder, AdamW", "burn_r50_folder_adamw", None),
         ("ResNet-18 bundled FMNIST train", "burn_r18_fmnist_train", None)]
print(f"{'workload':38} {'burn':>10} {'pytorch':>10} {'ratio':>7}")
for label, b, t in pairs:
    bv, tv = rows.get(b), rows.get(t) if t else None
    ratio = f"{bv / tv:.3f}" if bv and tv else "-"
    print(f"{label:38} {bv or float('nan'):10.1f} {tv or float('nan'):10.1f} {ratio:>7}")
if "burn_r18_fmnist_train_val_acc" in rows: print("burn ResNet-18 bundled val acc after the run:", rows["burn_r18_fmnist_train_val_acc"])
PY
