//! FusedSgd and FusedAdamW against burn's own Sgd and AdamW.
//!
//! Each step both optimizers get the **same gradients** (computed once, from the fused side's
//! model), so the comparison measures the optimizers alone: that is the pass/fail figure.
//! Beside it, two figures that say where a difference comes from when there is one: a third
//! model stepped by burn's optimizer on gradients of its own backward pass (the end-to-end
//! comparison), and the same model's gradients computed twice (how far burn's forward and
//! backward on the GPU repeat themselves).

use crate::util::{Ad, to_f64};
use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::reference::max_rel_err;
use burn_optim::{GradientsParams, LearningRate, Optimizer};

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

/// Copies a module's gradients into a second `GradientsParams` (the same tensors, for a
/// second optimizer) and collects their values in the module's order.
struct CopyGrads<'a> {
    from: &'a GradientsParams,
    to: GradientsParams,
    values: Vec<f64>,
}

impl ModuleVisitor<Ad> for CopyGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
        if let Some(g) = self.from.get::<Cuda, D>(param.id) {
            self.values.extend(to_f64(g.clone().flatten::<1>(0, D - 1)));
            self.to.register(param.id, g);
        }
    }
}

/// The gradients of `net`'s loss, a copy of them, and their values.
fn gradients(net: &SgdNet<Ad>, x: &Tensor<Ad, 4>, z: &Tensor<Ad, 2>) -> (GradientsParams, GradientsParams, Vec<f64>) {
    let grads = GradientsParams::from_grads(net.loss(x.clone(), z.clone()).backward(), net);
    let mut copy = CopyGrads { from: &grads, to: GradientsParams::new(), values: Vec::new() };
    net.visit(&mut copy);
    let (to, values) = (copy.to, copy.values);
    (grads, to, values)
}

/// What one setting's comparison measured (all maxima over the steps, relative to the largest
/// value compared).
struct Compared {
    /// The fused optimizer against burn's, on the same gradients (what the check judges).
    same_grads: f64,
    /// The fused optimizer against burn's on a model of its own (its own backward pass).
    end_to_end: f64,
    /// The fused side's gradients computed twice at the same parameters.
    grad_repeat: f64,
    /// How far the fused side's parameters moved from the start.
    moved: f64,
}

impl Compared {
    fn line(&self) -> String {
        format!(
            "max_rel_err={:.2e} end_to_end_rel_err={:.2e} grad_repeat_rel_err={:.2e} moved={:.2e}",
            self.same_grads, self.end_to_end, self.grad_repeat, self.moved
        )
    }
}

/// Steps `fused` and burn's optimizer (`burns`, and `own` for the end-to-end model) at each
/// of `lrs` from one starting model.
fn compare(
    device: &CudaDevice,
    fused: &mut impl Optimizer<SgdNet<Ad>, Ad>,
    burns: &mut impl Optimizer<SgdNet<Ad>, Ad>,
    own: &mut impl Optimizer<SgdNet<Ad>, Ad>,
    lrs: &[LearningRate],
) -> Compared {
    let x = Tensor::<Ad, 4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), device);
    let z = Tensor::<Ad, 2>::random([8, 37], Distribution::Normal(0.0, 1.0), device);
    // The same starting values: parameters are initialised lazily, so a clone before the
    // first read would draw its own; mapping reads (initialises) them all first.
    let mut a = SgdNet::<Ad>::new(device).map(&mut Materialise);
    let (mut b, mut c) = (a.clone(), a.clone());
    let start = a.values();
    let mut r = Compared { same_grads: 0.0, end_to_end: 0.0, grad_repeat: 0.0, moved: 0.0 };
    for &lr in lrs {
        let (ga, gb, values) = gradients(&a, &x, &z);
        let (_, _, again) = gradients(&a, &x, &z);
        r.grad_repeat = r.grad_repeat.max(max_rel_err(&again, &values));
        let gc = GradientsParams::from_grads(c.loss(x.clone(), z.clone()).backward(), &c);
        a = fused.step(lr, a, ga);
        b = burns.step(lr, b, gb);
        c = own.step(lr, c, gc);
        let got = a.values();
        r.same_grads = r.same_grads.max(max_rel_err(&got, &b.values()));
        r.end_to_end = r.end_to_end.max(max_rel_err(&got, &c.values()));
    }
    r.moved = max_rel_err(&a.values(), &start);
    r
}

/// burn-ddp's FusedSgd (one operation per step: its CUDA kernel) against burn's own Sgd on the
/// same GPU and the same gradients, three steps with changing learning rates, for momentum
/// with weight decay, Nesterov, dampening and plain SGD; the kernel must have run.
pub(crate) fn check_sgd(device: &CudaDevice) -> bool {
    use burn_ddp::nn::{FusedSgdConfig, sgd};
    use burn_optim::{SgdConfig, decay::WeightDecayConfig, momentum::MomentumConfig};
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
        let burns = SgdConfig::new()
            .with_momentum(momentum)
            .with_weight_decay((c.weight_decay > 0.0).then(|| WeightDecayConfig::new(c.weight_decay as f32)));
        let before = sgd::fused_updates();
        let r = compare(
            device,
            &mut c.init::<Ad, SgdNet<Ad>>(),
            &mut burns.init::<Ad, SgdNet<Ad>>(),
            &mut burns.init::<Ad, SgdNet<Ad>>(),
            &[0.1, 0.05, 0.02],
        );
        let kernel = sgd::fused_updates() - before;
        let pass = r.same_grads < 1e-5 && kernel == 15 && r.moved > 1e-4;
        println!(
            "RESULT check=fused_sgd momentum={} dampening={} nesterov={} weight_decay={} {} parameters_through_the_kernel={kernel} {}",
            c.momentum,
            c.dampening,
            c.nesterov,
            c.weight_decay,
            r.line(),
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}

/// burn-ddp's FusedAdamW (one operation per step: its CUDA kernel) against burn's own AdamW on
/// the same GPU and the same gradients, four steps with changing learning rates, for burn's
/// defaults, a ViT recipe's weight decay and other betas; the kernel must have run for every
/// parameter of every step.
pub(crate) fn check_adamw(device: &CudaDevice) -> bool {
    use burn_ddp::nn::FusedAdamWConfig;
    use burn_ddp::nn::optim::adamw;
    use burn_optim::AdamWConfig;
    let mut ok = true;
    let d = FusedAdamWConfig::default();
    for c in [
        d,
        FusedAdamWConfig { weight_decay: 0.05, ..d },
        FusedAdamWConfig { beta_1: 0.8, beta_2: 0.95, epsilon: 1e-8, ..d },
    ] {
        let burns = AdamWConfig::new()
            .with_beta_1(c.beta_1)
            .with_beta_2(c.beta_2)
            .with_epsilon(c.epsilon)
            .with_weight_decay(c.weight_decay);
        let before = adamw::fused_updates();
        let r = compare(
            device,
            &mut c.init::<Ad, SgdNet<Ad>>(),
            &mut burns.init::<Ad, SgdNet<Ad>>(),
            &mut burns.init::<Ad, SgdNet<Ad>>(),
            &[1e-3, 5e-4, 2e-4, 1e-4],
        );
        let kernel = adamw::fused_updates() - before;
        let pass = r.same_grads < 1e-5 && kernel == 20 && r.moved > 1e-5;
        println!(
            "RESULT check=fused_adamw beta_1={} beta_2={} epsilon={} weight_decay={} {} parameters_through_the_kernel={kernel} {}",
            c.beta_1,
            c.beta_2,
            c.epsilon,
            c.weight_decay,
            r.line(),
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}
