"""PyTorch anchor for burn-vision's cuDNN convolutions: every distinct ResNet-50 convolution
shape (benches/resnet50_conv_shapes.json), forward and forward + backward, timed exactly as
`burn-ddp-gpu-checks --bench convolution` times them (2 warm-up calls, then `iters` calls;
`latency`: a device synchronize after each call, `pipelined`: one after all of them), TF32
allowed for f32 as PyTorch's default for convolutions, cudnn.benchmark on.

usage: python3 benches/pytorch_conv_shapes.py [batch] [iters] [f32|bf16|f16] [latency|pipelined] [nchw|nhwc]
"""
import json, os, sys, time
import torch
import torch.nn.functional as F

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 256
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
dtype_name = sys.argv[3] if len(sys.argv) > 3 else "f32"
mode = sys.argv[4] if len(sys.argv) > 4 else "latency"
layout = sys.argv[5] if len(sys.argv) > 5 else "nchw"
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
label = "pytorch" if layout == "nchw" else "pytorch-nhwc"
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda:0")
spec = json.load(open(os.path.join(os.path.dirname(__file__), "resnet50_conv_shapes.json")))
print(f"RESULT torch={torch.__version__} cudnn={torch.backends.cudnn.version()} tf32_conv={torch.backends.cudnn.allow_tf32} dtype={dtype_name} mode={mode} layout={layout}")


def sync():
    if mode == "latency":
        torch.cuda.synchronize()


def time_ms(f):
    f(); f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / iters


for s in spec["shapes"]:
    x = torch.randn(batch, s["c"], s["h"], s["w"], device=dev).to(dtype).to(memory_format=fmt)
    w = (torch.randn(s["k"], s["c"], s["r"], s["s"], device=dev) * 0.05).to(dtype).to(memory_format=fmt)

    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, None, s["stride"], s["pad"])
        sync()

    xa = x.clone().requires_grad_(True)
    wa = w.clone().requires_grad_(True)
    g = torch.randn_like(F.conv2d(x, w, None, s["stride"], s["pad"]))

    def fwdbwd():
        xa.grad = None
        wa.grad = None
        y = F.conv2d(xa, wa, None, s["stride"], s["pad"])
        (y * g).sum().backward()
        sync()

    f_ms, fb_ms = time_ms(fwd), time_ms(fwdbwd)
    print(f"RESULT framework={label} dtype={dtype_name} mode={mode} shape={s['name']} batch={batch} c={s['c']} hw={s['h']} k={s['k']} r={s['r']} stride={s['stride']} fwd_ms={f_ms:.3f} fwdbwd_ms={fb_ms:.3f}", flush=True)
