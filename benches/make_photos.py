"""Writes a class folder of ImageNet-size photos (500x375 or 375x500 JPEG, quality 90) made from
scikit-image's bundled sample photos: each class is one photo, each image a random crop of it
(10-100 % of its area, any aspect within 3:4..4:3), resized, flipped at random, its brightness
and colour shifted a little. Real photographic content at the size and compression of ImageNet,
for input-pipeline benchmarks on machines that cannot download ImageNet.

    python3 benches/make_photos.py OUT [PER_CLASS] [WORKERS]

PER_CLASS defaults to 1200 (8 classes: 9,600 images), WORKERS to the number of CPUs.
"""
import os
import random
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageEnhance

# Colour photos shipped inside scikit-image (no download needed); grey ones are made RGB.
SOURCES = ["astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "camera", "coins",
           "moon", "page", "text", "clock"]
CLASSES = 8


def load_sources():
    from skimage import data
    photos = []
    for name in SOURCES:
        try:
            pixels = getattr(data, name)()
        except Exception as e:  # some sample images are fetched on first use: skip them offline
            print(f"skipping {name}: {e}", flush=True)
            continue
        image = Image.fromarray(np.asarray(pixels)).convert("RGB")
        photos.append((name, image))
        if len(photos) == CLASSES:
            break
    if len(photos) < 4:
        sys.exit(f"only {len(photos)} of scikit-image's sample photos could be read; need 4")
    return photos


def make(job):
    out, name, source, index, seed = job
    rng = random.Random(seed)
    w, h = source.size
    for _ in range(20):
        area = w * h * rng.uniform(0.1, 1.0)
        aspect = rng.uniform(3 / 4, 4 / 3)
        cw, ch = int(round((area * aspect) ** 0.5)), int(round((area / aspect) ** 0.5))
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = w, h
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    size = (500, 375) if rng.random() < 0.75 else (375, 500)
    image = source.crop((x, y, x + cw, y + ch)).resize(size, Image.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.8, 1.2))
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.8, 1.2))
    image.save(os.path.join(out, name, f"{index:05d}.jpg"), quality=90)


def main():
    out = sys.argv[1]
    per_class = int(sys.argv[2]) if len(sys.argv) > 2 else 1200
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else os.cpu_count()
    photos = load_sources()
    jobs = []
    for c, (name, image) in enumerate(photos):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        jobs += [(out, name, image, i, c * 1_000_003 + i) for i in range(per_class)]
    with Pool(workers) as pool:
        pool.map(make, jobs, chunksize=64)
    print(f"wrote {len(jobs)} photos of {len(photos)} classes to {out}", flush=True)


if __name__ == "__main__":
    main()
