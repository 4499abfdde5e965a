"""What nvJPEG gives on this GPU through torchvision: JPEG files of a class folder decoded on the
GPU in batches (torchvision.io.decode_jpeg(..., device="cuda")), then RandomResizedCrop 224 +
flip + normalise to bf16 on the GPU, against the same on the CPU (PIL, one process) — the
ceiling a GPU decode path in burn-vision is measured against.

    python3 benches/gpu_decode_probe.py FOLDER [BATCH] [BATCHES]

Prints one JSON line per measurement (img/s over BATCHES batches after one warm-up batch).
"""
import glob
import json
import os
import sys
import time

import torch
import torchvision
from torchvision.io import decode_jpeg
from torchvision.transforms import v2


def files(folder, n):
    paths = sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))
    if len(paths) < n:
        sys.exit(f"{folder} holds {len(paths)} JPEGs; need {n}")
    return [torchvision.io.read_file(p) for p in paths[:n]]


def report(what, images, seconds, **extra):
    print(json.dumps(dict(what=what, images=images, seconds=seconds, img_per_s=images / seconds, **extra)), flush=True)


def gpu(data, batch, batches, augment):
    rrc = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(3, 1, 1) * 255

    def step(chunk):
        images = decode_jpeg(chunk, device="cuda")
        if augment:
            out = torch.stack([rrc(im) for im in images]).float()
            return ((out - mean) / std).to(torch.bfloat16)
        return images

    step(data[:batch])
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in range(batches):
        step(data[b * batch:(b + 1) * batch])
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    folder = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    batches = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    data = files(folder, batch * batches)
    extra = dict(torch=torch.__version__, torchvision=torchvision.__version__, batch=batch)
    report("gpu decode (nvJPEG via torchvision)", batch * batches, gpu(data, batch, batches, False), **extra)
    report("gpu decode + RandomResizedCrop 224 + flip + normalise, bf16", batch * batches,
           gpu(data, batch, batches, True), **extra)
    t = time.perf_counter()
    for d in data[:512]:
        torchvision.io.decode_jpeg(d)
    report("cpu decode (libjpeg-turbo via torchvision), one thread", 512, time.perf_counter() - t, **extra)


if __name__ == "__main__":
    main()
