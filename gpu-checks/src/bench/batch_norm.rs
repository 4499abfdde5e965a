//! Times burn-ddp's batch norm in both layouts.

use crate::util::{Ad, dtype_name, time_ms};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::CudaDevice;
use burn_ddp::nn::Layout;
use burn_nn::BatchNormConfig;

/// Batch norm + ReLU (forward and backward, training) on ResNet-50's activation shapes, queued
/// back to back: `RESULT bn ...` lines, ms per call.
pub(crate) fn bench_bn(device: &CudaDevice, batch: usize, iters: usize, dtype: FloatDType, layout: Layout) {
    for (c, hw) in [(64, 112), (64, 56), (256, 56), (128, 28), (512, 28), (256, 14), (1024, 14), (512, 7), (2048, 7)] {
        let bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(c).init::<Ad>(device)).with_layout(layout);
        let x = Tensor::<Ad, 4>::random(layout.from_nchw([batch, c, hw, hw]), Distribution::Normal(0.0, 1.0), device)
            .cast(dtype)
            .require_grad();
        let g = Tensor::<Ad, 4>::random(x.dims(), Distribution::Normal(0.0, 1.0), device).cast(dtype);
        let fwdbwd = time_ms(iters, device, || {
            let y = bn.forward_relu(x.clone());
            let grads = (y * g.clone()).sum().backward();
            drop(x.grad(&grads));
        });
        println!(
            "RESULT bn dtype={} layout={layout:?} batch={batch} c={c} hw={hw} fwdbwd_ms={fwdbwd:.3}",
            dtype_name(dtype)
        );
    }
}
