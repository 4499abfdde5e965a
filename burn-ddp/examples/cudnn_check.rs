//! On a GPU: checks the cuDNN convolution path against an f64 reference in every direction and
//! option (TF32 on and off, and burn's own kernels for comparison) and cuDNN's batch norm against
//! burn's on the CPU, then times every distinct
//! ResNet-50 convolution shape (forward, and forward + backward) at batch 256; checks cuBLAS's
//! matrix products against f64 (`bench-gemm` times them against burn's kernels) and cuDNN's fused
//! attention (`bench-sdpa` times it against the unfused path at ViT-B/16's shape);
//! `check-nccl` checks NCCL's sums ordered on the device with burn's stream and DDP over them
//! (one rank: needs libnccl): against plain training, with large gradients summed in place,
//! with bf16 / fp16 on the wire, with `find_unused_parameters`; then DDP's host time per step.
//!
//! `cargo build --release -p burn-ddp --features cuda --example cudnn_check`; run it with
//! `cudnn_check [check] [check-transformer] [check-relu] [check-accumulate] [check-sgd] [check-ce] [check-nccl] [check-sync-bn] [bench] [bench-gemm] [bench-sdpa] [bench-bn] [--batch N] [--iters N] [--strided] [--dtype f32|bf16|f16]
//! [--pipelined] [--nhwc]`. Prints `RESULT` lines; exits 1 when a check fails.

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType, bf16, f16};
use burn_autodiff::Autodiff;
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::cuda::cublas;
use burn_ddp::nn::cuda::cudnn::{attention as cudnn_sdpa, convolution as cudnn, layer_norm as cudnn_ln};
use burn_ddp::nn::reference::{Conv2dCase, conv2d_f64, conv2d_grads_f64, max_pool2d_f64, max_rel_err};
use burn_ddp::nn::{
    CudnnOptions, CudnnTimes, Layout, batch_norm, conv2d, layer_norm, linear, matmul, options, self_attention,
};
use burn_nn::BatchNormConfig;
use std::time::Instant;

type Ad = Autodiff<Cuda>;

fn to_f64<const D: usize, B: Backend>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().expect("f32 data").into_iter().map(f64::from).collect()
}

/// `v` rounded to `dtype` (so that a reference computed from the result sees exactly what the
/// GPU sees).
fn round(v: &[f64], dtype: FloatDType) -> Vec<f64> {
    match dtype {
        FloatDType::BF16 => v.iter().map(|&a| bf16::from_f64(a).to_f64()).collect(),
        FloatDType::F16 => v.iter().map(|&a| f16::from_f64(a).to_f64()).collect(),
        _ => v.to_vec(),
    }
}

/// y, dx, dw, db of one case on the GPU with activations in `dtype` and `layout` (the weight
/// is cast by `conv2d`), relative errors against the f64 reference on the same (rounded) inputs.
fn errors(case: &Conv2dCase, device: &CudaDevice, dtype: FloatDType, layout: Layout) -> [f64; 4] {
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

fn check(device: &CudaDevice) -> bool {
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
    let cases = [
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
    ];
    let mut ok = true;
    let base = options::get();
    let (nchw, nhwc) = (Layout::Nchw, Layout::Nhwc);
    for (label, opts, bound, dtype, layout) in [
        ("cudnn_fp32", CudnnOptions { allow_tf32: false, ..base.clone() }, 1e-4, FloatDType::F32, nchw),
        ("cudnn_tf32", CudnnOptions { allow_tf32: true, ..base.clone() }, 5e-3, FloatDType::F32, nchw),
        // Outputs and gradients are rounded to the type (bf16 keeps 8 mantissa bits, f16 11).
        ("cudnn_bf16", base.clone(), 1e-2, FloatDType::BF16, nchw),
        ("cudnn_f16", base.clone(), 2e-3, FloatDType::F16, nchw),
        // Channels-last activations, KRSC filters.
        ("cudnn_fp32_nhwc", CudnnOptions { allow_tf32: false, ..base.clone() }, 1e-4, FloatDType::F32, nhwc),
        ("cudnn_bf16_nhwc", base.clone(), 1e-2, FloatDType::BF16, nhwc),
        ("burn_kernels", CudnnOptions { enabled: false, ..base.clone() }, 1e-4, FloatDType::F32, nchw),
        ("burn_kernels_nhwc", CudnnOptions { enabled: false, ..base.clone() }, 1e-4, FloatDType::F32, nhwc),
    ] {
        options::set(opts.clone());
        // burn's own kernels autotune every new shape: two cases are enough to compare with.
        let n = if opts.enabled { cases.len() } else { 2 };
        for case in &cases[..n] {
            let before = cudnn::calls();
            let e = errors(case, device, dtype, layout);
            let used = cudnn::calls() - before;
            // cuDNN sessions: the forward, and one for both gradients (`run_backward`).
            let path_ok = if opts.enabled { used == 2 } else { used == 0 };
            let pass = path_ok && e.iter().all(|&v| v < bound);
            // burn's own kernels are measured for comparison only: their accuracy is burn's.
            let verdict = match (opts.enabled, pass) {
                (true, true) => "ok",
                (true, false) => "FAIL",
                (false, true) => "info: within the bound",
                (false, false) => "info: outside the bound",
            };
            ok &= pass || !opts.enabled;
            println!(
                "RESULT check={label} case={case:?} y={:.2e} dx={:.2e} dw={:.2e} db={:.2e} bound={bound:.0e} cudnn_calls={used} {verdict}",
                e[0], e[1], e[2], e[3]
            );
        }
    }
    options::set(base);
    ok
}

/// One input feeding several convolutions (a ResNet stage's first block: its first
/// convolution and the downsample; here also a third): the input gradient against the sum of
/// the f64 references, and how many of the convolutions added their share into the gradient
/// already there (cuDNN's β = 1) instead of writing a new buffer.
fn accumulate_case(cases: &[Conv2dCase], device: &CudaDevice, dtype: FloatDType, layout: Layout) -> (f64, u64) {
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

fn check_accumulate(device: &CudaDevice) -> bool {
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

type BnRun = ([Vec<f64>; 4], [Vec<f64>; 2], Vec<f64>);

/// Two training steps of `relu?(batch_norm(x))` (the first on x/2, for the running statistics),
/// then inference with the result: (y, dx, dgamma, dbeta), (running mean, var), inference y.
/// The activations are in `dtype`, the parameters and statistics in f32.
#[allow(clippy::too_many_arguments)]
fn bn_case<B: burn::tensor::backend::AutodiffBackend>(
    d: &B::Device,
    dims: [usize; 4],
    x: &[f32],
    g: &[f32],
    gamma: &[f32],
    beta: &[f32],
    relu: bool,
    dtype: FloatDType,
    layout: Layout,
) -> BnRun {
    let c = dims[1];
    let mut bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(c).init::<B>(d)).with_layout(layout);
    bn.gamma = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(gamma.to_vec(), [c]), d));
    bn.beta = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(beta.to_vec(), [c]), d));
    let xt = Tensor::<B, 4>::from_data(TensorData::new(x.to_vec(), dims), d).require_grad();
    let bn_in = |t: Tensor<B, 4>| layout.view_from_nchw(t).cast(dtype);
    let _ = batch_norm(&bn, bn_in(xt.clone() * 0.5), relu);
    let y = layout.view_nchw(batch_norm(&bn, bn_in(xt.clone()), relu));
    assert_eq!(y.dtype(), dtype.into(), "batch norm keeps its input's type");
    let grads = (y.clone().cast(FloatDType::F32) * Tensor::<B, 4>::from_data(TensorData::new(g.to_vec(), dims), d))
        .sum()
        .backward();
    let out = [
        to_f64(y),
        to_f64(xt.grad(&grads).expect("dx")),
        to_f64(bn.gamma.val().grad(&grads).expect("dgamma")),
        to_f64(bn.beta.val().grad(&grads).expect("dbeta")),
    ];
    let running = [to_f64(bn.running_mean.value_sync()), to_f64(bn.running_var.value_sync())];
    let xi = Tensor::<B::InnerBackend, 4>::from_data(TensorData::new(x.to_vec(), dims), d);
    let infer = batch_norm(&bn.valid(), layout.view_from_nchw(xi).cast(dtype), relu);
    (out, running, to_f64(layout.view_nchw(infer)))
}

/// Seeded values in `shift ± scale/2` (the seeded generator the f64 reference uses).
fn values(seed: u64, len: usize, scale: f32, shift: f32) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| shift + scale * rng.random_range(-0.5f32..0.5)).collect()
}

