//! cuDNN convolutions against the f64 reference in every direction and option, and gradient accumulation into one buffer.

use crate::util::{Ad, round, to_f64};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cudnn::convolution as cudnn;
use burn_ddp::nn::reference::{Conv2dCase, conv2d_f64, conv2d_grads_f64, max_rel_err};
use burn_ddp::nn::{CudnnOptions, Layout, conv2d, options};

/// y, dx, dw, db of one case on the GPU with activations in `dtype` and `layout` (the weight
/// is cast by `conv2d`), relative errors against the f64 reference on the same (rounded) inputs.
pub(crate) fn errors(case: &Conv2dCase, device: &CudaDevice, dtype: FloatDType, layout: Layout) -> [f64; 4] {
    let (x, w, b, g) = case.random_inputs(11);
    let (x, w, b, g) = (round(&x, dtype), round(&w, dtype), round(&b, dtype), round(&g, dtype));
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
    let xt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&x), case.x_dims()), device).require_grad();
    let wt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&w), case.w_dims()), device).require_grad();
    let bt = Tensor::<Ad, 1>::from_data(TensorData::new(f32s(&b), [case.k]), device).require_grad();
    let gt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&g), case.y_dims()), device);
    let x_in = layout.view_from_nchw(xt.clone()).cast(dtype);
    let y = layout.view_nchw(conv2d(x_in, wt.clone(), case.bias.then(|| bt.clone()), case.options(), layout));
    assert_eq!(y.dtype(), dtype.into(), "the convolution runs in its input's type");
    let grads = (y.clone().cast(FloatDType::F32) * gt).sum().backward();
    let y_ref = conv2d_f64(case, &x, &w, &b);
    let (dx, dw, db) = conv2d_grads_f64(case, &x, &w, &g);
    let db_err = if case.bias { max_rel_err(&to_f64(bt.grad(&grads).expect("bias grad")), &db) } else { 0.0 };
    [
        max_rel_err(&to_f64(y), &y_ref),
        max_rel_err(&to_f64(xt.grad(&grads).expect("x grad")), &dx),
        max_rel_err(&to_f64(wt.grad(&grads).expect("w grad")), &dw),
        db_err,
    ]
}

/// The convolutions every setting is checked on.
fn cases() -> [Conv2dCase; 8] {
    let c = |n, c, h, w, k, r, stride: usize, pad: usize, dil: usize, groups, bias| Conv2dCase {
        n,
        c,
        h,
        w,
        k,
        r,
        s: r,
        stride: [stride; 2],
        pad: [pad; 2],
        dil: [dil; 2],
        groups,
        bias,
    };
    [
        c(4, 16, 14, 14, 32, 3, 1, 1, 1, 1, false),  // pitched rows (14 floats -> 16)
        c(2, 3, 32, 32, 16, 7, 2, 3, 1, 1, false),   // a stem
        c(3, 32, 7, 7, 64, 1, 1, 0, 1, 1, true),     // 1x1 with bias on 7x7 (pitched)
        c(2, 24, 15, 13, 24, 3, 2, 1, 1, 4, true),   // groups, odd sizes
        c(2, 8, 17, 17, 12, 3, 1, 2, 2, 1, false),   // dilation
        c(5, 64, 9, 9, 32, 1, 2, 0, 1, 1, false),    // strided 1x1 (downsample)
        c(2, 12, 10, 10, 12, 3, 1, 1, 1, 12, false), // depthwise
        // Large enough that cuDNN's fastest algorithms use tensor cores: the TF32 pass differs
        // from the FP32 one here (on the small cases above Find picks FMA kernels either way).
        c(8, 128, 14, 14, 128, 3, 1, 1, 1, 1, false),
    ]
}

