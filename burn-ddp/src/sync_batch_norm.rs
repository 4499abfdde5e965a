//! SyncBatchNorm: BatchNorm whose training-mode statistics span every rank, with exact
//! gradients.
//!
//! Each rank computes its per-channel (count, mean, M2 = Σ(x − mean)²) and the ranks exchange
//! them in one collective; every rank combines them with Chan's parallel-variance formula (no
//! `E[x²] − mean²` cancellation), so counts may differ between ranks. The exchange is an autodiff
//! operation: its backward pass sums the statistics' gradients over the ranks (one more
//! collective), which carries every rank's loss into every rank's input gradient — the result
//! equals BatchNorm over the concatenated batch, values and gradients. Running statistics follow
//! burn's BatchNorm (biased variance, `momentum` weighting). Evaluation mode (a backend without
//! autodiff) uses the running statistics and never communicates, and neither does a world of one
//! process, where this is plain batch norm ([`crate::nn::batch_norm`]), as in PyTorch.
//!
//! It is a function over the parameters of [`crate::nn::layers::BatchNorm`] (burn-nn's, with settings),
//! so a model switches between the two without changing its parameters or checkpoints. The
//! caller passes the channels at axis 1 (a channels-last caller an NCHW view). A channels-last
//! layer trained on burn-cuda runs on the batch norm kernels of `nn` (`sync_batch_norm_nhwc`:
//! moments → exchange → normalise, gradient sums → sum over ranks → input gradient, in the
//! activations' type); everything else on burn's operations in f32.
//!
//! On an NCCL group with burn-cuda tensors the exchanges are summed on the device, ordered
//! after burn's stream (`tensor::all_reduce_on_device`): the host does not wait for them.

use crate::error::{Error, Result};
use crate::nn::batch_norm::ChannelRows;
use crate::nn::layers::BatchNorm;
use crate::process_group::ProcessGroup;
use crate::sync_batch_norm_exchange::{GroupRef, combine, gather_plain, sum_over_ranks};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::backend::AutodiffBackend;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use std::any::{Any, TypeId};
use std::sync::Arc;

/// `[k]` on every rank → `[world · k]`, rank r's values at `r·k..(r+1)·k`.
type GatherFn<B> = fn(Tensor<B, 1>, &Arc<dyn ProcessGroup>) -> Tensor<B, 1>;

/// What a model needs to run its BatchNorms synchronised: the group and the differentiable
/// exchange resolved for the training backend.
#[derive(Clone)]
pub struct BatchNormSync {
    pg: Arc<dyn ProcessGroup>,
    gather: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for BatchNormSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BatchNormSync {{ rank: {}, world: {} }}", self.pg.rank(), self.pg.world_size())
    }
}

impl BatchNormSync {
    /// Ranks the statistics span: with one, [`sync_batch_norm`] is plain batch norm, and a
    /// caller may take its own plain path instead.
    pub fn world_size(&self) -> usize {
        self.pg.world_size()
    }

    /// Statistics over `pg`'s ranks for a model trained on autodiff backend `B`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `B` is not burn's `Autodiff<_>`
    /// (with or without balanced checkpointing), whose graph the exchange hooks into.
    pub fn new<B: AutodiffBackend>(pg: Arc<dyn ProcessGroup>) -> Result<Self> {
        let ty = TypeId::of::<B>();
        let gather: Arc<dyn Any + Send + Sync> = if ty == TypeId::of::<Autodiff<B::InnerBackend, NoCheckpointing>>() {
            Arc::new(
                gather_autodiff::<B::InnerBackend, NoCheckpointing>
                    as GatherFn<Autodiff<B::InnerBackend, NoCheckpointing>>,
            )
        } else if ty == TypeId::of::<Autodiff<B::InnerBackend, BalancedCheckpointing>>() {
            Arc::new(
                gather_autodiff::<B::InnerBackend, BalancedCheckpointing>
                    as GatherFn<Autodiff<B::InnerBackend, BalancedCheckpointing>>,
            )
        } else {
            return Err(Error::Unsupported {
                what: format!(
                    "SyncBatchNorm on backend {}: it needs burn_autodiff::Autodiff<_>",
                    std::any::type_name::<B>()
                ),
            });
        };
        Ok(Self { pg, gather })
    }

    /// The group the statistics are exchanged in.
    pub fn process_group(&self) -> &Arc<dyn ProcessGroup> {
        &self.pg
    }

    fn gather<B: Backend>(&self, local: Tensor<B, 1>) -> Tensor<B, 1> {
        if B::ad_enabled(&local.device()) {
            let f = self
                .gather
                .downcast_ref::<GatherFn<B>>()
                .unwrap_or_else(|| panic!("SyncBatchNorm was set up for another backend than {}; build BatchNormSync::new::<YourAutodiffBackend>", std::any::type_name::<B>()));
            f(local, &self.pg)
        } else {
            gather_plain(local, &self.pg)
                .unwrap_or_else(|e| panic!("SyncBatchNorm: exchanging batch statistics failed: {e}"))
        }
    }
}

#[derive(Debug)]
struct GatherBackward;

