//! LayerNorm in the activations' type with f32 statistics: on burn-cuda with bf16/f16
//! activations our kernel's pass forward (cuDNN's without `CudnnOptions::layer_norm_kernel`)
//! and cuDNN's one backward ([`crate::nn::cuda::ops::layer_norm`]), elsewhere
//! burn-nn's `LayerNorm` on an f32 copy (PyTorch's autocast runs `layer_norm` in f32 too).

use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_nn::LayerNorm;

/// `norm(x)` over the last axis, the result in `x`'s type. `eps` must be the module's ε
/// (burn-nn keeps the field private; the cuDNN path needs it, burn's uses the module's own).
pub fn layer_norm<B: Backend, const D: usize>(norm: &LayerNorm<B>, x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    let x = match crate::nn::cuda::ops::layer_norm::try_layer_norm(norm, x, eps) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let _ = eps;
    let dtype = x.dtype();
    norm.forward(x.cast(FloatDType::F32)).cast(dtype)
}

/// How many forward passes burn-ddp's own layer-norm kernel has run in this process (0 without
/// CUDA, or with `CudnnOptions::layer_norm_kernel` off): whether it ran instead of cuDNN's.
pub fn kernel_forward_calls() -> usize {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::ops::layer_norm::KERNEL_CALLS.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "cuda"))]
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;
    use burn_nn::LayerNormConfig;

    #[test]
    fn matches_f64_layer_norm_with_affine_parameters() {
        let device = Default::default();
        let mut norm = LayerNormConfig::new(6).with_epsilon(1e-6).init::<Flex>(&device);
        norm.gamma = norm.gamma.map(|_| Tensor::from_floats([0.5, -1.0, 2.0, 1.5, 0.25, 3.0], &device));
        let beta = [0.1, 0.2, -0.3, 0.0, 1.0, -2.0];
        norm.beta = norm.beta.map(|b| b.map(|_| Tensor::from_floats(beta, &device)));
        let x = Tensor::<Flex, 3>::random([2, 3, 6], burn::tensor::Distribution::Normal(1.0, 2.0), &device);
        let xv: Vec<f64> = x.clone().into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        let y = layer_norm(&norm, x, 1e-6).into_data().to_vec::<f32>().unwrap();
        let gamma = [0.5, -1.0, 2.0, 1.5, 0.25, 3.0];
        for (r, row) in xv.chunks(6).enumerate() {
            let mean = row.iter().sum::<f64>() / 6.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0;
            for (i, v) in row.iter().enumerate() {
                let want = (v - mean) / (var + 1e-6).sqrt() * gamma[i] + beta[i];
                assert!(
                    (f64::from(y[r * 6 + i]) - want).abs() < 1e-5,
                    "row {r} feature {i}: {} vs {want}",
                    y[r * 6 + i]
                );
            }
        }
    }
}
