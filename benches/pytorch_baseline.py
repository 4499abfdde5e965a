"""PyTorch/torchvision baselines for the burn-vision benchmarks, run in the same device call.

Modes (each prints one JSON line prefixed with RESULT):
  synthetic  MODEL BATCH SIZE CHANNELS CLASSES SMALL WARMUP STEPS [f32|bf16] [nchw|nhwc] [eager|compile|ddp] [sgd|adamw]
             forward+backward+SGD(lr 0.01, momentum 0.9) or AdamW(lr 5e-4, weight decay 0.05,
             fused=True: PyTorch's fastest; `burn-vision bench --optimizer adamw`) on random data, fp32 (cuDNN may use TF32, as
             PyTorch allows by default) or bf16 autocast, NCHW or channels_last, eager,
             torch.compile (compiled during the warm-up steps) or eager under
             DistributedDataParallel over a one-rank NCCL group (its defaults: 25 MB buckets, the
             first 1 MB; every bucket goes through NCCL): the same work
             `burn-vision bench --precision ... [--ddp]` does. cudnn.benchmark is on.
  folder     DIR BATCH STEPS [nchw|nhwc] [f32|bf16] [WORKERS]  ResNet-50 on an ImageFolder with
             RandomResizedCrop(224)+flip, DataLoader with WORKERS workers (default 8), pinned
             memory: real decoding and augmentation (fp32 by default, bf16 autocast; nhwc: model
             and batches channels_last). SGD(lr 0.01, momentum 0.9).
  tutorial   DIR EPOCHS [f32|bf16] [nchw|nhwc] [WORKERS] [VALIDATION_TXT] [ddp]  the tutorial's whole job, as
             `burn-vision train --preset tutorial --epochs EPOCHS` runs it on one GPU: ResNet-34,
             batch 16, SGD(lr 1e-3, momentum 0.9, weight decay 5e-3), cosine to 0.1x per step,
             20 % of each class held out (seed 0; or, given VALIDATION_TXT — the `validation.txt`
             of a `burn-vision train` run on the same DIR — exactly the files it names, so both
             frameworks score the same images); training RandomResizedCrop(224)+flip, validation
             Resize(256)+CenterCrop(224), every epoch validated; DataLoader with WORKERS workers
             (default: one per core, at most 16 — with 8 the job is input-bound on a 16-core host), pinned memory, persistent workers. Prints one RESULT line per epoch (seconds,
             steady img/s after the epoch's first two steps, validation top-1) and one for the job
             (wall seconds from before `import torch`). ddp (the last word): the model with
             SyncBatchNorm under DistributedDataParallel over a one-rank NCCL group, as `burn-ddp
             launch --nproc-per-node 1 burn-vision train --preset tutorial` trains it.
  loader     DIR BATCH STEPS WORKERS [plain|vit]  the DataLoader alone, each batch copied to the GPU
             (pinned memory, non-blocking, then synchronised): img/s after one untimed batch —
             what `burn-vision bench-data --gpus 0 --decode cpu [--preset vit]` measures. plain:
             RandomResizedCrop(224)+flip; vit: timm's DeiT recipe as torchvision spells it
             (RandomResizedCrop, flip, RandAugment(2, 9), ColorJitter(0.4, 0.4, 0.4), then
             RandomErasing(0.25) after normalising).
  make-folder IDX_IMAGES IDX_LABELS OUT SIDE  writes the IDX images as SIDExSIDE RGB JPEGs in
             class folders (the real-data input for both frameworks).
"""
import gzip, json, os, sys, time

T_START = time.perf_counter()  # before `import torch`: time to the first step is the user's wait
import torch
import torch.nn as nn
import torchvision

# What a PyTorch expert runs: cuDNN picks the fastest algorithm per shape (as burn-ddp's plans do).
torch.backends.cudnn.benchmark = True


def resnet(name, classes, channels, small):
    if name.startswith("timm:"):  # e.g. timm:vit_small_patch16_224
        import timm

        return timm.create_model(name[5:], pretrained=False, num_classes=classes)
    model = getattr(torchvision.models, name)(num_classes=classes)
    if name.startswith("vit_"):  # torchvision's vit_b_16 etc.
        return model
    if small:  # the small-input stem of burn-vision: 3x3 stride-1 conv, no max-pool
        model.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model


def synthetic_optimizer(model, optimizer):
    """The optimizer of the synthetic runs: fused AdamW (`bench --optimizer adamw`) or SGD."""
    if optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05, fused=True)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


FIRST = {}  # the first step: its own seconds and the seconds since the script started