/// cuDNN's batch norm (+ ReLU) on the GPU against burn's BatchNorm on the CPU (burn-flex, f32):
/// outputs, the three gradients, running statistics after two training steps, and inference;
/// with f32 activations, then bf16 and f16 ones (the reference gets the same rounded inputs and
/// computes in f32; the GPU's outputs and input gradient are rounded to the type).
fn check_bn(device: &CudaDevice) -> bool {
    let mut ok = true;
    let f32_cases = [
        ([4, 16, 14, 14], true),
        ([4, 16, 14, 14], false),
        ([2, 8, 7, 7], true),
        ([3, 5, 9, 11], false),
        ([16, 64, 28, 28], true),
    ];
    let half_cases = [([4, 16, 14, 14], true), ([3, 5, 9, 11], false), ([16, 64, 28, 28], true)];
    let nhwc_cases = [
        ([4, 16, 14, 14], true),
        ([3, 5, 9, 11], false),
        ([16, 64, 28, 28], true),
        ([8, 100, 12, 13], true),
        ([64, 64, 32, 32], false),
    ];
    let (nchw, nhwc) = (Layout::Nchw, Layout::Nhwc);
    let runs = f32_cases
        .iter()
        .map(|&(d, r)| (d, r, FloatDType::F32, 1e-4, nchw))
        .chain(half_cases.iter().map(|&(d, r)| (d, r, FloatDType::BF16, 1e-2, nchw)))
        .chain(half_cases.iter().map(|&(d, r)| (d, r, FloatDType::F16, 2e-3, nchw)))
        // Channels-last: burn-ddp's own kernels (`batch_norm_nhwc`), no cuDNN call; more
        // channels than one 32-wide tile and not a multiple of it, many rows per thread.
        .chain(nhwc_cases.iter().map(|&(d, r)| (d, r, FloatDType::F32, 1e-4, nhwc)))
        .chain(nhwc_cases.iter().map(|&(d, r)| (d, r, FloatDType::BF16, 1e-2, nhwc)))
        .chain(nhwc_cases.iter().map(|&(d, r)| (d, r, FloatDType::F16, 2e-3, nhwc)));
    for (dims, relu, dtype, bound, layout) in runs {
        let n: usize = dims.iter().product();
        let x: Vec<f32> = round(&values(1, n, 4.0, 0.7).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let g: Vec<f32> = round(&values(2, n, 2.0, 0.1).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let (gamma, beta) = (values(3, dims[1], 1.0, 1.0), values(4, dims[1], 1.0, 0.0));
        let (before, kernels_before) = (cudnn::calls(), burn_ddp::nn::nhwc_bn_kernel_calls());
        let (out, running, infer) = bn_case::<Ad>(device, dims, &x, &g, &gamma, &beta, relu, dtype, layout);
        let (used, kernels) = (cudnn::calls() - before, burn_ddp::nn::nhwc_bn_kernel_calls() - kernels_before);
        let (ref_out, ref_running, ref_infer) = bn_case::<Autodiff<burn_flex::Flex>>(
            &Default::default(),
            dims,
            &x,
            &g,
            &gamma,
            &beta,
            relu,
            FloatDType::F32,
            Layout::Nchw,
        );
        let errs: Vec<f64> = out
            .iter()
            .zip(&ref_out)
            .chain(running.iter().zip(&ref_running))
            .map(|(a, b)| max_rel_err(a, b))
            .chain([max_rel_err(&infer, &ref_infer)])
            .collect();
        // Two training forwards, one backward, one inference: on cuDNN (NCHW) or on the
        // channels-last kernels (NHWC, unless switched off with CudnnOptions::nhwc_bn_kernels).
        let want_kernels = if options::get().nhwc_bn_kernels { 4 } else { 0 };
        let path_ok =
            if layout == Layout::Nhwc { used == 0 && kernels == want_kernels } else { used >= 4 && kernels == 0 };
        let pass = path_ok && errs.iter().all(|&e| e < bound);
        ok &= pass;
        println!(
            "RESULT check=cudnn_batch_norm dtype={dtype:?} layout={layout:?} dims={dims:?} relu={relu} y={:.2e} dx={:.2e} dgamma={:.2e} dbeta={:.2e} running_mean={:.2e} running_var={:.2e} inference={:.2e} bound={bound:.0e} cudnn_calls={used} nhwc_kernel_calls={kernels} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            errs[4],
            errs[5],
            errs[6],
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

/// Convolution + BatchNorm + ReLU as one cuDNN operation against the two separate ones (same
/// algorithms): outputs, the four gradients, running mean; fused = 2 cuDNN sessions, separate = 4
/// (convolution, batch norm, its backward, both convolution gradients in one).
fn check_fused(device: &CudaDevice) -> bool {
    use burn_nn::PaddingConfig2d;
    use burn_nn::conv::Conv2dConfig;
    let base = options::get();
    let mut ok = true;
    let (nchw, nhwc) = (Layout::Nchw, Layout::Nhwc);
    let cases = [
        ([8, 32, 14, 14], 64, 3, 1, FloatDType::F32, nchw),
        ([4, 64, 28, 28], 32, 1, 2, FloatDType::F32, nchw),
        ([8, 32, 14, 14], 64, 3, 1, FloatDType::BF16, nchw),
        ([4, 64, 28, 28], 32, 1, 2, FloatDType::BF16, nchw),
        ([8, 32, 14, 14], 64, 3, 1, FloatDType::BF16, nhwc),
        ([4, 64, 28, 28], 32, 1, 2, FloatDType::F32, nhwc),
    ];
    for (x_dims, k, r, stride, dtype, layout) in cases {
        let run = |fuse: bool| {
            options::set(CudnnOptions { fuse_conv_bn: fuse, allow_tf32: false, ..base.clone() });
            Ad::seed(device, 3);
            let conv = Conv2dConfig::new([x_dims[1], k], [r, r])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(r / 2, r / 2, r / 2, r / 2))
                .with_bias(false)
                .init::<Ad>(device);
            let conv = burn_ddp::nn::Conv2d::from(conv).with_layout(layout);
            let bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(k).init::<Ad>(device)).with_layout(layout);
            let n: usize = x_dims.iter().product();
            let x = Tensor::<Ad, 4>::from_data(TensorData::new(values(5, n, 3.0, 0.2), x_dims), device).require_grad();
            let before = cudnn::calls();
            let y = burn_ddp::nn::conv_batch_norm(&conv, &bn, layout.view_from_nchw(x.clone()).cast(dtype), true);
            let y = layout.view_nchw(y).cast(FloatDType::F32);
            let g = Tensor::<Ad, 4>::from_data(
                TensorData::new(values(6, y.dims().iter().product(), 2.0, 0.0), y.dims()),
                device,
            );
            let grads = (y.clone() * g).sum().backward();
            let out = [
                to_f64(y),
                to_f64(x.grad(&grads).expect("dx")),
                to_f64(conv.weight.val().grad(&grads).expect("dw")),
                to_f64(bn.gamma.val().grad(&grads).expect("dgamma")),
                to_f64(bn.beta.val().grad(&grads).expect("dbeta")),
                to_f64(bn.running_mean.value_sync()),
            ];
            (out, cudnn::calls() - before)
        };
        let (separate, calls_separate) = run(false);
        let (fused, calls_fused) = run(true);
        let errs: Vec<f64> = fused.iter().zip(&separate).map(|(a, b)| max_rel_err(a, b)).collect();
        // Both run the same cuDNN computations; in a half type the separate path rounds the
        // convolution's output the same way, so the bound stays tight.
        let bound = if dtype == FloatDType::F32 { 1e-5 } else { 1e-2 };
        // Channels-last never fuses: the convolution's three cuDNN calls, the batch norm from
        // burn's operations, either way.
        // Channels-last: the convolution's forward and backward sessions, batch norm on burn-ddp's kernels.
        let calls_ok = if layout == Layout::Nhwc {
            calls_fused == 2 && calls_separate == 2
        } else {
            calls_fused == 2 && calls_separate == 4
        };
        let pass = calls_ok && errs.iter().all(|&e| e < bound);
        ok &= pass;
        println!(
            "RESULT check=fused_conv_bn dtype={dtype:?} layout={layout:?} x={x_dims:?} k={k} r={r} stride={stride} y={:.2e} dx={:.2e} dw={:.2e} dgamma={:.2e} dbeta={:.2e} running_mean={:.2e} cudnn_calls fused={calls_fused} separate={calls_separate} bound={bound:.0e} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            errs[4],
            errs[5],
            if pass { "ok" } else { "FAIL" }
        );
    }
    options::set(base);
    ok
}

#[derive(serde::Deserialize)]
struct Shapes {
    shapes: Vec<Shape4>,
}

#[derive(serde::Deserialize)]
struct Shape4 {
    name: String,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    r: usize,
    s: usize,
    stride: usize,
    pad: usize,
}

/// How a shape is timed: `latency` synchronises after every call (one call's latency, nothing
/// to overlap); `pipelined` queues `iters` calls and synchronises once (what a training step
/// sees when the host runs ahead).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Latency,
    Pipelined,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Pipelined => "pipelined",
        }
    }
}

fn time_ms(iters: usize, device: &CudaDevice, mut f: impl FnMut()) -> f64 {
    f();
    f();
    <Cuda as Backend>::sync(device).expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    <Cuda as Backend>::sync(device).expect("sync");
    t.elapsed().as_secs_f64() * 1e3 / iters as f64
}

