#!/usr/bin/env bash
# What DistributedDataParallel costs on one GPU: each workload plain and through DDP over a
# one-rank NCCL group — every bucket goes through NCCL, there is no world-size-1 shortcut for
# DDP's buckets — with PyTorch's DDP over a one-rank NCCL group beside it, pairs alternated.
#   PART=1  `burn-ddp-gpu-checks nccl` (NCCL ordered on the device; DDP against plain training;
#           bf16-compressed DDP within bf16 rounding; DDP's host time per step), then
#           ResNet-50 bf16 channels-last b256 and ViT-B/16 bf16 b128 on synthetic batches:
#           ours plain, ours `bench --ddp`, PyTorch eager, PyTorch DDP — twice in that order.
#   PART=2  ResNet-18 on the bundled 28² data b256 (host-bound): the synthetic step plain,
#           `--ddp` and `--ddp --no-overlap` (DDP without gradient hooks), then training for 6
#           epochs; and the tutorial preset (ResNet-34, batch 16, SyncBatchNorm) on 224² JPEGs
#           for 1 epoch — each plain and under `burn-ddp launch --nproc-per-node 1`, alternated
#           twice; ResNet-50 with bf16-compressed gradients.
#   PART=3  the rows a host-bound step makes noisy, with more pairs: `burn-ddp-gpu-checks nccl`,
#           the tutorial preset plain / under the launcher three times, the ResNet-18 28²
#           synthetic step plain / `--ddp` four times.
#   PART=4  is the host-bound rows' spread a matter of where the busy threads land? The CPU
#           topology (lscpu), then the ResNet-18 28² synthetic step plain / `--ddp` six times
#           as the scheduler places it, and six times confined to one logical CPU per physical
#           core (taskset: no two busy threads on one core's hyperthreads); each run's threads
#           and the CPUs they ran on are sampled 3 s in (ps -L).
#   PART=5  DDP's cost without the spread between processes: `bench --ddp --ddp-interleave 25`
#           alternates blocks of 25 plain and 25 DDP steps in one process (ResNet-18 28² b256,
#           300 and 600 timed steps, three runs each; ResNet-50 and ViT-B/16 once), each block
#           timed to the device's end; each also with BURN_DDP_ENQUEUE_THREAD=1 (the NCCL
#           enqueue off cubecl's device thread, experimental), after `nccl`'s checks with it.
#   PART=6  collectives ordered by CUDA events (the default since 2026-12-05) against the
#           flags and fence kernels (BURN_DDP_DIRECT_FENCES=0): the NCCL, SyncBatchNorm and
#           same-stream checks both ways, then the interleaved rows of PART=5 (ResNet-18 28²
#           twice, ResNet-50, ViT-B/16) each way, and ViT-B/16 with 100 MiB buckets
#           (--bucket-cap-mb 100: 4 buckets instead of 16).
#   PART=7  PART=1's ResNet-50 rows alone, three pairs (the spread between processes makes
#           them the noisiest of PART=1).
#   PART=8  the host-bound goals on one build: the batch-norm, NCCL, SyncBatchNorm and
#           same-stream checks, the ResNet-18 28² interleaved row three times, the tutorial
#           preset plain / under the launcher twice (SKIP_TUT=1 leaves them out), then
#           ResNet-50's and ViT-B/16's interleaved rows once.
#   PART=9  every goal of the DDP cost in one call, PyTorch beside each row: the batch-norm,
#           NCCL, SyncBatchNorm and same-stream checks; twice, ResNet-50 bf16 b256 and ViT-B/16
#           bf16 b128 (synthetic 224²) and ResNet-18 on 28² b256 (host-bound), each ours plain, ours
#           `bench --ddp`, PyTorch eager, PyTorch DDP; the tutorial preset (1 epoch) plain and
#           under `burn-ddp launch --nproc-per-node 1`, and PyTorch's tutorial plain and under
#           DDP with SyncBatchNorm (f32 channels-last, 16 loader workers); then the in-process
#           rows (`--ddp-interleave`) of ResNet-18 28² twice, ResNet-50, ViT-B/16 and the
#           tutorial's model alone (ResNet-34 b16 224² f32, synthetic).
#           REPS=1: each between-process pair once (about half the time).
#   PART=10 where the host-bound rows' DDP cost lies, inside one process (`--ddp-interleave 25`),
#           twice: the tutorial's model (ResNet-34 b16 224² f32) and ResNet-18 28² b256 (600
#           steps), each with DDP's defaults, in one bucket (`--bucket-cap-mb 100`: per-bucket
#           work) and without overlap (`--no-overlap`: no gradient hooks, buckets after backward).
#           REPS=1: once.
#   PART=11 DDP's parts timed apart, inside one process (`--ddp-interleave 25`), twice: the
#           tutorial's model and ResNet-18 28² b256 (600 steps), each whole, then leaving out
#           (BURN_DDP_DIAGNOSE, a world of one only) in turn: NCCL's all-reduce
#           (no-collective), all but the fences (fences-only: NCCL's stream ordered after
#           burn's and back, nothing in between), everything on NCCL's stream (no-stream-work:
#           burn-fusion's bucket and join operations only), every bucket operation
#           (no-device-ops: the plan, the gradient hooks and the hand-over only) — the levels
#           in DIAGNOSE, by default all but no-collective — after the NCCL and SyncBatchNorm
#           checks. REPS=1: once.
#   PART=12 the host-bound rows inside one process (`--ddp-interleave 25`), twice: the
#           tutorial's model and ResNet-18 28² b256 (600 steps), each with DIR's binaries first
#           when OLD=DIR is given (bins.txz there is unpacked), then with these; after the
#           same-stream, NCCL and SyncBatchNorm checks. REPS=1: once. ALT='VAR=VALUE ...': each
#           also with these binaries under those variables (alt_*), right after. LARGE=1: then
#           ResNet-50 bf16 b256 and ViT-B/16 bf16 b128 in one process (60 steps in blocks of 10),
#           these binaries only (and under ALT).
#   PART=13 the host-bound ResNet-18 28² b256 row between processes, as the goal measures it:
#           PAIRS pairs (default 6) of `bench` plain and `bench --ddp`, alternated, ours only
#           (PyTorch's pairs are PART=9's).
#   PART=14 which host thread sets a host-bound DDP step's pace, inside one process
#           (`--ddp-interleave 25`): after the batch-norm, same-stream, NCCL and SyncBatchNorm
#           checks, REPS times (default 2) ResNet-18 28² b256 (600 steps) and the tutorial's
#           model, each as is and with SPIN_US microseconds (default 300) of busy host work
#           added once per DDP step on the training thread, burn-fusion's thread and cubecl's
#           device thread in turn (BURN_DDP_DIAGNOSE_SPIN): a step slows by the whole amount
#           only where that thread sets its pace; and the tutorial's model in one bucket (`--bucket-cap-mb 100`) and in
#           about 18 (`--bucket-cap-mb 5`): what a bucket costs beyond its gradients.
#   OLD=DIR also runs DIR's binaries (an earlier build) the same way, where they can.
# Binaries: carry/bins.txz (burn-vision, burn-ddp, burn-ddp-gpu-checks; release, CUDA). Raw log
# $OUT/ddp-cost-PART.log; the summary table last (benches/gpu/ddp_cost_summary.py).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-1}
LOG=$OUT/ddp-cost-$PART.log
SHOW="RESULT|rror|panick|FAIL"; SHOW_LINES=3
B=${B:-carry}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp "$B"/burn-ddp-gpu-checks 2>/dev/null
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee -a "$LOG"
BV="$B"/burn-vision
# A training run's metrics.jsonl into the log, each line prefixed with the run's name.
metrics() { sed "s/^/METRICS $1 /" "$2/metrics.jsonl" >>"$LOG" 2>/dev/null; }
# `train_pair NAME I BINDIR ARGS...`: BINDIR's `burn-vision ARGS` alone (NAME_plain_I), then
# under its `burn-ddp launch --nproc-per-node 1` (NAME_ddp_I), each run's metrics into the log.
train_pair() {
  local name=$1 i=$2 bins=$3; shift 3
  rm -rf /tmp/$name-plain-$i /tmp/$name-ddp-$i
  step ${name}_plain_$i 300 "$bins"/burn-vision "$@" --out /tmp/$name-plain-$i
  metrics ${name}_plain_$i /tmp/$name-plain-$i
  step ${name}_ddp_$i 300 "$bins"/burn-ddp launch --standalone --nproc-per-node 1 "$bins"/burn-vision "$@" --out /tmp/$name-ddp-$i
  metrics ${name}_ddp_$i /tmp/$name-ddp-$i
}
# `ddp_pair NAME I OURS TORCH...`: our `burn-vision` with the arguments of the array named OURS
# plain (NAME_plain_I) and with `--ddp` (NAME_ddp_I), then `pytorch_baseline.py TORCH...` eager
# (NAME_torch_I) and under DDP (NAME_torch_ddp_I).
ddp_pair() {
  local name=$1 i=$2; local -n ours=$3; shift 3
  step ${name}_plain_$i 150 "$BV" "${ours[@]}"
  step ${name}_ddp_$i 150 "$BV" "${ours[@]}" --ddp
  step ${name}_torch_$i 120 python3 benches/pytorch_baseline.py "$@" eager
  step ${name}_torch_ddp_$i 120 python3 benches/pytorch_baseline.py "$@" ddp
}
R50T=(synthetic resnet50 256 224 3 1000 0 5 "$STEPS" bf16 nhwc)
VBT=(synthetic vit_b_16 128 224 3 1000 0 5 "$STEPS" bf16 nchw)
R18=(train --model resnet18 --batch-size 256 --epochs 6 --optimizer sgd --precision bf16 --gpus 0 --quiet)
TUT=(train --data /tmp/fm224 --preset tutorial --epochs 1 --gpus 0 --quiet)
# The tutorial's model and batch alone (ResNet-34 b16 224², f32, synthetic): no data pipeline,
# no launcher.
TUTM=(bench --gpus 0 --model resnet34 --batch-size 16 --image-size 224 --classes 10 --warmup 5 --steps 500)
# `interleaved_variants I W VAR PREFIX VALUE...`: the workload array named W (TUTM or R18L) in
# one process (`--ddp --ddp-interleave 25`) as is, then under VAR=VALUE for each VALUE (the
# run named after PREFIX and VALUE up to a colon).
interleaved_variants() {
  local i=$1 w=$2 var=$3 prefix=$4; shift 4
  local name label; name=$([ "$w" = TUTM ] && echo tut_model || echo r18s)
  local -n args=$w
  step ${name}_interleaved_$i 150 "$BV" "${args[@]}" --ddp --ddp-interleave 25
  for v in "$@"; do
    label=$prefix${v%%:*}
    step ${name}_${label//-/_}_interleaved_$i 150 env $var=$v "$BV" "${args[@]}" --ddp --ddp-interleave 25
  done
}
if [ "$PART" = 1 ] || [ "$PART" = 7 ]; then
  [ "$PART" = 1 ] && step check_nccl 300 "$B"/burn-ddp-gpu-checks nccl
  for i in $([ "$PART" = 7 ] && echo 1 2 3 || echo 1 2); do ddp_pair r50 $i R50 "${R50T[@]}"; done
  for i in $([ "$PART" = 7 ] || echo 1 2); do ddp_pair vitb16 $i VB "${VBT[@]}"; done
elif [ "$PART" = 2 ]; then
  for i in 1 2; do
    step r18s_plain_$i 150 "$BV" "${R18B[@]}"
    step r18s_ddp_$i 150 "$BV" "${R18B[@]}" --ddp
    step r18s_ddp_no_overlap_$i 150 "$BV" "${R18B[@]}" --ddp --no-overlap
  done
  for i in 1 2; do train_pair r18 $i "$B" "${R18[@]}"; done
  fm224
  for i in 1 2; do train_pair tut $i "$B" "${TUT[@]}"; done
  step r50_ddp_bf16 300 "$BV" "${R50[@]}" --ddp --grad-compression bf16
  step r50_plain_3 300 "$BV" "${R50[@]}"
  step r50_ddp_3 300 "$BV" "${R50[@]}" --ddp
  if [ -n "${OLD:-}" ]; then
    # The earlier build's DDP (its bench has no --ddp): the training rows only.
    chmod +x "$OLD"/burn-vision "$OLD"/burn-ddp
    train_pair old_r18 1 "$OLD" "${R18[@]}"
  fi
elif [ "$PART" = 3 ]; then
  step check_nccl 300 "$B"/burn-ddp-gpu-checks nccl
  fm224
  for i in 1 2 3; do train_pair tut $i "$B" "${TUT[@]}"; done
  for i in 1 2 3 4; do
    step r18s_plain_$i 150 "$BV" "${R18B[@]}"
    step r18s_ddp_$i 150 "$BV" "${R18B[@]}" --ddp
  done
elif [ "$PART" = 4 ]; then
  lscpu | tee -a "$LOG"
  # One logical CPU per physical core: the first CPU listed for each (socket, core).
  CORES=$(lscpu -p=CPU,SOCKET,CORE | grep -v '^#' | sort -t, -k2,2n -k3,3n -u | cut -d, -f1 | paste -sd, -)
  echo "one CPU per core: $CORES" | tee -a "$LOG"
  # `placed NAME ARGS...`: the run, with its threads' CPUs sampled 3 s in.
  placed() {
    local name=$1; shift
    ( sleep 3; echo "THREADS $name"; ps -L -o tid=,psr=,pcpu=,comm= -p "$(pgrep -n burn-vision)" 2>/dev/null ) >>"$LOG" &
    step "$name" 150 "$@"
    wait
  }
  for i in 1 2 3 4 5 6; do
    placed r18s_plain_$i "$BV" "${R18B[@]}"
    placed r18s_ddp_$i "$BV" "${R18B[@]}" --ddp
  done
  for i in 1 2 3 4 5 6; do
    placed r18s_pinned_plain_$i taskset -c "$CORES" "$BV" "${R18B[@]}"
    placed r18s_pinned_ddp_$i taskset -c "$CORES" "$BV" "${R18B[@]}" --ddp
  done
elif [ "$PART" = 5 ]; then
  # DDP's checks with the buckets' NCCL work enqueued by burn-ddp's enqueue thread
  # (BURN_DDP_ENQUEUE_THREAD=1, experimental), then each row without and with it.
  step checks_enqueue_thread 200 env BURN_DDP_ENQUEUE_THREAD=1 "$B"/burn-ddp-gpu-checks nccl
  for i in 1 2 3; do
    step r18s_interleaved_$i 150 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25
    step r18s_interleaved_enqueue_$i 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25
    step r18s_interleaved_long_$i 150 "$BV" "${R18L[@]}" --ddp --ddp-interleave 25
  done
  step r50_interleaved 150 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step r50_interleaved_enqueue 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved 150 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved_enqueue 150 env BURN_DDP_ENQUEUE_THREAD=1 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
elif [ "$PART" = 6 ]; then
  SHOW_LINES=20 step checks_events 300 "$B"/burn-ddp-gpu-checks same-stream nccl sync-batch-norm
  SHOW_LINES=20 step checks_flags 300 env BURN_DDP_DIRECT_FENCES=0 "$B"/burn-ddp-gpu-checks same-stream nccl sync-batch-norm
  for way in events flags; do
    run=(env BURN_DDP_DIRECT_FENCES=$([ $way = events ] && echo 1 || echo 0) "$BV")
    for i in 1 2; do step r18s_${way}_interleaved_$i 150 "${run[@]}" "${R18B[@]}" --ddp --ddp-interleave 25; done
    step r50_${way}_interleaved 150 "${run[@]}" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
    step vitb16_${way}_interleaved 150 "${run[@]}" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
  done
  step vitb16_events_100mib_interleaved 150 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10 --bucket-cap-mb 100
elif [ "$PART" = 8 ]; then
  SHOW_LINES=20 step checks 300 "$B"/burn-ddp-gpu-checks batch-norm same-stream nccl sync-batch-norm
  for i in 1 2 3; do step r18s_interleaved_$i 150 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25; done
  if [ "${SKIP_TUT:-0}" != 1 ]; then
    fm224
    for i in 1 2; do train_pair tut $i "$B" "${TUT[@]}"; done
  fi
  step r50_interleaved 150 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved 150 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
elif [ "$PART" = 9 ]; then
  SHOW_LINES=20 step checks 300 "$B"/burn-ddp-gpu-checks batch-norm same-stream nccl sync-batch-norm
  fm224
  R18T=(synthetic resnet18 256 28 1 10 1 5 300 bf16 nhwc)
  for i in $(seq 1 "${REPS:-2}"); do
    ddp_pair r50 $i R50 "${R50T[@]}"
    ddp_pair vitb16 $i VB "${VBT[@]}"
    ddp_pair r18s $i R18B "${R18T[@]}"
    train_pair tut $i "$B" "${TUT[@]}"
  done
  step tut_torch_plain_1 200 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 1 f32 nhwc 16
  step tut_torch_ddp_1 200 python3 benches/pytorch_baseline.py tutorial /tmp/fm224 1 f32 nhwc 16 ddp
  for i in 1 2; do step r18s_interleaved_$i 150 "$BV" "${R18B[@]}" --ddp --ddp-interleave 25; done
  step r50_interleaved 150 "$BV" "${R50[@]/$STEPS/100}" --ddp --ddp-interleave 10
  step vitb16_interleaved 150 "$BV" "${VB[@]/$STEPS/100}" --ddp --ddp-interleave 10
  # The tutorial's model and batch (ResNet-34 b16 224², f32) without its data pipeline or the
  # launcher: whether the tutorial's DDP cost is DDP's or the processes' around it.
  step tut_model_interleaved 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25
elif [ "$PART" = 10 ]; then
  R18L=("${R18B[@]/300/600}")
  for i in $(seq 1 "${REPS:-2}"); do
    step tut_model_interleaved_$i 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25
    step tut_model_one_bucket_interleaved_$i 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25 --bucket-cap-mb 100
    step tut_model_no_overlap_interleaved_$i 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25 --no-overlap
    step r18s_interleaved_$i 150 "$BV" "${R18L[@]}" --ddp --ddp-interleave 25
    step r18s_one_bucket_interleaved_$i 150 "$BV" "${R18L[@]}" --ddp --ddp-interleave 25 --bucket-cap-mb 100
    step r18s_no_overlap_interleaved_$i 150 "$BV" "${R18L[@]}" --ddp --ddp-interleave 25 --no-overlap
  done
elif [ "$PART" = 11 ]; then
  SHOW_LINES=20 step checks 300 "$B"/burn-ddp-gpu-checks nccl sync-batch-norm
  R18L=("${R18B[@]/300/600}")
  for i in $(seq 1 "${REPS:-2}"); do
    for w in TUTM R18L; do
      interleaved_variants $i $w BURN_DDP_DIAGNOSE "" ${DIAGNOSE:-fences-only no-stream-work no-device-ops}
    done
  done
  for t in perf nsys; do echo "$t: $(command -v $t || echo not found)" | tee -a "$LOG"; done
elif [ "$PART" = 12 ]; then
  SHOW_LINES=20 step checks 300 "$B"/burn-ddp-gpu-checks batch-norm same-stream nccl sync-batch-norm
  R18L=("${R18B[@]/300/600}")
  [ -n "${OLD:-}" ] && { [ -f "$OLD"/bins.txz ] && python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$OLD"/bins.txz "$OLD"; chmod +x "$OLD"/burn-vision; }
  for i in $(seq 1 "${REPS:-2}"); do
    for w in TUTM R18L; do
      name=$([ $w = TUTM ] && echo tut_model || echo r18s)
      declare -n args=$w
      [ -n "${OLD:-}" ] && step old_${name}_interleaved_$i 150 "$OLD"/burn-vision "${args[@]}" --ddp --ddp-interleave 25
      step ${name}_interleaved_$i 150 "$BV" "${args[@]}" --ddp --ddp-interleave 25
      [ -n "${ALT:-}" ] && step alt_${name}_interleaved_$i 150 env $ALT "$BV" "${args[@]}" --ddp --ddp-interleave 25
      unset -n args
    done
  done
  if [ "${LARGE:-0}" = 1 ]; then
    step r50_interleaved 150 "$BV" "${R50[@]/$STEPS/60}" --ddp --ddp-interleave 10
    [ -n "${ALT:-}" ] && step alt_r50_interleaved 150 env $ALT "$BV" "${R50[@]/$STEPS/60}" --ddp --ddp-interleave 10
    step vitb16_interleaved 150 "$BV" "${VB[@]/$STEPS/60}" --ddp --ddp-interleave 10
    [ -n "${ALT:-}" ] && step alt_vitb16_interleaved 150 env $ALT "$BV" "${VB[@]/$STEPS/60}" --ddp --ddp-interleave 10
  fi
elif [ "$PART" = 14 ]; then
  SHOW_LINES=20 step checks 300 "$B"/burn-ddp-gpu-checks batch-norm same-stream nccl sync-batch-norm
  R18L=("${R18B[@]/300/600}")
  for i in $(seq 1 "${REPS:-2}"); do
    for w in R18L TUTM; do
      interleaved_variants $i $w BURN_DDP_DIAGNOSE_SPIN spin_ training:${SPIN_US:-300} fusion:${SPIN_US:-300} device:${SPIN_US:-300}
    done
    step tut_model_one_bucket_interleaved_$i 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25 --bucket-cap-mb 100
    step tut_model_5mb_buckets_interleaved_$i 150 "$BV" "${TUTM[@]}" --ddp --ddp-interleave 25 --bucket-cap-mb 5
  done
elif [ "$PART" = 13 ]; then
  for i in $(seq 1 "${PAIRS:-6}"); do
    step r18s_plain_$i 150 "$BV" "${R18B[@]}"
    step r18s_ddp_$i 150 "$BV" "${R18B[@]}" --ddp
  done
fi
save_cache
python3 benches/gpu/ddp_cost_summary.py "$LOG" | tee -a "$LOG"
