#!/usr/bin/env bash
# JPEGs decoded on the GPU (nvJPEG, crop/resize/flip/normalise in one kernel) against the CPU
# decode, on ImageNet-size photos, with PyTorch's DataLoader beside:
#   benches/make_photos.py: 9,600 photos, 500x375 JPEG q90, 8 classes (scikit-image's samples)
#   burn-ddp-gpu-checks crop-resize jpeg-decode (the photos added to the decode check's JPEGs)
#   burn-vision bench-data b256, 30 batches, RandomResizedCrop 224 + flip + normalise, to GPU 0:
#     --decode cpu / gpu alternated twice
#   ResNet-50 bf16 b256 SGD: `bench` on synthetic batches, then `train` 3 epochs on the photos
#     with --decode gpu, cpu, gpu (steady img/s, data wait, accuracy), each under a
#     wrapper that reports the host cores busy (CPU seconds / wall seconds)
#   PyTorch 2.11: the same model on the same folder, DataLoader(16 workers), bf16 autocast,
#     channels_last, SGD (benches/pytorch_baseline.py folder), and on synthetic batches
#   ResNet-18 bf16 b128, 3 epochs, --decode gpu and cpu: validation accuracy on either path
# In PART=6, `BURN_DDP_DECODE_OUTPUT=planes` runs beside the default: the Y, Cb, Cr planes
# converted in the crop kernel against the default's nvJPEG colour conversion to RGB (decode
# check, training twice, alternated with the default's runs, and bench-data).
# PART=2 leaves out the checks and bench-data (the training rows alone); PART=3 times every
# kernel of a GPU-decoded bench-data run with Nsight Compute (ncu) instead; PART=4 trains on
# small JPEGs (the bundled Fashion-MNIST at 224x224) with either decoder; PART=5 runs the
# whole GPU check suite and bench-data each way; PART=6 is the issue's table in one call with
# the decode started by the loader's thread a batch ahead (the decode checks, training on the
# photos GPU / CPU / GPU with synthetic `bench` before and after, PyTorch's DataLoader and
# synthetic run, bench-data each way, `eval --decode gpu|cpu` of the trained checkpoint, and
# the small-JPEG training); PART=7 looks for where a GPU-decoded training step loses time
# against `bench` (small JPEGs: host profiles of both, nvidia-smi's SM and JPEG-engine
# utilisation during each, and the loader capped at 4 threads). Needs a burn-vision built with
# `--features host-profile`. PART=8: the ViT recipe's augmentation (RandAugment 2,9, colour jitter
# 0.4, random erasing 0.25) on the GPU — the decode and pixel-operation checks, bench-data with
# --preset vit each way and with the plain recipe, PyTorch's DataLoader alone with either recipe
# (16 workers), ViT-S/16 bf16 b256 `--preset vit` training on the photos with --decode gpu, cpu,
# gpu, and `bench` of the same model with AdamW on synthetic batches. PART=10: ResNet-50 on the
# photos with short epochs (30 steps) against long ones (90 steps, three times the photos),
# --decode gpu, alternated twice, synthetic `bench` of 30 and 90 steps before and after.
# PART=11: ResNet-50 (or MODEL) on the photos decoded to planes against nvJPEG's RGB output,
# alternated three times, with `bench-data` of each (does the length of nvJPEG's calls cost the
# steps?). PART=12: how long nvJPEG's calls take while ResNet-18 and ResNet-50 train on the
# photos (metrics.jsonl's device_decode), planes and nvJPEG's RGB, beside bench-data's.
# PART=15: nvJPEG's time a batch with the GPU idle and with burn's stream busy (--bench
# decode-wait). PART=16: the same and ResNet-18 / ResNet-50 training with 8 (CUDA's default),
# 32 and 1 hardware queues for the context's streams (CUDA_DEVICE_MAX_CONNECTIONS). PART=17:
# synthetic `bench` (ResNet-50, ResNet-18, ViT-B/16, ResNet-50 with --ddp) with 8 and 32.
# PART=18: bench-data's GPU decode with 8 and 32 hardware queues, alternated three times.
# Binaries: carry/bins.txz (burn-vision, burn-ddp-gpu-checks).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/gpu_decode.log; SHOW="img_per_s|RESULT|CORES|rror|panick|val loss|^ok|^FAIL|passed|decoding"; SHOW_LINES=${SHOW_LINES:-6}
source benches/gpu/lib.sh
chmod +x "$B"/burn-vision "$B"/burn-ddp-gpu-checks
D=/tmp/photos
echo "host: $(nproc) cores" | tee -a "$LOG"
CORES="python3 benches/cores_busy.py"   # reports the host cores a command kept busy
step photos 300 python3 benches/make_photos.py $D/folder 1200
# Writes $OUT/summary.txt (the log's result lines, then each training's epochs from its
# metrics.jsonl), packs every run's metrics.jsonl into metrics.tgz, leaves the run folders
# behind (few files come back from the GPU machine) and prints the summary.
summarise_runs() {
  {
    grep -hE "img_per_s|RESULT check.*(lowest|FAIL)|CORES|^=== .*rc=" "$LOG" | cut -c1-200
    for f in $OUT/run-*/metrics.jsonl; do
      echo "$f"
      python3 -c "import json, sys; [print(' epoch', d['epoch'], 'steady', round(d.get('steady_img_per_s') or 0), 'data_wait', round(d['data_wait_s'], 4), 'device_decode', d.get('device_decode')) for d in map(json.loads, open(sys.argv[1]))]" "$f"
    done
  } > "$OUT/summary.txt"
  (cd "$OUT" && tar czf metrics.tgz run-*/metrics.jsonl 2>/dev/null)
  rm -rf $OUT/run-*
  cat "$OUT/summary.txt"
}
if [ "${PART:-1}" = 8 ]; then
  BURN_DDP_CHECK_JPEGS=$D/folder SHOW_LINES=4 step checks 200 "$B"/burn-ddp-gpu-checks pixel-ops crop-resize jpeg-decode decode-ahead
  DATA="bench-data --data $D/folder --batches 30 --gpus 0"
  for i in 1 2; do
    SHOW_LINES=2 step "data_vit_gpu_$i" 90 "$B"/burn-vision $DATA --preset vit --decode gpu
  done
  SHOW_LINES=2 step data_vit_cpu 150 "$B"/burn-vision $DATA --preset vit --decode cpu
  SHOW_LINES=2 step data_plain_gpu 90 "$B"/burn-vision $DATA --decode gpu
  step torch_loader_vit 200 $CORES python3 benches/pytorch_baseline.py loader $D/folder 256 30 16 vit
  step torch_loader_plain 200 $CORES python3 benches/pytorch_baseline.py loader $D/folder 256 30 16 plain
  step vits_synthetic 200 "$B"/burn-vision bench --gpus 0 --model vit_s16 --batch-size 256 --image-size 224 --classes 8 \
    --precision bf16 --optimizer adamw --warmup 5 --steps 30
  T="train --preset vit --gpus 0 --model vit_s16 --epochs 3 --warmup-epochs 1 --batch-size 256 --precision bf16 --data $D/folder"
  step train_vit_gpu_decode 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/vit-gpu
  step train_vit_cpu_decode 300 $CORES "$B"/burn-vision $T --decode cpu --out $OUT/vit-cpu
  step train_vit_gpu_decode_2 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/vit-gpu-2
  save_cache
  grep -hE "img_per_s|RESULT check|CORES|^=== .*rc=" "$LOG" | cut -c1-300 > "$OUT/summary.txt"
  for f in $OUT/vit-*/metrics.jsonl; do
    echo "$f" >> "$OUT/summary.txt"
    python3 -c "import json, sys; [print(' epoch', d['epoch'], 'steady', round(d.get('steady_img_per_s') or 0), 'data_wait', round(d['data_wait_s'], 4), 'val_acc', d['val_acc']) for d in map(json.loads, open(sys.argv[1]))]" "$f" >> "$OUT/summary.txt"
  done
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "${PART:-1}" = 5 ]; then
  # The whole GPU check suite (the decode checks with the photos), then bench-data each way.
  BURN_DDP_CHECK_JPEGS=$D/folder SHOW="^ok|^FAIL|passed" SHOW_LINES=30 step suite 400 "$B"/burn-ddp-gpu-checks
  SHOW_LINES=2 step data_gpu 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
  SHOW_LINES=2 step data_cpu 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode cpu
  exit 0
