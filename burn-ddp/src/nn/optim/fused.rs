//! The optimizer both fused optimizers are: burn's [`Optimizer`] over a [`FusedRule`] — gather
//! every trained parameter's value, gradient and state, update them all in one call of the rule
//! (one device operation on burn-cuda), put the new values back — with burn's records as its
//! checkpoint state. `FusedSgd` and `FusedAdamW` are this optimizer with their rules.

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Device, Tensor, TensorPrimitive};
use burn_optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use hashbrown::HashMap;
use std::marker::PhantomData;

use crate::nn::optim::params::{Done, Entry, Grads, Replace};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// An update rule with per-parameter state, applied to all parameters at once. Implemented by
/// the rules' configs ([`FusedSgdConfig`](crate::nn::optim::sgd_rule::FusedSgdConfig),
/// [`FusedAdamWConfig`](crate::nn::optim::adamw_rule::FusedAdamWConfig)); its inputs are crate-private, so it is
/// not implemented elsewhere.
pub trait FusedRule<B: AutodiffBackend>: Copy + Send + Sync + 'static {
    /// One parameter's state between steps (a momentum buffer, two moments), in its shape.
    type State: Clone + Send + Sync;
    /// burn's record of one parameter's state (what burn's own optimizer of this rule writes).
    type Record: burn::record::Record<B> + Clone;
    /// The state a loaded record gives a parameter of rank `D` on `device` (`None`: nothing).
    fn state_from_record<const D: usize>(record: Self::Record, device: &Device<Inner<B>>) -> Option<Self::State>;
    /// burn's record of `state`.
    fn record_of(state: &Self::State) -> Self::Record;
    /// The step of every entry at learning rate `lr`.
    fn update(&self, entries: Vec<Entry<Inner<B>, Self::State>>, lr: f64) -> Vec<Done<Inner<B>, Self::State>>;
}

/// burn's [`Optimizer`] over the rule `R` (see the module documentation).
pub struct FusedOptimizer<R: FusedRule<B>, M, B: AutodiffBackend> {
    rule: R,
    /// Each parameter's state.
    state: HashMap<ParamId, R::State>,
    /// Records loaded and not yet claimed by a step (their rank is learnt from the parameter).
    loaded: HashMap<ParamId, R::Record>,
    _module: PhantomData<fn() -> M>,
}

impl<R: FusedRule<B>, M, B: AutodiffBackend> FusedOptimizer<R, M, B> {
    /// A fresh optimizer of `rule` (no state yet).
    pub(crate) fn new(rule: R) -> Self {
        Self { rule, state: HashMap::new(), loaded: HashMap::new(), _module: PhantomData }
    }
}

impl<R: FusedRule<B>, M, B: AutodiffBackend> Clone for FusedOptimizer<R, M, B> {
    fn clone(&self) -> Self {
        Self { rule: self.rule, state: self.state.clone(), loaded: self.loaded.clone(), _module: PhantomData }
    }
}

/// Gathers each trained parameter's value, gradient and state.
struct Gather<'a, R: FusedRule<B>, B: AutodiffBackend> {
    grads: Grads,
    state: &'a mut HashMap<ParamId, R::State>,
    loaded: &'a mut HashMap<ParamId, R::Record>,
    entries: Vec<Entry<Inner<B>, R::State>>,
}

impl<R: FusedRule<B>, B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, R, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) else { return };
        let value = param.val().inner();
        let device = value.device();
        let grad = grad.to_device(&device);
        if let Some(state) = self.loaded.remove(&param.id).and_then(|r| R::state_from_record::<D>(r, &device)) {
            self.state.insert(param.id, state);
        }
        self.entries.push(Entry {
            id: param.id,
            param: value.into_primitive().tensor(),
            grad: grad.into_primitive().tensor(),
            state: self.state.remove(&param.id),
        });
    }
}

impl<R: FusedRule<B>, M: AutodiffModule<B>, B: AutodiffBackend> FusedOptimizer<R, M, B> {
    fn step_with(&mut self, lr: LearningRate, module: M, grads: Grads) -> M {
        let mut gather =
            Gather::<R, B> { grads, state: &mut self.state, loaded: &mut self.loaded, entries: Vec::new() };
        module.visit(&mut gather);
        let entries = gather.entries;
        let mut updated = HashMap::with_capacity(entries.len());
        for (id, param, state) in self.rule.update(entries, lr) {
            updated.insert(id, param);
            if let Some(s) = state {
                self.state.insert(id, s);
            }
        }
        module.map(&mut Replace::<B> { updated })
    }
}

impl<R: FusedRule<B>, M: AutodiffModule<B>, B: AutodiffBackend> Optimizer<M, B> for FusedOptimizer<R, M, B> {
    type Record = HashMap<ParamId, R::Record>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.step_with(lr, module, Grads::Single(grads))
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.step_with(lr, module, Grads::Multi(grads))
    }

    fn to_record(&self) -> Self::Record {
        let mut record = self.loaded.clone();
        for (id, s) in &self.state {
            record.insert(*id, R::record_of(s));
        }
        record
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        self.state.clear();
        self.loaded = record;
        self
    }
}

/// A buffer of the inner backend as a rank-`D` tensor (for burn's records).
pub(crate) fn as_tensor<B: AutodiffBackend, const D: usize>(t: FloatTensor<Inner<B>>) -> Tensor<Inner<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}
