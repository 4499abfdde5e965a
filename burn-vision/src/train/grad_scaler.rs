//! Dynamic loss scaling for f16 training — PyTorch's `torch.amp.GradScaler`.
//!
//! f16 keeps 5 exponent bits: small gradients of the activations underflow to zero. The loss
//! is multiplied by a large scale before the backward pass, so that the activation gradients
//! stay representable; the parameter gradients (f32) are divided by it again before the
//! optimizer step. When any of them is not finite the step is skipped and the scale halved;
//! after `growth_interval` finite steps in a row it is doubled.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_optim::GradientsParams;

/// Loss-scale state. Defaults as PyTorch's: scale 2¹⁶, growth ×2 every 2000 finite steps,
/// backoff ×0.5.
#[derive(Debug, Clone)]
pub struct GradScaler {
    scale: f64,
    growth_interval: usize,
    finite_steps: usize,
}

impl Default for GradScaler {
    fn default() -> Self {
        Self::new(65536.0, 2000)
    }
}

/// Divides every float parameter's gradient by the scale, summing their absolute values on the
/// device (one host read for all of them: NaN or infinite when any element is).
struct Unscale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    inv_scale: f64,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let g = g.mul_scalar(self.inv_scale);
            let size = g.clone().abs().sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + size,
                None => size,
            });
            self.grads.register::<B::InnerBackend, D>(param.id, g);
        }
    }
}

impl GradScaler {
    /// Starts at `scale`, doubling it after `growth_interval` finite steps in a row.
    ///
    /// # Panics
    /// If `scale` is not a positive finite number or `growth_interval` is zero.
    pub fn new(scale: f64, growth_interval: usize) -> Self {
        assert!(
            scale.is_finite() && scale > 0.0 && growth_interval > 0,
            "Got scale {scale}, growth interval {growth_interval}; expected positive"
        );
        Self { scale, growth_interval, finite_steps: 0 }
    }

    /// The current loss scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// `loss · scale`, to call `backward` on.
    pub fn scale_loss<B: AutodiffBackend>(&self, loss: Tensor<B, 1>) -> Tensor<B, 1> {
        loss.mul_scalar(self.scale)
    }

    /// Divides `model`'s gradients by the scale (after any all-reduce: every rank then decides
    /// alike) and updates the scale. Returns the gradients when they are all finite, `None`
    /// when the step must be skipped.
    pub fn unscale<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Option<GradientsParams> {
        let mut visitor = Unscale::<B> { grads: &mut grads, inv_scale: 1.0 / self.scale, total: None };
        model.visit(&mut visitor);
        let finite = visitor.total.is_none_or(|t| t.into_scalar().elem::<f64>().is_finite());
        if finite {
            self.finite_steps += 1;
            if self.finite_steps == self.growth_interval {
                self.scale *= 2.0;
                self.finite_steps = 0;
            }
            Some(grads)
        } else {
            self.scale *= 0.5;
            self.finite_steps = 0;
            log::warn!("f16 gradients overflowed: step skipped, loss scale lowered to {}", self.scale);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, FloatDType};
    use burn_autodiff::Autodiff;
    use burn_ddp::nn::Conv2d;
    use burn_flex::Flex;
    use burn_nn::PaddingConfig2d;
    use burn_nn::conv::Conv2dConfig;

    type B = Autodiff<Flex>;

    /// A convolution (f32 weight cast to the input's type) on `x` in `dt`, as f32.
    fn conv_out(layer: &Conv2d<B>, x: &Tensor<B, 4>, dt: FloatDType) -> Tensor<B, 4> {
        layer.forward(x.clone().cast(dt)).cast(FloatDType::F32)
    }

    fn layer(device: &burn_flex::FlexDevice) -> Conv2d<B> {
        Conv2dConfig::new([2, 3], [3, 3]).with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1)).init(device).into()
    }

    /// A convolution computing in f16, its loss scaled: unscaled gradients equal the f32
    /// model's (to f16 rounding), and the scale grows after `growth_interval` finite steps.
    #[test]
    fn unscaled_gradients_match_and_the_scale_grows() {
        let device = Default::default();
        let layer = layer(&device);
        let x = Tensor::<B, 4>::random([4, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
        let loss_of = |dt: FloatDType| conv_out(&layer, &x, dt).powf_scalar(2.0).mean();
        let want = GradientsParams::from_grads(loss_of(FloatDType::F32).backward(), &layer)
            .get::<Flex, 4>(layer.weight.id)
            .unwrap();
        let mut scaler = GradScaler::new(1024.0, 2);
        for step in 0..2 {
            let grads = GradientsParams::from_grads(scaler.scale_loss(loss_of(FloatDType::F16)).backward(), &layer);
            let grads = scaler.unscale(&layer, grads).expect("finite gradients");
            let got = grads.get::<Flex, 4>(layer.weight.id).unwrap();
            let err = (got - want.clone()).abs().max().into_scalar() / want.clone().abs().max().into_scalar();
            assert!(err < 5e-3, "step {step}: unscaled f16 gradient differs from f32 by {err}");
        }
        assert_eq!(scaler.scale(), 2048.0, "two finite steps with growth interval 2 double the scale");
    }

    /// A scale that overflows f16 makes the gradients infinite: the step is skipped and the
    /// scale halved, until it fits again.
    #[test]
    fn overflow_skips_the_step_and_halves_the_scale() {
        let device = Default::default();
        let layer = layer(&device);
        let x = Tensor::<B, 4>::random([3, 2, 5, 5], Distribution::Normal(0.0, 1.0), &device);
        let mut scaler = GradScaler::new(1e30, 2000);
        let loss = conv_out(&layer, &x, FloatDType::F16).sum();
        let grads = GradientsParams::from_grads(scaler.scale_loss(loss).backward(), &layer);
        assert!(scaler.unscale(&layer, grads).is_none(), "1e30 overflows f16: the step must be skipped");
        assert_eq!(scaler.scale(), 5e29);
    }
}