/// One setting of the convolution path: its label, options, error bound, activation type and
/// layout.
type Setting = (&'static str, CudnnOptions, f64, FloatDType, Layout);

/// Every setting checked: cuDNN in each type and layout, with and without the filter kernel,
/// and burn's own kernels for comparison.
fn settings(base: &CudnnOptions) -> Vec<Setting> {
    let (nchw, nhwc) = (Layout::Nchw, Layout::Nhwc);
    vec![
        ("cudnn_fp32", CudnnOptions { allow_tf32: false, ..base.clone() }, 1e-4, FloatDType::F32, nchw),
        ("cudnn_tf32", CudnnOptions { allow_tf32: true, ..base.clone() }, 5e-3, FloatDType::F32, nchw),
        // Outputs and gradients are rounded to the type (bf16 keeps 8 mantissa bits, f16 11).
        ("cudnn_bf16", base.clone(), 1e-2, FloatDType::BF16, nchw),
        ("cudnn_f16", base.clone(), 2e-3, FloatDType::F16, nchw),
        // Channels-last activations, KRSC filters: the filter cast by burn and its permuted view
        // copied (`filter_kernel` off), then reordered and cast by one kernel each way (the
        // default).
        (
            "cudnn_fp32_nhwc",
            CudnnOptions { allow_tf32: false, filter_kernel: false, ..base.clone() },
            1e-4,
            FloatDType::F32,
            nhwc,
        ),
        ("cudnn_bf16_nhwc", CudnnOptions { filter_kernel: false, ..base.clone() }, 1e-2, FloatDType::BF16, nhwc),
        (
            "cudnn_fp32_nhwc_filter_kernel",
            CudnnOptions { allow_tf32: false, filter_kernel: true, ..base.clone() },
            1e-4,
            FloatDType::F32,
            nhwc,
        ),
        (
            "cudnn_bf16_nhwc_filter_kernel",
            CudnnOptions { filter_kernel: true, ..base.clone() },
            1e-2,
            FloatDType::BF16,
            nhwc,
        ),
        ("burn_kernels", CudnnOptions { enabled: false, ..base.clone() }, 1e-4, FloatDType::F32, nchw),
        ("burn_kernels_nhwc", CudnnOptions { enabled: false, ..base.clone() }, 1e-4, FloatDType::F32, nhwc),
    ]
}

pub(crate) fn check(device: &CudaDevice) -> bool {
    let cases = cases();
    let mut ok = true;
    let base = options::get();
    for (label, opts, bound, dtype, layout) in settings(&base) {
        options::set(opts.clone());
        // burn's own kernels autotune every new shape: two cases are enough to compare with.
        let n = if opts.enabled { cases.len() } else { 2 };
        for case in &cases[..n] {
            ok &= check_case(case, device, (label, &opts, bound, dtype, layout));
        }
    }
    options::set(base);
    ok
}

/// One case under one setting (already set): prints its RESULT line; false when cuDNN's path
/// ran other than expected or an error is over the bound (burn's own kernels never fail it).
fn check_case(
    case: &Conv2dCase,
    device: &CudaDevice,
    (label, opts, bound, dtype, layout): (&str, &CudnnOptions, f64, FloatDType, Layout),
) -> bool {
    let (before, reorders_before) = (cudnn::calls(), burn_ddp::nn::filter_kernel_calls());
    let e = errors(case, device, dtype, layout);
    let used = cudnn::calls() - before;
    let reorders = burn_ddp::nn::filter_kernel_calls() - reorders_before;
    // cuDNN sessions: the forward, and one for both gradients (`run_backward`); with
    // the filter kernel, it reorders the filter and its gradient.
    // The filter kernel serves channels-last convolutions only (KCRS is the filter's own
    // order for NCHW ones).
    let want_reorders = if opts.filter_kernel && opts.enabled && layout == Layout::Nhwc { 2 } else { 0 };
    let path_ok = reorders == want_reorders && if opts.enabled { used == 2 } else { used == 0 };
    let pass = path_ok && e.iter().all(|&v| v < bound);
    // burn's own kernels are measured for comparison only: their accuracy is burn's.
    let verdict = match (opts.enabled, pass) {
        (true, true) => "ok",
        (true, false) => "FAIL",
        (false, true) => "info: within the bound",
        (false, false) => "info: outside the bound",
    };
    println!(
        "RESULT check={label} case={case:?} y={:.2e} dx={:.2e} dw={:.2e} db={:.2e} bound={bound:.0e} cudnn_calls={used} filter_kernel_calls={reorders} {verdict}",
        e[0], e[1], e[2], e[3]
    );
    pass || !opts.enabled
}

/// One input feeding several convolutions (a ResNet stage's first block: its first
/// convolution and the downsample; here also a third): the input gradient against the sum of
/// the f64 references, and how many of the convolutions added their share into the gradient
/// already there (cuDNN's β = 1) instead of writing a new buffer.
pub(crate) fn accumulate_case(
    cases: &[Conv2dCase],
    device: &CudaDevice,
    dtype: FloatDType,
    layout: Layout,
) -> (f64, u64) {
    let inputs: Vec<_> = cases.iter().enumerate().map(|(i, c)| c.random_inputs(21 + i as u64)).collect();
    let x = round(&inputs[0].0, dtype);
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
    let xt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&x), cases[0].x_dims()), device).require_grad();
    let x_in = layout.view_from_nchw(xt.clone()).cast(dtype);
    let mut want = vec![0.0; x.len()];
    let mut loss: Option<Tensor<Ad, 1>> = None;
    for (case, (_, w, _, g)) in cases.iter().zip(&inputs) {
        let (w, g) = (round(w, dtype), round(g, dtype));
        let wt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&w), case.w_dims()), device).require_grad();
        let gt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(&g), case.y_dims()), device);
        let y = layout.view_nchw(conv2d(x_in.clone(), wt, None, case.options(), layout));
        let term = (y.cast(FloatDType::F32) * gt).sum();
        loss = Some(match loss {
            Some(l) => l + term,
            None => term,
        });
        want.iter_mut().zip(conv2d_grads_f64(case, &x, &w, &g).0).for_each(|(a, b)| *a += b);
    }
    let before = cudnn::accumulated();
    let grads = loss.expect("at least one case").backward();
    let dx = to_f64(xt.grad(&grads).expect("x grad"));
    (max_rel_err(&dx, &want), cudnn::accumulated() - before)
}

