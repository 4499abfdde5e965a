//! BatchNorm (optionally followed by ReLU) that takes the fastest path the backend has: one
//! cuDNN call or our kernels on burn-cuda (`feature = "cuda"`), burn-nn's batch norm on burn's
//! operations everywhere else — as [`BatchNorm::forward`] and the functions beside it.

use super::Layout;
use crate::grad_ready;
use crate::nn::layers::{BatchNorm, Conv2d};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::relu as relu_op;

impl<B: Backend> BatchNorm<B> {
    /// The same layer reading `gamma` and `beta` through the gradient hook (DDP's overlap),
    /// with `anchor` the input of the operation that uses them; running statistics shared.
    pub(crate) fn through_grad_hooks<const D: usize>(&self, anchor: &Tensor<B, D>) -> Self {
        let mut copy = self.clone();
        copy.gamma = Param::initialized(self.gamma.id, grad_ready::param_val(&self.gamma, anchor));
        copy.beta = Param::initialized(self.beta.id, grad_ready::param_val(&self.beta, anchor));
        copy
    }

    /// `bn(x)`: batch statistics on autodiff backends (running statistics updated as burn's
    /// BatchNorm does), running statistics otherwise. See [`batch_norm`].
    ///
    /// # Shapes
    /// `[batch, channels, height, width]` in the layer's [`Layout`] → the same
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        batch_norm(self, x, false)
    }

    /// `relu(bn(x))` in one pass where the backend has one (cuDNN, our kernels).
    ///
    /// # Shapes
    /// As [`BatchNorm::forward`].
    pub fn forward_relu(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        batch_norm(self, x, true)
    }

    /// `relu(bn(x) + residual)`, a residual block's end, in one pass where the backend has
    /// one. See [`batch_norm_add_relu`].
    ///
    /// # Shapes
    /// `x`, `residual`: as [`BatchNorm::forward`].
    pub fn forward_add_relu(&self, x: Tensor<B, 4>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
        batch_norm_add_relu(self, x, residual)
    }
}

/// `relu(bn(x))` when `relu`, else `bn(x)`: training statistics on autodiff backends (running
/// statistics updated as burn's BatchNorm does), running statistics otherwise. The output has
/// the input's element type (or the layer's precision, when set); statistics and parameters
/// stay f32, and so does the arithmetic (PyTorch's rule for half inputs).
///
/// Channels-last activations ([`Layout::Nhwc`] in the layer) go to [`crate::nn::batch_norm_nhwc`]
/// (our CUDA kernels on burn-cuda, burn's operations elsewhere). NCHW ones, on
/// `Autodiff<Cuda>` and `Cuda`, run cuDNN's batch normalization — and its ReLU — when the
/// library loads and [`super::CudnnOptions::batch_norm`] is set; otherwise burn-nn's batch
/// norm computed on burn's operations over [`ChannelRows`], and ReLU, with one log line when
/// cuDNN was meant to run and could not.
///
/// # Shapes
/// `[batch, channels, height, width]` (in the layer's layout) → the same
pub fn batch_norm<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
    let x = match bn.precision {
        Some(p) => x.cast(p.dtype()),
        None => x,
    };
    let hooked = grad_ready::active().then(|| bn.through_grad_hooks(&x));
    let bn = hooked.as_ref().unwrap_or(bn);
    if bn.layout == Layout::Nhwc {
        return crate::nn::batch_norm_nhwc(bn, x, relu);
    }
    #[cfg(feature = "cuda")]
    let x = match crate::nn::cuda::ops::batch_norm::try_batch_norm(bn, x, relu) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let dtype = x.dtype();
    let y = nchw(bn, x.cast(bn.gamma.val().dtype()));
    let y = if relu { relu_op(y) } else { y };
    y.cast(dtype)
}

/// Activations with channels at axis 1 taken as rows, `[batch · channels, the other axes]`,
/// against one value per row (a channel's, repeated for each image): every pass of a batch
/// norm over them is then a reduction along rows or an operation with a per-row scalar, which
/// burn-flex runs vectorised, where `[1, channels, 1, 1]` broadcasts and transposed copies are
/// walked an element at a time.
#[derive(Clone, Copy)]
pub(crate) struct ChannelRows {
    batch: usize,
    channels: usize,
    /// Values per row: the product of the axes after the channels.
    rest: usize,
}

impl ChannelRows {
    /// `x` as rows, and their shape.
    pub fn of<B: Backend, const D: usize>(x: Tensor<B, D>) -> (Self, Tensor<B, 2>) {
        let dims = x.dims();
        let rows = Self { batch: dims[0], channels: dims[1], rest: dims[2..].iter().product() };
        (rows, x.reshape([rows.batch * rows.channels, rows.rest]))
    }

    /// Values per channel: what a batch statistic averages over.
    pub fn per_channel(self) -> usize {
        self.batch * self.rest
    }

