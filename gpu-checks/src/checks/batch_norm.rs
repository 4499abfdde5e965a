//! cuDNN's batch norm (+ ReLU) against burn's on the CPU, convolution + batch norm + ReLU as one cuDNN operation against the separate ones, and a residual block's end on the channels-last kernels.

use crate::util::{Ad, round, to_f64, values};
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_autodiff::Autodiff;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cudnn::convolution as cudnn;
use burn_ddp::nn::reference::max_rel_err;
use burn_ddp::nn::{CudnnOptions, Layout, batch_norm, batch_norm_add_relu, options};
use burn_nn::BatchNormConfig;

pub(crate) type BnRun = ([Vec<f64>; 4], [Vec<f64>; 2], Vec<f64>);

/// Which batch norm a case runs: burn-ddp's (`nn::batch_norm`, what is checked), or burn-nn's
/// BatchNorm and burn's ReLU (the reference: NCHW, f32).
#[derive(Clone, Copy)]
pub(crate) enum Bn {
    BurnDdp,
    BurnNn,
}

impl Bn {
    /// `relu?(bn(x))` by this implementation.
    fn run<B: Backend>(self, bn: &burn_ddp::nn::BatchNorm<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
        match (self, relu) {
            (Bn::BurnDdp, _) => batch_norm(bn, x, relu),
            (Bn::BurnNn, false) => bn.to_burn_nn().forward(x),
            (Bn::BurnNn, true) => burn::tensor::activation::relu(bn.to_burn_nn().forward(x)),
        }
    }

    /// `relu(bn(x) + r)` by this implementation.
    fn run_add_relu<B: Backend>(
        self,
        bn: &burn_ddp::nn::BatchNorm<B>,
        x: Tensor<B, 4>,
        r: Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        match self {
            Bn::BurnDdp => batch_norm_add_relu(bn, x, r),
            Bn::BurnNn => burn::tensor::activation::relu(bn.to_burn_nn().forward(x) + r),
        }
    }
}

/// Two training steps of `relu?(batch_norm(x))` (the first on x/2, for the running statistics),
/// then inference with the result: (y, dx, dgamma, dbeta), (running mean, var), inference y.
/// The activations are in `dtype`, the parameters and statistics in f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bn_case<B: burn::tensor::backend::AutodiffBackend>(
    (d, which): (&B::Device, Bn),
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
    let _ = which.run(&bn, bn_in(xt.clone() * 0.5), relu);
    let y = layout.view_nchw(which.run(&bn, bn_in(xt.clone()), relu));
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
    let infer = which.run(&bn.valid(), layout.view_from_nchw(xi).cast(dtype), relu);
    (out, running, to_f64(layout.view_nchw(infer)))
}

/// cuDNN's batch norm (+ ReLU) on the GPU against burn's BatchNorm on the CPU (burn-flex, f32):
/// outputs, the three gradients, running statistics after two training steps, and inference;
/// with f32 activations, then bf16 and f16 ones (the reference gets the same rounded inputs and
/// computes in f32; the GPU's outputs and input gradient are rounded to the type).
pub(crate) fn check_bn(device: &CudaDevice) -> bool {
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
        let (out, running, infer) =
            bn_case::<Ad>((device, Bn::BurnDdp), dims, &x, &g, &gamma, &beta, relu, dtype, layout);
        let (used, kernels) = (cudnn::calls() - before, burn_ddp::nn::nhwc_bn_kernel_calls() - kernels_before);
        let (ref_out, ref_running, ref_infer) = bn_case::<Autodiff<burn_flex::Flex>>(
            (&Default::default(), Bn::BurnNn),
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
pub(crate) fn check_fused(device: &CudaDevice) -> bool {
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

/// One training step of `relu(bn(x) + r)` (`nn::batch_norm_add_relu`), then inference with
/// the statistics it left: `[y, dx, dr, dγ, dβ, running mean, running var]`, inference y. The
/// activations and the residual in `dtype`, parameters and statistics in f32. `shared`: the
/// output's gradient also reaches another tensor (`y + e`, `e` a zero leaf), so the backward
/// may not write into it.
#[allow(clippy::too_many_arguments)]
fn add_relu_case<B: burn::tensor::backend::AutodiffBackend>(
    (d, which): (&B::Device, Bn),
    dims: [usize; 4],
    [x, r, g]: [&[f32]; 3],
    gamma: &[f32],
    beta: &[f32],
    (dtype, shared): (FloatDType, bool),
    layout: Layout,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let c = dims[1];
    let mut bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(c).init::<B>(d)).with_layout(layout);
    bn.gamma = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(gamma.to_vec(), [c]), d));
    bn.beta = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(beta.to_vec(), [c]), d));
    let t = |v: &[f32]| Tensor::<B, 4>::from_data(TensorData::new(v.to_vec(), dims), d);
    let (xt, rt) = (t(x).require_grad(), t(r).require_grad());
    let into = |t: Tensor<B, 4>| layout.view_from_nchw(t).cast(dtype);
    let y = which.run_add_relu(&bn, into(xt.clone()), into(rt.clone()));
    assert_eq!(y.dtype(), dtype.into(), "the block's end keeps its input's type");
    let y = if shared { y.clone() + Tensor::zeros_like(&y).require_grad() } else { y };
    let y = layout.view_nchw(y);
    let grads = (y.clone().cast(FloatDType::F32) * t(g)).sum().backward();
    let out = vec![
        to_f64(y),
        to_f64(xt.grad(&grads).expect("dx")),
        to_f64(rt.grad(&grads).expect("dr")),
        to_f64(bn.gamma.val().grad(&grads).expect("dgamma")),
        to_f64(bn.beta.val().grad(&grads).expect("dbeta")),
        to_f64(bn.running_mean.value_sync()),
        to_f64(bn.running_var.value_sync()),
    ];
    let inner = |v: &[f32]| {
        let t = Tensor::<B::InnerBackend, 4>::from_data(TensorData::new(v.to_vec(), dims), d);
        layout.view_from_nchw(t).cast(dtype)
    };
    let infer = which.run_add_relu(&bn.valid(), inner(x), inner(r));
    (out, to_f64(layout.view_nchw(infer)))
}

