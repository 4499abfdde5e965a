//! BatchNorm (optionally followed by ReLU) that takes the fastest path the backend has: one
//! cuDNN call on burn-cuda (`feature = "cuda"`), burn-nn's [`BatchNorm`] everywhere else.

use burn::prelude::*;
use burn::tensor::activation::relu as relu_op;
use burn_nn::BatchNorm;

/// `relu(bn(x))` when `relu`, else `bn(x)`: training statistics on autodiff backends (running
/// statistics updated as burn's BatchNorm does), running statistics otherwise.
///
/// On `Autodiff<Cuda>` and `Cuda` (f32) it runs cuDNN's batch normalization — and its ReLU —
/// when the library loads and [`super::CudnnOptions::batch_norm`] is set; otherwise burn's
/// BatchNorm and ReLU, with one log line when cuDNN was meant to run and could not.
///
/// # Shapes
/// `[batch, channels, height, width]` → the same
pub fn batch_norm<B: Backend>(bn: &BatchNorm<B>, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    let x = match super::cudnn_bn_burn::try_batch_norm(bn, x, relu) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let y = bn.forward(x);
    if relu { relu_op(y) } else { y }
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
        let y = batch_norm(&bn, x.clone(), true);
        let reference = BatchNormConfig::new(3).init::<B>(&device);
        let expected = relu_op(reference.forward(x));
        y.into_data().assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
        bn.running_mean.value_sync().into_data().assert_approx_eq::<f32>(&reference.running_mean.value_sync().into_data(), Tolerance::default());
        let moved = bn.running_mean.value_sync().abs().sum().into_scalar();
        assert!(moved > 0.0, "running mean was not updated");
    }
}
