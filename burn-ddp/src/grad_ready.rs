//! Gradient-ready notifications during burn's backward pass, for DDP's overlap of the
//! all-reduce with backward (PyTorch's reducer uses autograd hooks for the same).
//!
//! burn 0.21 runs a backward pass depth by depth (distance from the leaves, deepest first), so
//! a parameter's own leaf is reached only at the very end: a hook on the leaf would fire after
//! all of backward. Instead a layer reads a parameter through [`param_val`], which, while a
//! [`Scope`] is active on the thread, inserts an identity operation whose parents are the
//! parameter *and the layer's input* (the anchor). Its depth is then one below the layer's own
//! operation, so it runs right after that operation's backward — when the parameter's gradient
//! is final — and hands the gradient to the scope's [`GradSink`], which takes it: the
//! parameter's leaf gets no gradient from that use (nothing else holds the buffer, so DDP may
//! average it in place), and nothing is registered for the anchor. burn-ddp's layers (`nn::Conv2d`, `nn::BatchNorm`) read their parameters this way;
//! a user's layer can too. Outside a scope, or on a backend without autodiff, [`param_val`] is
//! `param.val()`.
//!
//! This module sits beside `nn` (which imports it) and below `ddp` (which opens scopes); it
//! knows no process group.

use crate::error::{Error, Result};
use burn::module::{Param, ParamId};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Receives parameter gradients (in the parameter's shape, in the inner backend) as backward
/// finishes them, and owns them from then on.
pub trait GradSink<B: Backend>: Send + Sync {
    /// One use's gradient of the parameter in `slot`; a parameter read `n` times in the
    /// forward pass (see [`Scope::uses`]) sends `n` of them.
    fn ready(&self, slot: usize, grad: FloatTensor<B>);
}

/// The identity with a notification, on the primitives of one backend: `(param, anchor, sink,
/// slot) → param`.
type HookFn<B> = fn(FloatTensor<B>, FloatTensor<B>, &Arc<dyn Any + Send + Sync>, usize) -> FloatTensor<B>;

struct Active {
    /// A `HookFn<AB>` for the scope's autodiff backend `AB`.
    hook: Arc<dyn Any + Send + Sync>,
    /// An `Arc<dyn GradSink<AB::InnerBackend>>`.
    sink: Arc<dyn Any + Send + Sync>,
    slots: Arc<HashMap<ParamId, usize>>,
    uses: Arc<Mutex<Vec<usize>>>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// While alive, parameters in `slots` read through [`param_val`] on this thread notify the
/// sink; dropping it ends that.
pub struct Scope {
    uses: Arc<Mutex<Vec<usize>>>,
}

impl Scope {
    /// Opens a scope on this thread for autodiff backend `AB`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `AB` is not burn's `Autodiff<_>` (with or without balanced
    /// checkpointing), or when a scope is already open on this thread.
    pub fn enter<AB: AutodiffBackend>(
        sink: Arc<dyn GradSink<AB::InnerBackend>>,
        slots: Arc<HashMap<ParamId, usize>>,
    ) -> Result<Self> {
        let hook = hook_for::<AB>()?;
        let uses = Arc::new(Mutex::new(vec![0; slots.values().max().map_or(0, |m| m + 1)]));
        let sink: Arc<dyn Any + Send + Sync> = Arc::new(sink);
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            if a.is_some() {
                return Err(Error::Unsupported {
                    what: "two gradient-hook scopes on one thread (one DDP step at a time per thread)".into(),
                });
            }
            *a = Some(Active { hook, sink, slots, uses: uses.clone() });
            Ok(())
        })?;
        Ok(Self { uses })
    }

    /// How many times each slot's parameter was read through [`param_val`] so far.
    pub fn uses(&self) -> Vec<usize> {
        self.uses.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        ACTIVE.with(|a| *a.borrow_mut() = None);
    }
}

/// Whether a [`Scope`] is open on this thread (layers skip the hook work when not).
pub fn active() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// `param.val()`, through the gradient hook when a [`Scope`] for this backend is open on the
/// thread and knows the parameter. `anchor` is the input of the operation that uses the
/// parameter (it orders the notification right after that operation's backward).
pub fn param_val<B: Backend, const D: usize, const DA: usize>(
    param: &Param<Tensor<B, D>>,
    anchor: &Tensor<B, DA>,
) -> Tensor<B, D> {
    let value = param.val();
    if !value.is_require_grad() {
        return value;
    }
    // Outside a scope (inference, or training without DDP's overlap) the value goes back as is.
    let found = ACTIVE.with(|a| {
        let a = a.borrow();
        let active = a.as_ref()?;
        let (slot, hook) = (*active.slots.get(&param.id)?, *active.hook.downcast_ref::<HookFn<B>>()?);
        active.uses.lock().unwrap_or_else(|p| p.into_inner())[slot] += 1;
        Some((slot, hook, active.sink.clone()))
    });
    match found {
        // The value moves into the hook: one clone of the parameter per read, as outside a scope.
        Some((slot, hook, sink)) => Tensor::from_primitive(TensorPrimitive::Float(hook(
            value.into_primitive().tensor(),
            anchor.clone().into_primitive().tensor(),
            &sink,
            slot,
        ))),
        None => value,
    }
}