fi
if [ "${PART:-1}" = 7 ]; then
  step fm224 300 python3 benches/pytorch_baseline.py make-folder datasets/fashion-mnist-10k/images-idx3-ubyte.gz \
    datasets/fashion-mnist-10k/labels-idx1-ubyte.gz /tmp/fm224 224
  S="bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 10 --precision bf16 --warmup 5"
  F="train --gpus 0 --model resnet50 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data /tmp/fm224 --decode gpu"
  # nvidia-smi's utilisation each second (sm, mem, enc, dec, jpg, ofa) during the step NAME.
  dmon_on() { nvidia-smi dmon -s u -d 1 > "$OUT/dmon-$1.txt" 2>&1 & DMON=$!; }
  dmon_on bench; step bench_dmon 200 "$B"/burn-vision $S --steps 300; kill $DMON
  dmon_on train; step train_dmon 300 "$B"/burn-vision $F --out $OUT/fm-gpu; kill $DMON
  step bench_profile 200 "$B"/burn-vision $S --steps 60 --host-profile $OUT/hp-bench
  step train_profile 300 "$B"/burn-vision $F --host-profile $OUT/hp-train --out $OUT/fm-gpu-hp
  step train_rayon4 300 env RAYON_NUM_THREADS=4 "$B"/burn-vision $F --out $OUT/fm-gpu-rayon4
  step bench_2 200 "$B"/burn-vision $S --steps 30
  rm -rf $OUT/*/*.ckpt $OUT/*/tensorboard $OUT/*/*.svg
  grep -hE "img_per_s|^=== .*rc=" "$LOG" | cut -c1-200 > "$OUT/summary.txt"
  for f in $OUT/fm-gpu*/metrics.jsonl; do
    echo "$f" >> "$OUT/summary.txt"
    python3 -c "import json, sys; [print(' epoch', d['epoch'], 'steady', round(d.get('steady_img_per_s') or 0), 'data_wait', round(d['data_wait_s'], 4)) for d in map(json.loads, open(sys.argv[1]))]" "$f" >> "$OUT/summary.txt"
  done
  cat "$OUT/summary.txt"
  # Few files come back from the GPU machine: everything but the log and summary in one archive.
  tar czf /tmp/part7.tgz -C "$OUT" --exclude gpu_decode.log --exclude summary.txt . && mv /tmp/part7.tgz "$OUT/" && \
    find "$OUT" -mindepth 1 -maxdepth 1 ! -name part7.tgz ! -name gpu_decode.log ! -name summary.txt -exec rm -rf {} +
  exit 0
