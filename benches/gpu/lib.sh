# Shared by the GPU run scripts (source it after setting LOG and SHOW): the GPU machine's
# library paths, the binaries (bins.tgz or bins.txz) and autotune cache carried in $B (default carry/), and
# the workloads R50, VB, VS and R18B (bench arguments), fm224 (the tutorial's JPEG folder), and
# `step NAME TIMEOUT COMMAND...`, which appends the command's whole output to $LOG, shows the
# lines matching $SHOW, and logs its exit code and wall time.
source benches/gpu/env.sh
B=${B:-carry}
[ -f "$B"/bins.tgz ] && tar xzf "$B"/bins.tgz -C "$B"
# xz-packed binaries (smaller; Python unpacks them, so no xz tool is needed there).
[ -f "$B"/bins.txz ] && python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$B"/bins.txz "$B"
# cubecl keeps autotune results under ./target (repo root) for binaries built before 2026-12-01's kernel cache;
# since then burn-ddp's kernel caches (autotune + PTX) live in $BURN_DDP_CACHE_DIR: restore
# the last call's (carry/kernel-cache.tgz) unless the script wants them cold.
[ -f "$B"/cubecl-cache.tgz ] && mkdir -p target && tar xzf "$B"/cubecl-cache.tgz -C target
export BURN_DDP_CACHE_DIR=${BURN_DDP_CACHE_DIR:-/tmp/burn-ddp-cache}
[ -f "$B"/kernel-cache.tgz ] && mkdir -p "$BURN_DDP_CACHE_DIR" && tar xzf "$B"/kernel-cache.tgz -C "$BURN_DDP_CACHE_DIR"
: > "$LOG"
# What ran it, at the top of every log.
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv 2>&1 | tee -a "$LOG"
echo "libcupti from: ${CUPTI_DIR:-not found}" | tee -a "$LOG"
# The bf16 training workloads the comparisons time (synthetic 224², SGD unless a script adds
# --optimizer; 5 warm-up and $STEPS timed steps, PyTorch's baseline likewise).
STEPS=${STEPS:-30}
R50=(bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
VB=(bench --gpus 0 --model vit_b16 --batch-size 128 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
VS=(bench --gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 1000 --precision bf16 --warmup 5 --steps "$STEPS")
# The host-bound DDP workload: ResNet-18 on the bundled 28² images, 300 timed steps.
R18B=(bench --gpus 0 --model resnet18 --batch-size 256 --image-size 28 --channels 1 --classes 10 --small-input --precision bf16 --warmup 5 --steps 300)
# The tutorial's data: the bundled images as a 224² JPEG class folder, made once.
fm224() {
  local d=datasets/fashion-mnist-10k
  [ -d /tmp/fm224 ] || python3 benches/pytorch_baseline.py make-folder $d/images-idx3-ubyte.gz $d/labels-idx1-ubyte.gz /tmp/fm224 224 >>"$LOG" 2>&1
}
step() {
  local name=$1 t=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local s=$(date +%s.%N)
  timeout "$t" "$@" 2>&1 | tee -a "$LOG" | grep -E "$SHOW" | tail -n ${SHOW_LINES:-6}
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc wall=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$s" "$(date +%s.%N)")s" | tee -a "$LOG"
}
# Keeps cubecl's autotune results for the next call (only the cache: ./target may be a whole
# Cargo target directory where this runs on a development machine).
save_cache() {
  [ -d target/autotune ] && tar czf "$OUT/cubecl-cache.tgz" -C target ./autotune 2>/dev/null
  [ -d "$BURN_DDP_CACHE_DIR" ] && tar czf "$OUT/kernel-cache.tgz" -C "$BURN_DDP_CACHE_DIR" . 2>/dev/null
}
# Replaces each FILE with FILE.xz (Python's lzma: the GPU machine has no xz tool).
xz_files() {
  python3 -c "import lzma, os, sys; [(open(f + '.xz', 'wb').write(lzma.compress(open(f, 'rb').read())), os.remove(f)) for f in sys.argv[1:]]" "$@"
}