def device_used_gib():
    """Memory in use on the device (every process: cuMemGetInfo), as burn-vision's bench reads it."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def timed_steps(model, opt, batches, warmup, steps, amp=None):
    loss_fn = nn.CrossEntropyLoss()
    model.train()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    it = iter(batches)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(*next(it))
        if i == 0:
            torch.cuda.synchronize()
            FIRST["step_s"], FIRST["total_s"] = time.perf_counter() - t0, time.perf_counter() - T_START
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t1 = time.perf_counter()
    n = 0
    for _ in range(steps):
        x, y = next(it)
        loss = step(x, y)
        n += x.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t1), warm, float(loss)


def allocated_after_forward(model, x, y, amp):
    """GiB allocated at the end of one more forward pass and its loss (parameters, optimizer
    state, what autograd saved for the backward): burn-vision bench's `in_use_after_forward_gib`."""
    model.zero_grad(set_to_none=True)  # as a training step starts (burn keeps no gradients between steps)
    with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
        loss = nn.CrossEntropyLoss()(model(x), y)
    torch.cuda.synchronize()
    gib = torch.cuda.memory_allocated() / 2**30
    loss.backward()
    return gib


def synthetic(name, batch, size, channels, classes, small, warmup, steps, precision="f32", layout="nchw", mode="eager",
              optimizer="sgd"):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    model = resnet(name, classes, channels, small).to(dev).to(memory_format=fmt)
    opt = synthetic_optimizer(model, optimizer)
    if mode == "compile":
        model = torch.compile(model)
    if mode == "ddp":
        model = one_rank_ddp(model)
    x = torch.randn(batch, channels, size, size, device=dev).to(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev)
    amp = {"f32": None, "bf16": torch.bfloat16}[precision]
    ips, warm, loss = timed_steps(model, opt, iter(lambda: (x, y), None), warmup, steps, amp)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print("RESULT " + json.dumps(dict(framework="pytorch", mode="synthetic", model=name, batch=batch, size=size,
                                      precision=precision, layout=layout, compiled=mode == "compile", ddp=mode == "ddp", optimizer=optimizer,
                                      img_per_s=ips, peak_mem_gib=peak, allocated_after_forward_gib=allocated_after_forward(model, x, y, amp),
                                      reserved_gib=torch.cuda.max_memory_reserved() / 2**30, device_used_gib=device_used_gib(),
                                      first_step=FIRST, warmup_s=warm, loss=loss, torch=torch.__version__)), flush=True)


def one_rank_ddp(model):
    """`model` under DDP in a world of this process alone (NCCL, a free loopback port)."""
    import socket
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    return nn.parallel.DistributedDataParallel(model, device_ids=[0])


def folder(path, batch, steps, layout="nchw", precision="f32", workers=8):
    import torchvision.transforms as T
    dev = torch.device("cuda")
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(path, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                     pin_memory=True, persistent_workers=True)

    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format

    def forever():
        while True:
            for x, y in dl:
                yield x.to(dev, non_blocking=True).to(memory_format=fmt), y.to(dev, non_blocking=True)

    model = resnet("resnet50", len(ds.classes), 3, False).to(dev).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = torch.bfloat16 if precision == "bf16" else None
    ips, warm, loss = timed_steps(model, opt, forever(), 3, steps, amp)
    print("RESULT " + json.dumps(dict(framework="pytorch", mode="folder", model="resnet50", batch=batch, layout=layout,
                                      precision=precision, workers=workers, img_per_s=ips, warmup_s=warm,
                                      loss=loss)), flush=True)


