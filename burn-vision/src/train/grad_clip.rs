//! Gradient clipping by the global norm (PyTorch's `clip_grad_norm_`, timm's `--clip-grad`):
//! every gradient is scaled by `min(1, max_norm / (‖g‖ + 1e-6))`, `‖g‖` the L2 norm of all
//! gradients as one vector. Burn's optimizers clip each tensor on its own; this clips them
//! together. Called after DDP's all-reduce (and after f16 unscaling), so every rank clips the
//! same averaged gradients alike. The norm stays on the device: no host round trip.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_optim::GradientsParams;

/// Sums `Σ g²` over every parameter's gradient.
struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let sq = g.cast(burn::tensor::FloatDType::F32).powi_scalar(2).sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + sq,
                None => sq,
            });
        }
    }
}

/// Multiplies every gradient by `factor` (a one-element device tensor).
struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: Tensor<B::InnerBackend, 1>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let factor = self.factor.clone().cast(g.dtype()).reshape([1; D]);
            self.grads.register::<B::InnerBackend, D>(param.id, g * factor);
        }
    }
}

/// `grads` scaled so that their global L2 norm is at most `max_norm`; returns them with the
/// norm before clipping (a device scalar, read only when logged).
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    mut grads: GradientsParams,
    max_norm: f64,
) -> (GradientsParams, Option<Tensor<B::InnerBackend, 1>>) {
    let mut sum = SquaredNorm::<B> { grads: &grads, total: None };
    model.visit(&mut sum);
    let Some(total) = sum.total else { return (grads, None) };
    let norm = total.sqrt();
    let factor = norm.clone().add_scalar(1e-6).recip().mul_scalar(max_norm).clamp_max(1.0);
    model.visit(&mut Scale::<B> { grads: &mut grads, factor });
    (grads, Some(norm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::{Linear, LinearConfig};

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Two<B: Backend> {
        a: Linear<B>,
        b: Linear<B>,
    }

    fn flat(model: &Two<B>, grads: &GradientsParams) -> Vec<f64> {
        let mut out = Vec::new();
        for layer in [&model.a, &model.b] {
            let w = grads.get::<Flex, 2>(layer.weight.id).unwrap().into_data().to_vec::<f32>().unwrap();
            let b = grads.get::<Flex, 1>(layer.bias.as_ref().unwrap().id).unwrap().into_data().to_vec::<f32>().unwrap();
            out.extend(w.into_iter().chain(b).map(f64::from));
        }
        out
    }

    #[test]
    fn equals_clipping_the_concatenated_gradient_vector() {
        let device = Default::default();
        let model = Two::<B> { a: LinearConfig::new(5, 4).init(&device), b: LinearConfig::new(4, 3).init(&device) };
        let x = Tensor::<B, 2>::random([6, 5], burn::tensor::Distribution::Normal(0.0, 3.0), &device);
        let grads = || {
            GradientsParams::from_grads(
                model.b.forward(model.a.forward(x.clone())).powi_scalar(2).sum().backward(),
                &model,
            )
        };
        let before = flat(&model, &grads());
        let norm: f64 = before.iter().map(|g| g * g).sum::<f64>().sqrt();
        for max_norm in [norm / 3.0, norm * 2.0] {
            let (clipped, measured) = clip_global_norm(&model, grads(), max_norm);
            let measured: f64 = measured.unwrap().into_scalar().elem();
            assert!((measured - norm).abs() < 1e-4 * norm, "norm {measured} vs {norm}");
            let factor = (max_norm / (norm + 1e-6)).min(1.0);
            for (got, g) in flat(&model, &clipped).iter().zip(&before) {
                assert!((got - g * factor).abs() < 1e-5 * norm, "{got} vs {}", g * factor);
            }
        }
    }
}