/// A residual block's end, `relu(bn(x) + r)`, on the channels-last kernels (one forward pass,
/// the residual's gradient written by the backward's reduction) against burn's BatchNorm on the
/// CPU (burn-flex, f32), the addition and ReLU: output, the gradients of x, r, γ and β, the
/// running statistics and inference; f32, bf16 and f16 activations (the reference gets the same
/// rounded inputs). A third of each residual is negative enough to make the ReLU cut.
pub(crate) fn check_bn_add_relu(device: &CudaDevice) -> bool {
    let mut ok = true;
    let dims_list = [[4, 16, 14, 14], [3, 5, 9, 11], [8, 100, 12, 13], [16, 256, 14, 14]];
    let dtypes = [(FloatDType::F32, 1e-4), (FloatDType::BF16, 1e-2), (FloatDType::F16, 2e-3)];
    let cases = dims_list.iter().flat_map(|d| dtypes.iter().map(move |t| (*d, *t, false)));
    // The output's gradient shared with another tensor: the masked gradient gets a buffer of its own.
    let shared = [([8, 100, 12, 13], dtypes[0], true), ([16, 256, 14, 14], dtypes[1], true)];
    for (dims, (dtype, bound), shared) in cases.chain(shared) {
        let n: usize = dims.iter().product();
        let rounded = |seed, scale, shift| -> Vec<f32> {
            let v: Vec<f64> = values(seed, n, scale, shift).into_iter().map(f64::from).collect();
            round(&v, dtype).into_iter().map(|a| a as f32).collect()
        };
        let (x, r, g) = (rounded(11, 4.0, 0.7), rounded(12, 3.0, -0.4), rounded(13, 2.0, 0.1));
        let (gamma, beta) = (values(3, dims[1], 1.0, 1.0), values(4, dims[1], 1.0, 0.0));
        let (before, kernels_before) = (cudnn::calls(), burn_ddp::nn::nhwc_bn_kernel_calls());
        let (out, infer) = add_relu_case::<Ad>(
            (device, Bn::BurnDdp),
            dims,
            [&x, &r, &g],
            &gamma,
            &beta,
            (dtype, shared),
            Layout::Nhwc,
        );
        let (used, kernels) = (cudnn::calls() - before, burn_ddp::nn::nhwc_bn_kernel_calls() - kernels_before);
        let (ref_out, ref_infer) = add_relu_case::<Autodiff<burn_flex::Flex>>(
            (&Default::default(), Bn::BurnNn),
            dims,
            [&x, &r, &g],
            &gamma,
            &beta,
            (FloatDType::F32, shared),
            Layout::Nchw,
        );
        let errs: Vec<f64> =
            out.iter().zip(&ref_out).map(|(a, b)| max_rel_err(a, b)).chain([max_rel_err(&infer, &ref_infer)]).collect();
        // One training forward, one backward, one inference, all on the kernels.
        let fused = options::get().nhwc_bn_kernels && options::get().fuse_residual;
        let path_ok = used == 0 && kernels == if fused { 3 } else { 0 };
        let pass = path_ok && errs.iter().all(|&e| e < bound);
        ok &= pass;
        println!(
            "RESULT check=bn_add_relu dtype={dtype:?} dims={dims:?} shared_gradient={shared} y={:.2e} dx={:.2e} dr={:.2e} dgamma={:.2e} dbeta={:.2e} running_mean={:.2e} running_var={:.2e} inference={:.2e} bound={bound:.0e} cudnn_calls={used} nhwc_kernel_calls={kernels} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            errs[4],
            errs[5],
            errs[6],
            errs[7],
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

/// The channels-last batch norm's checks again with each channel's partial sums folded by one
/// warp per channel (`CudnnOptions::coalesced_fold` off; the coalesced fold is the default):
/// `batch-norm`, `bn-add-relu` and `sync-batch-norm` (its phases fold the moments and the
/// gradient sums).
pub(crate) fn check_warp_fold(device: &CudaDevice) -> bool {
    let base = options::get();
    options::set(CudnnOptions { coalesced_fold: false, ..base.clone() });
    println!("RESULT coalesced_fold=off (the checks below repeat batch-norm, bn-add-relu and sync-batch-norm)");
    let ok = check_bn(device) & check_bn_add_relu(device) & crate::checks::sync_batch_norm::check_sync_bn(device);
    options::set(base);
    ok
}
