//! BatchNorm (optionally followed by ReLU) that takes the fastest path the backend has: one
//! cuDNN call on burn-cuda (`feature = "cuda"`), burn-nn's [`BatchNorm`] everywhere else.

use burn::prelude::*;
use burn::tensor::activation::relu as relu_op;
use burn_nn::BatchNorm;
use burn_nn::conv::Conv2d;
use super::Layout;

/// `relu(bn(x))` when `relu`, else `bn(x)`: training statistics on autodiff backends (running
/// statistics updated as burn's BatchNorm does), running statistics otherwise. The output has
/// the input's element type; statistics and parameters stay in theirs (f32), and so does the
/// arithmetic (PyTorch's rule for half inputs).
///
/// Channels-last activations go to [`super::batch_norm_nhwc`] (burn's operations on every
/// backend: cuDNN's batch norm is slow on NHWC, see there). NCHW ones, on `Autodiff<Cuda>` and
/// `Cuda`, run cuDNN's batch normalization — and its ReLU — when the library loads and
/// [`super::CudnnOptions::batch_norm`] is set; otherwise burn's BatchNorm and ReLU, with one log
/// line when cuDNN was meant to run and could not.
///
/// # Shapes
/// `[batch, channels, height, width]` (in `layout`'s order) → the same
pub fn batch_norm<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool, layout: Layout) -> Tensor<B, 4> {
    if layout == Layout::Nhwc {
        return super::batch_norm_nhwc(bn, x, relu);
    }
    #[cfg(feature = "cuda")]
    let x = match super::cudnn_bn_burn::try_batch_norm(bn, x, relu) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let dtype = x.dtype();
    let y = bn.forward(x.cast(bn.gamma.val().dtype()));
    let y = if relu { relu_op(y) } else { y };
    y.cast(dtype)
}

/// `relu?(bn(conv(x)))` — [`super::forward_conv`] then [`batch_norm`] — as one cuDNN
/// operation on `Autodiff<Cuda>` when [`super::CudnnOptions::fuse_conv_bn`] is set and the
/// convolution has symmetric padding and no bias, in NCHW; the two separate operations
/// otherwise.
///
/// # Shapes
/// As [`Conv2d::forward`], in `layout`'s order.
pub fn conv_batch_norm<B: Backend>(conv: &Conv2d<B>, bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool, layout: Layout) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    let x = match (&conv.padding, &conv.bias) {
        (burn_nn::PaddingConfig2d::Explicit(top, left, bottom, right), None) if top == bottom && left == right && layout == Layout::Nchw => {
            let options = burn::tensor::ops::ConvOptions::new(conv.stride, [*top, *left], conv.dilation, conv.groups);
            let weight = conv.weight.val().cast(x.dtype());
            match super::cudnn_conv_bn::try_conv_bn(weight, &options, bn, x, relu) {
                Ok(y) => return y,
                Err(x) => x,
            }
        }
        _ => x,
    };
    batch_norm(bn, super::forward_conv(conv, x, layout), relu, layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Tolerance;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::BatchNormConfig;

    type B = Autodiff<Flex>;

    #[test]
    fn matches_burn_batch_norm_then_relu_and_updates_running_stats() {
        let device = Default::default();
        let bn = BatchNormConfig::new(3).init::<B>(&device);
        let x = Tensor::<B, 4>::random([2, 3, 4, 5], burn::tensor::Distribution::Normal(0.5, 2.0), &device);
        let y = batch_norm(&bn, x.clone(), true, Layout::Nchw);
        let reference = BatchNormConfig::new(3).init::<B>(&device);
        let expected = relu_op(reference.forward(x));
        y.into_data().assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
        bn.running_mean.value_sync().into_data().assert_approx_eq::<f32>(&reference.running_mean.value_sync().into_data(), Tolerance::default());
        let moved = bn.running_mean.value_sync().abs().sum().into_scalar();
        assert!(moved > 0.0, "running mean was not updated");
    }
}
