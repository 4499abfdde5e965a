//! burn-ddp's ReLU and max-pool against burn's and the f64 reference.

use crate::util::{Ad, to_f64};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::reference::max_pool2d_f64;

/// `burn_ddp::nn::relu` (backward from its output) against burn's `relu` (backward from its
/// input) on a residual sum, as a ResNet block uses it: the same values and the same gradients
/// for both addends, bit for bit (f32 and bf16).
pub(crate) fn check_relu(device: &CudaDevice) -> bool {
    let mut ok = true;
    for dtype in [FloatDType::F32, FloatDType::BF16] {
        let leaf = |seed: u64| {
            <Ad as Backend>::seed(device, seed);
            Tensor::<Ad, 4>::random([4, 7, 9, 16], Distribution::Normal(0.0, 1.0), device)
                .cast(dtype)
                .detach()
                .require_grad()
        };
        let (a, b, w) = (leaf(1), leaf(2), leaf(3).detach());
        let run = |ours: bool| {
            let s = a.clone() + b.clone();
            let y = if ours { burn_ddp::nn::relu(s) } else { burn::tensor::activation::relu(s) };
            let grads = (y.clone() * w.clone()).sum().backward();
            let f = |t: Tensor<Cuda, 4>| t.cast(FloatDType::F32).into_data().to_vec::<f32>().expect("f32");
            [f(y.inner()), f(a.grad(&grads).expect("a's gradient")), f(b.grad(&grads).expect("b's gradient"))]
        };
        let (mine, burns) = (run(true), run(false));
        let same = mine.iter().zip(&burns).all(|(m, r)| m == r);
        let positive = mine[0].iter().filter(|&&v| v > 0.0).count();
        println!(
            "RESULT check=relu_from_output dtype={dtype:?} elements={} positive={positive} y/da/db bit-identical={same} {}",
            mine[0].len(),
            if same { "ok" } else { "FAIL" }
        );
        ok &= same;
    }
    ok
}

/// `burn_ddp::nn::max_pool2d` (ResNet's 3×3 stride-2 pool, padding 1) on an NCHW tensor and on
/// the NCHW view of a channels-last one: in f32 against f64 (distinct values: one maximum per
/// window), in bf16 against burn's own max-pool on the same GPU (values and gradient bit for bit).
pub(crate) fn check_max_pool(device: &CudaDevice) -> bool {
    let pool = burn_nn::pool::MaxPool2dConfig::new([3, 3])
        .with_strides([2, 2])
        .with_padding(burn_nn::PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init();
    let (n, ch, h, w) = (2usize, 5usize, 11usize, 12usize);
    let count = n * ch * h * w;
    let distinct: Vec<f32> = (0..count).map(|i| ((i * 7919) % count) as f32 / count as f32 - 0.5).collect();
    let mut ok = true;
    for (dtype, channels_last) in [(FloatDType::F32, false), (FloatDType::F32, true), (FloatDType::BF16, true)] {
        let x = if channels_last {
            Tensor::<Ad, 1>::from_floats(distinct.as_slice(), device).reshape([n, h, w, ch]).permute([0, 3, 1, 2])
        } else {
            Tensor::<Ad, 1>::from_floats(distinct.as_slice(), device).reshape([n, ch, h, w])
        };
        let x = x.cast(dtype).detach().require_grad();
        let run = |ours: bool| {
            let y = if ours { burn_ddp::nn::max_pool2d(&pool, x.clone()) } else { pool.forward(x.clone()) };
            let [_, _, ho, wo] = y.dims();
            let wt = Tensor::<Ad, 1>::from_floats(
                (0..n * ch * ho * wo).map(|i| (i % 13) as f32 + 1.0).collect::<Vec<_>>().as_slice(),
                device,
            )
            .reshape([n, ch, ho, wo])
            .cast(dtype);
            let grads = (y.clone() * wt).sum().backward();
            (to_f64(y.inner()), to_f64(x.grad(&grads).expect("x's gradient")), [ho, wo])
        };
        let (y, g, [ho, wo]) = run(true);
        let (y_ref, g_ref) = if dtype == FloatDType::F32 {
            let dy: Vec<f64> = (0..n * ch * ho * wo).map(|i| (i % 13) as f64 + 1.0).collect();
            max_pool2d_f64(&to_f64(x.clone().inner()), [n, ch, h, w], 3, 2, 1, &dy)
        } else {
            let (y, g, _) = run(false);
            (y, g)
        };
        let same = y == y_ref && g == g_ref;
        println!(
            "RESULT check=max_pool dtype={dtype:?} channels_last={channels_last} y/dx equal to {}={same} {}",
            if dtype == FloatDType::F32 { "f64" } else { "burn's max-pool" },
            if same { "ok" } else { "FAIL" }
        );
        ok &= same;
    }
    ok
}
