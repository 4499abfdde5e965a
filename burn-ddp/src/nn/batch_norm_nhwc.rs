//! BatchNorm (+ ReLU) on channels-last activations, from burn's tensor operations, on every
//! backend — except burn-cuda, where burn-vision's own kernels run (`cuda::ops::batch_norm_nhwc`; these
//! operations remain its fallback and reference).
//!
//! cuDNN's batch norm reads NHWC through its legacy entry points 4–6× slower than NCHW, and its
//! fast channels-last kernels are persistent ones that cannot run beside the fence kernel that
//! orders cuDNN with burn (see `cuda::cudnn::batch_norm`). Here the statistics are reductions over the
//! spatial axes and the batch of an `[n, h, w, c]` tensor, whose channels are contiguous — each
//! stage reads memory in order and leaves many independent sums — and the normalisation, ReLU
//! and type casts are elementwise operations that burn's fusion merges. The gradients are
//! burn's autodiff of these operations. Statistics and arithmetic are f32 whatever the
//! activations' type; the output has the input's type.

use crate::nn::layers::{BatchNorm, Epilogue};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn::tensor::activation::relu as relu_op;

/// Per-channel mean over `[n, h, w]` of an `[n, h, w, c]` tensor, as `[1, 1, 1, c]`: one
/// reduction per axis, batch first (the fastest of four orders measured on the H200,
/// docs/benchmarks-history.md, 2026-12-01).
fn channel_mean<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [n, h, w, _] = x.dims();
    x.sum_dim(0).sum_dim(1).sum_dim(2).div_scalar((n * h * w) as f64)
}

/// `relu?(bn(x))` for channels-last `x`: batch statistics when the backend records gradients
/// (running statistics updated as burn's BatchNorm does: momentum blend of the batch mean and
/// the biased batch variance), running statistics otherwise.
///
/// # Shapes
/// `[batch, height, width, channels]` → the same
pub fn batch_norm_nhwc<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
    nhwc(bn, x, if relu { Epilogue::Relu } else { Epilogue::None })
}

/// `relu(bn(x) + residual)` for channels-last `x` and `residual` (a residual block's end), the
/// statistics as [`batch_norm_nhwc`]'s. On burn-cuda one pass writes it and the backward keeps
/// only the output (the addition and ReLU cost no passes of their own); the sum is in f32.
///
/// # Shapes
/// `x`, `residual`: `[batch, height, width, channels]` → the same
pub fn batch_norm_add_relu_nhwc<B: Backend>(
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    residual: Tensor<B, 4>,
) -> Tensor<B, 4> {
    nhwc(bn, x, Epilogue::AddRelu(residual))
}