    /// One value per channel (`[channels]`) as one per row (`[batch · channels, 1]`).
    pub fn per_row<B: Backend>(self, t: Tensor<B, 1>) -> Tensor<B, 2> {
        let (n, c) = (self.batch, self.channels);
        t.reshape([1, c]).repeat_dim(0, n).reshape([n * c, 1])
    }

    /// Per channel, the sum of its rows' values: `[channels]`.
    pub fn channel_sum<B: Backend>(self, rows: Tensor<B, 2>) -> Tensor<B, 1> {
        let (n, c) = (self.batch, self.channels);
        rows.sum_dim(1).reshape([n, c]).sum_dim(0).reshape([c])
    }
}

/// `bn(x)` for NCHW `x` on burn's operations, as burn-nn's BatchNorm computes it: batch
/// statistics on autodiff backends (the mean, then the biased variance of the centred values;
/// running statistics blended as burn-nn blends them), running statistics otherwise — over
/// [`ChannelRows`].
fn nchw<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    let (dims, device) = (x.dims(), x.device());
    let (at, rows) = ChannelRows::of(x);
    let (centered, inv_std) = if B::ad_enabled(&device) {
        let count = at.per_channel() as f64;
        let mean = at.channel_sum(rows.clone()).div_scalar(count);
        let centered = rows - at.per_row(mean.clone());
        let var = at.channel_sum(centered.clone().square()).div_scalar(count);
        bn.update_running(mean, var.clone());
        (centered, var.add_scalar(bn.epsilon).sqrt().recip())
    } else {
        let mean = bn.running_mean.value().to_device(&device);
        let var = bn.running_var.value().to_device(&device);
        (rows - at.per_row(mean), var.add_scalar(bn.epsilon).sqrt().recip())
    };
    let y = centered * at.per_row(inv_std * bn.gamma.val()) + at.per_row(bn.beta.val());
    y.reshape(dims)
}

/// `relu(bn(x) + residual)`, the output in `bn(x)`'s type (`residual` is cast to it), the
/// addition in f32 where it is fused. Channels-last on burn-cuda: one pass of our batch-norm
/// kernels writes it, and the backward keeps only the output — no separate addition or ReLU
/// pass either way — unless [`super::CudnnOptions::fuse_residual`] is off. Elsewhere
/// [`batch_norm`], the addition, then [`crate::nn::relu`] (which keeps only its output).
///
/// # Shapes
/// `x`, `residual`: `[batch, channels, height, width]` in the layer's layout → the same
pub fn batch_norm_add_relu<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
    if bn.layout != Layout::Nhwc || !crate::nn::settings::options::get().fuse_residual {
        return add_relu(batch_norm(bn, x, false), residual);
    }
    let x = match bn.precision {
        Some(p) => x.cast(p.dtype()),
        None => x,
    };
    let residual = residual.cast(x.dtype());
    let hooked = grad_ready::active().then(|| bn.through_grad_hooks(&x));
    crate::nn::batch_norm_nhwc::batch_norm_add_relu_nhwc(hooked.as_ref().unwrap_or(bn), x, residual)
}

/// `relu(bn(conv(x)) + residual)`: [`Conv2d::forward`] then [`batch_norm_add_relu`] — or, in
/// NCHW, [`conv_batch_norm`] then the addition and [`crate::nn::relu`].
///
/// # Shapes
/// `x`: as [`Conv2d::forward`]; `residual`: its output's shape.
///
/// # Panics
/// When the two layers' layouts differ.
pub fn conv_batch_norm_add_relu<B: Backend>(
    conv: &Conv2d<B>,
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    residual: Tensor<B, 4>,
) -> Tensor<B, 4> {
    assert_eq!(
        conv.layout, bn.layout,
        "conv_batch_norm_add_relu: the convolution is {:?}, the batch norm {:?}",
        conv.layout, bn.layout
    );
    if conv.layout == Layout::Nhwc {
        return batch_norm_add_relu(bn, conv.forward(x), residual);
    }
    add_relu(conv_batch_norm(conv, bn, x, false), residual)
}

/// `relu(y + residual)` as separate operations, `residual` cast to `y`'s type; the ReLU keeps
/// only its output (the sum is kept by nothing else).
fn add_relu<B: Backend>(y: Tensor<B, 4>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
    let dtype = y.dtype();
    crate::nn::relu(y + residual.cast(dtype))
}