fn bench(
    device: &CudaDevice,
    batch: usize,
    iters: usize,
    strided: bool,
    dtype: FloatDType,
    mode: Mode,
    layout: Layout,
) {
    let shapes: Shapes =
        serde_json::from_str(include_str!("../../benches/resnet50_conv_shapes.json")).expect("shape list");
    let base = options::get();
    // Burn-cuda's activations are pitched; `--strided` also times cuDNN on them as they are.
    let plain = if layout == Layout::Nhwc { "burn-cudnn-nhwc" } else { "burn-cudnn" };
    let variants: &[(&str, bool)] =
        if strided { &[(plain, true), ("burn-cudnn-strided", false)] } else { &[(plain, true)] };
    for &(label, pack) in variants {
        options::set(CudnnOptions { pack_inputs: pack, ..base.clone() });
        bench_shapes(device, batch, iters, &shapes, label, dtype, mode, layout);
    }
    options::set(base);
}

#[allow(clippy::too_many_arguments)]
fn bench_shapes(
    device: &CudaDevice,
    batch: usize,
    iters: usize,
    shapes: &Shapes,
    label: &str,
    dtype: FloatDType,
    mode: Mode,
    layout: Layout,
) {
    let sync = || {
        if mode == Mode::Latency {
            let _ = <Cuda as Backend>::sync(device);
        }
    };
    for s in &shapes.shapes {
        let o = burn::tensor::ops::ConvOptions::new([s.stride; 2], [s.pad; 2], [1, 1], 1);
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Cuda, 4>::random(layout.from_nchw([batch, s.c, s.h, s.w]), normal, device).cast(dtype);
        let w = (Tensor::<Cuda, 4>::random([s.k, s.c, s.r, s.s], normal, device) * 0.05).cast(dtype);
        let fwd = time_ms(iters, device, || {
            let y = conv2d(x.clone(), w.clone(), None, o.clone(), layout);
            sync();
            drop(y);
        });
        let xa = Tensor::<Ad, 4>::from_inner(x.clone()).require_grad();
        let wa = Tensor::<Ad, 4>::from_inner(w.clone()).require_grad();
        let y0 = conv2d(xa.clone(), wa.clone(), None, o.clone(), layout);
        let g = Tensor::<Ad, 4>::random(y0.dims(), normal, device).cast(dtype);
        drop(y0);
        let fwdbwd = time_ms(iters, device, || {
            let y = conv2d(xa.clone(), wa.clone(), None, o.clone(), layout);
            let grads = (y * g.clone()).sum().backward();
            let dx = xa.grad(&grads).expect("dx");
            let dw = wa.grad(&grads).expect("dw");
            sync();
            drop((dx, dw));
        });
        println!(
            "RESULT framework={label} dtype={} mode={} shape={} batch={batch} c={} hw={} k={} r={} stride={} fwd_ms={fwd:.3} fwdbwd_ms={fwdbwd:.3}",
            dtype_name(dtype),
            mode.name(),
            s.name,
            s.c,
            s.h,
            s.k,
            s.r,
            s.stride
        );
    }
}

/// Batch norm + ReLU (forward and backward, training) on ResNet-50's activation shapes, queued
/// back to back: `RESULT bn ...` lines, ms per call.
fn bench_bn(device: &CudaDevice, batch: usize, iters: usize, dtype: FloatDType, layout: Layout) {
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

/// Batches uploaded through page-locked memory arrive bit-exact, also when several are in
/// flight and a buffer is reused (more uploads than the ring has buffers), and the model's
/// first layer reads them in order with the uploads.
fn check_upload(device: &CudaDevice) -> bool {
    use burn_ddp::nn::images_to_device;
    let mut ok = true;
    // Five uploads each followed by an operation on them, then a burst of eight with nothing
    // in between (every buffer reused while its copy may still be queued).
    let mut shapes = vec![[4, 3, 17, 19], [2, 3, 224, 224], [4, 3, 17, 19], [1, 1, 5, 5], [2, 3, 224, 224]];
    shapes.extend([[4, 3, 17, 19]; 8]);
    let uploads: Vec<(Vec<f32>, Tensor<Ad, 4>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let v: Vec<f32> =
                (0..s.iter().product::<usize>()).map(|j| ((j * 7 + i * 13) % 1000) as f32 * 0.01 - 5.0).collect();
            let t = images_to_device::<Ad>(v.clone(), *s, device);
            (v, if i < 5 { t.mul_scalar(1.0) } else { t })
        })
        .collect();
    for (i, (v, t)) in uploads.into_iter().enumerate() {
        let got = t.into_data().into_vec::<f32>().unwrap();
        let exact = got == v;
        println!(
            "RESULT check=upload n={i} shape={:?} values={} exact={exact} {}",
            shapes[i],
            v.len(),
            if exact { "ok" } else { "FAIL" }
        );
        ok &= exact;
    }
    ok
}

/// Row-major batched product of f64 matrices: `batch` times `[m, k] · [k, n]`.
fn mm(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                c[(t * m + i) * n + j] = (0..k).map(|l| a[(t * m + i) * k + l] * b[(t * k + l) * n + j]).sum();
            }
        }
    }
    c
}

/// Each `[r, c]` matrix of the batch transposed.
fn tr(a: &[f64], batch: usize, r: usize, c: usize) -> Vec<f64> {
    (0..batch * r * c)
        .map(|o| (o / (r * c), (o % (r * c)) / r, o % r))
        .map(|(t, j, i)| a[(t * r + i) * c + j])
        .collect()
}

