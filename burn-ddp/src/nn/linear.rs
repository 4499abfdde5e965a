//! `Linear`, matrix products and attention, fast and f32-accurate on every backend.
//!
//! On burn-cuda the products run on cuBLAS ([`crate::nn::cuda::ops::matmul`]) with f32 accumulation:
//! strict f32 for f32 tensors (PyTorch's default, `torch.backends.cuda.matmul.allow_tf32 =
//! False`), tensor cores for bf16/f16 — about six times burn-cuda's own matmul kernels on an
//! H200. Where cuBLAS is switched off or missing, burn-cuda's kernels run; their f32 products
//! are TF32 (cubek-matmul 0.2 turns f32 inputs into tf32 stage and register types whenever the
//! GPU supports them; there is no switch), leaving relative errors near 1e-4, so there each
//! f32 factor is split, `a = a_hi + a_lo` with `a_hi` rounded to bf16 (exact in TF32) and
//! `a_lo = a − a_hi` (exact in f32, 2⁻⁸ of `a`), and the four TF32 products are added: good to
//! about 2⁻¹⁸ relative. On every other backend they are burn's own operations.

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
#[cfg_attr(not(feature = "cuda"), allow(clippy::extra_unused_type_parameters))]
fn tf32_matmul<B: Backend>() -> bool {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::runtime::launch::cuda_backend::<B>().is_some();
    #[cfg(not(feature = "cuda"))]
    false
}

/// Whether `B`'s products run on cuBLAS.
#[cfg_attr(not(feature = "cuda"), allow(clippy::extra_unused_type_parameters))]
fn cublas<B: Backend>() -> bool {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::ops::matmul::enabled::<B>();
    #[cfg(not(feature = "cuda"))]
    false
}

/// `a · b`, batched over the leading axes (broadcast as burn's `matmul` does), in the inputs'
/// element type with f32 accumulation; f32-accurate for f32 tensors on every backend.
pub fn matmul<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    let (a, b) = match crate::nn::cuda::ops::matmul::try_matmul(a, b) {
        Ok(c) => return c,
        Err(inputs) => inputs,
    };
    if tf32_matmul::<B>() && a.dtype() == burn::tensor::DType::F32 { split_matmul(a, b) } else { a.matmul(b) }
}

/// The mean of `x` `[n, a, b]` over axis `dim` (1 or 2): `[n, b]` or `[n, a]` — a global average
/// pool of activations viewed as `[n, h·w, c]` (channels-last) or `[n, c, h·w]`. On cuBLAS it is
/// a product with a constant averaging vector, which needs no reduction kernel (burn-cuda's are
/// autotuned: several compiled and timed on a fresh machine's first step); elsewhere burn's
/// `mean_dim` (and for other than f32 tensors, whose averaging vector would round).
///
/// # Panics
/// When `dim` is neither 1 nor 2.
pub fn mean_over<B: Backend>(x: Tensor<B, 3>, dim: usize) -> Tensor<B, 2> {
    let [n, a, b] = x.dims();
    assert!(dim == 1 || dim == 2, "mean_over: axis {dim} of a rank-3 tensor (1 or 2)");
    if !cublas::<B>() || x.dtype() != burn::tensor::DType::F32 {
        return x.mean_dim(dim).squeeze_dim(dim);
    }
    let opts = (&x.device(), x.dtype());
    if dim == 1 {
        let avg = Tensor::<B, 3>::full([n, 1, a], 1.0 / a as f64, opts);
        matmul(avg, x).reshape([n, b])
    } else {
        let avg = Tensor::<B, 3>::full([n, b, 1], 1.0 / b as f64, opts);
        matmul(x, avg).reshape([n, a])
    }
}

/// `x · W + b` in `x`'s element type (the parameters are cast to it; they stay f32 in the
/// module). On burn-cuda with cuBLAS it is one autodiff operation each way, the casts and the
/// bias inside it (`nn::cuda::ops::linear`, `CudnnOptions::fused_linear`); elsewhere
/// [`matmul`] and the bias addition.
///
/// # Shapes
/// `[..., d_input]` → `[..., d_output]`
pub fn linear<B: Backend, const D: usize>(linear: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let (w, b) = parameters(linear, &x);
    affine(w, b, x)
}