/// `relu?(bn(conv(x)))` — [`Conv2d::forward`] then [`batch_norm`] — as one cuDNN operation on
/// `Autodiff<Cuda>` when [`super::CudnnOptions::fuse_conv_bn`] is set and the convolution has
/// symmetric padding and no bias, in NCHW; the two separate operations otherwise. The
/// convolution's layout and precision rule both.
///
/// # Shapes
/// As [`Conv2d::forward`].
///
/// # Panics
/// When the two layers' layouts differ.
pub fn conv_batch_norm<B: Backend>(conv: &Conv2d<B>, bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
    assert_eq!(
        conv.layout, bn.layout,
        "conv_batch_norm: the convolution is {:?}, the batch norm {:?}",
        conv.layout, bn.layout
    );
    #[cfg(feature = "cuda")]
    let x = match (&conv.padding, &conv.bias) {
        (burn_nn::PaddingConfig2d::Explicit(top, left, bottom, right), None)
            if top == bottom
                && left == right
                && conv.layout == Layout::Nchw
                && crate::nn::cuda::ops::conv_batch_norm::applies::<B>() =>
        {
            let x = match conv.precision {
                Some(p) => x.cast(p.dtype()),
                None => x,
            };
            let options = burn::tensor::ops::ConvOptions::new(conv.stride, [*top, *left], conv.dilation, conv.groups);
            let weight = grad_ready::param_val(&conv.weight, &x).cast(x.dtype());
            let hooked = grad_ready::active().then(|| bn.through_grad_hooks(&x));
            match crate::nn::cuda::ops::conv_batch_norm::try_conv_bn(
                weight,
                &options,
                hooked.as_ref().unwrap_or(bn),
                x,
                relu,
            ) {
                Ok(y) => return y,
                Err(x) => x,
            }
        }
        _ => x,
    };
    batch_norm(bn, conv.forward(x), relu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::AutodiffModule;
    use burn::tensor::Tolerance;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::BatchNormConfig;

    type B = Autodiff<Flex>;

    /// Against burn-nn's BatchNorm (an independent implementation: `[1, c, 1, 1]` broadcasts),
    /// with and without the ReLU: the output, the gradients of the input, gamma and beta, both
    /// running statistics, and inference from them afterwards.
    #[test]
    fn matches_burn_batch_norm_values_gradients_and_running_stats() {
        let device = Default::default();
        let tol = Tolerance::<f32>::absolute(2e-5);
        for relu in [false, true] {
            let gamma = Tensor::<B, 1>::random([3], burn::tensor::Distribution::Uniform(0.5, 1.5), &device);
            let beta = Tensor::<B, 1>::random([3], burn::tensor::Distribution::Uniform(-0.5, 0.5), &device);
            let layer = || {
                let mut bn = BatchNormConfig::new(3).init::<B>(&device);
                bn.gamma = Param::from_tensor(gamma.clone());
                bn.beta = Param::from_tensor(beta.clone());
                bn
            };
            let (mine, theirs) = (BatchNorm::from(layer()), layer());
            let x = Tensor::<B, 4>::random([2, 3, 4, 5], burn::tensor::Distribution::Normal(0.5, 2.0), &device)
                .require_grad();
            let g = Tensor::<B, 4>::random([2, 3, 4, 5], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
            let y = if relu { mine.forward_relu(x.clone()) } else { mine.forward(x.clone()) };
            let y_ref = theirs.forward(x.clone());
            let y_ref = if relu { relu_op(y_ref) } else { y_ref };
            y.clone().into_data().assert_approx_eq::<f32>(&y_ref.clone().into_data(), tol);
            let (grads, grads_ref) = ((y * g.clone()).sum().backward(), (y_ref * g).sum().backward());
            let grad = |t: Tensor<B, 1>, gr| t.grad(gr).expect("a gradient").into_data();
            x.grad(&grads).unwrap().into_data().assert_approx_eq::<f32>(&x.grad(&grads_ref).unwrap().into_data(), tol);
            grad(mine.gamma.val(), &grads).assert_approx_eq::<f32>(&grad(theirs.gamma.val(), &grads_ref), tol);
            grad(mine.beta.val(), &grads).assert_approx_eq::<f32>(&grad(theirs.beta.val(), &grads_ref), tol);
            for (a, b) in [(&mine.running_mean, &theirs.running_mean), (&mine.running_var, &theirs.running_var)] {
                a.value_sync().into_data().assert_approx_eq::<f32>(&b.value_sync().into_data(), tol);
            }
            let moved = mine.running_mean.value_sync().abs().sum().into_scalar();
            assert!(moved > 0.0, "running mean was not updated");
            let (mine, theirs, xi) = (mine.valid(), theirs.valid(), x.inner());
            mine.forward(xi.clone()).into_data().assert_approx_eq::<f32>(&theirs.forward(xi).into_data(), tol);
        }
    }

    /// A fresh layer (parameters not yet initialised) gets its gradients on the first step:
    /// the fallback path must read its parameters, not clones that initialise on their own.
    #[test]
    fn a_fresh_layer_gets_gradients_on_its_first_step() {
        let device = Default::default();
        let bn = BatchNorm::from(BatchNormConfig::new(3).init::<B>(&device));
        let x = Tensor::<B, 4>::random([2, 3, 4, 5], burn::tensor::Distribution::Normal(0.5, 2.0), &device);
        let g = Tensor::<B, 4>::random([2, 3, 4, 5], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let grads = (bn.forward(x) * g).sum().backward();
        assert!(
            bn.gamma.val().grad(&grads).is_some() && bn.beta.val().grad(&grads).is_some(),
            "gamma and beta got no gradient"
        );
    }
}
