//! What the fused optimizers share: one parameter's inputs and result, where a step's gradients
//! come from, and putting the updated values back into the module.

use burn::module::{ModuleMapper, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_optim::{GradientsParams, MultiGradientsParams};
use hashbrown::HashMap;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// One parameter's inputs to a step of a fused rule, as buffers of any rank.
pub struct Entry<B: Backend, S> {
    pub(crate) id: ParamId,
    pub(crate) param: FloatTensor<B>,
    pub(crate) grad: FloatTensor<B>,
    /// The rule's state from the last step (`None` on the parameter's first step).
    pub(crate) state: Option<S>,
}

/// One parameter's step result: `(id, new value, new state)`.
pub type Done<B, S> = (ParamId, FloatTensor<B>, Option<S>);

/// Where the gradients come from: one device's, or several devices' to be summed.
pub(crate) enum Grads {
    Single(GradientsParams),
    Multi(MultiGradientsParams),
}

impl Grads {
    pub(crate) fn remove<B: Backend, const D: usize>(&mut self, id: ParamId) -> Option<Tensor<B, D>> {
        match self {
            Grads::Single(g) => g.remove(id),
            Grads::Multi(g) => g.remove(id).map(|(t, _)| t),
        }
    }
}

/// Puts the updated values in place of the parameters (keeping whether they require a gradient).
pub(crate) struct Replace<B: AutodiffBackend> {
    /// The new values, by parameter.
    pub(crate) updated: HashMap<ParamId, FloatTensor<Inner<B>>>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Replace<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, value, mapper) = param.consume();
        let value = match self.updated.remove(&id) {
            Some(new) => {
                let new = Tensor::from_inner(Tensor::<Inner<B>, D>::from_primitive(TensorPrimitive::Float(new)));
                if value.is_require_grad() { new.require_grad() } else { new }
            }
            None => value,
        };
        Param::from_mapped_value(id, value, mapper)
    }
}