/// [`linear`] on the parameters' values: `x · w + b` over `x`'s last axis (`w` `[d_input,
/// d_output]` and `b` `[d_output]`, f32 or of `x`'s type; a transposed view of `w` is read in
/// place on cuBLAS).
pub(crate) fn affine<B: Backend, const D: usize>(
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    let (w, b, x) = match crate::nn::cuda::ops::linear::try_linear(w, b, x) {
        Ok(y) => return y,
        Err(inputs) => inputs,
    };
    let (y, b, dims) = product(w, b, x);
    let y = match b {
        Some(b) => add_bias(y, b),
        None => y,
    };
    unflatten(y, dims)
}

/// The layer's weight and bias as `x`'s operation reads them (through DDP's gradient hooks
/// while they are active), still in their own type.
fn parameters<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: &Tensor<B, D>,
) -> (Tensor<B, 2>, Option<Tensor<B, 1>>) {
    (param_val(&linear.weight, x), linear.bias.as_ref().map(|b| param_val(b, x)))
}

/// `gelu(x · W + b)` (exact GELU, erf), as [`linear`] followed by burn's `gelu` computes it —
/// a transformer MLP's first layer. On burn-cuda with `CudnnOptions::fused_gelu` the bias and
/// the GELU are one pass each way ([`bias_gelu`]).
///
/// # Shapes
/// `[..., d_input]` → `[..., d_output]`
pub fn linear_gelu<B: Backend, const D: usize>(linear: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let (w, b) = parameters(linear, &x);
    #[cfg(feature = "cuda")]
    let (w, x) = match crate::nn::cuda::ops::linear::try_linear(w, None, x) {
        // The product as one operation, then the bias and GELU over the same axes.
        Ok(y) => {
            let dtype = y.dtype();
            return bias_gelu(y, b.map(|b| b.cast(dtype)));
        }
        Err((w, _, x)) => (w, x),
    };
    let (y, b, dims) = product(w, b, x);
    unflatten(bias_gelu(y, b), dims)
}

/// `x · W` over `x`'s rows (`[rows, d_output]`), the bias in `x`'s type, and `x`'s dims.
fn product<B: Backend, const D: usize>(
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    x: Tensor<B, D>,
) -> (Tensor<B, 2>, Option<Tensor<B, 1>>, [usize; D]) {
    let dtype = x.dtype();
    let (w, b) = (w.cast(dtype), b.map(|b| b.cast(dtype)));
    let dims = x.dims();
    let d_in = dims[D - 1];
    let rows = x.shape().num_elements() / d_in.max(1);
    (matmul(x.reshape([rows, d_in]), w), b, dims)
}

/// `y` `[rows, d_output]` back to `x`'s leading dims.
fn unflatten<B: Backend, const D: usize>(y: Tensor<B, 2>, mut dims: [usize; D]) -> Tensor<B, D> {
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}

/// `gelu(y + b)` over `y`'s last axis (`y` `[..., cols]`, `b` `[cols]`, of `y`'s type; none:
/// `gelu(y)`), with the exact GELU `x·Φ(x) = x/2 · (1 + erf(x/√2))` of `torch.nn.GELU()` and
/// burn's `gelu`.
///
/// On burn-cuda (f32, bf16 or f16) it is one kernel forward and one backward, computing in f32
/// and keeping `y` and `b` for the backward rather than their sum
/// ([`crate::nn::cuda::ops::gelu`], while `CudnnOptions::fused_gelu` is on); otherwise [`linear`]'s
/// bias addition and burn's `gelu`.
pub fn bias_gelu<B: Backend, const D: usize>(y: Tensor<B, D>, b: Option<Tensor<B, 1>>) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    let (y, b) = match crate::nn::cuda::ops::gelu::try_bias_gelu(y, b) {
        Ok(h) => return h,
        Err(inputs) => inputs,
    };
    let y = match b {
        Some(b) => {
            let dims = y.dims();
            let cols = dims[D - 1];
            let rows = y.shape().num_elements() / cols.max(1);
            unflatten(add_bias(y.reshape([rows, cols]), b), dims)
        }
        None => y,
    };
    burn::tensor::activation::gelu(y)
}

/// How many passes (forward or backward) burn-cuda's fused bias + GELU kernel has run in this
/// process (0 without CUDA): whether the fast path ran.
pub fn gelu_kernel_calls() -> usize {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::ops::gelu::CALLS.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "cuda"))]
    0
}

