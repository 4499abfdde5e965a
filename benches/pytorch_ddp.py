"""PyTorch anchor for `burn-vision train --gpus 0,1`: the same model (ResNet-18 with the small
3x3 stem, 1 input channel, 10 classes), the same bundled Fashion-MNIST images (IDX .gz), the
same per-GPU batch, SGD momentum 0.9, DistributedSampler(shuffle, set_epoch), DDP over NCCL,
optionally SyncBatchNorm. fp32 NCHW (cuDNN may use TF32, PyTorch's default), no AMP.
Run with torchrun; rank 0 prints one RESULT JSON line per epoch.

usage: torchrun --standalone --nproc-per-node N benches/pytorch_ddp.py IMAGES.gz LABELS.gz BATCH EPOCHS [syncbn]
"""
import gzip, json, os, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision


def idx(path):
    raw = gzip.open(path).read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    images, labels, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sync_bn = len(sys.argv) > 5 and sys.argv[5] == "syncbn"
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cudnn.benchmark = True
    x = torch.tensor(idx(images), dtype=torch.float32).unsqueeze(1).div_(255).sub_(0.2860).div_(0.3530)
    y = torch.tensor(idx(labels), dtype=torch.int64)
    n_train = len(x) * 8 // 10  # the bundled split holds out 20 %
    ds = torch.utils.data.TensorDataset(x[:n_train], y[:n_train])
    sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, drop_last=True, pin_memory=True)
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.002 * world, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        torch.cuda.synchronize()
        t = time.perf_counter()
        seen = 0
        for xb, yb in loader:
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            seen += len(xb)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t
        total = torch.tensor([seen], device=dev)
        dist.all_reduce(total)
        if rank == 0:
            print("RESULT " + json.dumps({"framework": "pytorch", "mode": "ddp" + ("+syncbn" if sync_bn else ""), "world": world,
                                          "epoch": epoch + 1, "img_per_s": total.item() / secs, "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
