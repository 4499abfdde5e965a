//! SyncBatchNorm's exchanges, shared by its f32 path (`sync_batch_norm`) and its channels-last
//! kernel path (`sync_batch_norm_nhwc`): the gather of every rank's moments, sums over the
//! ranks (on the device where the group allows) and Chan's combination.

use crate::error::Result;
use crate::process_group::ProcessGroup;
use crate::{ReduceOp, tensor};
use burn::prelude::*;
use std::sync::Arc;

/// All-gather built from a sum all-reduce (the one collective every group has on every memory
/// kind): each rank writes its slot of a zero buffer.
pub(crate) fn gather_plain<B: Backend>(local: Tensor<B, 1>, pg: &Arc<dyn ProcessGroup>) -> Result<Tensor<B, 1>> {
    let (w, r, k) = (pg.world_size(), pg.rank(), local.dims()[0]);
    let device = local.device();
    let mut parts = Vec::with_capacity(3);
    if r > 0 {
        parts.push(Tensor::zeros([r * k], &device));
    }
    parts.push(local);
    if r + 1 < w {
        parts.push(Tensor::zeros([(w - r - 1) * k], &device));
    }
    sum_over_ranks(pg, Tensor::cat(parts, 0), "SyncBatchNorm statistics")
}

/// `t` summed over the ranks: on the device without the host waiting where the group allows
/// it (`tensor::orders_on_device`), else by a blocking collective.
pub(crate) fn sum_over_ranks<B: Backend>(
    pg: &Arc<dyn ProcessGroup>,
    t: Tensor<B, 1>,
    label: &str,
) -> Result<Tensor<B, 1>> {
    if tensor::orders_on_device::<B>(&**pg, &t.device()) {
        let (summed, join) = tensor::all_reduce_on_device(pg.clone(), t, None, label.into())?;
        return Ok(tensor::join_on_device(summed, &join));
    }
    tensor::all_reduce(&**pg, t, ReduceOp::Sum)
}

/// Every rank's `[count, mean[c], M2[c]]`, gathered as `[world · (2c + 1)]`, combined with
/// Chan's formula: the mean `[1, c]`, the biased variance `[1, c]` and the total count `[1, 1]`.
pub(crate) fn combine<B: Backend>(
    gathered: Tensor<B, 1>,
    world: usize,
    c: usize,
) -> (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
    let g = gathered.reshape([world, 2 * c + 1]);
    let counts = g.clone().slice([0..world, 0..1]); // [w, 1]
    let means = g.clone().slice([0..world, 1..1 + c]); // [w, c]
    let m2s = g.slice([0..world, 1 + c..1 + 2 * c]); // [w, c]
    let total = counts.clone().sum().reshape([1, 1]);
    let mean = (means.clone() * counts.clone()).sum_dim(0) / total.clone(); // [1, c]
    let m2 = m2s.sum_dim(0) + ((means - mean.clone()).square() * counts).sum_dim(0);
    let var = m2 / total.clone(); // biased, as burn's BatchNorm normalises with
    (mean, var, total)
}

/// A group in an autodiff op's state (which must be `Debug`).
#[derive(Clone)]
pub(crate) struct GroupRef(pub Arc<dyn ProcessGroup>);

impl std::fmt::Debug for GroupRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.0.rank(), self.0.world_size())
    }
}