/// `y + b` over `y`'s rows; on cuBLAS's path the backward sums `dy`'s rows there too.
fn add_bias<B: Backend>(y: Tensor<B, 2>, b: Tensor<B, 1>) -> Tensor<B, 2> {
    #[cfg(feature = "cuda")]
    let (y, b) = match crate::nn::cuda::ops::matmul::try_bias_add(y, b) {
        Ok(sum) => return sum,
        Err(inputs) => inputs,
    };
    y + b.unsqueeze()
}

/// Scaled dot-product attention, `softmax(q·kᵀ/√d)·v` over `[batch, heads, tokens, head_dim]`:
/// both products through [`matmul`] (`kᵀ` read in place) where they run on cuBLAS or must be
/// split for f32 accuracy; burn's attention operation otherwise.
pub fn attention<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Tensor<B, 4> {
    let split = tf32_matmul::<B>() && q.dtype() == burn::tensor::DType::F32;
    if !cublas::<B>() && !split {
        let options = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
        return burn::tensor::module::attention(q, k, v, None, None, options);
    }
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    let scores = matmul(q, k.swap_dims(2, 3)).mul_scalar(scale);
    matmul(burn::tensor::activation::softmax(scores, 3), v)
}

/// Multi-head self-attention of one qkv projection's output, `[batch, tokens, 3, heads,
/// head_dim]` (q, k, v in that order: timm's and torchvision's layout) → `softmax(q·kᵀ/√d)·v` as
/// `[batch, tokens, heads, head_dim]` (reshape it to `[batch, tokens, heads·head_dim]` for the
/// out projection).
///
/// On burn-cuda with bf16/f16 activations it runs as cuDNN's fused flash-attention forward
/// and backward (no token × token matrix in memory; `CudnnOptions::fused_attention`); elsewhere as
/// [`attention`] on q, k and v sliced out of `qkv`.
pub fn self_attention<B: Backend>(qkv: Tensor<B, 5>) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    let qkv = {
        let dims = qkv.dims();
        let [n, t, _, h, d] = dims;
        match crate::nn::cuda::ops::attention::try_self_attention(qkv, dims, [n, t, h, d]) {
            Ok(out) => return out,
            Err(qkv) => qkv,
        }
    };
    sliced_self_attention(qkv)
}

/// [`self_attention`] on the projections' own shapes: the qkv projection's output `[batch,
/// tokens, 3·dim]` (q, k, v, each `heads` heads of `dim / heads`: timm's and torchvision's
/// layout) → `softmax(q·kᵀ/√d)·v` as `[batch, tokens, dim]`, the out projection's input. On
/// the fused path (see [`self_attention`]) no reshape is queued either way: a transformer
/// block's attention is then one operation between its two projections.
///
/// # Shapes
/// - `qkv`: `[batch, tokens, 3·dim]`
/// - output: `[batch, tokens, dim]`
///
/// # Panics
/// When the last dimension is not a multiple of `3 · heads`.
pub fn multi_head_self_attention<B: Backend>(qkv: Tensor<B, 3>, heads: usize) -> Tensor<B, 3> {
    let [n, t, width] = qkv.dims();
    assert!(
        heads > 0 && width % (3 * heads) == 0,
        "multi_head_self_attention: got a qkv projection of {width} outputs for {heads} heads; expected a multiple of 3 · heads = {}",
        3 * heads
    );
    let (dim, d) = (width / 3, width / (3 * heads));
    #[cfg(feature = "cuda")]
    let qkv = match crate::nn::cuda::ops::attention::try_self_attention(qkv, [n, t, 3, heads, d], [n, t, dim]) {
        Ok(out) => return out,
        Err(qkv) => qkv,
    };
    sliced_self_attention(qkv.reshape([n, t, 3, heads, d])).reshape([n, t, dim])
}

