"""The attention op alone, forward and forward + backward, at ViT-B/16's shape on one GPU:
PyTorch's F.scaled_dot_product_attention (its default backend choice) on q, k, v viewed out of
one qkv buffer [batch, tokens, 3, heads, head_dim] as timm does, bf16, loss o.sum() — the same
work as `burn-ddp-gpu-checks --bench attention`.

python3 benches/pytorch_sdpa.py [iters]
"""
import sys

import torch
import torch.nn.functional as F


def time_ms(iters, fn):
    fn()
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    qkv = torch.randn(128, 197, 3, 12, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def attend():
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v)

    def forward():
        with torch.no_grad():
            attend()

    def both():
        attend().sum().backward()

    fwd, fb = time_ms(iters, forward), time_ms(iters, both)
    print(f"RESULT bench=sdpa shape=[128,197,12,64] path=pytorch_sdpa torch={torch.__version__} forward_ms={fwd:.3f} forward_backward_ms={fb:.3f}")
    for name, ctx in [("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION), ("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION), ("efficient", torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with torch.nn.attention.sdpa_kernel(ctx):
                fwd, fb = time_ms(iters, forward), time_ms(iters, both)
            print(f"RESULT bench=sdpa shape=[128,197,12,64] path=pytorch_{name} forward_ms={fwd:.3f} forward_backward_ms={fb:.3f}")
        except RuntimeError as e:
            print(f"RESULT bench=sdpa path=pytorch_{name} unavailable: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    main()
