//! What the fused optimizers' tests share: a small network with parameters of rank 4, 2 and 1,
//! a training step, and the comparison of two networks' parameters.

use burn::module::{AutodiffModule, Module, ModuleMapper};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_autodiff::Autodiff;
use burn_flex::Flex;
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::{Linear, LinearConfig};
use burn_optim::{GradientsParams, Optimizer};

pub(crate) type Ad = Autodiff<Flex>;

/// The identity mapping: initialises lazily initialised parameters, so that clones share
/// them (a clone before the first read draws its own).
pub(crate) struct Materialise;

impl<B: Backend> ModuleMapper<B> for Materialise {}

/// Parameters of rank 4 (convolution), 2 and 1 (linear).
#[derive(Module, Debug)]
pub(crate) struct Net<B: Backend> {
    pub(crate) conv: Conv2d<B>,
    pub(crate) fc: Linear<B>,
}

impl<B: Backend> Net<B> {
    pub(crate) fn new(device: &B::Device) -> Self {
        B::seed(device, 7);
        Self { conv: Conv2dConfig::new([2, 3], [3, 3]).init(device), fc: LinearConfig::new(3 * 4 * 4, 5).init(device) }
    }

    pub(crate) fn loss(&self, x: Tensor<B, 4>) -> Tensor<B, 1> {
        let y = self.fc.forward(self.conv.forward(x).flatten::<2>(1, 3));
        (y.clone() * y).sum()
    }
}

/// One step of `optim` on the network's loss for `x`.
pub(crate) fn step<O: Optimizer<Net<Ad>, Ad>>(optim: &mut O, net: Net<Ad>, x: &Tensor<Ad, 4>, lr: f64) -> Net<Ad> {
    let grads = GradientsParams::from_grads(net.loss(x.clone()).backward(), &net);
    optim.step(lr, net, grads)
}

/// The two networks' parameters agree within 1e-5 of the largest value (and are not all zero).
pub(crate) fn assert_same(a: &Net<Ad>, b: &Net<Ad>, what: &str) {
    let (a, b) = (a.clone().valid(), b.clone().valid());
    for (x, y, name) in [
        (a.conv.weight.val().flatten::<1>(0, 3), b.conv.weight.val().flatten::<1>(0, 3), "conv weight"),
        (a.fc.weight.val().flatten::<1>(0, 1), b.fc.weight.val().flatten::<1>(0, 1), "fc weight"),
        (a.fc.bias.unwrap().val(), b.fc.bias.unwrap().val(), "fc bias"),
    ] {
        let diff: f32 = (x - y.clone()).abs().max().into_scalar();
        let scale: f32 = y.abs().max().into_scalar();
        assert!(scale > 0.0, "{what}: {name} is all zeros");
        assert!(diff <= 1e-5 * scale + 1e-6, "{what}: {name} differs by {diff} (largest value {scale})");
    }
}