fn leaf<const D: usize>(
    device: &CudaDevice,
    seed: u64,
    dims: [usize; D],
    dtype: FloatDType,
) -> (Tensor<Ad, D>, Vec<f64>) {
    let v = round(&values(seed, dims.iter().product(), 1.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
    let t = Tensor::<Ad, D>::from_data(TensorData::new(v.iter().map(|&a| a as f32).collect::<Vec<_>>(), dims), device)
        .require_grad();
    (t, v)
}

/// `nn::linear` and `nn::matmul` on cuBLAS against f64: a linear layer of odd sizes with bias
/// (its gradient: row sums on cuBLAS), and attention's `q · kᵀ` with
/// `q` a sliced, permuted view (batch axes not one stride apart: an array of addresses, at an
/// offset into its buffer) and `kᵀ` a transposed view
/// (read in place); values and all gradients.
fn check_gemm(device: &CudaDevice) -> bool {
    let mut ok = true;
    for (dtype, bound) in [(FloatDType::F32, 1e-5), (FloatDType::BF16, 1e-2), (FloatDType::F16, 2e-3)] {
        let before = cublas::calls();
        let (x, xv) = leaf(device, 1, [37, 70], dtype);
        let (g, gv) = leaf(device, 3, [37, 19], dtype);
        let layer = burn_nn::LinearConfig::new(70, 19).init::<Ad>(device);
        let (wv, bv) = (
            round(&to_f64(layer.weight.val()), dtype),
            round(&to_f64(layer.bias.as_ref().expect("bias").val()), dtype),
        );
        let y = linear(&layer, x.clone().cast(dtype));
        let grads = (y.clone().cast(FloatDType::F32) * g.detach()).sum().backward();
        let y_ref: Vec<f64> = mm(&xv, &wv, 1, 37, 70, 19).iter().enumerate().map(|(i, v)| v + bv[i % 19]).collect();
        let db_ref: Vec<f64> = (0..19).map(|j| (0..37).map(|i| gv[i * 19 + j]).sum()).collect();
        let e2 = [
            max_rel_err(&to_f64(y), &y_ref),
            max_rel_err(&to_f64(x.grad(&grads).expect("dx")), &mm(&gv, &tr(&wv, 1, 70, 19), 1, 37, 19, 70)),
            max_rel_err(&to_f64(layer.weight.grad(&grads).expect("dw")), &mm(&tr(&xv, 1, 37, 70), &gv, 1, 70, 37, 19)),
            max_rel_err(&to_f64(layer.bias.as_ref().expect("bias").grad(&grads).expect("db")), &db_ref),
        ];
        let (p, _) = leaf(device, 4, [2, 29, 2, 3, 8], dtype);
        let (k, kv) = leaf(device, 5, [2, 3, 29, 8], dtype);
        let (g, gv) = leaf(device, 6, [2, 3, 29, 29], dtype);
        // As a ViT's q out of its qkv projection: part 1 of [n, t, parts, h, d], viewed [n, h, t, d].
        let part = |t: Tensor<Ad, 5>| t.permute([2, 0, 3, 1, 4]).slice([1..2]).reshape([2, 3, 29, 8]);
        let q = part(p.clone().cast(dtype));
        let qv = to_f64(q.clone());
        let s = matmul(q, k.clone().cast(dtype).swap_dims(2, 3));
        let grads = (s.clone().cast(FloatDType::F32) * g.detach()).sum().backward();
        let dq = mm(&gv, &kv, 6, 29, 29, 8);
        let dp = part(Tensor::from_inner(p.grad(&grads).expect("dp")));
        let e3 = [
            max_rel_err(&to_f64(s), &mm(&qv, &tr(&kv, 6, 29, 8), 6, 29, 8, 29)),
            max_rel_err(&to_f64(dp), &dq),
            max_rel_err(&to_f64(k.grad(&grads).expect("dk")), &mm(&tr(&gv, 6, 29, 29), &qv, 6, 29, 29, 8)),
        ];
        let used = cublas::calls() - before;
        // linear: forward, dx, dw, db (row sums); attention: forward, dq, dk.
        let pass = used == 7 && e2.iter().chain(&e3).all(|&e| e < bound);
        ok &= pass;
        let f = |e: &[f64]| e.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/");
        println!(
            "RESULT check=cublas_{} linear(y/dx/dw/db)={} attention(s/dq/dk)={} bound={bound:.0e} cublas_calls={used} {}",
            dtype_name(dtype),
            f(&e2),
            f(&e3),
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

/// Forward products at a ViT-B/16 step's shapes (batch 128), cuBLAS against burn's kernels.
fn bench_gemm(device: &CudaDevice, iters: usize) {
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

/// Self-attention in f64 of a qkv buffer `[n, t, 3, h, d]` (values `x`) with output gradient
/// `g` (`[n, t, h, d]`): the output and the qkv gradient, from the textbook formulas
/// (`p = softmax(q·kᵀ/√d)`, `dv = pᵀ·g`, `ds = p ∘ (g·vᵀ − rowsum(g ∘ o))/√d`, `dq = ds·k`,
/// `dk = dsᵀ·q`).
fn attention_f64(x: &[f64], g: &[f64], [n, t, h, d]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let (mut o, mut dx) = (vec![0.0; n * t * h * d], vec![0.0; x.len()]);
    let xi = |b: usize, tok: usize, part: usize, head: usize| (((b * t + tok) * 3 + part) * h + head) * d;
    let oi = |b: usize, tok: usize, head: usize| ((b * t + tok) * h + head) * d;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(u, v)| u * v).sum::<f64>();
    let scale = 1.0 / (d as f64).sqrt();
    for (b, head) in (0..n).flat_map(|b| (0..h).map(move |hh| (b, hh))) {
        let row = |tok: usize, part: usize| &x[xi(b, tok, part, head)..xi(b, tok, part, head) + d];
        let grad = |tok: usize| &g[oi(b, tok, head)..oi(b, tok, head) + d];
        let p: Vec<Vec<f64>> = (0..t)
            .map(|i| {
                let s: Vec<f64> = (0..t).map(|j| dot(row(i, 0), row(j, 1)) * scale).collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                s.iter().map(|v| (v - m).exp() / z).collect()
            })
            .collect();
        for i in 0..t {
            for c in 0..d {
                o[oi(b, i, head) + c] = (0..t).map(|j| p[i][j] * row(j, 2)[c]).sum();
            }
        }
        for i in 0..t {
            let r = dot(grad(i), &o[oi(b, i, head)..oi(b, i, head) + d]);
            let ds: Vec<f64> = (0..t).map(|j| p[i][j] * (dot(grad(i), row(j, 2)) - r) * scale).collect();
            for j in 0..t {
                for c in 0..d {
                    dx[xi(b, i, 0, head) + c] += ds[j] * row(j, 1)[c];
                    dx[xi(b, j, 1, head) + c] += ds[j] * row(i, 0)[c];
                    dx[xi(b, j, 2, head) + c] += p[i][j] * grad(i)[c];
                }
            }
        }
    }
    (o, dx)
}

/// `nn::self_attention` on cuDNN's fused flash attention against f64: the output and the qkv
/// gradient (dq, dk, dv in one buffer), bf16 and f16, token counts that are not multiples of a
/// tile (197, 50, 65), head dims 64 and 32; the fused path must have run (two calls per case);
/// f32 (the unfused path: cuBLAS products in strict f32 and a softmax) to 1e-5.
fn check_sdpa(device: &CudaDevice) -> bool {
    let mut ok = true;
    // f32 is not fused (cuDNN's flash attention takes half types): cuBLAS products and a softmax.
    for (dtype, bound) in [(FloatDType::BF16, 2e-2), (FloatDType::F16, 4e-3), (FloatDType::F32, 1e-5)] {
        for dims in [[2, 197, 3, 64], [3, 50, 2, 64], [2, 65, 4, 32]] {
            let [n, t, h, d] = dims;
            let before = cudnn_sdpa::calls();
            let xv =
                round(&values(21, n * t * 3 * h * d, 6.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let gv = round(&values(22, n * t * h * d, 2.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let x = Tensor::<Ad, 5>::from_data(
                TensorData::new(xv.iter().map(|&a| a as f32).collect::<Vec<_>>(), [n, t, 3, h, d]),
                device,
            )
            .require_grad();
            let g = Tensor::<Ad, 4>::from_data(
                TensorData::new(gv.iter().map(|&a| a as f32).collect::<Vec<_>>(), [n, t, h, d]),
                device,
            );
            let o = self_attention(x.clone().cast(dtype));
            let grads = (o.clone().cast(FloatDType::F32) * g).sum().backward();
            let (o_ref, dx_ref) = attention_f64(&xv, &gv, dims);
            let e = [max_rel_err(&to_f64(o), &o_ref), max_rel_err(&to_f64(x.grad(&grads).expect("dqkv")), &dx_ref)];
            let used = cudnn_sdpa::calls() - before;
            let fused_calls = if dtype == FloatDType::F32 { 0 } else { 2 };
            let pass = used == fused_calls && e.iter().all(|&v| v < bound);
            ok &= pass;
            println!(
                "RESULT check=sdpa_{} shape={dims:?} o={:.1e} dqkv={:.1e} bound={bound:.0e} sdpa_calls={used} {}",
                dtype_name(dtype),
                e[0],
                e[1],
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    ok
}

/// `nn::layer_norm` on cuDNN against f64: y, dx, dγ, dβ of rows × features (odd row counts;
/// 96 and 768 features), bf16 and f16 activations, f32 γ/β; two cuDNN calls per case.
fn check_ln(device: &CudaDevice) -> bool {
    let mut ok = true;
    for (dtype, bound) in [(FloatDType::BF16, 2e-2), (FloatDType::F16, 4e-3)] {
        for [rows, f] in [[37, 96], [197, 768]] {
            let before = cudnn_ln::calls();
            let xv = round(&values(31, rows * f, 6.0, 1.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let gv = round(&values(32, rows * f, 2.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let (gamma, beta): (Vec<f64>, Vec<f64>) = (
                values(33, f, 2.0, 1.0).into_iter().map(f64::from).collect(),
                values(34, f, 1.0, 0.0).into_iter().map(f64::from).collect(),
            );
            let mut norm = burn_nn::LayerNormConfig::new(f).with_epsilon(1e-6).init::<Ad>(device);
            let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            norm.gamma =
                norm.gamma.map(|_| Tensor::from_data(TensorData::new(f32s(&gamma), [f]), device).require_grad());
            norm.beta = norm
                .beta
                .map(|b| b.map(|_| Tensor::from_data(TensorData::new(f32s(&beta), [f]), device).require_grad()));
            let x = Tensor::<Ad, 2>::from_data(TensorData::new(f32s(&xv), [rows, f]), device).require_grad();
            let g = Tensor::<Ad, 2>::from_data(TensorData::new(f32s(&gv), [rows, f]), device);
            let y = layer_norm(&norm, x.clone().cast(dtype), 1e-6);
            let grads = (y.clone().cast(FloatDType::F32) * g).sum().backward();
            let (mut y_ref, mut dx_ref, mut dg_ref, mut db_ref) =
                (vec![0.0; rows * f], vec![0.0; rows * f], vec![0.0; f], vec![0.0; f]);
            for r in 0..rows {
                let row = &xv[r * f..(r + 1) * f];
                let mean = row.iter().sum::<f64>() / f as f64;
                let rstd = 1.0 / (row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / f as f64 + 1e-6).sqrt();
                let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
                let dxhat: Vec<f64> = (0..f).map(|i| gv[r * f + i] * gamma[i]).collect();
                let (m1, m2) = (
                    dxhat.iter().sum::<f64>() / f as f64,
                    dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / f as f64,
                );
                for i in 0..f {
                    y_ref[r * f + i] = xhat[i] * gamma[i] + beta[i];
                    dx_ref[r * f + i] = rstd * (dxhat[i] - m1 - xhat[i] * m2);
                    dg_ref[i] += gv[r * f + i] * xhat[i];
                    db_ref[i] += gv[r * f + i];
                }
            }
            let e = [
                max_rel_err(&to_f64(y), &y_ref),
                max_rel_err(&to_f64(x.grad(&grads).expect("dx")), &dx_ref),
                max_rel_err(&to_f64(norm.gamma.grad(&grads).expect("dgamma")), &dg_ref),
                max_rel_err(&to_f64(norm.beta.as_ref().expect("beta").grad(&grads).expect("dbeta")), &db_ref),
            ];
            let used = cudnn_ln::calls() - before;
            let pass = used == 2 && e.iter().all(|&v| v < bound);
            ok &= pass;
            let list = e.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/");
            println!(
                "RESULT check=layer_norm_{} rows={rows} features={f} y/dx/dgamma/dbeta={list} bound={bound:.0e} cudnn_ln_calls={used} {}",
                dtype_name(dtype),
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    ok
}

/// Attention forward + backward at ViT-B/16's shape (batch 128, 12 heads, 197 tokens, head dim
/// 64, bf16): cuDNN's fused attention against the unfused path (two products and a softmax);
/// `o.sum().backward()`, as `benches/pytorch_sdpa.py` does with PyTorch's.
fn bench_sdpa(device: &CudaDevice, iters: usize) {
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

fn dtype_name(dtype: FloatDType) -> &'static str {
    match dtype {
        FloatDType::BF16 => "bf16",
        FloatDType::F16 => "f16",
        _ => "f32",
    }
}

/// `burn_ddp::nn::relu` (backward from its output) against burn's `relu` (backward from its
/// input) on a residual sum, as a ResNet block uses it: the same values and the same gradients
/// for both addends, bit for bit (f32 and bf16).
fn check_relu(device: &CudaDevice) -> bool {
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
fn check_max_pool(device: &CudaDevice) -> bool {
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

/// Parameters of rank 4, 2 and 1 whose sizes take every vector width of the fused SGD kernel
/// (9408, 37000, 1000, 3000 and 3 elements).
#[derive(burn::module::Module, Debug)]
struct SgdNet<B: Backend> {
    conv: burn_nn::conv::Conv2d<B>,
    fc1: burn_nn::Linear<B>,
    fc2: burn_nn::Linear<B>,
}

impl<B: Backend> SgdNet<B> {
    fn new(device: &B::Device) -> Self {
        B::seed(device, 3);
        Self {
            conv: burn_nn::conv::Conv2dConfig::new([3, 64], [7, 7]).with_bias(false).init(device),
            fc1: burn_nn::LinearConfig::new(37, 1000).init(device),
            fc2: burn_nn::LinearConfig::new(1000, 3).init(device),
        }
    }

    fn loss(&self, x: Tensor<B, 4>, z: Tensor<B, 2>) -> Tensor<B, 1> {
        let a = self.conv.forward(x).powi_scalar(2).mean();
        let y = self.fc2.forward(burn::tensor::activation::relu(self.fc1.forward(z)));
        (y.clone() * y).mean() + a
    }

    fn values(&self) -> Vec<f64> {
        let m = self.clone();
        [
            m.conv.weight.val().flatten::<1>(0, 3),
            m.fc1.weight.val().flatten::<1>(0, 1),
            m.fc1.bias.unwrap().val(),
            m.fc2.weight.val().flatten::<1>(0, 1),
            m.fc2.bias.unwrap().val(),
        ]
        .into_iter()
        .flat_map(to_f64)
        .collect()
    }
}

/// The identity mapping, which initialises lazily initialised parameters.
struct Materialise;

impl<B: Backend> burn::module::ModuleMapper<B> for Materialise {}

/// burn-ddp's FusedSgd (one operation per step: its CUDA kernel) against burn's own Sgd on the
/// same GPU, three steps with changing learning rates, for momentum with weight decay,
/// Nesterov, dampening and plain SGD; the kernel must have run.
fn check_sgd(device: &CudaDevice) -> bool {
    use burn_ddp::nn::{FusedSgdConfig, sgd};
    use burn_optim::{GradientsParams, Optimizer, SgdConfig, decay::WeightDecayConfig, momentum::MomentumConfig};
    let x = Tensor::<Ad, 4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), device);
    let z = Tensor::<Ad, 2>::random([8, 37], Distribution::Normal(0.0, 1.0), device);
    let mut ok = true;
    let d = FusedSgdConfig::default();
    for c in [
        FusedSgdConfig { momentum: 0.9, weight_decay: 5e-3, ..d },
        FusedSgdConfig { momentum: 0.9, nesterov: true, ..d },
        FusedSgdConfig { momentum: 0.5, dampening: 0.1, weight_decay: 1e-2, ..d },
        FusedSgdConfig { weight_decay: 1e-3, ..d },
    ] {
        let momentum = (c.momentum > 0.0).then(|| {
            MomentumConfig::new().with_momentum(c.momentum).with_dampening(c.dampening).with_nesterov(c.nesterov)
        });
        let mut burns = SgdConfig::new()
            .with_momentum(momentum)
            .with_weight_decay((c.weight_decay > 0.0).then(|| WeightDecayConfig::new(c.weight_decay as f32)))
            .init::<Ad, SgdNet<Ad>>();
        let mut fused = c.init::<Ad, SgdNet<Ad>>();
        // The same starting values: parameters are initialised lazily, so a clone before the
        // first read would draw its own; mapping reads (initialises) them all first.
        let mut a = SgdNet::<Ad>::new(device).map(&mut Materialise);
        let mut b = a.clone();
        let start = a.values();
        let before = sgd::fused_updates();
        let mut err = max_rel_err(&a.values(), &b.values());
        for lr in [0.1, 0.05, 0.02] {
            let ga = GradientsParams::from_grads(a.loss(x.clone(), z.clone()).backward(), &a);
            a = fused.step(lr, a, ga);
            let gb = GradientsParams::from_grads(b.loss(x.clone(), z.clone()).backward(), &b);
            b = burns.step(lr, b, gb);
            err = err.max(max_rel_err(&a.values(), &b.values()));
        }
        let kernel = sgd::fused_updates() - before;
        let moved = max_rel_err(&a.values(), &start);
        let pass = err < 1e-5 && kernel == 15 && moved > 1e-4;
        println!(
            "RESULT check=fused_sgd momentum={} dampening={} nesterov={} weight_decay={} max_rel_err={err:.2e} moved={moved:.2e} parameters_through_the_kernel={kernel} {}",
            c.momentum,
            c.dampening,
            c.nesterov,
            c.weight_decay,
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}

/// burn-ddp's fused cross-entropy on the GPU against the f64 loss and gradient computed here
/// (`(softmax − t) / n`), with and without label smoothing, for a ResNet head's shape and odd
/// ones; a label out of range must give NaN, and the kernels must have run.
fn check_cross_entropy(device: &CudaDevice) -> bool {
    use burn_ddp::nn::cross_entropy::{cross_entropy, fused_calls, reference};
    let mut ok = true;
    for (n, k, eps) in [(256usize, 1000usize, 0.0f32), (256, 1000, 0.1), (5, 7, 0.1), (3, 1500, 0.0)] {
        let z: Vec<f32> = Tensor::<Cuda, 1>::random([n * k], Distribution::Normal(0.0, 4.0), device)
            .into_data()
            .into_vec()
            .expect("f32");
        let y: Vec<i64> = (0..n).map(|r| ((r * 7919 + 13) % k) as i64).collect();
        let zt = Tensor::<Ad, 1>::from_floats(z.as_slice(), device).reshape([n, k]).require_grad();
        let yt = Tensor::<Ad, 1, Int>::from_ints(y.iter().map(|&v| v as i32).collect::<Vec<_>>().as_slice(), device);
        let before = fused_calls();
        let loss = cross_entropy(zt.clone(), yt, eps);
        let got: f64 = f64::from(loss.clone().into_scalar().elem::<f32>());
        let grad: Vec<f64> = zt
            .grad(&loss.backward())
            .expect("a gradient")
            .into_data()
            .into_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect();
        let want = reference(&z, &y, k, f64::from(eps));
        let want_grad: Vec<f64> = z
            .chunks(k)
            .zip(&y)
            .flat_map(|(row, &label)| {
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
                let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
                row.iter()
                    .enumerate()
                    .map(move |(i, &v)| {
                        ((f64::from(v) - m).exp() / s
                            - f64::from(eps) / k as f64
                            - if i as i64 == label { 1.0 - f64::from(eps) } else { 0.0 })
                            / n as f64
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let (loss_err, grad_err) =
            ((got - want).abs() / want.abs().max(1e-12), max_abs_err(&grad, &want_grad) * n as f64);
        let pass = loss_err < 1e-5 && grad_err < 1e-5 && fused_calls() == before + 1;
        println!(
            "RESULT check=cross_entropy n={n} k={k} eps={eps} loss={got:.6} f64={want:.6} rel_err={loss_err:.1e} grad_abs_err_x_n={grad_err:.1e} {}",
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    let z = Tensor::<Ad, 2>::random([4, 10], Distribution::Normal(0.0, 1.0), device);
    let bad: f32 = cross_entropy(z, Tensor::<Ad, 1, Int>::from_ints([1, 2, 10, 3], device), 0.0).into_scalar().elem();
    println!("RESULT check=cross_entropy label_out_of_range loss={bad} {}", if bad.is_nan() { "ok" } else { "FAIL" });
    ok && bad.is_nan()
}

/// `linear::mean_over` (a global average pool on cuBLAS) against f64 means, both axes, and its
/// gradient (each input's is the output's over the axis length).
fn check_mean_over(device: &CudaDevice) -> bool {
    let (n, a, b) = (8usize, 49usize, 2048usize);
    let x: Vec<f32> = Tensor::<Cuda, 1>::random([n * a * b], Distribution::Normal(1.0, 2.0), device)
        .into_data()
        .into_vec()
        .expect("f32");
    let mut ok = true;
    for dim in [1usize, 2] {
        let xt = Tensor::<Ad, 1>::from_floats(x.as_slice(), device).reshape([n, a, b]).require_grad();
        let y = burn_ddp::nn::linear::mean_over(xt.clone(), dim);
        let got: Vec<f64> = y.clone().into_data().into_vec::<f32>().expect("f32").into_iter().map(f64::from).collect();
        let (len, other) = if dim == 1 { (a, b) } else { (b, a) };
        let at = |i: usize, r: usize, o: usize| {
            f64::from(x[if dim == 1 { (i * a + r) * b + o } else { (i * a + o) * b + r }])
        };
        let want: Vec<f64> = (0..n)
            .flat_map(|i| (0..other).map(move |o| (0..len).map(|r| at(i, r, o)).sum::<f64>() / len as f64))
            .collect();
        let grad: Vec<f64> = xt
            .grad(&y.sum().backward())
            .expect("a gradient")
            .into_data()
            .into_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect();
        let grad_err = grad.iter().map(|g| (g - 1.0 / len as f64).abs() * len as f64).fold(0.0, f64::max);
        let err = max_rel_err(&got, &want);
        let pass = err < 1e-5 && grad_err < 1e-5;
        println!(
            "RESULT check=mean_over dim={dim} [{n}, {a}, {b}] max_rel_err={err:.1e} grad_rel_err={grad_err:.1e} {}",
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}

fn max_abs_err(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// A world-1 NCCL group through the env:// rendezvous on a free local port.
fn nccl_group() -> std::sync::Arc<burn_ddp::Group> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let config = burn_ddp::RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        timeout: std::time::Duration::from_secs(60),
        token: None,
        source: burn_ddp::launch_env::EnvSource::Torchrun,
    };
    burn_ddp::init_process_group(burn_ddp::CommBackend::Nccl, &config).expect("a one-rank NCCL group")
}

/// NCCL summing on the device, ordered after burn's stream with nobody waiting (one rank: the
/// sum is the rank's own values times the pre-multiplier, 2 here, so a collective that ran
/// before its producers, or was read before it ended, shows as un-doubled values): the
/// producers are 24 chained 2048² products still running when the collective is enqueued.
fn check_nccl_ordering(device: &CudaDevice, pg: &std::sync::Arc<burn_ddp::Group>) -> bool {
    use burn_ddp::tensor::{all_reduce_on_device, collective_seconds, join_on_device, orders_on_device};
    let pg: std::sync::Arc<dyn burn_ddp::ProcessGroup> = pg.clone();
    let ordered = orders_on_device::<Cuda>(&*pg, device);
    <Cuda as Backend>::seed(device, 5);
    let b = Tensor::<Cuda, 2>::random([2048, 2048], Distribution::Uniform(-1.0, 1.0), device).div_scalar(24.0);
    let mut a = Tensor::<Cuda, 2>::random([2048, 2048], Distribution::Uniform(-1.0, 1.0), device);
    <Cuda as Backend>::sync(device).expect("sync");
    let clock = collective_seconds();
    for _ in 0..24 {
        a = matmul(a, b.clone()).add_scalar(0.25);
    }
    let flat = a.reshape([2048 * 2048]);
    let keep = flat.clone().mul_scalar(1.0);
    let started = Instant::now();
    let (summed, join) =
        all_reduce_on_device(pg, flat, Some(2.0), "ordering check".into()).expect("all_reduce_on_device");
    let enqueued_ms = started.elapsed().as_secs_f64() * 1e3;
    let got = join_on_device(summed, &join).into_data().to_vec::<f32>().expect("f32");
    let want = keep.mul_scalar(2.0).into_data().to_vec::<f32>().expect("f32");
    let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    // The watchdog adds the device time once it sees the collective's end.
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    while collective_seconds() == clock && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let device_ms = (collective_seconds() - clock) * 1e3;
    let ok = ordered && wrong == 0 && device_ms > 0.0;
    println!(
        "RESULT check=nccl_ordered_sum ordered_on_device={ordered} elements={} wrong={wrong} host_enqueue_ms={enqueued_ms:.2} device_ms={device_ms:.3} {}",
        got.len(),
        if ok { "ok" } else { "FAIL" }
    );
    ok
}

/// Convolutions in a row, their output weighted and summed: burn-ddp's layers report their
/// gradients to DDP during backward.
#[derive(burn::module::Module, Debug)]
struct ConvStack<B: Backend> {
    convs: Vec<burn_ddp::nn::Conv2d<B>>,
}

impl<B: Backend> ConvStack<B> {
    /// Convolutions from `channels[i]` to `channels[i + 1]` features, 3×3, padding 1.
    fn new(device: &B::Device, channels: &[usize]) -> Self {
        let conv = |c, k| {
            burn_ddp::nn::Conv2d::from(
                burn_nn::conv::Conv2dConfig::new([c, k], [3, 3])
                    .with_padding(burn_nn::PaddingConfig2d::Explicit(1, 1, 1, 1))
                    .init(device),
            )
        };
        // Drawn now: a clone of a fresh module would draw its own.
        burn_ddp::params::initialized(Self { convs: channels.windows(2).map(|w| conv(w[0], w[1])).collect() })
    }

    fn loss(&self, x: Tensor<B, 4>, g: &Tensor<B, 4>) -> Tensor<B, 1> {
        let y = self.convs.iter().fold(x, |x, c| c.forward(x));
        (y * g.clone()).sum()
    }

    fn values(&self) -> Vec<f32> {
        self.convs
            .iter()
            .flat_map(|c| {
                [
                    c.weight.val().into_data().to_vec::<f32>().expect("f32"),
                    c.bias.as_ref().expect("bias").val().into_data().to_vec::<f32>().expect("f32"),
                ]
            })
            .flatten()
            .collect()
    }
}

/// `steps` SGD steps of `model` on (x, g), through `ddp` when given; host milliseconds per step
/// spent in backward (with DDP's finish) and in the optimizer, and the wall time per step.
fn ddp_steps(
    mut m: ConvStack<Ad>,
    ddp: Option<&burn_ddp::DistributedDataParallel>,
    (x, g): (&Tensor<Ad, 4>, &Tensor<Ad, 4>),
    steps: usize,
) -> (ConvStack<Ad>, [f64; 3]) {
    use burn_optim::{GradientsParams, Optimizer, SgdConfig};
    let mut opt = SgdConfig::new().init::<Ad, ConvStack<Ad>>();
    let (mut backward, mut optimizer) = (0.0, 0.0);
    let started = Instant::now();
    for _ in 0..steps {
        let step = ddp.map(|d| d.step(&m).expect("ddp step"));
        let loss = m.loss(x.clone(), g);
        let t = Instant::now();
        let grads = match step {
            Some(s) => s.backward(loss, &m).expect("ddp backward"),
            None => GradientsParams::from_grads(loss.backward(), &m),
        };
        let t2 = Instant::now();
        m = opt.step(0.01, m, grads);
        (backward, optimizer) = (backward + (t2 - t).as_secs_f64(), optimizer + t2.elapsed().as_secs_f64());
    }
    let _ = m.convs[0].weight.val().into_data();
    let per_step = |s: f64| 1e3 * s / steps as f64;
    (m, [per_step(backward), per_step(optimizer), per_step(started.elapsed().as_secs_f64())])
}

/// DDP over a one-rank NCCL group (buckets summed on the device, started during backward)
/// against plain training of the same model: parameters after 3 SGD steps equal to 1e-4 (one
/// rank's average is its own gradient; cuDNN's filter gradients are not bit-reproducible),
/// every bucket summed on the device.
fn check_nccl_ddp(device: &CudaDevice, pg: std::sync::Arc<burn_ddp::Group>) -> bool {
    <Ad as Backend>::seed(device, 9);
    let model = ConvStack::<Ad>::new(device, &[8, 32, 32, 16]);
    let (x, g) = (
        Tensor::<Ad, 4>::random([4, 8, 16, 16], Distribution::Normal(0.0, 1.0), device),
        Tensor::<Ad, 4>::random([4, 16, 16, 16], Distribution::Normal(0.0, 1.0), device),
    );
    let config = burn_ddp::DdpConfig { bucket_bytes: 16 << 10, ..Default::default() };
    let ddp = burn_ddp::DistributedDataParallel::new(pg, config);
    let plain = ddp_steps(model.clone(), None, (&x, &g), 3).0.values();
    let again = ddp_steps(model.clone(), None, (&x, &g), 3).0.values();
    let with_ddp = ddp_steps(model, Some(&ddp), (&x, &g), 3).0.values();
    // cuDNN's filter-gradient algorithms may sum in any order: plain training against itself
    // shows that noise; a bucket read before its gradients were written, or summed twice, would
    // be off by far more.
    let f = |v: &[f32]| v.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
    let (noise, err) = (max_rel_err(&f(&again), &f(&plain)), max_rel_err(&f(&with_ddp), &f(&plain)));
    let s = ddp.stats();
    let ok = err <= 1e-4 && s.buckets > 3 && s.on_device == s.buckets && s.overlapped > 0;
    println!(
        "RESULT check=nccl_ddp_one_rank params={} max_rel_err={err:.1e} (plain vs plain {noise:.1e}) bound=1e-4 buckets={} on_device={} started_in_backward={} {}",
        plain.len(),
        s.buckets,
        s.on_device,
        s.overlapped,
        if ok { "ok" } else { "FAIL" }
    );
    ok
}

/// One step's gradients of `m` on (x, g), through `ddp` when given, in parameter order.
fn step_gradients(
    m: &ConvStack<Ad>,
    ddp: Option<&burn_ddp::DistributedDataParallel>,
    (x, g): (&Tensor<Ad, 4>, &Tensor<Ad, 4>),
) -> Vec<f64> {
    let step = ddp.map(|d| d.step(m).expect("ddp step"));
    let loss = m.loss(x.clone(), g);
    let grads = match step {
        Some(s) => s.backward(loss, m).expect("ddp backward"),
        None => burn_optim::GradientsParams::from_grads(loss.backward(), m),
    };
    let values = |t: Option<Vec<f32>>| t.expect("a gradient for every parameter").into_iter().map(f64::from);
    m.convs
        .iter()
        .flat_map(|c| {
            let w = values(grads.get::<Cuda, 4>(c.weight.id).map(|t| t.into_data().to_vec::<f32>().expect("f32")));
            let b = values(
                grads
                    .get::<Cuda, 1>(c.bias.as_ref().expect("bias").id)
                    .map(|t| t.into_data().to_vec::<f32>().expect("f32")),
            );
            w.chain(b).collect::<Vec<_>>()
        })
        .collect()
}

/// The bound on DDP's difference from plain gradients beside `noise`, plain training's own
/// difference from itself: 1e-4, or three times the noise where cuDNN chose a filter-gradient
/// algorithm that sums in no fixed order (6.8e-4 seen on one machine, 6e-6 on another).
fn noise_floor(noise: f64) -> f64 {
    1e-4f64.max(3.0 * noise)
}

/// A bucket whose large gradient (a 128×256×3×3 filter, 1.2 MB) NCCL sums in its own buffer
/// beside packed small ones (a 0.6 MB filter, the biases): one step's gradients equal plain
/// training's up to cuDNN's noise.
fn check_nccl_ddp_large(device: &CudaDevice, pg: std::sync::Arc<burn_ddp::Group>) -> bool {
    <Ad as Backend>::seed(device, 13);
    let model = ConvStack::<Ad>::new(device, &[64, 256, 128]);
    let (x, g) = (
        Tensor::<Ad, 4>::random([2, 64, 8, 8], Distribution::Normal(0.0, 1.0), device),
        Tensor::<Ad, 4>::random([2, 128, 8, 8], Distribution::Normal(0.0, 1.0), device),
    );
    let plain = step_gradients(&model, None, (&x, &g));
    let scale = plain.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let rel =
        |a: &[f64]| a.iter().zip(&plain).map(|(a, b)| (a - b).abs() / (b.abs() + 1e-3 * scale)).fold(0.0, f64::max);
    let noise = rel(&step_gradients(&model, None, (&x, &g)));
    let ddp = burn_ddp::DistributedDataParallel::new(pg, burn_ddp::DdpConfig::default());
    let _ = step_gradients(&model, Some(&ddp), (&x, &g));
    let err = rel(&step_gradients(&model, Some(&ddp), (&x, &g)));
    let s = ddp.stats();
    let bound = noise_floor(noise);
    let pass = err <= bound && s.on_device == s.buckets;
    println!(
        "RESULT check=nccl_ddp_large_in_place grads={} max_rel_err={err:.2e} (plain vs plain {noise:.1e}) bound={bound:.1e} buckets={} on_device={} {}",
        plain.len(),
        s.buckets,
        s.on_device,
        if pass { "ok" } else { "FAIL" }
    );
    pass
}

/// DDP's other device-route settings against plain gradients of one step: bf16 on the wire
/// (each gradient rounded to bf16 once: within 2^-8 of its magnitude, beside cuDNN's own
/// noise) and `find_unused_parameters` (presence counts summed through NCCL beside the
/// gradients, read back; equal to plain up to cuDNN's noise).
fn check_nccl_ddp_settings(device: &CudaDevice, pg: std::sync::Arc<burn_ddp::Group>) -> bool {
    <Ad as Backend>::seed(device, 11);
    let model = ConvStack::<Ad>::new(device, &[8, 32, 32, 16]);
    let (x, g) = (
        Tensor::<Ad, 4>::random([4, 8, 16, 16], Distribution::Normal(0.0, 1.0), device),
        Tensor::<Ad, 4>::random([4, 16, 16, 16], Distribution::Normal(0.0, 1.0), device),
    );
    let base = burn_ddp::DdpConfig { bucket_bytes: 16 << 10, ..Default::default() };
    let plain = step_gradients(&model, None, (&x, &g));
    let scale = plain.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    // Relative to each value, with a floor of 1e-3 of the largest (values near zero).
    let rel =
        |a: &[f64]| a.iter().zip(&plain).map(|(a, b)| (a - b).abs() / (b.abs() + 1e-3 * scale)).fold(0.0, f64::max);
    let noise = rel(&step_gradients(&model, None, (&x, &g)));
    let mut ok = check_nccl_ddp_large(device, pg.clone());
    for (name, config, bound) in [
        (
            "bf16_wire",
            burn_ddp::DdpConfig { compression: burn_ddp::GradCompression::Bf16, ..base },
            2f64.powi(-8) + noise_floor(noise),
        ),
        (
            "fp16_wire",
            burn_ddp::DdpConfig { compression: burn_ddp::GradCompression::Fp16, ..base },
            2f64.powi(-11) + noise_floor(noise),
        ),
        ("find_unused", burn_ddp::DdpConfig { find_unused_parameters: true, ..base }, noise_floor(noise)),
    ] {
        let ddp = burn_ddp::DistributedDataParallel::new(pg.clone(), config);
        let _ = step_gradients(&model, Some(&ddp), (&x, &g));
        let err = rel(&step_gradients(&model, Some(&ddp), (&x, &g)));
        let s = ddp.stats();
        let pass = err <= bound && s.on_device == s.buckets && s.buckets > 2;
        ok &= pass;
        println!(
            "RESULT check=nccl_ddp_{name} grads={} max_rel_err={err:.2e} (plain vs plain {noise:.1e}) bound={bound:.2e} buckets={} on_device={} {}",
            plain.len(),
            s.buckets,
            s.on_device,
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

/// Host time per step of plain training, DDP on the device route and DDP with blocking
/// collectives (`BURN_DDP_NCCL_HOST_SYNC=1`), one-rank NCCL, 6 convolutions of 64 features at
/// 56², batch 32, f32.
fn bench_nccl_ddp(device: &CudaDevice, pg: std::sync::Arc<burn_ddp::Group>) {
    let model = ConvStack::<Ad>::new(device, &[64; 7]);
    let (x, g) = (
        Tensor::<Ad, 4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), device),
        Tensor::<Ad, 4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), device),
    );
    let config = burn_ddp::DdpConfig { bucket_bytes: 64 << 10, ..Default::default() };
    let ddp = burn_ddp::DistributedDataParallel::new(pg.clone(), config);
    let after_backward = burn_ddp::DistributedDataParallel::new(pg, burn_ddp::DdpConfig { overlap: false, ..config });
    for (name, with_ddp, host_sync) in [
        ("plain", None, false),
        ("ddp_device", Some(&ddp), false),
        ("ddp_device_after_backward", Some(&after_backward), false),
        ("ddp_host_sync", Some(&ddp), true),
        ("ddp_device", Some(&ddp), false),
    ] {
        // SAFETY: read by this thread only (the route is chosen per step on this thread).
        unsafe { std::env::set_var("BURN_DDP_NCCL_HOST_SYNC", if host_sync { "1" } else { "0" }) };
        let _ = ddp_steps(model.clone(), with_ddp, (&x, &g), 3);
        burn_ddp::trace::start();
        let [backward, optimizer, wall] = ddp_steps(model.clone(), with_ddp, (&x, &g), 20).1;
        let mut spans: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
        for s in burn_ddp::trace::stop() {
            let e = spans.entry(s.name).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + s.dur_us / 1e3 / 20.0);
        }
        let spans: Vec<String> = spans.into_iter().map(|(k, (n, ms))| format!("{k}: {n}x {ms:.2} ms/step")).collect();
        println!(
            "RESULT bench=nccl_ddp run={name} host_ms_per_step backward={backward:.2} optimizer={optimizer:.2} wall_ms_per_step={wall:.2} | {}",
            spans.join("; ")
        );
    }
    unsafe { std::env::remove_var("BURN_DDP_NCCL_HOST_SYNC") };
}

/// One rank of [`check_sync_bn`]: its half of the batch through SyncBatchNorm (channels-last,
/// activations in `dtype`) over a TCP group of 2 on the same GPU, after a first training
/// forward on half the values (running statistics move twice): `[y, dx, dγ, dβ]` and the
/// running statistics.
#[allow(clippy::too_many_arguments)]
fn sync_bn_rank(
    device: &CudaDevice,
    port: u16,
    rank: usize,
    dims: [usize; 4],
    x: &[f32],
    g: &[f32],
    gamma: &[f32],
    beta: &[f32],
    relu: bool,
    dtype: FloatDType,
) -> BnRun {
    let config = burn_ddp::RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: 2,
        local_rank: 0,
        local_world_size: 2,
        timeout: std::time::Duration::from_secs(60),
        token: None,
        source: burn_ddp::launch_env::EnvSource::Torchrun,
    };
    let pg = burn_ddp::init_process_group(burn_ddp::CommBackend::Tcp, &config).expect("a TCP group of 2");
    let sync = burn_ddp::BatchNormSync::new::<Ad>(pg).expect("SyncBatchNorm on Autodiff<Cuda>");
    let c = dims[1];
    let mut bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(c).init::<Ad>(device)).with_layout(Layout::Nhwc);
    bn.gamma = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(gamma.to_vec(), [c]), device));
    bn.beta = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(beta.to_vec(), [c]), device));
    let xt = Tensor::<Ad, 4>::from_data(TensorData::new(x.to_vec(), dims), device).require_grad();
    // NCHW-ordered dims over channels-last memory, as a channels-last model hands it over.
    let bn_in = |t: Tensor<Ad, 4>| Layout::Nhwc.view_nchw(Layout::Nhwc.view_from_nchw(t).cast(dtype));
    let run = |t| {
        if relu {
            burn_ddp::sync_batch_norm_relu(&bn, bn_in(t), &sync)
        } else {
            burn_ddp::sync_batch_norm(&bn, bn_in(t), &sync)
        }
    };
    let _ = run(xt.clone() * 0.5);
    let y = run(xt.clone());
    assert_eq!(y.dtype(), dtype.into(), "SyncBatchNorm keeps its input's type");
    let grads = (y.clone().cast(FloatDType::F32)
        * Tensor::<Ad, 4>::from_data(TensorData::new(g.to_vec(), dims), device))
    .sum()
    .backward();
    let out = [
        to_f64(y),
        to_f64(xt.grad(&grads).expect("dx")),
        to_f64(bn.gamma.val().grad(&grads).expect("dgamma")),
        to_f64(bn.beta.val().grad(&grads).expect("dbeta")),
    ];
    (out, [to_f64(bn.running_mean.value_sync()), to_f64(bn.running_var.value_sync())], Vec::new())
}

/// SyncBatchNorm on the channels-last kernels, 2 ranks (threads with a TCP group, one GPU) each
/// with half the batch, against burn's BatchNorm over the whole batch on the CPU (burn-flex,
/// f32): outputs and input gradients (each rank's half), γ and β gradients (summed over the
/// ranks, as the whole batch's loss sums them), running statistics on both ranks.
fn check_sync_bn(device: &CudaDevice) -> bool {
    let mut ok = true;
    for (dims, relu, dtype, bound) in [
        ([8, 24, 6, 5], true, FloatDType::F32, 1e-4),
        ([6, 100, 7, 9], false, FloatDType::F32, 1e-4),
        ([8, 64, 14, 14], true, FloatDType::BF16, 1e-2),
    ] {
        let n: usize = dims.iter().product();
        let x: Vec<f32> = round(&values(11, n, 4.0, 0.7).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let g: Vec<f32> = round(&values(12, n, 2.0, 0.1).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let (gamma, beta) = (values(13, dims[1], 1.0, 1.0), values(14, dims[1], 1.0, 0.0));
        let (ref_out, ref_running, _) = bn_case::<Autodiff<burn_flex::Flex>>(
            &Default::default(),
            dims,
            &x,
            &g,
            &gamma,
            &beta,
            relu,
            FloatDType::F32,
            Layout::Nchw,
        );
        let half = [dims[0] / 2, dims[1], dims[2], dims[3]];
        let per_rank = n / 2;
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let kernels_before = burn_ddp::nn::nhwc_bn_kernel_calls();
        let ranks: Vec<BnRun> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let (x, g, gamma, beta) =
                        (&x[r * per_rank..(r + 1) * per_rank], &g[r * per_rank..(r + 1) * per_rank], &gamma, &beta);
                    s.spawn(move || sync_bn_rank(device, port, r, half, x, g, gamma, beta, relu, dtype))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        let kernels = burn_ddp::nn::nhwc_bn_kernel_calls() - kernels_before;
        let joined = |k: usize| [ranks[0].0[k].clone(), ranks[1].0[k].clone()].concat();
        let summed = |k: usize| ranks[0].0[k].iter().zip(&ranks[1].0[k]).map(|(a, b)| a + b).collect::<Vec<f64>>();
        let mut errs = vec![
            max_rel_err(&joined(0), &ref_out[0]),
            max_rel_err(&joined(1), &ref_out[1]),
            max_rel_err(&summed(2), &ref_out[2]),
            max_rel_err(&summed(3), &ref_out[3]),
        ];
        errs.extend(ranks.iter().flat_map(|r| r.1.iter().zip(&ref_running).map(|(a, b)| max_rel_err(a, b))));
        // Per rank: two training forwards (moments) and one backward (input gradient).
        let pass = kernels == 6 && errs.iter().all(|&e| e < bound);
        ok &= pass;
        println!(
            "RESULT check=sync_batch_norm_nhwc ranks=2 dtype={dtype:?} dims={dims:?} relu={relu} y={:.2e} dx={:.2e} dgamma={:.2e} dbeta={:.2e} running(max over ranks)={:.2e} bound={bound:.0e} nhwc_kernel_calls={kernels} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            errs[4..].iter().cloned().fold(0.0, f64::max),
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

fn check_nccl(device: &CudaDevice) -> bool {
    let pg = nccl_group();
    let ok = check_nccl_ordering(device, &pg)
        & check_nccl_ddp(device, pg.clone())
        & check_nccl_ddp_settings(device, pg.clone());
    bench_nccl_ddp(device, pg);
    ok
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    // As burn-vision runs: kernel caches, cuDNN's plans on disk, exact-size allocations.
    let _ =
        burn_ddp::nn::runtime::kernel_cache::configure_with(burn_ddp::nn::runtime::kernel_cache::Allocator::ExactSizes);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let all = !args.iter().any(|a| {
        a == "check"
            || a == "bench"
            || a == "bench-bn"
            || a == "bench-gemm"
            || a == "bench-sdpa"
            || a == "check-transformer"
            || a == "check-relu"
            || a == "check-accumulate"
            || a == "check-sgd"
            || a == "check-ce"
            || a == "check-nccl"
            || a == "check-sync-bn"
    });
    let device = CudaDevice::new(0);
    println!("RESULT cudnn_version={:?} available={}", cudnn::version(), cudnn::available());
    let mut ok = true;
    if all || args.iter().any(|a| a == "check") {
        ok = check(&device);
        ok &= check_accumulate(&device);
        ok &= check_bn(&device);
        ok &= check_fused(&device);
        ok &= check_upload(&device);
        ok &= check_gemm(&device);
        ok &= check_sdpa(&device);
        ok &= check_ln(&device);
        ok &= check_relu(&device);
        ok &= check_max_pool(&device);
        ok &= check_sgd(&device);
        ok &= check_cross_entropy(&device);
        ok &= check_mean_over(&device);
        // Unless asked to wait on the host, every cuDNN call must have been ordered on the device.
        let t = CudnnTimes::now();
        let ordered = options::get().host_sync || (t.calls > 0 && t.device_ordered == t.calls);
        println!(
            "RESULT cuDNN calls={} ordered_on_device={} {}",
            t.calls,
            t.device_ordered,
            if ordered { "ok" } else { "FAIL" }
        );
        ok &= ordered;
        println!("RESULT cudnn_check={}", if ok { "ok" } else { "FAIL" });
    }
    if args.iter().any(|a| a == "check-transformer") {
        ok &= check_sdpa(&device);
        ok &= check_ln(&device);
        println!("RESULT cudnn_check_transformer={}", if ok { "ok" } else { "FAIL" });
    }
    if args.iter().any(|a| a == "check-relu") {
        ok &= check_relu(&device);
        ok &= check_max_pool(&device);
    }
    if args.iter().any(|a| a == "check-accumulate") {
        ok &= check_accumulate(&device);
    }
    if args.iter().any(|a| a == "check-sgd") {
        ok &= check_sgd(&device);
    }
    if args.iter().any(|a| a == "check-ce") {
        ok &= check_cross_entropy(&device);
        ok &= check_mean_over(&device);
    }
    if args.iter().any(|a| a == "check-nccl") {
        ok &= check_nccl(&device);
    }
    if all || args.iter().any(|a| a == "check" || a == "check-sync-bn") {
        ok &= check_sync_bn(&device);
    }
    if args.iter().any(|a| a == "bench-sdpa") {
        bench_sdpa(&device, flag("--iters", 20));
    }
    if args.iter().any(|a| a == "bench-gemm") {
        bench_gemm(&device, flag("--iters", 20));
    }
    if args.iter().any(|a| a == "bench-bn") {
        let dtype = if args.iter().any(|a| a == "--f32") { FloatDType::F32 } else { FloatDType::BF16 };
        for layout in [Layout::Nchw, Layout::Nhwc] {
            bench_bn(&device, flag("--batch", 256), flag("--iters", 10), dtype, layout);
        }
    }
    if all || args.iter().any(|a| a == "bench") {
        let text = |name: &str, default: &str| {
            args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
        };
        let dtype = match text("--dtype", "f32").as_str() {
            "bf16" => FloatDType::BF16,
            "f16" => FloatDType::F16,
            "f32" => FloatDType::F32,
            other => panic!("--dtype {other}: use f32, bf16 or f16"),
        };
        let mode = if args.iter().any(|a| a == "--pipelined") { Mode::Pipelined } else { Mode::Latency };
        let layout = if args.iter().any(|a| a == "--nhwc") { Layout::Nhwc } else { Layout::Nchw };
        bench(
            &device,
            flag("--batch", 256),
            flag("--iters", 10),
            args.iter().any(|a| a == "--strided"),
            dtype,
            mode,
            layout,
        );
    }
    std::process::exit(if ok { 0 } else { 1 });
}
