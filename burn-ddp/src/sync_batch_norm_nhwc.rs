//! SyncBatchNorm of a channels-last layer trained on burn-cuda, on `nn`'s batch norm kernels
//! (`nn::cuda::kernels::batch_norm_phases`) — PyTorch's split of its SyncBatchNorm into per-rank statistics, an
//! exchange and an elementwise pass:
//!
//! - forward: this rank's `[count, mean, M2]` (one read of `x`), gathered from every rank and
//!   combined with Chan's formula (as the f32 path does), then one pass writing
//!   `relu?(γ·(x − mean)/σ + β)` in the activations' type;
//! - backward: this rank's `Σ dz·(x − mean)/σ` and `Σ dz` (one read of `x` and `dy`), summed
//!   over the ranks and divided by the total count, then one pass writing `dx`. γ and β get this
//!   rank's own sums (DDP averages them as every parameter's gradient), so the result equals
//!   BatchNorm over the concatenated batch, values and gradients.
//!
//! The exchanges run where the group can sum without the host waiting (NCCL on the device),
//! else by blocking collectives (TCP through the host). Anything the kernels refuse falls back
//! to the f32 path of SyncBatchNorm (its caller).

use crate::nn::Layout;
use crate::nn::cuda::kernels::batch_norm_phases::{self as phases, Affine};
use crate::nn::layers::BatchNorm;
use crate::process_group::ProcessGroup;
use crate::same_type::cast;
use crate::sync_batch_norm_exchange::{GroupRef, combine, gather_plain, sum_over_ranks};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use std::any::Any;
use std::sync::Arc;

type Ad = Autodiff<Cuda>;
type Prim = FloatTensor<Cuda>;

fn tensor<const D: usize>(p: Prim) -> Tensor<Cuda, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The kernel path for `x` (NCHW-ordered dims of a channels-last layer) when `B` is
/// `Autodiff<Cuda>`, `bn` is channels-last and the kernels are on; `x` back untouched otherwise
/// (and, with one warning, when the kernels refuse it).
pub(crate) fn try_sync_batch_norm<B: Backend, const D: usize>(
    bn: &BatchNorm<B>,
    x: Tensor<B, D>,
    pg: &Arc<dyn ProcessGroup>,
    relu: bool,
) -> std::result::Result<Tensor<B, D>, Tensor<B, D>> {
    if bn.layout != Layout::Nhwc || !crate::nn::settings::options::get().nhwc_bn_kernels {
        return Err(x);
    }
    let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Ad>>() else { return Err(x) };
    let x: Tensor<Ad, 4> = cast(x)?;
    let nhwc = Layout::Nhwc.view_from_nchw(x.clone());
    match train(bn, nhwc, pg, relu) {
        Ok(y) => Ok(cast(Layout::Nhwc.view_nchw(y)).unwrap_or_else(|_| unreachable!("B is Autodiff<Cuda>, D is 4"))),
        Err(e) => {
            log::warn!("SyncBatchNorm runs on burn's f32 operations: the channels-last kernels refused: {e}");
            Err(cast(x).unwrap_or_else(|_| unreachable!("B is Autodiff<Cuda>, D is 4")))
        }
    }
}

fn train(bn: &BatchNorm<Ad>, x: Tensor<Ad, 4>, pg: &Arc<dyn ProcessGroup>, relu: bool) -> crate::Result<Tensor<Ad, 4>> {
    let c = x.dims()[3];
    let xp = x.into_primitive().tensor();
    let (gamma, beta) = (bn.gamma.val().into_primitive().tensor(), bn.beta.val().into_primitive().tensor());
    let local = tensor::<1>(phases::moments(&xp.primitive)?);
    let gathered =
        gather_plain(local, pg).unwrap_or_else(|e| panic!("SyncBatchNorm: exchanging batch statistics failed: {e}"));
    let (mean, var, total) = combine(gathered, pg.world_size(), c);
    let (mean, var) = (mean.reshape([c]), var.reshape([c]));
    bn.update_running(Tensor::<Ad, 1>::from_inner(mean.clone()), Tensor::from_inner(var.clone()));
    let inv_std = var.add_scalar(bn.epsilon).sqrt().recip();
    let prim = |t: Tensor<Cuda, 1>| -> Prim { t.into_primitive().tensor() };
    let affine = Affine {
        mean: prim(mean),
        inv_std: prim(inv_std),
        gamma: gamma.primitive.clone(),
        beta: beta.primitive.clone(),
        relu,
    };
    let y = phases::normalize(&xp.primitive, &affine)?;
    let saved = Saved { x: xp.primitive.clone(), affine, total: prim(total.reshape([1])), group: GroupRef(pg.clone()) };
    let out = match SyncNhwcBatchNorm
        .prepare::<NoCheckpointing>([xp.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

#[derive(Debug)]
struct SyncNhwcBatchNorm;

fn fail<T>(e: crate::Error) -> T {
    panic!("SyncBatchNorm backward on the channels-last kernels failed: {e}")
}

/// What the backward pass needs: the input, the normalisation, the total count over the ranks
/// and the group.
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    affine: Affine,
    total: Prim,
    group: GroupRef,
}

impl Backward<Cuda, 3> for SyncNhwcBatchNorm {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let s = ops.state;
        let dy = tensor::<4>(grads.consume::<Cuda>(&ops.node)).cast(s.x.dtype).into_primitive().tensor();
        let (dgamma, dbeta) = phases::grad_sums(&s.x, &dy, &s.affine).unwrap_or_else(fail);
        // Every rank runs this collective, whether or not its input needs the gradient, so the
        // ranks' collective sequences stay aligned.
        let c = s.x.shape.as_slice()[3];
        let both = Tensor::cat(vec![tensor::<1>(dgamma.clone()), tensor::<1>(dbeta.clone())], 0);
        let summed = sum_over_ranks(&s.group.0, both, "SyncBatchNorm gradient sums").unwrap_or_else(fail);
        let per_row = summed / tensor::<1>(s.total.clone());
        let (dgamma_m, dbeta_m) = (
            per_row.clone().slice([0..c]).into_primitive().tensor(),
            per_row.slice([c..2 * c]).into_primitive().tensor(),
        );
        if let Some(node) = node_x {
            let dx = phases::input_grad(&s.x, &dy, &s.affine, dgamma_m, dbeta_m).unwrap_or_else(fail);
            grads.register::<Cuda>(node.id, dx);
        }
        for (node, grad) in [(node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}
