#!/usr/bin/env bash
# One device call on two H200s: `burn-vision train --gpus 0,1` end to end (DDP over NCCL, with
# and without SyncBatchNorm, and DataParallel), one GPU for the scaling ratio, and PyTorch DDP
# (torchrun) on the same model, data and per-GPU batch in the same call.
# The burn-vision binary comes from carry/ (B=...), built with
#   cargo build --release -p burn-vision --features cuda --bin burn-vision
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/multi_gpu.log
SHOW="RESULT|epoch [0-9]+/|rank [0-9]+:|ranks:|done:|error|panic|warn"
SHOW_LINES=12
source benches/gpu/lib.sh
BIN=$B/burn-vision
chmod +x "$BIN"
D=datasets/fashion-mnist-10k
BATCH=${BATCH:-128}
EPOCHS=${EPOCHS:-3}
burn() { # name, extra flags...
  local name=$1; shift
  rm -rf /tmp/run_$name
  step "$name" ${T_BURN:-150} "$BIN" train --data bundled --model resnet18 --batch-size $BATCH --epochs $EPOCHS --lr 0.002 --optimizer sgd --quiet --out /tmp/run_$name "$@"
  cp /tmp/run_$name/metrics.jsonl "$OUT/${name}_metrics.jsonl" 2>/dev/null
}
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee -a "$LOG"
for s in ${STEPS:-burn_1gpu burn_ddp burn_ddp_syncbn burn_dp torch_ddp torch_ddp_syncbn torch_1gpu}; do
  case $s in
    burn_1gpu)        burn burn_1gpu --gpus 0 ;;
    burn_ddp)         burn burn_ddp --gpus 0,1 ;;
    burn_ddp_syncbn)  burn burn_ddp_syncbn --gpus 0,1 --sync-bn ;;
    burn_dp)          burn burn_dp --gpus 0,1 --strategy dp ;;
    torch_ddp)        step torch_ddp 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benches/pytorch_ddp.py $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz $BATCH $EPOCHS ;;
    torch_ddp_syncbn) step torch_ddp_syncbn 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benches/pytorch_ddp.py $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz $BATCH $EPOCHS syncbn ;;
    torch_1gpu)       step torch_1gpu 150 python3 -m torch.distributed.run --standalone --nproc-per-node 1 benches/pytorch_ddp.py $D/images-idx3-ubyte.gz $D/labels-idx1-ubyte.gz $BATCH $EPOCHS ;;
  esac
done
save_cache

echo; echo "SUMMARY ResNet-18 (3x3 stem) on bundled Fashion-MNIST, batch $BATCH per GPU, img/s of the last epoch"
python3 - "$LOG" "$OUT" <<'PY'
import json, os, re, sys
log, out = open(sys.argv[1]).read(), sys.argv[2]
rows = {}
for name in ["burn_1gpu", "burn_ddp", "burn_ddp_syncbn", "burn_dp"]:
    p = os.path.join(out, f"{name}_metrics.jsonl")
    if os.path.exists(p):
        recs = [json.loads(l) for l in open(p) if l.strip()]
        if recs:
            rows[name] = (recs[-1]["img_per_s"], recs[-1]["val_acc"])
for name in ["torch_1gpu", "torch_ddp", "torch_ddp_syncbn"]:
    body = re.search(rf"=== {name}: .*?\n(.*?)=== {name} rc", log, re.S)
    res = [json.loads(l.split("RESULT ", 1)[1]) for l in (body.group(1).splitlines() if body else []) if "RESULT {" in l]
    if res:
        rows[name] = (res[-1]["img_per_s"], None)
def g(n): return rows.get(n, (float("nan"), None))[0]
print(f"{'run':18} {'img/s':>9} {'val acc':>8}")
for n, (ips, acc) in rows.items():
    print(f"{n:18} {ips:9.0f} {('%.2f%%' % (100 * acc)) if acc is not None else '':>8}")
print(f"burn 2-GPU DDP / 1 GPU scaling: {g('burn_ddp') / g('burn_1gpu'):.2f}   pytorch: {g('torch_ddp') / g('torch_1gpu'):.2f}")
print(f"burn / pytorch: 1 GPU {g('burn_1gpu') / g('torch_1gpu'):.2f}, DDP {g('burn_ddp') / g('torch_ddp'):.2f}, DDP+SyncBN {g('burn_ddp_syncbn') / g('torch_ddp_syncbn'):.2f}")
PY
