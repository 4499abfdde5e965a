"""PyTorch dist.all_reduce bus bandwidth, 1 MiB ... 1 GiB, for comparison with burn-ddp's
nccl_bench in the same device call. Each op is followed by torch.cuda.synchronize(), as
burn-ddp's ProcessGroup::all_reduce blocks until the collective has finished.
Run: python3 -m torch.distributed.run --standalone --nproc-per-node 2 benches/pytorch_allreduce.py"""
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
for mib in [1, 4, 16, 64, 256, 1024]:
    x = torch.zeros(mib * 1024 * 1024 // 4, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    iters = 10 if mib >= 256 else 30
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
        torch.cuda.synchronize()
    s = (time.perf_counter() - t) / iters
    algbw = mib * 1024 * 1024 / s / 1e9
    if r == 0:
        print(f"RESULT framework=pytorch MiB={mib} ms={s * 1e3:.3f} algbw_GBs={algbw:.1f} busbw_GBs={algbw * 2 * (w - 1) / w:.1f}", flush=True)
dist.destroy_process_group()