fn nhwc<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, epilogue: Epilogue<Tensor<B, 4>>) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    let (x, epilogue) = match crate::nn::cuda::ops::batch_norm_nhwc::try_batch_norm(bn, x, epilogue) {
        Ok(y) => return y,
        Err(back) => back,
    };
    let [_, _, _, c] = x.dims();
    let dtype = x.dtype();
    let device = x.device();
    let per_channel = |t: Tensor<B, 1>| t.reshape([1, 1, 1, c]);
    let x = x.cast(FloatDType::F32);
    let (centered, inv_std) = if B::ad_enabled(&device) {
        let mean = channel_mean(x.clone());
        let centered = x - mean.clone();
        let var = channel_mean(centered.clone().square());
        bn.update_running(mean.reshape([c]), var.clone().reshape([c]));
        (centered, var.add_scalar(bn.epsilon).sqrt().recip())
    } else {
        let mean = per_channel(bn.running_mean.value().to_device(&device));
        let var = per_channel(bn.running_var.value().to_device(&device));
        (x - mean, var.add_scalar(bn.epsilon).sqrt().recip())
    };
    let y = centered * (inv_std * per_channel(bn.gamma.val())) + per_channel(bn.beta.val());
    let y = match epilogue {
        Epilogue::None => y,
        Epilogue::Relu => relu_op(y),
        Epilogue::AddRelu(r) => relu_op(y + r.cast(FloatDType::F32)),
    };
    y.cast(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::AutodiffModule;
    use burn::tensor::{Distribution, Tolerance};
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::BatchNormConfig;

    type B = Autodiff<Flex>;

    /// Against burn's BatchNorm on the NCHW view: output, the three gradients, running
    /// statistics, and inference afterwards.
    #[test]
    fn matches_burn_batch_norm_on_the_nchw_view() {
        let device = Default::default();
        for relu in [false, true] {
            let mine = BatchNorm::from(BatchNormConfig::new(5).init::<B>(&device)).with_layout(crate::nn::Layout::Nhwc);
            let theirs =
                BatchNorm::from(BatchNormConfig::new(5).init::<B>(&device)).with_layout(crate::nn::Layout::Nhwc);
            let gamma = Tensor::<B, 1>::random([5], Distribution::Uniform(0.5, 1.5), &device);
            let beta = Tensor::<B, 1>::random([5], Distribution::Uniform(-0.5, 0.5), &device);
            let (mine, theirs) = [mine, theirs]
                .map(|mut bn| {
                    bn.gamma = burn::module::Param::from_tensor(gamma.clone());
                    bn.beta = burn::module::Param::from_tensor(beta.clone());
                    bn
                })
                .into();
            let x = Tensor::<B, 4>::random([3, 4, 6, 5], Distribution::Normal(0.3, 2.0), &device).require_grad();
            let g = Tensor::<B, 4>::random([3, 4, 6, 5], Distribution::Normal(0.0, 1.0), &device);
            let y = batch_norm_nhwc(&mine, x.clone(), relu);
            let y_ref = theirs.to_burn_nn().forward(x.clone().permute([0, 3, 1, 2])).permute([0, 2, 3, 1]);
            let y_ref = if relu { relu_op(y_ref) } else { y_ref };
            let tol = Tolerance::<f32>::absolute(2e-5);
            y.clone().into_data().assert_approx_eq::<f32>(&y_ref.clone().into_data(), tol);
            let grads = (y * g.clone()).sum().backward();
            let grads_ref = (y_ref * g).sum().backward();
            let grad = |t: &Tensor<B, 1>, gr| t.grad(gr).expect("gradient").into_data();
            x.grad(&grads).unwrap().into_data().assert_approx_eq::<f32>(&x.grad(&grads_ref).unwrap().into_data(), tol);
            grad(&mine.gamma.val(), &grads).assert_approx_eq::<f32>(&grad(&theirs.gamma.val(), &grads_ref), tol);
            grad(&mine.beta.val(), &grads).assert_approx_eq::<f32>(&grad(&theirs.beta.val(), &grads_ref), tol);
            for (a, b) in [(&mine.running_mean, &theirs.running_mean), (&mine.running_var, &theirs.running_var)] {
                a.value_sync().into_data().assert_approx_eq::<f32>(&b.value_sync().into_data(), tol);
            }
            let xi = x.clone().inner();
            let (mine, theirs) = (mine.valid(), theirs.valid());
            let yi = batch_norm_nhwc(&mine, xi.clone(), false);
            let yi_ref = theirs.to_burn_nn().forward(xi.permute([0, 3, 1, 2])).permute([0, 2, 3, 1]);
            yi.into_data().assert_approx_eq::<f32>(&yi_ref.into_data(), tol);
        }
    }

    /// `relu(bn(x) + r)` against burn's BatchNorm on the NCHW view, the addition and burn's
    /// ReLU: output and the gradients of `x`, `r`, γ and β, in training and in inference.
    #[test]
    fn add_relu_matches_burn_batch_norm_then_the_sum() {
        let device = Default::default();
        let mine = BatchNorm::from(BatchNormConfig::new(6).init::<B>(&device)).with_layout(crate::nn::Layout::Nhwc);
        let theirs = mine.clone();
        let dims = [2, 5, 3, 6];
        let x = Tensor::<B, 4>::random(dims, Distribution::Normal(0.3, 2.0), &device).require_grad();
        let r = Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), &device).require_grad();
        let g = Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), &device);
        let y = batch_norm_add_relu_nhwc(&mine, x.clone(), r.clone());
        let nchw = |t: Tensor<B, 4>| t.permute([0, 3, 1, 2]);
        let y_ref = relu_op(theirs.to_burn_nn().forward(nchw(x.clone())).permute([0, 2, 3, 1]) + r.clone());
        // Some sums are negative, so the mask matters.
        assert!(y_ref.clone().lower_equal_elem(0.0).int().sum().into_scalar() > 0);
        let tol = Tolerance::<f32>::absolute(2e-5);
        y.clone().into_data().assert_approx_eq::<f32>(&y_ref.clone().into_data(), tol);
        let grads = (y * g.clone()).sum().backward();
        let grads_ref = (y_ref * g).sum().backward();
        for t in [&x, &r] {
            t.grad(&grads).unwrap().into_data().assert_approx_eq::<f32>(&t.grad(&grads_ref).unwrap().into_data(), tol);
        }
        for (a, b) in [(&mine.gamma, &theirs.gamma), (&mine.beta, &theirs.beta)] {
            let grad = |p: &burn::module::Param<Tensor<B, 1>>, gr| p.val().grad(gr).expect("gradient").into_data();
            grad(a, &grads).assert_approx_eq::<f32>(&grad(b, &grads_ref), tol);
        }
        let (xi, ri) = (x.inner(), r.inner());
        let (mine, theirs) = (mine.valid(), theirs.valid());
        let yi = batch_norm_add_relu_nhwc(&mine, xi.clone(), ri.clone());
        let yi_ref = relu_op(theirs.to_burn_nn().forward(xi.permute([0, 3, 1, 2])).permute([0, 2, 3, 1]) + ri);
        yi.into_data().assert_approx_eq::<f32>(&yi_ref.into_data(), tol);
    }
}