impl<B: Backend> Backward<B, 1> for GatherBackward {
    type State = (GroupRef, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (GroupRef(pg), k) = ops.state;
        // Every rank runs this collective, whether or not its input needs the gradient, so the
        // ranks' collective sequences stay aligned.
        let g = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(grad));
        let summed = sum_over_ranks(&pg, g, "SyncBatchNorm statistic gradients")
            .unwrap_or_else(|e| panic!("SyncBatchNorm backward: summing statistic gradients failed: {e}"));
        if let Some(node) = parent {
            let r = pg.rank();
            let own = summed.slice([r * k..(r + 1) * k]);
            grads.register::<B>(node.id, own.into_primitive().tensor());
        }
    }
}

fn gather_autodiff<B: Backend, C: CheckpointStrategy>(
    local: Tensor<Autodiff<B, C>, 1>,
    pg: &Arc<dyn ProcessGroup>,
) -> Tensor<Autodiff<B, C>, 1> {
    let k = local.dims()[0];
    let ad = local.into_primitive().tensor();
    let inner = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(ad.primitive.clone()));
    let gathered =
        gather_plain(inner, pg).unwrap_or_else(|e| panic!("SyncBatchNorm: exchanging batch statistics failed: {e}"));
    let gathered = gathered.into_primitive().tensor();
    let out = match GatherBackward.prepare::<C>([ad.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((GroupRef(pg.clone()), k), gathered),
        OpsKind::UnTracked(prep) => prep.finish(gathered),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// BatchNorm over the batch of every rank of `sync`'s group, using `bn`'s parameters and
/// updating its running statistics; on a backend without autodiff (evaluation) it is
/// `bn.forward(x)` and does not communicate. Every rank must call it for the same layers in the
/// same order. The output has `x`'s element type.
///
/// # Shapes
/// - x: `[batch, channels, ...]` (batch may differ between ranks)
/// - output: as x
///
/// # Panics
/// When the exchange fails (a dead rank, a time-out): a forward pass has no error channel, and
/// the launcher stops the other ranks.
pub fn sync_batch_norm<B: Backend, const D: usize>(
    bn: &BatchNorm<B>,
    x: Tensor<B, D>,
    sync: &BatchNormSync,
) -> Tensor<B, D> {
    sync_batch_norm_act(bn, x, sync, false)
}

/// [`sync_batch_norm`] then ReLU (one pass on the channels-last kernels).
pub fn sync_batch_norm_relu<B: Backend, const D: usize>(
    bn: &BatchNorm<B>,
    x: Tensor<B, D>,
    sync: &BatchNormSync,
) -> Tensor<B, D> {
    sync_batch_norm_act(bn, x, sync, true)
}

fn sync_batch_norm_act<B: Backend, const D: usize>(
    bn: &BatchNorm<B>,
    mut x: Tensor<B, D>,
    sync: &BatchNormSync,
    relu: bool,
) -> Tensor<B, D> {
    let relu_if = |y: Tensor<B, D>| if relu { burn::tensor::activation::relu(y) } else { y };
    let device = x.device();
    // Evaluation (the running statistics), and a world of one (the global batch is this rank's
    // own): plain batch norm, as PyTorch's SyncBatchNorm (it synchronises only when training
    // over more than one process).
    if !B::ad_enabled(&device) || sync.pg.world_size() == 1 {
        match crate::same_type::cast::<Tensor<B, D>, Tensor<B, 4>>(x) {
            // The caller's NCHW-ordered dims, in the layer's own layout for `nn::batch_norm`.
            Ok(x4) => {
                let y = bn.layout.view_nchw(crate::nn::batch_norm(bn, bn.layout.view_from_nchw(x4), relu));
                return crate::same_type::cast(y).unwrap_or_else(|_| unreachable!("D is 4"));
            }
            Err(back) => x = back,
        }
    }
    if !B::ad_enabled(&device) {
        let dtype = x.dtype();
        return relu_if(bn.to_burn_nn().forward(x.cast(bn.gamma.val().dtype()))).cast(dtype);
    }
    // γ and β report their gradients to DDP as soon as this layer's backward has run, like
    // every burn-ddp layer's parameters (outside a DDP step: their plain values).
    let hooked = crate::grad_ready::active().then(|| bn.through_grad_hooks(&x));
    let bn = hooked.as_ref().unwrap_or(bn);
    #[cfg(feature = "cuda")]
    let x = match crate::sync_batch_norm_nhwc::try_sync_batch_norm(bn, x, &sync.pg, relu) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let (dtype, dims) = (x.dtype(), x.dims());
    let c = dims[1];
    let (at, rows) = ChannelRows::of(x.cast(burn::tensor::FloatDType::F32));
    let per_channel = at.per_channel();
    let mean_r = at.channel_sum(rows.clone()).div_scalar(per_channel as f64);
    let m2_r = at.channel_sum((rows.clone() - at.per_row(mean_r.clone())).square());
    let count = Tensor::<B, 1>::full([1], per_channel as f32, &device);
    let local = Tensor::cat(vec![count, mean_r, m2_r], 0);
    let (mean, var, _) = combine(sync.gather(local), sync.pg.world_size(), c);
    let (mean, var) = (mean.reshape([c]), var.reshape([c]));
    bn.update_running(mean.clone(), var.clone());
    let inv_std = (var + bn.epsilon).sqrt().recip();
    let y = (rows - at.per_row(mean)) * at.per_row(inv_std * bn.gamma.val()) + at.per_row(bn.beta.val());
    relu_if(y.reshape(dims)).cast(dtype)
}
