//! AdamW — burn's `AdamW` rule (decoupled weight decay, bias-corrected moments) — as a drop-in
//! [`Optimizer`] whose step on burn-cuda is PyTorch's `AdamW(fused=True)`: **one** operation for
//! every parameter of the model, one CUDA kernel launch per 48 parameters, where burn's own
//! AdamW queues about fifteen tensor operations per parameter. On every other backend (and for
//! parameters that are not f32) the same rule runs on burn's operations.
//!
//! The state is burn's: `FusedAdamW`'s `to_record` is the record `AdamWConfig::init()`'s
//! optimizer writes (`HashMap<ParamId, AdaptorRecord<AdamW, B>>`), so checkpoints move between
//! the two. AMSGrad, cautious weight decay and gradient clipping inside the optimizer are not
//! offered (burn's AdamW has them).

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Device, TensorMetadata};
use burn_optim::record::AdaptorRecord;
use burn_optim::{AdamW, AdamWState, AdaptiveMomentumState};

pub use crate::nn::optim::adamw_rule::FusedAdamWConfig;
use crate::nn::optim::adamw_rule::{Done, Entry, Moments, reference_update};
use crate::nn::optim::fused::{FusedOptimizer, FusedRule, as_tensor};

impl FusedAdamWConfig {
    /// The optimizer for modules `M` on `B`.
    ///
    /// # Panics
    /// On settings outside the rule: β outside [0, 1), a negative ε or weight decay.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedAdamW<M, B> {
        let c = *self;
        assert!(
            (0.0..1.0).contains(&c.beta_1) && (0.0..1.0).contains(&c.beta_2),
            "AdamW: beta_1={} and beta_2={} must be in [0, 1)",
            c.beta_1,
            c.beta_2
        );
        assert!(
            c.epsilon >= 0.0 && c.weight_decay >= 0.0,
            "AdamW: epsilon={} and weight_decay={} must not be negative",
            c.epsilon,
            c.weight_decay
        );
        FusedOptimizer::new(c)
    }
}

type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// burn's record of one parameter's AdamW state.
pub type AdamWRecord<B> = AdaptorRecord<AdamW, B>;

/// AdamW whose step is one operation on burn-cuda (see the module documentation).
pub type FusedAdamW<M, B> = FusedOptimizer<FusedAdamWConfig, M, B>;

impl<B: AutodiffBackend> FusedRule<B> for FusedAdamWConfig {
    /// The two moments and their step count.
    type State = Moments<Inner<B>>;
    type Record = AdamWRecord<B>;

    fn state_from_record<const D: usize>(record: AdamWRecord<B>, device: &Device<Inner<B>>) -> Option<Self::State> {
        let state: AdamWState<Inner<B>, D> = record.into_state::<D>();
        let s = state.momentum;
        let (m, v) = (s.moment_1.to_device(device), s.moment_2.to_device(device));
        Some(Moments { m: m.into_primitive().tensor(), v: v.into_primitive().tensor(), time: s.time })
    }

    fn record_of(state: &Self::State) -> AdamWRecord<B> {
        moments_record::<B>(state)
    }

    /// On burn-cuda one operation for the f32 entries, elsewhere (and for the rest) burn's
    /// operations.
    fn update(&self, entries: Vec<Entry<Inner<B>>>, lr: f64) -> Vec<Done<Inner<B>>> {
        #[cfg(feature = "cuda")]
        let (mut done, entries) = crate::nn::cuda::ops::adamw::update(entries, lr, self);
        #[cfg(not(feature = "cuda"))]
        let mut done = Vec::new();
        done.extend(entries.into_iter().map(|e| reference_update(e, lr, self)));
        done
    }
}

/// Parameter updates the CUDA kernel has run so far in this process (0 without the `cuda`
/// feature): whether the fused path was taken.
pub fn fused_updates() -> usize {
    #[cfg(feature = "cuda")]
    let n = crate::nn::cuda::ops::adamw::UPDATES.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "cuda"))]
    let n = 0;
    n
}