/// [`attention`] on q, k and v sliced out of `qkv` (`[n, t, 3, h, d]`), as `[n, t, h, d]`.
fn sliced_self_attention<B: Backend>(qkv: Tensor<B, 5>) -> Tensor<B, 4> {
    let [n, t, _, h, d] = qkv.dims();
    let qkv = qkv.permute([2, 0, 3, 1, 4]);
    let part = |i: usize| qkv.clone().slice([i..i + 1]).reshape([n, h, t, d]);
    attention(part(0), part(1), part(2)).swap_dims(1, 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn mean_over_averages_either_axis_as_f64_does() {
        let device = Default::default();
        let [n, a, b] = [2, 3, 4];
        let v: Vec<f32> = (0..n * a * b).map(|i| (i * i % 17) as f32 - 3.5).collect();
        let x = Tensor::<Flex, 1>::from_floats(v.as_slice(), &device).reshape([n, a, b]);
        let at = |i: usize, j: usize, k: usize| f64::from(v[(i * a + j) * b + k]);
        let over1: Vec<f64> =
            (0..n).flat_map(|i| (0..b).map(move |k| (0..a).map(|j| at(i, j, k)).sum::<f64>() / a as f64)).collect();
        let over2: Vec<f64> =
            (0..n).flat_map(|i| (0..a).map(move |j| (0..b).map(|k| at(i, j, k)).sum::<f64>() / b as f64)).collect();
        for (dim, want, cols) in [(1, over1, b), (2, over2, a)] {
            let got = mean_over(x.clone(), dim).into_data();
            assert_eq!(got.shape.to_vec(), vec![n, cols]);
            for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-6, "axis {dim}: {g} vs {w}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "expected a multiple of 3 · heads = 9")]
    fn a_qkv_width_that_does_not_split_into_the_heads_is_refused() {
        let qkv = Tensor::<Flex, 3>::zeros([1, 2, 12], &Default::default());
        let _ = multi_head_self_attention(qkv, 3);
    }

    #[test]
    fn self_attention_matches_f64_softmax_attention_in_the_qkv_layout() {
        let device = Default::default();
        let [n, t, h, d] = [2, 5, 3, 4];
        let qkv = Tensor::<Flex, 5>::random([n, t, 3, h, d], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let x: Vec<f64> = qkv.clone().into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        let flat = multi_head_self_attention(qkv.clone().reshape([n, t, 3 * h * d]), h).into_data();
        assert_eq!(flat.shape.to_vec(), vec![n, t, h * d]);
        let out = self_attention(qkv).into_data();
        assert_eq!(out.shape.to_vec(), vec![n, t, h, d]);
        let out = out.to_vec::<f32>().unwrap();
        assert_eq!(flat.to_vec::<f32>().unwrap(), out, "the projections' shapes hold the same values");
        let at = |b: usize, tok: usize, part: usize, head: usize, i: usize| {
            x[(((b * t + tok) * 3 + part) * h + head) * d + i]
        };
        for (b, head, qi) in (0..n).flat_map(|b| (0..h).flat_map(move |hh| (0..t).map(move |q| (b, hh, q)))) {
            let s: Vec<f64> = (0..t)
                .map(|k| (0..d).map(|i| at(b, qi, 0, head, i) * at(b, k, 1, head, i)).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
            for i in 0..d {
                let want: f64 = (0..t).map(|k| (s[k] - m).exp() / z * at(b, k, 2, head, i)).sum();
                let got = f64::from(out[((b * t + qi) * h + head) * d + i]);
                assert!((got - want).abs() < 1e-5, "({b},{head},{qi},{i}): {got} vs {want}");
            }
        }
    }

    /// The qkv gradient of `self_attention` (burn's autodiff on the CPU) against the textbook
    /// f64 formulas: `dv = pᵀ·g`, `ds = p ∘ (g·vᵀ − rowsum(g ∘ o))/√d`, `dq = ds·k`, `dk = dsᵀ·q`.
    #[test]
    fn self_attention_gradients_match_f64() {
        type Ad = burn_autodiff::Autodiff<Flex>;
        let device = Default::default();
        let [n, t, h, d] = [2, 5, 2, 4];
        let qkv = Tensor::<Ad, 5>::random([n, t, 3, h, d], burn::tensor::Distribution::Normal(0.0, 1.0), &device)
            .require_grad();
        let g = Tensor::<Ad, 4>::random([n, t, h, d], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let f64s = |v: TensorData| v.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect::<Vec<_>>();
        let (x, gv) = (f64s(qkv.to_data()), f64s(g.to_data()));
        let grads = (self_attention(qkv.clone()) * g.clone()).sum().backward();
        let got = f64s(qkv.grad(&grads).expect("qkv gradient").into_data());
        // The same through the projections' shapes: `[n, t, 3·h·d]` in, `[n, t, h·d]` out.
        let values = qkv.to_data().to_vec::<f32>().unwrap();
        let flat = Tensor::<Ad, 3>::from_data(TensorData::new(values, [n, t, 3 * h * d]), &device).require_grad();
        let grads = (multi_head_self_attention(flat.clone(), h) * g.reshape([n, t, h * d])).sum().backward();
        let got_flat = f64s(flat.grad(&grads).expect("qkv gradient").into_data());
        assert_eq!(got_flat.len(), got.len());
        let at = |b: usize, tok: usize, part: usize, head: usize| (((b * t + tok) * 3 + part) * h + head) * d;
        let gat = |b: usize, tok: usize, head: usize| ((b * t + tok) * h + head) * d;
        let dot = |a: usize, b: usize, xs: &[f64], ys: &[f64]| (0..d).map(|i| xs[a + i] * ys[b + i]).sum::<f64>();
        let mut want = vec![0.0; x.len()];
        let scale = 1.0 / (d as f64).sqrt();
        for (b, head) in (0..n).flat_map(|b| (0..h).map(move |hh| (b, hh))) {
            for i in 0..t {
                let s: Vec<f64> = (0..t).map(|j| dot(at(b, i, 0, head), at(b, j, 1, head), &x, &x) * scale).collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|v| (v - m).exp() / z).collect();
                let o: Vec<f64> = (0..d).map(|c| (0..t).map(|j| p[j] * x[at(b, j, 2, head) + c]).sum()).collect();
                let r: f64 = (0..d).map(|c| gv[gat(b, i, head) + c] * o[c]).sum();
                for j in 0..t {
                    let ds = p[j] * (dot(gat(b, i, head), at(b, j, 2, head), &gv, &x) - r) * scale;
                    for c in 0..d {
                        want[at(b, i, 0, head) + c] += ds * x[at(b, j, 1, head) + c];
                        want[at(b, j, 1, head) + c] += ds * x[at(b, i, 0, head) + c];
                        want[at(b, j, 2, head) + c] += p[j] * gv[gat(b, i, head) + c];
                    }
                }
            }
        }
        for (k, ((a, f), w)) in got.iter().zip(&got_flat).zip(&want).enumerate() {
            assert!((a - w).abs() < 1e-5 && (f - w).abs() < 1e-5, "element {k}: {a} and {f} vs {w}");
        }
    }

    #[test]
    fn halves_add_up_exactly_and_the_high_half_is_bf16() {
        let device = Default::default();
        let a = Tensor::<Flex, 2>::random([16, 33], burn::tensor::Distribution::Normal(0.0, 3.0), &device);
        let (hi, lo) = split(a.clone());
        let again = hi.clone().cast(FloatDType::BF16).cast(FloatDType::F32);
        assert_eq!(
            again.into_data().to_vec::<f32>().unwrap(),
            hi.clone().into_data().to_vec::<f32>().unwrap(),
            "hi is not bf16-representable"
        );
        let (a, hi, lo) = (
            a.into_data().to_vec::<f32>().unwrap(),
            hi.into_data().to_vec::<f32>().unwrap(),
            lo.into_data().to_vec::<f32>().unwrap(),
        );
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
    fn vals<const D: usize>(t: Tensor<Flex, D>) -> Vec<f64> {
        t.into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
    }

    #[test]
    fn linear_on_a_3d_input_matches_f64() {
        let device = Default::default();
        let layer = burn_nn::LinearConfig::new(6, 4).init::<Flex>(&device);
        let x = Tensor::<Flex, 3>::random([2, 3, 6], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let y = vals(linear(&layer, x.clone()));
        let (xv, w, b) = (vals(x), vals(layer.weight.val()), vals(layer.bias.as_ref().unwrap().val()));
        for r in 0..6 {
            for o in 0..4 {
                let exact = b[o] + (0..6).map(|i| xv[r * 6 + i] * w[i * 4 + o]).sum::<f64>();
                assert!((y[r * 4 + o] - exact).abs() < 1e-5, "({r},{o}): {} vs {exact}", y[r * 4 + o]);
            }
        }
    }

    #[test]
    fn attention_matches_f64_softmax_of_scaled_scores() {
        let device = Default::default();
        let (n, h, t, d) = (2, 3, 5, 4);
        let r = || Tensor::<Flex, 4>::random([n, h, t, d], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v) = (r(), r(), r());
        let out = vals(attention(q.clone(), k.clone(), v.clone()));
        let (q, k, v) = (vals(q), vals(k), vals(v));
        for bh in 0..n * h {
            let at = |m: &[f64], i: usize, j: usize| m[(bh * t + i) * d + j];
            for i in 0..t {
                let s: Vec<f64> = (0..t)
                    .map(|j| (0..d).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    let exact: f64 = (0..t).map(|j| e[j] / z * at(&v, j, c)).sum();
                    let got = out[(bh * t + i) * d + c];
                    assert!((got - exact).abs() < 1e-5, "[{bh}, {i}, {c}]: {got} vs {exact}");
                }
            }
        }
    }

    /// The f64 reference itself, against values of the GELU and, for the derivative, a central
    /// difference of the f64 GELU (independent of the closed form it checks).
    #[test]
    fn the_gelu_reference_has_the_known_values_and_its_derivative() {
        use crate::nn::reference::{gelu_f64, gelu_grad_f64};
        // x·Φ(x) with Φ(1) = 0.841344746068543, Φ(2) = 0.977249868051821.
        for (x, want) in [(1.0, 0.841344746068543), (-1.0, -0.158655253931457), (2.0, 1.954499736103642), (0.0, 0.0)] {
            assert!((gelu_f64(x) - want).abs() < 1e-14, "gelu({x}) = {} vs {want}", gelu_f64(x));
        }
        for x in [-4.0, -1.3, -0.2, 0.0, 0.7, 2.5] {
            let h = 1e-5;
            let fd = (gelu_f64(x + h) - gelu_f64(x - h)) / (2.0 * h);
            assert!((gelu_grad_f64(x) - fd).abs() < 1e-9, "gelu'({x}) = {} vs {fd}", gelu_grad_f64(x));
        }
    }

    /// `linear_gelu` and `bias_gelu` on the CPU (burn's addition and `gelu` under autodiff):
    /// values, the input's, the weight's and the bias's gradients against f64.
    #[test]
    fn linear_gelu_values_and_gradients_match_f64() {
        use crate::nn::reference::{gelu_f64, gelu_grad_f64};
        type A = burn_autodiff::Autodiff<Flex>;
        let device = Default::default();
        let (rows, d_in, d_out) = (6, 5, 4);
        let layer = burn_nn::LinearConfig::new(d_in, d_out).init::<A>(&device);
        let x =
            Tensor::<A, 3>::random([2, 3, d_in], burn::tensor::Distribution::Normal(0.0, 1.5), &device).require_grad();
        let dh: Vec<f32> = (0..rows * d_out).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.25).collect();
        let h = linear_gelu(&layer, x.clone());
        let grads =
            (h.clone() * Tensor::<A, 1>::from_floats(dh.as_slice(), &device).reshape([2, 3, d_out])).sum().backward();
        let (xv, w, b) = (
            vals(x.clone().inner()),
            vals(layer.weight.val().inner()),
            vals(layer.bias.as_ref().unwrap().val().inner()),
        );
        let pre: Vec<f64> = (0..rows * d_out)
            .map(|k| {
                b[k % d_out] + (0..d_in).map(|i| xv[(k / d_out) * d_in + i] * w[i * d_out + k % d_out]).sum::<f64>()
            })
            .collect();
        let dy: Vec<f64> = pre.iter().zip(&dh).map(|(&p, &g)| f64::from(g) * gelu_grad_f64(p)).collect();
        let want_dx: Vec<f64> = (0..rows * d_in)
            .map(|k| (0..d_out).map(|o| dy[(k / d_in) * d_out + o] * w[(k % d_in) * d_out + o]).sum())
            .collect();
        let want_dw: Vec<f64> = (0..d_in * d_out)
            .map(|k| (0..rows).map(|r| xv[r * d_in + k / d_out] * dy[r * d_out + k % d_out]).sum())
            .collect();
        let want_db: Vec<f64> = (0..d_out).map(|o| (0..rows).map(|r| dy[r * d_out + o]).sum()).collect();
        let want_h: Vec<f64> = pre.iter().map(|&p| gelu_f64(p)).collect();
        let close = |got: Vec<f64>, want: &[f64], what: &str| {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() < 1e-5 * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
            }
        };
        close(vals(h.inner()), &want_h, "h");
        close(vals(x.grad(&grads).unwrap()), &want_dx, "dx");
        close(vals(layer.weight.val().grad(&grads).unwrap()), &want_dw, "dW");
        close(vals(layer.bias.as_ref().unwrap().val().grad(&grads).unwrap()), &want_db, "db");
    }
}