fi
if [ "${PART:-1}" = 15 ]; then
  # Do nvJPEG's calls wait for other streams' work? Its time a batch of 256 photos with the GPU
  # idle and with products queued on burn's stream (burn-ddp-gpu-checks --bench decode-wait).
  BURN_DDP_CHECK_JPEGS=$D/folder SHOW="RESULT" SHOW_LINES=8 step decode_wait 200 \
    "$B"/burn-ddp-gpu-checks --bench decode-wait --iters 10
  save_cache
  exit 0
fi
if [ "${PART:-1}" = 18 ]; then
  # bench-data to the GPU (GPU decode, nvJPEG's RGB: the default) with CUDA's 8 hardware queues and
  # with 32 (burn-vision's default since 2026-12-07), alternated three times: does the decode's
  # pace where nothing else runs depend on them?
  for i in 1 2 3; do
    for c in 8 32; do
      SHOW_LINES=1 step "data_gpu_c${c}_$i" 60 env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-vision bench-data \
        --data $D/folder --batches 30 --gpus 0 --decode gpu
    done
  done
  grep -hE "^=== .*rc=" "$LOG" > "$OUT/summary.txt"
  exit 0
fi
if [ "${PART:-1}" = 17 ]; then
  # What 32 hardware queues (burn-vision's default since 2026-12-07) cost or gain where the
  # decode is not involved: synthetic `bench` of ResNet-50, ResNet-18 and ViT-B/16 bf16 b256,
  # and ResNet-50 through DDP over a one-rank NCCL group, with CUDA's 8 and with 32, alternated.
  S="bench --gpus 0 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30"
  for i in 1 2; do
    for c in 8 32; do
      for m in resnet50 resnet18 vit_b16; do
        SHOW_LINES=1 step "${m}_c${c}_$i" 200 env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-vision $S --model $m
      done
      SHOW_LINES=1 step "resnet50_ddp_c${c}_$i" 200 env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-vision $S --model resnet50 --ddp
    done
  done
  save_cache
  grep -hE "^=== .*rc=" "$LOG" > "$OUT/summary.txt"
  exit 0
