//! `Linear`, matrix products and attention at full f32 precision on every backend.
//!
//! burn-cuda's f32 matrix products run on tensor cores in TF32 (cubek-matmul 0.2 turns f32
//! inputs into tf32 stage and register types whenever the GPU supports them; there is no
//! switch), leaving relative errors near 1e-4 — where PyTorch's default for matrix products
//! (`torch.backends.cuda.matmul.allow_tf32 = False`) is full f32. On burn-cuda [`linear_f32`]
//! splits both factors, `a = a_hi + a_lo` with `a_hi` rounded to bf16 (exact in TF32) and
//! `a_lo = a − a_hi` (exact in f32, 2⁻⁸ of `a`), and adds the four TF32 products: each factor
//! TF32 rounds is at most 2⁻⁸ of its whole, so the result is good to about 2⁻¹⁸ relative. The
//! four products of a classifier head are a rounding error of a ResNet's step; for a ViT's
//! f32 training they cost about what PyTorch's strict-f32 products cost (f32 FMA runs at a
//! quarter of TF32's rate). [`attention_f32`] does the same for attention's two products. On
//! every other backend, and for other element types, they are burn's own operations.

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

/// `x · w` as the four products of the factors' halves.
fn split_matmul<B: Backend, const D: usize>(x: Tensor<B, D>, w: Tensor<B, D>) -> Tensor<B, D> {
    let (x_hi, x_lo) = split(x);
    let (w_hi, w_lo) = split(w);
    x_hi.clone().matmul(w_hi.clone()) + (x_hi.matmul(w_lo.clone()) + x_lo.clone().matmul(w_hi)) + x_lo.matmul(w_lo)
}

/// Whether `B`'s f32 matrix products are TF32 (burn-cuda's, with or without autodiff).
fn tf32_matmul<B: Backend>() -> bool {
    #[cfg(feature = "cuda")]
    return super::cudnn_burn::cuda_backend::<B>().is_some();
    #[cfg(not(feature = "cuda"))]
    false
}

/// Whether products of `x`'s type need the split on `B` to be f32-accurate.
fn needs_split<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    tf32_matmul::<B>() && x.dtype() == burn::tensor::DType::F32
}

/// `a · b` (batched over the leading axes) with f32 accuracy for f32 tensors on every backend.
pub fn matmul_f32<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    if needs_split(&a) { split_matmul(a, b) } else { a.matmul(b) }
}

/// `x · W + b` with f32 accuracy (see the module documentation).
///
/// # Shapes
/// `[..., d_input]` → `[..., d_output]`
pub fn linear_f32<B: Backend, const D: usize>(linear: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let (w, b) = (param_val(&linear.weight, &x), linear.bias.as_ref().map(|b| param_val(b, &x)));
    if !needs_split(&x) {
        return burn::tensor::module::linear(x, w, b);
    }
    let dims = x.dims();
    let d_in = dims[D - 1];
    let rows = x.shape().num_elements() / d_in;
    let y = split_matmul(x.reshape([rows, d_in]), w);
    let y = match b {
        Some(b) => y + b.unsqueeze(),
        None => y,
    };
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}

/// Scaled dot-product attention, `softmax(q·kᵀ/√d)·v` over `[batch, heads, tokens, head_dim]`,
/// with f32-accurate products for f32 tensors on burn-cuda; burn's attention operation
/// otherwise (and for bf16/f16).
pub fn attention_f32<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Tensor<B, 4> {
    if !needs_split(&q) {
        let options = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
        return burn::tensor::module::attention(q, k, v, None, None, options);
    }
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    let scores = split_matmul(q, k.swap_dims(2, 3)).mul_scalar(scale);
    split_matmul(burn::tensor::activation::softmax(scores, 3), v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn halves_add_up_exactly_and_the_high_half_is_bf16() {
        let device = Default::default();
        let a = Tensor::<Flex, 2>::random([16, 33], burn::tensor::Distribution::Normal(0.0, 3.0), &device);
        let (hi, lo) = split(a.clone());
        let again = hi.clone().cast(FloatDType::BF16).cast(FloatDType::F32);
        assert_eq!(again.into_data().to_vec::<f32>().unwrap(), hi.clone().into_data().to_vec::<f32>().unwrap(), "hi is not bf16-representable");
        let (a, hi, lo) = (a.into_data().to_vec::<f32>().unwrap(), hi.into_data().to_vec::<f32>().unwrap(), lo.into_data().to_vec::<f32>().unwrap());
        for ((a, h), l) in a.iter().zip(&hi).zip(&lo) {
            assert_eq!(h + l, *a);
            assert!(l.abs() <= a.abs() / 128.0, "lo {l} is not small against {a}");
        }
    }

    #[test]
    fn the_split_product_matches_f64() {
        let device = Default::default();
        let x = Tensor::<Flex, 2>::random([5, 300], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<Flex, 2>::random([300, 7], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let y = split_matmul(x.clone(), w.clone()).into_data().to_vec::<f32>().unwrap();
        let (xv, wv) = (x.into_data().to_vec::<f32>().unwrap(), w.into_data().to_vec::<f32>().unwrap());
        for i in 0..5 {
            for j in 0..7 {
                let exact: f64 = (0..300).map(|k| f64::from(xv[i * 300 + k]) * f64::from(wv[k * 7 + j])).sum();
                assert!((f64::from(y[i * 7 + j]) - exact).abs() < 1e-4, "({i},{j}): {} vs {exact}", y[i * 7 + j]);
            }
        }
    }
}