/// burn's record of a parameter's moments, of any rank up to 6.
fn moments_record<B: AutodiffBackend>(s: &Moments<Inner<B>>) -> AdamWRecord<B> {
    fn at<B: AutodiffBackend, const D: usize>(s: &Moments<Inner<B>>) -> AdamWRecord<B> {
        let t = |x: &burn::tensor::ops::FloatTensor<Inner<B>>| as_tensor::<B, D>(x.clone());
        let momentum = AdaptiveMomentumState::new(s.time, t(&s.m), t(&s.v));
        AdaptorRecord::from_state::<D>(AdamWState::new(momentum))
    }
    match s.m.shape().num_dims() {
        1 => at::<B, 1>(s),
        2 => at::<B, 2>(s),
        3 => at::<B, 3>(s),
        4 => at::<B, 4>(s),
        5 => at::<B, 5>(s),
        6 => at::<B, 6>(s),
        d => panic!("AdamW state of a {d}-dimensional parameter: up to 6 dimensions are supported"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::optim::test_net::{Ad, Materialise, Net, assert_same, step};
    use burn::module::{Module, ParamId};
    use burn::tensor::Distribution;
    use burn::tensor::Tensor;
    use burn_optim::AdamWConfig;
    use burn_optim::Optimizer;
    use hashbrown::HashMap;

    fn burn_adamw(c: &FusedAdamWConfig) -> impl Optimizer<Net<Ad>, Ad, Record = HashMap<ParamId, AdamWRecord<Ad>>> {
        AdamWConfig::new()
            .with_beta_1(c.beta_1)
            .with_beta_2(c.beta_2)
            .with_epsilon(c.epsilon)
            .with_weight_decay(c.weight_decay)
            .init::<Ad, Net<Ad>>()
    }

    fn settings() -> [FusedAdamWConfig; 3] {
        let c = FusedAdamWConfig::default();
        [
            c,
            FusedAdamWConfig { weight_decay: 0.05, ..c },
            FusedAdamWConfig { beta_1: 0.8, beta_2: 0.99, epsilon: 1e-8, weight_decay: 0.0 },
        ]
    }

    /// Against burn's `AdamW`, step by step, with a learning rate that changes between steps;
    /// and the parameters do move.
    #[test]
    fn steps_match_burns_adamw() {
        let device = Default::default();
        let x = Tensor::<Ad, 4>::random([2, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
        for c in settings() {
            let (mut fused, mut reference) = (c.init::<Ad, Net<Ad>>(), burn_adamw(&c));
            let start = Net::<Ad>::new(&device).map(&mut Materialise);
            let (mut a, mut b) = (start.clone(), start.clone());
            for (i, lr) in [0.05, 0.03, 0.01].into_iter().enumerate() {
                a = step(&mut fused, a, &x, lr);
                b = step(&mut reference, b, &x, lr);
                assert_same(&a, &b, &format!("{c:?}, step {i}"));
            }
            let moved = (a.fc.weight.val() - start.fc.weight.val()).abs().sum().into_scalar();
            assert!(moved > 1e-3, "{c:?}: the parameters did not move ({moved})");
            assert_eq!(fused.to_record().len(), 4, "moments per parameter (conv weight and bias, fc weight and bias)");
        }
    }

    /// Checkpoints move between the two optimizers: each one's record, loaded into the other,
    /// continues exactly as the original would have.
    #[test]
    fn records_are_burns() {
        let device = Default::default();
        let x = Tensor::<Ad, 4>::random([2, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
        let c = settings()[1];
        let (mut fused, mut reference) = (c.init::<Ad, Net<Ad>>(), burn_adamw(&c));
        let mut a = Net::<Ad>::new(&device).map(&mut Materialise);
        let mut b = a.clone();
        for lr in [0.05, 0.03] {
            a = step(&mut fused, a, &x, lr);
            b = step(&mut reference, b, &x, lr);
        }
        let mut burn_from_fused = burn_adamw(&c).load_record(fused.to_record());
        let mut fused_from_burn = c.init::<Ad, Net<Ad>>().load_record(reference.to_record());
        let a2 = step(&mut burn_from_fused, a.clone(), &x, 0.02);
        let b2 = step(&mut fused_from_burn, b.clone(), &x, 0.02);
        let a3 = step(&mut fused, a, &x, 0.02);
        assert_same(&a2, &a3, "burn's AdamW on FusedAdamW's record");
        assert_same(&b2, &a3, "FusedAdamW on burn's record");
        let fresh = step(&mut c.init::<Ad, Net<Ad>>(), b, &x, 0.02);
        let differs = (fresh.fc.weight.val() - b2.fc.weight.val()).abs().sum().into_scalar();
        assert!(differs > 1e-6, "without the loaded moments the step differs ({differs}): the test can fail");
    }
}