fi
if [ "${PART:-1}" = 16 ]; then
  # CUDA multiplexes a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by
  # default): streams sharing one are served in order. Does the decode wait behind the
  # training's work that way? --bench decode-wait and ResNet-18 / ResNet-50 on the photos with
  # 8 (the default), 32 (the most) and 1 connection, metrics.jsonl's device_decode each.
  for c in 8 32 1; do
    BURN_DDP_CHECK_JPEGS=$D/folder SHOW="RESULT bench" SHOW_LINES=4 step "decode_wait_$c" 200 \
      env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-ddp-gpu-checks --bench decode-wait --iters 10
  done
  T="train --gpus 0 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --decode gpu --data $D/folder"
  for i in 1 2; do
    for c in 8 32; do
      step "train_resnet18_c${c}_$i" 300 $CORES env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-vision $T --model resnet18 \
        --out $OUT/run-resnet18-c$c-$i
    done
  done
  for c in 8 32; do
    step "train_resnet50_c$c" 300 $CORES env CUDA_DEVICE_MAX_CONNECTIONS=$c "$B"/burn-vision $T --model resnet50 \
      --out $OUT/run-resnet50-c$c
  done
  save_cache
  summarise_runs
  exit 0
fi
if [ "${PART:-1}" = 12 ]; then
  # Do nvJPEG's calls take longer while a model trains than in bench-data? metrics.jsonl's
  # device_decode (ms a batch in nvJPEG's calls on the loader's thread) for ResNet-18
  # (decode-bound) and ResNet-50 on the photos, planes and nvJPEG's RGB, beside bench-data's.
  DATA="bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu"
  SHOW_LINES=1 step data_planes 60 env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $DATA
  SHOW_LINES=1 step data_rgb 60 env BURN_DDP_DECODE_OUTPUT=rgb "$B"/burn-vision $DATA
  T="train --gpus 0 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --decode gpu --data $D/folder"
  for m in resnet18 resnet50; do
    step "train_${m}_planes" 300 $CORES env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $T --model $m --out $OUT/run-$m-planes
    step "train_${m}_rgb" 300 $CORES env BURN_DDP_DECODE_OUTPUT=rgb "$B"/burn-vision $T --model $m --out $OUT/run-$m-rgb
  done
  save_cache
  summarise_runs
  exit 0
fi
if [ "${PART:-1}" = 11 ]; then
  # Does the length of nvJPEG's calls on the loader's thread cost the training steps? The planes
  # (11-12 ms a batch in nvJPEG's calls, no decode kernel) against nvJPEG's RGB (the default
  # since 2026-12-07: 7-8 ms, plus nvJPEG's colour-conversion kernels), ResNet-50 on the photos,
  # alternated three times, `bench-data` of each and synthetic `bench` before and after.
  M=${MODEL:-resnet50}
  S="bench --gpus 0 --model $M --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30"
  T="train --gpus 0 --model $M --epochs 4 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --decode gpu --data $D/folder"
  DATA="bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu"
  step ${M}_synthetic 200 "$B"/burn-vision $S
  for i in 1 2 3; do
    SHOW_LINES=1 step "data_planes_$i" 60 env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $DATA
    SHOW_LINES=1 step "data_rgb_$i" 60 env BURN_DDP_DECODE_OUTPUT=rgb "$B"/burn-vision $DATA
    step "train_planes_$i" 300 $CORES env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $T --out $OUT/run-planes-$i
    step "train_rgb_$i" 300 $CORES env BURN_DDP_DECODE_OUTPUT=rgb "$B"/burn-vision $T --out $OUT/run-rgb-$i
  done
  step ${M}_synthetic_after 200 "$B"/burn-vision $S
  save_cache
  summarise_runs
  exit 0
