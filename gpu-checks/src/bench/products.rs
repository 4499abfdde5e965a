//! Times cuBLAS's products against burn's own kernels.

use crate::util::time_ms;
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::{CudnnOptions, matmul, options};

/// Forward products at a ViT-B/16 step's shapes (batch 128), cuBLAS against burn's kernels.
pub(crate) fn bench_gemm(device: &CudaDevice, iters: usize) {
    let base = options::get();
    let shapes: [(&str, [usize; 4], [usize; 4]); 3] = [
        ("fc1", [1, 1, 25216, 768], [1, 1, 768, 3072]),
        ("fc2", [1, 1, 25216, 3072], [1, 1, 3072, 768]),
        ("q·kT", [128, 12, 197, 64], [128, 12, 64, 197]),
    ];
    for (name, a, b) in shapes {
        let normal = Distribution::Normal(0.0, 1.0);
        let (x, y) = (
            Tensor::<Cuda, 4>::random(a, normal, device).cast(FloatDType::BF16),
            Tensor::<Cuda, 4>::random(b, normal, device).cast(FloatDType::BF16),
        );
        let flops = 2.0 * (a[0] * a[1] * a[2] * a[3] * b[3]) as f64;
        for (label, on) in [("cublas", true), ("burn", false)] {
            options::set(CudnnOptions { cublas: on, ..base.clone() });
            let ms = time_ms(iters, device, || drop(matmul(x.clone(), y.clone())));
            println!("RESULT bench=gemm shape={name} path={label} ms={ms:.3} tflops={:.0}", flops / ms / 1e9);
        }
    }
    options::set(base);
}
