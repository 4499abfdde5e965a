//! `Linear` at full f32 precision on every backend.
//!
//! burn-cuda's f32 matrix products run on tensor cores in TF32 (cubek-matmul 0.2 turns f32
//! inputs into tf32 stage and register types whenever the GPU supports them; there is no
//! switch), leaving relative errors near 1e-4 — where PyTorch's default for matrix products
//! (`torch.backends.cuda.matmul.allow_tf32 = False`) is full f32. On burn-cuda [`linear_f32`]
//! splits both factors, `a = a_hi + a_lo` with `a_hi` rounded to bf16 (exact in TF32) and
//! `a_lo = a − a_hi` (exact in f32, 2⁻⁸ of `a`), and adds the four TF32 products: each factor
//! TF32 rounds is at most 2⁻⁸ of its whole, so the result is good to about 2⁻¹⁸ relative. The
//! four products of a classifier head are a rounding error of a ResNet's step. On every other
//! backend, and for other element types, it is burn-nn's `Linear::forward`.

use crate::grad_ready::param_val;
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_nn::Linear;

/// `a = (hi, lo)` with `hi` bf16-representable and `hi + lo = a` exactly.
fn split<B: Backend, const D: usize>(a: Tensor<B, D>) -> (Tensor<B, D>, Tensor<B, D>) {
    let hi = a.clone().cast(FloatDType::BF16).cast(FloatDType::F32);
    let lo = a - hi.clone();
    (hi, lo)
}

/// Whether `B`'s f32 matrix products are TF32 (burn-cuda's, with or without autodiff).
fn tf32_matmul<B: Backend>() -> bool {
    #[cfg(feature = "cuda")]
    return super::cudnn_burn::cuda_backend::<B>().is_some();
    #[cfg(not(feature = "cuda"))]
    false
}

/// `x · W + b` with f32 accuracy (see the module documentation).
///
/// # Shapes
/// `[n, d_input]` → `[n, d_output]`
pub fn linear_f32<B: Backend>(linear: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    if !tf32_matmul::<B>() || x.dtype() != burn::tensor::DType::F32 {
        return linear.forward(x);
    }
    let (w, b) = (param_val(&linear.weight, &x), linear.bias.as_ref().map(|b| param_val(b, &x)));
    let (x_hi, x_lo) = split(x);
    let (w_hi, w_lo) = split(w);
    let y = x_hi.clone().matmul(w_hi.clone()) + (x_hi.matmul(w_lo.clone()) + x_lo.clone().matmul(w_hi)) + x_lo.matmul(w_lo);
    match b {
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}
