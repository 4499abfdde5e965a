# Host-to-device copy bandwidth of one 256x3x224x224 f32 batch, pinned and pageable (PyTorch):
# the yardstick for burn-vision's batch upload (nn/upload.rs).
import torch, time
x = torch.empty(256*3*224*224, dtype=torch.float32).pin_memory()
p = torch.empty(256*3*224*224, dtype=torch.float32)
d = torch.empty_like(x, device="cuda")
for name, src in [("pinned", x), ("pageable", p)]:
    for _ in range(3): d.copy_(src, non_blocking=True)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): d.copy_(src, non_blocking=True)
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
    print(f"RESULT h2d {name} 154MB: {dt*1e3:.2f} ms, {x.numel()*4/dt/1e9:.1f} GB/s")