fi
if [ "${PART:-1}" = 10 ]; then
  # Short epochs against long ones: ResNet-50 on the photos (30 steps an epoch) and on three
  # times as many made the same way (90 steps an epoch), --decode gpu, alternated twice, with
  # synthetic `bench` of 30 and of 90 timed steps before and after: does the training lose its
  # few per cent at each epoch's start (the loader's restart, the warm-up steps' sync, the
  # validation before), or in every step?
  step photos_long 600 python3 benches/make_photos.py /tmp/photos-long 3600
  S="bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5"
  T="train --gpus 0 --model resnet50 --epochs 4 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --decode gpu"
  step r50_synthetic_30 200 "$B"/burn-vision $S --steps 30
  step r50_synthetic_90 200 "$B"/burn-vision $S --steps 90
  for i in 1 2; do
    step "train_short_$i" 300 $CORES "$B"/burn-vision $T --data $D/folder --out $OUT/run-short-$i
    step "train_long_$i" 300 $CORES "$B"/burn-vision $T --data /tmp/photos-long --out $OUT/run-long-$i
  done
  step r50_synthetic_30_after 200 "$B"/burn-vision $S --steps 30
  step r50_synthetic_90_after 200 "$B"/burn-vision $S --steps 90
  save_cache
  summarise_runs
  exit 0
fi
if [ "${PART:-1}" = 6 ]; then
  BURN_DDP_CHECK_JPEGS=$D/folder SHOW_LINES=4 step checks 200 "$B"/burn-ddp-gpu-checks crop-resize jpeg-decode decode-ahead
  BURN_DDP_CHECK_JPEGS=$D/folder BURN_DDP_DECODE_OUTPUT=planes SHOW_LINES=4 step checks_planes 200 "$B"/burn-ddp-gpu-checks jpeg-decode
  S="bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30"
  T="train --gpus 0 --model resnet50 --epochs 4 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data $D/folder"
  step r50_synthetic_1 200 "$B"/burn-vision $S
  step train_gpu_decode_1 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu
  step train_gpu_decode_planes 300 $CORES env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu-planes
  step train_cpu_decode 300 $CORES "$B"/burn-vision $T --decode cpu --out $OUT/run-cpu
  step train_gpu_decode_2 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu-2
  step train_gpu_decode_planes_2 300 $CORES env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu-planes-2
  step r50_synthetic_2 200 "$B"/burn-vision $S
  step torch_folder 300 $CORES python3 benches/pytorch_baseline.py folder $D/folder 256 30 nhwc bf16 16
  step torch_synthetic 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 8 0 5 30 bf16 nhwc eager
  for i in 1 2; do
    SHOW_LINES=2 step "data_gpu_$i" 60 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
  done
  SHOW_LINES=2 step data_gpu_planes 60 env BURN_DDP_DECODE_OUTPUT=planes "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
  SHOW_LINES=2 step data_cpu 60 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode cpu
  SHOW="top-1|rror|decoding|images" step eval_gpu_decode 200 "$B"/burn-vision eval --checkpoint $OUT/run-gpu/best.ckpt --gpus 0 --decode gpu
  SHOW="top-1|rror|decoding|images" step eval_cpu_decode 200 "$B"/burn-vision eval --checkpoint $OUT/run-gpu/best.ckpt --gpus 0 --decode cpu
  step fm224 300 python3 benches/pytorch_baseline.py make-folder datasets/fashion-mnist-10k/images-idx3-ubyte.gz \
    datasets/fashion-mnist-10k/labels-idx1-ubyte.gz /tmp/fm224 224
  step fm224_gpu_decode 300 "$B"/burn-vision train --gpus 0 --model resnet50 --epochs 4 --batch-size 256 \
    --precision bf16 --optimizer sgd --lr 0.1 --data /tmp/fm224 --decode gpu --out $OUT/fm-gpu
  save_cache
  grep -hE "img_per_s|RESULT check|CORES|top-1|^=== .*rc=" "$LOG" | cut -c1-300 > "$OUT/summary.txt"
  for f in $OUT/run-*/metrics.jsonl $OUT/fm-gpu/metrics.jsonl; do
    echo "$f" >> "$OUT/summary.txt"
    python3 -c "import json, sys; [print(' epoch', d['epoch'], 'steady', round(d.get('steady_img_per_s') or 0), 'data_wait', round(d['data_wait_s'], 4), 'val_acc', d['val_acc']) for d in map(json.loads, open(sys.argv[1]))]" "$f" >> "$OUT/summary.txt"
  done
  # Few files come back from the GPU machine: every run's metrics.jsonl in one archive, the
  # checkpoints and TensorBoard logs left behind.
  (cd "$OUT" && tar czf metrics.tgz run-*/metrics.jsonl fm-gpu/metrics.jsonl 2>/dev/null)
  rm -rf $OUT/run-* $OUT/fm-gpu
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "${PART:-1}" = 4 ]; then
  # Where the rest of the gap to synthetic batches lies: the same training on small JPEGs
  # (the bundled Fashion-MNIST as 224x224 JPEGs), cheap to decode on either path.
  step fm224 300 python3 benches/pytorch_baseline.py make-folder datasets/fashion-mnist-10k/images-idx3-ubyte.gz \
    datasets/fashion-mnist-10k/labels-idx1-ubyte.gz /tmp/fm224 224
  step r50_synthetic_10 200 "$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 10 --precision bf16 --warmup 5 --steps 30
  F="train --gpus 0 --model resnet50 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data /tmp/fm224"
  step fm224_gpu_decode 300 $CORES "$B"/burn-vision $F --decode gpu --out $OUT/fm-gpu
  step fm224_cpu_decode 300 $CORES "$B"/burn-vision $F --decode cpu --out $OUT/fm-cpu
  step fm224_gpu_decode_sync 300 env BURN_VISION_STEP_SYNC=1 "$B"/burn-vision $F --decode gpu --out $OUT/fm-gpu-sync
  exit 0
