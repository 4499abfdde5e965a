"""Device time of one PyTorch training step by kernel (torch.profiler), the anchor for
burn-vision's per-kernel profile. Usage: pytorch_profile.py MODEL BATCH SIZE [channels_last 0|1] [N] [f32|bf16] [eager|compile] [sgd|adamw]
(MODEL: torchvision's name, or timm:NAME for timm's; bf16: autocast, as benches/pytorch_baseline.py;
compile: torch.compile, compiled during the warm-up steps; N: how many kernels to list, 0 for
all; adamw: fused AdamW as pytorch_baseline.py runs it, SGD with momentum 0.9 otherwise). Last, the same step timed without the
profiler, and how long the GPU waits in it."""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from pytorch_baseline import resnet, synthetic_optimizer  # the same model and optimizer as the timed runs

model_name, batch, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cl = len(sys.argv) > 4 and sys.argv[4] == "1"
top = int(sys.argv[5]) if len(sys.argv) > 5 else 25
bf16 = len(sys.argv) > 6 and sys.argv[6] == "bf16"
compiled = len(sys.argv) > 7 and sys.argv[7] == "compile"
optimizer = sys.argv[8] if len(sys.argv) > 8 else "sgd"
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
fmt = torch.channels_last if cl else torch.contiguous_format
model = resnet(model_name, 1000, 3, False).cuda().to(memory_format=fmt)
opt = synthetic_optimizer(model, optimizer)
if compiled:
    model = torch.compile(model)
x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=fmt)
y = torch.randint(0, 1000, (batch,), device="cuda")
loss_fn = torch.nn.CrossEntropyLoss()

def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()

for _ in range(5 if compiled else 3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step()
    torch.cuda.synchronize()
events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0]
key = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
total = sum(key(e) for e in events) / 1e3
label = f"torch-{model_name.removeprefix('timm:')}-b{batch}{'-cl' if cl else ''}{'-bf16' if bf16 else ''}{'-compile' if compiled else ''}"
print(f"NCU {label}: {sum(e.count for e in events)} kernels, {total:.1f} ms of device time")
for e in sorted(events, key=key, reverse=True)[: top or len(events)]:
    print(f"NCU {label}: {key(e) / 1e3:9.2f} ms {100 * key(e) / 1e3 / total:5.1f}% {e.count:5d}x  {e.key[:70]}")

# The same step without the profiler, timed with CUDA events over 20 steps: how long the GPU
# waits in a step (step time minus the profile's device time), as step_profile.sh prints ours.
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    step()
end.record()
torch.cuda.synchronize()
step_ms = start.elapsed_time(end) / 20
print(f"CLASSES {label}: a step takes {step_ms:.2f} ms without the profiler: "
      f"{total:.2f} ms of kernels, the GPU waits {step_ms - total:.2f} ms")
