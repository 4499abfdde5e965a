//! SGD with momentum, dampening, Nesterov and weight decay — PyTorch's `torch.optim.SGD` rule,
//! which burn's `Sgd` also follows — as a drop-in [`Optimizer`] whose step on burn-cuda is
//! PyTorch's multi-tensor apply (`SGD(fused=True)`): **one** operation for every parameter of
//! the model, one CUDA kernel launch per 64 parameters. burn's own `Sgd` queues seven tensor
//! operations per parameter (weight decay, momentum, update), each described by the training
//! thread and launched as its own kernels by cubecl's device thread: at batch 16 that is a
//! third of a ResNet-34 step's kernel launches. On every other backend (and for parameters that
//! are not f32) the same rule runs on burn's operations.
//!
//! The state is burn's: `FusedSgd`'s `to_record` is the record `SgdConfig::init()`'s optimizer
//! writes (`HashMap<ParamId, AdaptorRecord<Sgd, B>>`), so checkpoints move between the two.

use burn::module::AutodiffModule;
use burn::record::{FullPrecisionSettings, Record};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Device, Tensor, TensorMetadata};
use burn_optim::momentum::MomentumState;
use burn_optim::record::AdaptorRecord;
use burn_optim::{Sgd, SgdState};

use crate::nn::optim::fused::{FusedOptimizer, FusedRule, as_tensor};
pub use crate::nn::optim::sgd_rule::FusedSgdConfig;
use crate::nn::optim::sgd_rule::{Done, Entry, reference_update};

impl FusedSgdConfig {
    /// The optimizer for modules `M` on `B`.
    ///
    /// # Panics
    /// On settings PyTorch refuses: negative factors, or Nesterov without momentum or with
    /// dampening.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedSgd<M, B> {
        let c = *self;
        assert!(
            c.momentum >= 0.0 && c.weight_decay >= 0.0 && c.dampening >= 0.0,
            "SGD: momentum={}, dampening={} and weight_decay={} must not be negative",
            c.momentum,
            c.dampening,
            c.weight_decay
        );
        assert!(
            !c.nesterov || (c.momentum > 0.0 && c.dampening == 0.0),
            "SGD: Nesterov momentum needs momentum > 0 and dampening 0 (got momentum={}, dampening={})",
            c.momentum,
            c.dampening
        );
        FusedOptimizer::new(c)
    }
}

type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// burn's record of one parameter's SGD state.
pub type SgdRecord<B> = AdaptorRecord<Sgd<Inner<B>>, B>;

/// SGD whose step is one operation on burn-cuda (see the module documentation).
pub type FusedSgd<M, B> = FusedOptimizer<FusedSgdConfig, M, B>;

impl<B: AutodiffBackend> FusedRule<B> for FusedSgdConfig {
    /// The momentum buffer.
    type State = FloatTensor<Inner<B>>;
    type Record = SgdRecord<B>;

    fn state_from_record<const D: usize>(record: SgdRecord<B>, device: &Device<Inner<B>>) -> Option<Self::State> {
        let momentum = record.into_state::<D>().momentum?;
        Some(momentum_buffer::<B, D>(momentum, device).into_primitive().tensor())
    }

    fn record_of(state: &Self::State) -> SgdRecord<B> {
        velocity_record::<B>(state.clone())
    }

    /// On burn-cuda one operation for the f32 entries, elsewhere (and for the rest) burn's
    /// operations.
    fn update(&self, entries: Vec<Entry<Inner<B>>>, lr: f64) -> Vec<Done<Inner<B>>> {
        #[cfg(feature = "cuda")]
        let (mut done, entries) = crate::nn::cuda::ops::sgd::update(entries, lr, self);
        #[cfg(not(feature = "cuda"))]
        let mut done = Vec::new();
        done.extend(entries.into_iter().map(|e| reference_update(e, lr, self)));
        done
    }
}

/// The tensor inside burn's momentum state (its field is private; its record item is not).
fn momentum_buffer<B: AutodiffBackend, const D: usize>(
    state: MomentumState<Inner<B>, D>,
    device: &Device<Inner<B>>,
) -> Tensor<Inner<B>, D> {
    let item = state.into_item::<FullPrecisionSettings>();
    <Tensor<Inner<B>, D> as Record<Inner<B>>>::from_item(item.velocity, device)
}

/// Parameter updates the CUDA kernel has run so far in this process (0 without the `cuda`
/// feature): whether the fused path was taken.
pub fn fused_updates() -> usize {
    #[cfg(feature = "cuda")]
    let n = crate::nn::cuda::ops::sgd::UPDATES.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "cuda"))]
    let n = 0;
    n
}