fi
if [ "${PART:-1}" = 3 ]; then
  # Every kernel of a GPU-decoded bench-data run (3 batches) timed by Nsight Compute.
  step ncu_decode 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --page raw --log-file "$OUT/ncu_decode.csv" "$B"/burn-vision bench-data --data $D/folder --batches 2 --gpus 0 --decode gpu
  python3 - "$OUT/ncu_decode.csv" <<'PY' | tee -a "$LOG"
import csv, collections, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("=="))]
total = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    name, t = r.get("Kernel Name", "?"), r.get("gpu__time_duration.sum", "0").replace(",", "")
    try:
        total[name[:90]][0] += 1; total[name[:90]][1] += float(t)
    except ValueError:
        pass
for name, (n, t) in sorted(total.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"NCU {t / 1e6:9.3f} ms  x{n:4d}  {name}")
PY
  exit 0
fi
if [ "${PART:-1}" = 1 ]; then
BURN_DDP_CHECK_JPEGS=$D/folder step checks 200 "$B"/burn-ddp-gpu-checks crop-resize jpeg-decode
for i in 1 2; do
  SHOW_LINES=2 step "data_cpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode cpu
  SHOW_LINES=2 step "data_gpu_$i" 150 "$B"/burn-vision bench-data --data $D/folder --batches 30 --gpus 0 --decode gpu
done
fi
step r50_synthetic 200 "$B"/burn-vision bench --gpus 0 --model resnet50 --batch-size 256 --image-size 224 --classes 8 --precision bf16 --warmup 5 --steps 30
T="train --gpus 0 --model resnet50 --epochs 3 --batch-size 256 --precision bf16 --optimizer sgd --lr 0.1 --data $D/folder"
step train_gpu_decode 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu
step train_cpu_decode 300 $CORES "$B"/burn-vision $T --decode cpu --out $OUT/run-cpu
step train_gpu_decode_2 300 $CORES "$B"/burn-vision $T --decode gpu --out $OUT/run-gpu-2
step torch_folder 300 $CORES python3 benches/pytorch_baseline.py folder $D/folder 256 30 nhwc bf16 16
step torch_synthetic 300 python3 benches/pytorch_baseline.py synthetic resnet50 256 224 3 8 0 5 30 bf16 nhwc eager
if [ "${PART:-1}" = 1 ]; then
  # Accuracy on either path: ResNet-18 reaches this set's ceiling in 3 epochs (99.4-99.9 %).
  A="train --gpus 0 --model resnet18 --epochs 3 --batch-size 128 --precision bf16 --optimizer sgd --lr 0.1 --data $D/folder"
  step accuracy_gpu_decode 300 "$B"/burn-vision $A --decode gpu --out $OUT/acc-gpu
  step accuracy_cpu_decode 300 "$B"/burn-vision $A --decode cpu --out $OUT/acc-cpu
fi
save_cache
grep -hE "img_per_s|RESULT check|CORES|after warm-up|^=== .*rc=" "$LOG" | cut -c1-300 > "$OUT/summary.txt"
cat "$OUT/summary.txt"
