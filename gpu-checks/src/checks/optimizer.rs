//! FusedSgd and FusedAdamW against burn's own Sgd and AdamW.

use crate::util::{Ad, to_f64};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cuda::CudaDevice;
use burn_ddp::nn::reference::max_rel_err;

/// Parameters of rank 4, 2 and 1 whose sizes take every vector width of the fused SGD kernel
/// (9408, 37000, 1000, 3000 and 3 elements).
#[derive(burn::module::Module, Debug)]
pub(crate) struct SgdNet<B: Backend> {
    conv: burn_nn::conv::Conv2d<B>,
    fc1: burn_nn::Linear<B>,
    fc2: burn_nn::Linear<B>,
}

impl<B: Backend> SgdNet<B> {
    fn new(device: &B::Device) -> Self {
        B::seed(device, 3);
        Self {
            conv: burn_nn::conv::Conv2dConfig::new([3, 64], [7, 7]).with_bias(false).init(device),
            fc1: burn_nn::LinearConfig::new(37, 1000).init(device),
            fc2: burn_nn::LinearConfig::new(1000, 3).init(device),
        }
    }

    fn loss(&self, x: Tensor<B, 4>, z: Tensor<B, 2>) -> Tensor<B, 1> {
        let a = self.conv.forward(x).powi_scalar(2).mean();
        let y = self.fc2.forward(burn::tensor::activation::relu(self.fc1.forward(z)));
        (y.clone() * y).mean() + a
    }

    fn values(&self) -> Vec<f64> {
        let m = self.clone();
        [
            m.conv.weight.val().flatten::<1>(0, 3),
            m.fc1.weight.val().flatten::<1>(0, 1),
            m.fc1.bias.unwrap().val(),
            m.fc2.weight.val().flatten::<1>(0, 1),
            m.fc2.bias.unwrap().val(),
        ]
        .into_iter()
        .flat_map(to_f64)
        .collect()
    }
}

/// The identity mapping, which initialises lazily initialised parameters.
pub(crate) struct Materialise;

impl<B: Backend> burn::module::ModuleMapper<B> for Materialise {}

/// burn-ddp's FusedSgd (one operation per step: its CUDA kernel) against burn's own Sgd on the
/// same GPU, three steps with changing learning rates, for momentum with weight decay,
/// Nesterov, dampening and plain SGD; the kernel must have run.
pub(crate) fn check_sgd(device: &CudaDevice) -> bool {
    use burn_ddp::nn::{FusedSgdConfig, sgd};
    use burn_optim::{GradientsParams, Optimizer, SgdConfig, decay::WeightDecayConfig, momentum::MomentumConfig};
    let x = Tensor::<Ad, 4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), device);
    let z = Tensor::<Ad, 2>::random([8, 37], Distribution::Normal(0.0, 1.0), device);
    let mut ok = true;
    let d = FusedSgdConfig::default();
    for c in [
        FusedSgdConfig { momentum: 0.9, weight_decay: 5e-3, ..d },
        FusedSgdConfig { momentum: 0.9, nesterov: true, ..d },
        FusedSgdConfig { momentum: 0.5, dampening: 0.1, weight_decay: 1e-2, ..d },
        FusedSgdConfig { weight_decay: 1e-3, ..d },
    ] {
        let momentum = (c.momentum > 0.0).then(|| {
            MomentumConfig::new().with_momentum(c.momentum).with_dampening(c.dampening).with_nesterov(c.nesterov)
        });
        let mut burns = SgdConfig::new()
            .with_momentum(momentum)
            .with_weight_decay((c.weight_decay > 0.0).then(|| WeightDecayConfig::new(c.weight_decay as f32)))
            .init::<Ad, SgdNet<Ad>>();
        let mut fused = c.init::<Ad, SgdNet<Ad>>();
        // The same starting values: parameters are initialised lazily, so a clone before the
        // first read would draw its own; mapping reads (initialises) them all first.
        let mut a = SgdNet::<Ad>::new(device).map(&mut Materialise);
        let mut b = a.clone();
        let start = a.values();
        let before = sgd::fused_updates();
        let mut err = max_rel_err(&a.values(), &b.values());
        for lr in [0.1, 0.05, 0.02] {
            let ga = GradientsParams::from_grads(a.loss(x.clone(), z.clone()).backward(), &a);
            a = fused.step(lr, a, ga);
            let gb = GradientsParams::from_grads(b.loss(x.clone(), z.clone()).backward(), &b);
            b = burns.step(lr, b, gb);
            err = err.max(max_rel_err(&a.values(), &b.values()));
        }
        let kernel = sgd::fused_updates() - before;
        let moved = max_rel_err(&a.values(), &start);
        let pass = err < 1e-5 && kernel == 15 && moved > 1e-4;
        println!(
            "RESULT check=fused_sgd momentum={} dampening={} nesterov={} weight_decay={} max_rel_err={err:.2e} moved={moved:.2e} parameters_through_the_kernel={kernel} {}",
            c.momentum,
            c.dampening,
            c.nesterov,
            c.weight_decay,
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}

/// burn-ddp's FusedAdamW (one operation per step: its CUDA kernel) against burn's own AdamW on
/// the same GPU, four steps with changing learning rates, for burn's defaults, a ViT recipe's
/// weight decay and other betas; the kernel must have run for every parameter of every step.
pub(crate) fn check_adamw(device: &CudaDevice) -> bool {
    use burn_ddp::nn::FusedAdamWConfig;
    use burn_ddp::nn::optim::adamw;
    use burn_optim::{AdamWConfig, GradientsParams, Optimizer};
    let x = Tensor::<Ad, 4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), device);
    let z = Tensor::<Ad, 2>::random([8, 37], Distribution::Normal(0.0, 1.0), device);
    let mut ok = true;
    let d = FusedAdamWConfig::default();
    for c in [
        d,
        FusedAdamWConfig { weight_decay: 0.05, ..d },
        FusedAdamWConfig { beta_1: 0.8, beta_2: 0.95, epsilon: 1e-8, ..d },
    ] {
        let mut burns = AdamWConfig::new()
            .with_beta_1(c.beta_1)
            .with_beta_2(c.beta_2)
            .with_epsilon(c.epsilon)
            .with_weight_decay(c.weight_decay)
            .init::<Ad, SgdNet<Ad>>();
        let mut fused = c.init::<Ad, SgdNet<Ad>>();
        let mut a = SgdNet::<Ad>::new(device).map(&mut Materialise);
        let mut b = a.clone();
        let start = a.values();
        let before = adamw::fused_updates();
        let mut err = 0.0f64;
        for lr in [1e-3, 5e-4, 2e-4, 1e-4] {
            let ga = GradientsParams::from_grads(a.loss(x.clone(), z.clone()).backward(), &a);
            a = fused.step(lr, a, ga);
            let gb = GradientsParams::from_grads(b.loss(x.clone(), z.clone()).backward(), &b);
            b = burns.step(lr, b, gb);
            err = err.max(max_rel_err(&a.values(), &b.values()));
        }
        let kernel = adamw::fused_updates() - before;
        let moved = max_rel_err(&a.values(), &start);
        let pass = err < 1e-5 && kernel == 20 && moved > 1e-5;
        println!(
            "RESULT check=fused_adamw beta_1={} beta_2={} epsilon={} weight_decay={} max_rel_err={err:.2e} moved={moved:.2e} parameters_through_the_kernel={kernel} {}",
            c.beta_1,
            c.beta_2,
            c.epsilon,
            c.weight_decay,
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}
