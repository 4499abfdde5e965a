#!/usr/bin/env bash
# One device call on two H200s: burn-ddp's NCCL conformance + all-reduce bandwidth, launched
# with burn-ddp's own launcher, then PyTorch's dist.all_reduce in the same call.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source benches/gpu/env.sh
B=${B:-carry_nccl}
chmod +x $B/*
LOG=$OUT/nccl_2gpu.log
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$LOG"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$LOG"
echo "=== burn-ddp: $B/burn-ddp launch --standalone --nproc-per-node 2 -- $B/nccl_bench" | tee -a "$LOG"
timeout ${T:-120} $B/burn-ddp launch --standalone --nproc-per-node 2 -- $B/nccl_bench 2>&1 | tee -a "$LOG" | grep -E "RESULT|error|panic"
echo "=== pytorch: python3 -m torch.distributed.run --standalone --nproc-per-node 2 benches/pytorch_allreduce.py" | tee -a "$LOG"
timeout ${T:-120} python3 -m torch.distributed.run --standalone --nproc-per-node 2 benches/pytorch_allreduce.py 2>&1 | tee -a "$LOG" | grep -E "RESULT|Error"
echo; echo "SUMMARY all-reduce bus bandwidth, 2 GPUs (GB/s)"
python3 - "$LOG" <<'PY'
import re, sys
rows = {}
for fw, mib, bus in re.findall(r"RESULT framework=(\S+) MiB=(\d+) ms=\S+ algbw_GBs=\S+ busbw_GBs=(\S+)", open(sys.argv[1]).read()):
    rows.setdefault(int(mib), {})[fw] = float(bus)
print(f"{'MiB':>6} {'burn-ddp':>9} {'pytorch':>9} {'ratio':>6}")
for mib in sorted(rows):
    b, t = rows[mib].get("burn-ddp"), rows[mib].get("pytorch")
    print(f"{mib:>6} {b or float('nan'):9.1f} {t or float('nan'):9.1f} {(b / t if b and t else float('nan')):6.3f}")
PY
