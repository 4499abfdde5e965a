//! burn-ddp's ReLU, max-pool and fused bias + GELU against burn's and the f64 references.

use crate::util::{Ad, dtype_name, to_f64, values};
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

/// `burn_ddp::nn::bias_gelu` (one kernel each way) against f64: the activation and the
/// gradients of `y` and `b` under a weighted sum, in f32, bf16 and f16, on a ViT-B MLP row width
/// (four elements per thread) and an odd one (one per thread), with and without a bias. The
/// reference reads the inputs as the GPU holds them (rounded to the type); the bounds are the
/// type's rounding of each result (`db`: of every summed term too) and f32's for f32.
pub(crate) fn check_bias_gelu(device: &CudaDevice) -> bool {
    use burn_ddp::nn::options::{self, CudnnOptions};
    use burn_ddp::nn::reference::{gelu_f64, gelu_grad_f64};
    // The kernel is off by default while it is new: this check turns it on.
    let base = options::get();
    options::set(CudnnOptions { fused_gelu: true, ..base.clone() });
    let mut ok = true;
    let cases = [(257usize, 3072usize, true), (33, 10, true), (31, 12, false)];
    for dtype in [FloatDType::F32, FloatDType::BF16, FloatDType::F16] {
        for (rows, cols, with_bias) in cases {
            let make = |seed: u64, len: usize, scale: f32| {
                Tensor::<Ad, 1>::from_floats(values(seed, len, scale, 0.0).as_slice(), device).cast(dtype)
            };
            let y = make(11, rows * cols, 8.0).reshape([rows, cols]).detach().require_grad();
            let b = with_bias.then(|| make(12, cols, 2.0).detach().require_grad());
            let w = make(13, rows * cols, 2.0).reshape([rows, cols]).detach();
            let before = burn_ddp::nn::linear::gelu_kernel_calls();
            let h = burn_ddp::nn::bias_gelu(y.clone(), b.clone());
            let grads = (h.clone() * w.clone()).sum().backward();
            let (hv, dy) = (to_f64(h.inner()), to_f64(y.grad(&grads).expect("y's gradient")));
            let db = b.as_ref().map(|b| to_f64(b.grad(&grads).expect("b's gradient")));
            let calls = burn_ddp::nn::linear::gelu_kernel_calls() - before;
            let (yv, wv) = (to_f64(y.inner()), to_f64(w.inner()));
            let bv = b.map(|b| to_f64(b.inner())).unwrap_or_else(|| vec![0.0; cols]);
            let x: Vec<f64> = yv.iter().enumerate().map(|(i, v)| v + bv[i % cols]).collect();
            let want_h: Vec<f64> = x.iter().map(|&x| gelu_f64(x)).collect();
            let want_dy: Vec<f64> = x.iter().zip(&wv).map(|(&x, g)| g * gelu_grad_f64(x)).collect();
            // Relative rounding of one stored result — half an ulp is at most 2^-8 of a bf16
            // value, 2^-11 of an f16 one (taken twice) — plus 1 % for f32's own arithmetic; f32:
            // a few ulps of erff and expf.
            let unit = match dtype {
                FloatDType::BF16 => 2f64.powi(-8) * 1.01,
                FloatDType::F16 => 2f64.powi(-10) * 1.01,
                _ => 1e-6,
            };
            let worst = |got: &[f64], want: &[f64], bound: &dyn Fn(usize) -> f64| {
                got.iter().zip(want).enumerate().map(|(i, (g, w))| (g - w).abs() / bound(i)).fold(0.0, f64::max)
            };
            let h_err = worst(&hv, &want_h, &|i| unit * want_h[i].abs() + 1e-6);
            let dy_err = worst(&dy, &want_dy, &|i| unit * want_dy[i].abs() + 1e-6);
            let db_err = db.map_or(0.0, |db| {
                let col = |c: usize| (0..rows).map(move |r| r * cols + c);
                let want: Vec<f64> = (0..cols).map(|c| col(c).map(|i| want_dy[i]).sum()).collect();
                let spread: Vec<f64> = (0..cols).map(|c| col(c).map(|i| want_dy[i].abs()).sum()).collect();
                // Each summed term's rounding, f32's accumulation, the result's rounding.
                let per_term = 2.0 * unit + rows as f64 * 2f64.powi(-24);
                worst(&db, &want, &|c| per_term * spread[c] + unit * want[c].abs() + 1e-5)
            });
            let pass = h_err <= 1.0 && dy_err <= 1.0 && db_err <= 1.0 && calls == 2;
            println!(
                "RESULT check=bias_gelu dtype={} rows={rows} cols={cols} bias={with_bias} kernel_passes={calls} err/bound h={h_err:.2} dy={dy_err:.2} db={db_err:.2} {}",
                dtype_name(dtype),
                if pass { "ok" } else { "FAIL" }
            );
            ok &= pass;
        }
    }
    options::set(base);
    ok
}

/// `burn_ddp::nn::cast_packed` on the channels-last view of an RGB batch (rows of 3 values,
/// which burn-cuda pitches) against the host's round-to-nearest-even cast of the same f32
/// values, bit for bit (to bf16, to f16, and to f32: a packed copy), with and without autodiff;
/// and a tensor that needs a gradient still gets one through it (burn's cast there).
pub(crate) fn check_cast_packed(device: &CudaDevice) -> bool {
    use burn::tensor::{bf16, f16};
    let mut ok = true;
    <Cuda as Backend>::seed(device, 7);
    let nchw = Tensor::<Cuda, 4>::random([2, 3, 13, 11], Distribution::Normal(0.0, 3.0), device);
    let host: Vec<f32> = nchw.clone().permute([0, 2, 3, 1]).into_data().to_vec().expect("f32");
    let view = || nchw.clone().permute([0, 2, 3, 1]);
    for dtype in [FloatDType::BF16, FloatDType::F16, FloatDType::F32] {
        let expect: Vec<f32> = host
            .iter()
            .map(|&v| match dtype {
                FloatDType::BF16 => bf16::from_f32(v).to_f32(),
                FloatDType::F16 => f16::from_f32(v).to_f32(),
                _ => v,
            })
            .collect();
        let f = |t: Tensor<Cuda, 4>| t.cast(FloatDType::F32).into_data().to_vec::<f32>().expect("f32");
        let plain = f(burn_ddp::nn::cast_packed(view(), dtype));
        let ad = f(burn_ddp::nn::cast_packed(Tensor::<Ad, 4>::from_inner(view()), dtype).inner());
        let same = plain == expect && ad == expect;
        println!(
            "RESULT check=cast_packed dtype={} elements={} bit-identical to the host's cast (plain, autodiff)={same} {}",
            dtype_name(dtype),
            expect.len(),
            if same { "ok" } else { "FAIL" }
        );
        ok &= same;
    }
    let leaf = Tensor::<Ad, 4>::from_inner(view()).require_grad();
    let y = burn_ddp::nn::cast_packed(leaf.clone(), FloatDType::BF16);
    let grads = (y.cast(FloatDType::F32) * 2.0).sum().backward();
    let g: Vec<f32> = leaf.grad(&grads).map(|g| g.into_data().to_vec().expect("f32")).unwrap_or_default();
    let flows = g.len() == host.len() && g.iter().all(|&v| v == 2.0);
    println!(
        "RESULT check=cast_packed_gradient elements={} every gradient 2={flows} {}",
        g.len(),
        if flows { "ok" } else { "FAIL" }
    );
    ok && flows
}
