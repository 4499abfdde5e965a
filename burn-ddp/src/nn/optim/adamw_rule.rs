//! The AdamW rule that `FusedAdamW` (adamw.rs) applies — its settings, one parameter's inputs,
//! and the rule on burn's operations — shared with its CUDA path (`cuda::ops::adamw`), which
//! imports this file and not the optimizer.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

/// The update rule's settings: burn's `AdamWConfig` defaults (PyTorch's, except ε = 1e-5 and
/// weight decay 1e-4), without AMSGrad or cautious weight decay.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FusedAdamWConfig {
    /// Decay of the first moment, β₁.
    pub beta_1: f32,
    /// Decay of the second moment, β₂.
    pub beta_2: f32,
    /// Added to the root of the second moment, ε.
    pub epsilon: f32,
    /// Decoupled weight decay λ: each step multiplies the parameter by `1 − lr·λ`.
    pub weight_decay: f32,
}

impl Default for FusedAdamWConfig {
    fn default() -> Self {
        Self { beta_1: 0.9, beta_2: 0.999, epsilon: 1e-5, weight_decay: 1e-4 }
    }
}

/// A parameter's moments and the steps they hold (burn's `AdaptiveMomentumState`).
#[derive(Clone)]
pub struct Moments<B: Backend> {
    pub(crate) m: FloatTensor<B>,
    pub(crate) v: FloatTensor<B>,
    pub(crate) time: usize,
}

/// One parameter's inputs to the step; its state is the moments (`None` on the parameter's
/// first step: they start at zero).
pub(crate) type Entry<B> = crate::nn::optim::params::Entry<B, Moments<B>>;
/// One parameter's step result: `(id, new value, new moments)`.
pub(crate) type Done<B> = crate::nn::optim::params::Done<B, Moments<B>>;

/// The bias corrections of step `time` (counted from 1): `1 − β₁ᵗ` and `1 − β₂ᵗ`, in f32 as
/// burn computes them.
pub(crate) fn corrections(c: &FusedAdamWConfig, time: usize) -> (f32, f32) {
    let t = i32::try_from(time).unwrap_or(i32::MAX);
    (1.0 - c.beta_1.powi(t), 1.0 - c.beta_2.powi(t))
}

/// burn's AdamW on burn's operations: `m = β₁m + (1 − β₁)g`, `v = β₂v + (1 − β₂)g²` (from zero
/// on the first step), `p = p·(1 − lr·λ) − lr · (m / c₁) / (√(v / c₂) + ε)`.
pub(crate) fn reference_update<B: Backend>(e: Entry<B>, lr: f64, c: &FusedAdamWConfig) -> Done<B> {
    let flat = |t: FloatTensor<B>| -> Tensor<B, 1> {
        let n = t.shape().num_elements();
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(t, [n].into())))
    };
    let shape = e.param.shape();
    let (p, g) = (flat(e.param), flat(e.grad));
    let (m, v, time) = match e.state {
        Some(s) => (
            flat(s.m).mul_scalar(c.beta_1) + g.clone().mul_scalar(1.0 - c.beta_1),
            flat(s.v).mul_scalar(c.beta_2) + g.square().mul_scalar(1.0 - c.beta_2),
            s.time + 1,
        ),
        None => (g.clone().mul_scalar(1.0 - c.beta_1), g.square().mul_scalar(1.0 - c.beta_2), 1),
    };
    let (c1, c2) = corrections(c, time);
    let delta = m.clone().div_scalar(c1).div(v.clone().div_scalar(c2).sqrt().add_scalar(c.epsilon));
    let decay = lr * f64::from(c.weight_decay);
    let decayed = if decay == 0.0 { p } else { p.mul_scalar(1.0 - decay) };
    let back = |t: Tensor<B, 1>| B::float_reshape(t.into_primitive().tensor(), shape.clone());
    (e.id, back(decayed - delta.mul_scalar(lr)), Some(Moments { m: back(m), v: back(v), time }))
}