pub(crate) fn check_accumulate(device: &CudaDevice) -> bool {
    let c = |k, r: usize, stride: usize, pad: usize| Conv2dCase {
        n: 4,
        c: 32,
        h: 14,
        w: 14,
        k,
        r,
        s: r,
        stride: [stride; 2],
        pad: [pad; 2],
        dil: [1; 2],
        groups: 1,
        bias: false,
    };
    // A bottleneck stage's first block: 1x1 to the narrow width, 1x1 stride-2 downsample; then a
    // third user (a 3x3).
    let (first, down, third) = (c(16, 1, 1, 0), c(64, 1, 2, 0), c(24, 3, 1, 1));
    let mut ok = true;
    let base = options::get();
    // The bounds of `check`: f32 exact to 1e-4 without TF32, 5e-3 with it; bf16 to 1e-2.
    for (math, opts, bound, dtype) in [
        ("fp32", CudnnOptions { allow_tf32: false, ..base.clone() }, 1e-4, FloatDType::F32),
        ("tf32", CudnnOptions { allow_tf32: true, ..base.clone() }, 5e-3, FloatDType::F32),
        ("bf16", base.clone(), 1e-2, FloatDType::BF16),
    ] {
        options::set(opts);
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for cases in [vec![first, down], vec![first, down, third]] {
                let (err, added) = accumulate_case(&cases, device, dtype, layout);
                let pass = err < bound && added == cases.len() as u64 - 1;
                ok &= pass;
                println!(
                    "RESULT check=conv_input_feeds_{} math={math} layout={layout:?} dx={err:.2e} bound={bound:.0e} added_in_place={added} {}",
                    cases.len(),
                    if pass { "ok" } else { "FAIL" }
                );
            }
        }
    }
    options::set(base);
    ok
}
