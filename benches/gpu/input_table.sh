#!/usr/bin/env bash
# The input pipeline's goals in one device call, on ImageNet-size photos
# (benches/make_photos.py: 9,600 JPEGs, 500x375, q90, 8 classes), PyTorch beside:
#   gpu_decode.sh PART=6   the decode checks; ResNet-50 bf16 b256 SGD training on the photos (GPU
#                          decode to RGB and to planes, CPU decode) against synthetic `bench`
#                          before and after; PyTorch 2.11's DataLoader(16 workers) and synthetic
#                          runs; bench-data each way; eval with either decoder; small JPEGs
#   gpu_decode.sh PART=18  bench-data's GPU decode with 8 and 32 hardware queues, alternated
#   shards.sh              tar shards against the class folder, CPU decode: bench-data to host
#                          memory (alternated twice) and to the GPU, ResNet-18 training on each
# Each writes its own folder under $OUT (p6/, p18/, shards/). Binaries: carry/bins.txz
# (burn-vision, burn-ddp-gpu-checks, xtask), burn-vision built with `--features host-profile`.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OUT=$OUT/p6 PART=6 bash benches/gpu/gpu_decode.sh > /dev/null 2>&1
OUT=$OUT/p18 PART=18 bash benches/gpu/gpu_decode.sh > /dev/null 2>&1
OUT=$OUT/shards bash benches/gpu/shards.sh > /dev/null 2>&1
cat "$OUT"/p6/summary.txt
python3 - "$OUT"/p18/gpu_decode.log <<'PY'
import json, re, sys
name = None
for line in open(sys.argv[1]):
    m = re.match(r"=== (\S+):", line)
    name = m.group(1) if m else name
    if line.startswith("{") and "img_per_s" in line:
        d = json.loads(line)
        print(f"{name}: {d['img_per_s']:.0f} img/s, {d.get('device_submit', {}).get('submit_ms', 0):.2f} ms a batch in nvJPEG's calls")
PY
grep -h "rc=" "$OUT"/p18/gpu_decode.log
sed -n '/^summary (img\/s):/,$p' "$OUT"/shards/shards1.log
grep -hE "epoch [0-9]+/[0-9]+:|rc=" "$OUT"/shards/shards1.log | cut -c1-200 | tail -16