def loader(path, batch, steps, workers, recipe="plain"):
    import torchvision.transforms as T
    dev = torch.device("cuda")
    aug = [T.RandAugment(2, 9), T.ColorJitter(0.4, 0.4, 0.4)] if recipe == "vit" else []
    after = [T.RandomErasing(0.25, value="random")] if recipe == "vit" else []
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *aug, T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]), *after])
    ds = torchvision.datasets.ImageFolder(path, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                     pin_memory=True)
    it = iter(dl)
    next(it)[0].to(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    for _ in range(steps):
        x, _ = next(it)
        x.to(dev, non_blocking=True)
        n += x.shape[0]
    torch.cuda.synchronize()
    ips = n / (time.perf_counter() - t0)
    print("RESULT " + json.dumps(dict(framework="pytorch", mode="loader", recipe=recipe, batch=batch, workers=workers,
                                      img_per_s=ips)), flush=True)


def tutorial(path, epochs, precision="f32", layout="nchw", workers=min(16, os.cpu_count() or 8), validation_txt=None,
             ddp=False):
    import torchvision.transforms as T
    dev = torch.device("cuda")
    torch.manual_seed(0)
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    val_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    train_ds, val_ds = torchvision.datasets.ImageFolder(path, train_tf), torchvision.datasets.ImageFolder(path, val_tf)
    if validation_txt:  # burn-vision's own split: the files its run held out
        if not os.path.isfile(validation_txt):
            sys.exit(f"{validation_txt}: no such file; give the validation.txt of a burn-vision train run (built 2026-12-05 or later)")
        held_out = {os.path.realpath(line) for line in open(validation_txt).read().split("\n") if line}
        val_idx = [i for i, (p, _) in enumerate(train_ds.samples) if os.path.realpath(p) in held_out]
        if len(val_idx) != len(held_out):
            sys.exit(f"{validation_txt} names {len(held_out)} files, {len(val_idx)} of them in {path}: give the folder that run trained on")
        train_idx = sorted(set(range(len(train_ds.samples))) - set(val_idx))
    else:  # 20 % of each class held out, as burn-vision's split (drawn by another generator)
        per_class = {}
        for i, (_, c) in enumerate(train_ds.samples):
            per_class.setdefault(c, []).append(i)
        g = torch.Generator().manual_seed(0)
        train_idx, val_idx = [], []
        for idx in per_class.values():
            order = [idx[j] for j in torch.randperm(len(idx), generator=g).tolist()]
            k = round(0.2 * len(idx))
            val_idx += order[:k]
            train_idx += order[k:]
    batch = 16
    loader = dict(num_workers=workers, pin_memory=True, persistent_workers=True)
    train_dl = torch.utils.data.DataLoader(torch.utils.data.Subset(train_ds, train_idx), batch_size=batch, shuffle=True, drop_last=True, **loader)
    val_dl = torch.utils.data.DataLoader(torch.utils.data.Subset(val_ds, val_idx), batch_size=batch, **loader)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    model = resnet("resnet34", len(train_ds.classes), 3, False).to(dev).to(memory_format=fmt)
    if ddp:  # the tutorial's own recipe: SyncBatchNorm (plain batch norm in a world of one) under DDP
        model = one_rank_ddp(nn.SyncBatchNorm.convert_sync_batchnorm(model))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(train_dl), eta_min=1e-4)
    amp = {"f32": None, "bf16": torch.bfloat16}[precision]
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        model.train()
        n, t_steady, n_steady = 0, None, 0
        for i, (x, y) in enumerate(train_dl):
            if i == 2:
                torch.cuda.synchronize()
                t_steady, n_steady = time.perf_counter(), n
            x, y = x.to(dev, non_blocking=True).to(memory_format=fmt), y.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            n += x.shape[0]
        torch.cuda.synchronize()
        t_train = time.perf_counter()
        model.eval()
        correct = total = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            for x, y in val_dl:
                x, y = x.to(dev, non_blocking=True).to(memory_format=fmt), y.to(dev, non_blocking=True)
                correct += (model(x).argmax(1) == y).sum().item()
                total += y.shape[0]
        t1 = time.perf_counter()
        print("RESULT " + json.dumps(dict(framework="pytorch", mode="tutorial", ddp=ddp, epoch=epoch, precision=precision, layout=layout,
                                          workers=workers, seconds=t1 - t0, train_s=t_train - t0, val_s=t1 - t_train,
                                          steady_img_per_s=(n - n_steady) / (t_train - t_steady), val_acc=correct / total,
                                          since_start_s=t1 - T_START)), flush=True)
    print("RESULT " + json.dumps(dict(framework="pytorch", mode="tutorial_job", ddp=ddp, epochs=epochs, precision=precision, layout=layout,
                                      wall_s=time.perf_counter() - T_START, train_images=len(train_idx), val_images=len(val_idx),
                                      device_used_gib=device_used_gib(), peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                                      torch=torch.__version__)), flush=True)


def make_folder(images, labels, out, side):
    from PIL import Image
    classes = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]
    img = gzip.open(images).read()[16:]
    lab = gzip.open(labels).read()[8:]
    for c in classes:
        os.makedirs(os.path.join(out, c), exist_ok=True)
    for i, l in enumerate(lab):
        im = Image.frombytes("L", (28, 28), img[i * 784:(i + 1) * 784]).convert("RGB").resize((side, side), Image.BILINEAR)
        im.save(os.path.join(out, classes[l], f"{i:05d}.jpg"), quality=90)
    print(f"wrote {len(lab)} images to {out}", flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "synthetic":
        name, batch, size, ch, classes, small, warmup, steps = args[:8]
        synthetic(name, int(batch), int(size), int(ch), int(classes), small == "1", int(warmup), int(steps), *args[8:])
    elif mode == "folder":
        folder(args[0], int(args[1]), int(args[2]), *args[3:5], *[int(w) for w in args[5:6]])
    elif mode == "tutorial":
        ddp = args[-1:] == ["ddp"]
        args = args[:-1] if ddp else args
        tutorial(args[0], int(args[1]), *args[2:4], *[int(w) for w in args[4:5]], *args[5:6], ddp=ddp)
    elif mode == "loader":
        loader(args[0], int(args[1]), int(args[2]), int(args[3]), *args[4:5])
    elif mode == "make-folder":
        make_folder(args[0], args[1], args[2], int(args[3]))
    else:
        sys.exit(__doc__)