/// burn's record of a momentum buffer of any rank up to 6.
fn velocity_record<B: AutodiffBackend>(v: FloatTensor<Inner<B>>) -> SgdRecord<B> {
    fn at<B: AutodiffBackend, const D: usize>(v: FloatTensor<Inner<B>>) -> SgdRecord<B> {
        let state = SgdState::new(Some(MomentumState::new(as_tensor::<B, D>(v))));
        AdaptorRecord::from_state::<D>(state)
    }
    match v.shape().num_dims() {
        1 => at::<B, 1>(v),
        2 => at::<B, 2>(v),
        3 => at::<B, 3>(v),
        4 => at::<B, 4>(v),
        5 => at::<B, 5>(v),
        6 => at::<B, 6>(v),
        d => panic!("SGD state of a {d}-dimensional parameter: up to 6 dimensions are supported"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::optim::test_net::{Ad, Materialise, Net, assert_same, step};
    use burn::module::{Module, ParamId};
    use burn::tensor::Distribution;
    use burn_optim::Optimizer;
    use burn_optim::SgdConfig;
    use burn_optim::decay::WeightDecayConfig;
    use burn_optim::momentum::MomentumConfig;
    use hashbrown::HashMap;

    fn burn_sgd(c: &FusedSgdConfig) -> impl Optimizer<Net<Ad>, Ad, Record = HashMap<ParamId, SgdRecord<Ad>>> + use<> {
        let momentum = (c.momentum > 0.0).then(|| {
            MomentumConfig::new().with_momentum(c.momentum).with_dampening(c.dampening).with_nesterov(c.nesterov)
        });
        SgdConfig::new()
            .with_momentum(momentum)
            .with_weight_decay((c.weight_decay > 0.0).then(|| WeightDecayConfig::new(c.weight_decay as f32)))
            .init::<Ad, Net<Ad>>()
    }

    fn settings() -> [FusedSgdConfig; 4] {
        let c = FusedSgdConfig::default();
        [
            FusedSgdConfig { momentum: 0.9, weight_decay: 5e-3, ..c },
            FusedSgdConfig { momentum: 0.9, nesterov: true, ..c },
            FusedSgdConfig { momentum: 0.5, dampening: 0.1, weight_decay: 1e-2, ..c },
            FusedSgdConfig { weight_decay: 1e-3, ..c },
        ]
    }

    /// Against burn's `Sgd` (its own implementation of PyTorch's rule), step by step, with a
    /// learning rate that changes between steps.
    #[test]
    fn steps_match_burns_sgd() {
        let device = Default::default();
        let x = Tensor::<Ad, 4>::random([2, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
        for c in settings() {
            let (mut fused, mut reference) = (c.init::<Ad, Net<Ad>>(), burn_sgd(&c));
            let mut a = Net::<Ad>::new(&device).map(&mut Materialise);
            let mut b = a.clone();
            for (i, lr) in [0.05, 0.03, 0.01].into_iter().enumerate() {
                a = step(&mut fused, a, &x, lr);
                b = step(&mut reference, b, &x, lr);
                assert_same(&a, &b, &format!("{c:?}, step {i}"));
            }
            assert_eq!(
                fused.to_record().len(),
                if c.momentum > 0.0 { 4 } else { 0 },
                "one momentum buffer per parameter (conv weight and bias, fc weight and bias)"
            );
        }
    }

    /// Checkpoints move between the two optimizers: each one's record, loaded into the other,
    /// continues exactly as the original would have.
    #[test]
    fn records_are_burns() {
        let device = Default::default();
        let x = Tensor::<Ad, 4>::random([2, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device);
        let c = settings()[0];
        let (mut fused, mut reference) = (c.init::<Ad, Net<Ad>>(), burn_sgd(&c));
        let mut a = Net::<Ad>::new(&device).map(&mut Materialise);
        let mut b = a.clone();
        for lr in [0.05, 0.03] {
            a = step(&mut fused, a, &x, lr);
            b = step(&mut reference, b, &x, lr);
        }
        let mut burn_from_fused = burn_sgd(&c).load_record(fused.to_record());
        let mut fused_from_burn = c.init::<Ad, Net<Ad>>().load_record(reference.to_record());
        let a2 = step(&mut burn_from_fused, a.clone(), &x, 0.02);
        let b2 = step(&mut fused_from_burn, b.clone(), &x, 0.02);
        let a3 = step(&mut fused, a, &x, 0.02);
        assert_same(&a2, &a3, "burn's Sgd on FusedSgd's record");
        assert_same(&b2, &a3, "FusedSgd on burn's record");
        let fresh = step(&mut c.init::<Ad, Net<Ad>>(), b, &x, 0.02);
        let differs = (fresh.fc.weight.val() - b2.fc.weight.val()).abs().sum().into_scalar();
        assert!(differs > 1e-7, "without the loaded buffers the step differs ({differs}): the test can fail");
    }

    #[test]
    #[should_panic(expected = "Nesterov momentum needs momentum > 0")]
    fn nesterov_without_momentum_is_refused() {
        let _ = FusedSgdConfig { nesterov: true, ..FusedSgdConfig::default() }.init::<Ad, Net<Ad>>();
    }
}
