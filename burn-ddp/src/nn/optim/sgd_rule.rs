//! The SGD rule that `FusedSgd` (sgd.rs) applies — its settings, one parameter's inputs, and
//! the rule on burn's operations — shared with its CUDA path (`cuda::ops::sgd`), which imports this
//! file and not the optimizer.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

/// The update rule's settings (PyTorch's names and defaults, except `momentum`, 0 = none).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FusedSgdConfig {
    /// Momentum factor μ (0: plain SGD, no state).
    pub momentum: f64,
    /// Dampening of the gradient in the momentum buffer.
    pub dampening: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`, as in PyTorch).
    pub nesterov: bool,
    /// L2 penalty added to the gradient (`g + λ·p`).
    pub weight_decay: f64,
}

impl Default for FusedSgdConfig {
    fn default() -> Self {
        Self { momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 }
    }
}

/// One parameter's inputs to the step; its state is the momentum buffer (`None` on the first
/// step, when the buffer starts as the gradient, or without momentum).
pub(crate) type Entry<B> = crate::nn::optim::params::Entry<B, FloatTensor<B>>;
/// One parameter's step result: `(id, new value, new momentum buffer)`.
pub(crate) type Done<B> = crate::nn::optim::params::Done<B, FloatTensor<B>>;

/// PyTorch's rule on burn's operations: `g = ∇ + λp`; `v = g` on the first step, else
/// `μv + (1 − τ)g`; `g = g + μv` (Nesterov) or `v`; `p = p − lr·g`.
pub(crate) fn reference_update<B: Backend>(e: Entry<B>, lr: f64, c: &FusedSgdConfig) -> Done<B> {
    let flat = |t: FloatTensor<B>| -> Tensor<B, 1> {
        let n = t.shape().num_elements();
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(t, [n].into())))
    };
    let shape = e.param.shape();
    let p = flat(e.param);
    let mut g = flat(e.grad);
    if c.weight_decay != 0.0 {
        g = g + p.clone().mul_scalar(c.weight_decay);
    }
    let mut velocity = None;
    if c.momentum != 0.0 {
        let v = match e.state {
            Some(v) => flat(v).mul_scalar(c.momentum) + g.clone().mul_scalar(1.0 - c.dampening),
            None => g.clone(),
        };
        g = if c.nesterov { g + v.clone().mul_scalar(c.momentum) } else { v.clone() };
        velocity = Some(v);
    }
    let back = |t: Tensor<B, 1>| B::float_reshape(t.into_primitive().tensor(), shape.clone());
    (e.id, back(p - g.mul_scalar(lr)), velocity.map(back))
}