struct HookState<B: Backend> {
    sink: Arc<dyn GradSink<B>>,
    slot: usize,
}

impl<B: Backend> Clone for HookState<B> {
    fn clone(&self) -> Self {
        Self { sink: self.sink.clone(), slot: self.slot }
    }
}

impl<B: Backend> std::fmt::Debug for HookState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gradient hook of slot {}", self.slot)
    }
}

#[derive(Debug)]
struct HookBackward;

impl<B: Backend> Backward<B, 2> for HookBackward {
    type State = HookState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        // The sink takes this use's gradient; the parameter's leaf gets none from it.
        let grad = grads.consume::<B>(&ops.node);
        ops.state.sink.ready(ops.state.slot, grad);
    }
}

fn hook_autodiff<B: Backend, C: CheckpointStrategy>(
    param: FloatTensor<Autodiff<B, C>>,
    anchor: FloatTensor<Autodiff<B, C>>,
    sink: &Arc<dyn Any + Send + Sync>,
    slot: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let sink = sink.downcast_ref::<Arc<dyn GradSink<B>>>().expect("the scope's sink is for this backend").clone();
    match HookBackward.prepare::<C>([param.node.clone(), anchor.node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(HookState { sink, slot }, param.primitive),
        OpsKind::UnTracked(prep) => prep.finish(param.primitive),
    }
}

fn hook_for<AB: AutodiffBackend>() -> Result<Arc<dyn Any + Send + Sync>> {
    let ty = TypeId::of::<AB>();
    if ty == TypeId::of::<Autodiff<AB::InnerBackend, NoCheckpointing>>() {
        return Ok(Arc::new(
            hook_autodiff::<AB::InnerBackend, NoCheckpointing> as HookFn<Autodiff<AB::InnerBackend, NoCheckpointing>>,
        ));
    }
    if ty == TypeId::of::<Autodiff<AB::InnerBackend, BalancedCheckpointing>>() {
        return Ok(Arc::new(
            hook_autodiff::<AB::InnerBackend, BalancedCheckpointing>
                as HookFn<Autodiff<AB::InnerBackend, BalancedCheckpointing>>,
        ));
    }
    Err(Error::Unsupported {
        what: format!(
            "gradient hooks on backend {}: they need burn_autodiff::Autodiff<_>",
            std::any::type_name::<AB>()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    type B = Autodiff<Flex>;

    #[derive(Default)]
    struct Record(Mutex<Vec<(usize, Vec<f32>)>>);

    impl GradSink<Flex> for Record {
        fn ready(&self, slot: usize, grad: FloatTensor<Flex>) {
            self.0.lock().unwrap().push((
                slot,
                Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(grad)).into_data().to_vec().unwrap(),
            ));
        }
    }

    /// Two layers `y = relu(x·a)·b`: b's notification comes first (right after its own
    /// operation's backward, before a's operation ran), each carries the parameter's gradient
    /// (its analytic value, in the parameter's shape), and the sink keeps it: the leaves get
    /// none, while a plain read outside the scope still gives the leaf its gradient.
    #[test]
    fn notifies_after_each_use_with_the_final_gradient() {
        let device = Default::default();
        let a = Param::from_tensor(Tensor::<B, 2>::from_floats([[1.0, -2.0], [3.0, 0.5]], &device));
        let b = Param::from_tensor(Tensor::<B, 2>::from_floats([[0.5], [-1.0]], &device));
        let slots = Arc::new(HashMap::from([(a.id, 0), (b.id, 1)]));
        let sink = Arc::new(Record::default());
        let scope = Scope::enter::<B>(sink.clone(), slots).unwrap();
        let x = Tensor::<B, 2>::from_floats([[1.0, 1.0], [2.0, -1.0]], &device);
        let h = burn::tensor::activation::relu(x.clone().matmul(param_val(&a, &x)));
        let y = h.clone().matmul(param_val(&b, &h));
        assert_eq!(scope.uses(), [1, 1]);
        drop(scope);
        let grads = y.sum().backward();
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 0], "b is final before a");
        // h = relu([[4, -1.5], [-1, -4.5]]) = [[4, 0], [0, 0]]; dy/db = column sums of h.
        assert_eq!(got[0].1, [4.0, 0.0]);
        // dy/da = xᵀ · (relu' ⊙ bᵀ): only h[0][0] is active, with b[0] = 0.5.
        assert_eq!(got[1].1, [0.5, 0.0, 0.5, 0.0]);
        assert!(a.val().grad(&grads).is_none() && b.val().grad(&grads).is_none(), "the sink took the hooked gradients");
        // Outside a scope: plain values, no notification, the leaf's own gradient.
        let grads = param_val(&a, &x).sum().backward();
        assert_eq!(sink.0.lock().unwrap().len(), 2);
        assert_eq!(a.val().grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(), [1.0, 1.0, 1.0, 1.0]);
    }
}
