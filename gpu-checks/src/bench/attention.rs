//! Times cuDNN's fused attention against the unfused path at ViT-B/16's shape.

use crate::util::{Ad, time_ms};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::CudaDevice;
use burn_ddp::nn::{CudnnOptions, options, self_attention};

/// Attention forward + backward at ViT-B/16's shape (batch 128, 12 heads, 197 tokens, head dim
/// 64, bf16): cuDNN's fused attention against the unfused path (two products and a softmax);
/// `o.sum().backward()`, as `benches/pytorch_sdpa.py` does with PyTorch's.
pub(crate) fn bench_sdpa(device: &CudaDevice, iters: usize) {
    let base = options::get();
    let qkv = Tensor::<Ad, 5>::random([128, 197, 3, 12, 64], Distribution::Normal(0.0, 1.0), device)
        .cast(FloatDType::BF16)
        .detach()
        .require_grad();
    for (label, on) in [("cudnn_fused", true), ("unfused", false)] {
        options::set(CudnnOptions { fused_attention: on, ..base.clone() });
        let fwd = time_ms(iters, device, || drop(self_attention(qkv.clone().inner())));
        let both = time_ms(iters, device, || drop(self_attention(qkv.clone()).sum().backward()));
        println!(
            "RESULT bench=sdpa shape=[128,197,12,64] path={label} forward_ms={fwd:.3} forward_backward_ms={both:.3}"
        );
    }
    options::set(base);
}
