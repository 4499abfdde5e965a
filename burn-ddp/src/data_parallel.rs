//! DataParallel: one process, several devices, one thread each — PyTorch's `nn.DataParallel`.
//!
//! Every step replicates the model onto each device, splits the batch into contiguous shards,
//! runs forward and backward on all devices at once and reduces the gradients onto the first
//! device, weighted by shard size, so the result is the gradient of the mean loss over the whole
//! batch (what one device would compute). BatchNorm running statistics come from the first
//! device's shard, as in PyTorch.
//!
//! DDP is the better choice whenever it can run: DataParallel copies the parameters to every
//! device and the gradients back to one each step, funnels the reduction through the first
//! device, and shares one process (one host thread of Python in PyTorch's case) between devices,
//! while DDP's ranks overlap nothing but a bucketed all-reduce. It exists for parity with the
//! tutorial's comparison and for quick single-process experiments.

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{BasicOps, TensorKind};
use burn_optim::GradientsParams;
use std::ops::Range;

/// The devices of one DataParallel process.
#[derive(Debug, Clone)]
pub struct DataParallel<B: AutodiffBackend> {
    devices: Vec<B::Device>,
}

/// One step's outcome on all devices.
pub struct DataParallelStep<M, T> {
    /// The first device's replica after its forward pass (parameters unchanged, BatchNorm
    /// running statistics updated from its shard): continue training with it.
    pub model: M,
    /// The mean loss over the whole batch.
    pub loss: f64,
    /// Gradients of the mean loss, on the first device.
    pub grads: GradientsParams,
    /// What `loss_of` returned beside each shard's loss, in device order.
    pub outputs: Vec<T>,
}

/// Contiguous shards of `batch` rows over `parts` devices, sizes differing by at most one.
///
/// # Panics
/// If `batch < parts`: every device needs at least one row.
pub fn shard_rows(batch: usize, parts: usize) -> Vec<Range<usize>> {
    assert!(batch >= parts, "Got a batch of {batch} for {parts} devices; each device needs at least one row");
    let (base, extra) = (batch / parts, batch % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            start += len;
            start - len..start
        })
        .collect()
}

/// Moves every float tensor (parameters and running statistics) to `device` through host
/// memory, keeping ids and trainability. Only for a module whose running statistics it owns
/// (burn's `RunningState` is shared between clones and mapped in place).
struct ViaHost<'a, B: Backend> {
    device: &'a B::Device,
}

impl<B: Backend> ModuleMapper<B> for ViaHost<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let device = self.device;
        param.map(|t| {
            let tracked = t.is_require_grad();
            let moved = move_via_host(t, device);
            if tracked { moved.require_grad() } else { moved }
        })
    }
}

/// A copy of `model` on `device` that shares nothing mutable with it: fresh running statistics
/// (clones of a burn module share them), values copied through host memory (cubecl's
/// device-to-device copies from worker threads failed on GPUs).
fn replica<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, device: &B::Device) -> M {
    let fresh = M::from_inner(model.valid());
    if fresh.devices().first() == Some(device) { fresh } else { fresh.map(&mut ViaHost::<B> { device }) }
}

/// `t` on `device`, through host memory when it is elsewhere.
fn move_via_host<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    t: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K> {
    if &t.device() == device { t } else { Tensor::from_data(t.into_data(), device) }
}

struct Materialize;

impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

struct Combine<'a, B: AutodiffBackend> {
    parts: &'a mut [(GradientsParams, f64)],
    device: B::Device,
    out: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Combine<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let id: ParamId = param.id;
        let mut sum: Option<Tensor<B::InnerBackend, D>> = None;
        for (grads, weight) in self.parts.iter_mut() {
            if let Some(g) = grads.remove::<B::InnerBackend, D>(id) {
                let g = move_via_host(g, &self.device) * *weight;
                sum = Some(match sum {
                    Some(s) => s + g,
                    None => g,
                });
            }
        }
        if let Some(s) = sum {
            self.out.register::<B::InnerBackend, D>(id, s);
        }
    }
}

impl<B: AutodiffBackend> DataParallel<B> {
    /// DataParallel over `devices` (the first one holds the model and the reduced gradients).
    ///
    /// # Panics
    /// If `devices` is empty.
    pub fn new(devices: Vec<B::Device>) -> Self {
        assert!(!devices.is_empty(), "DataParallel needs at least one device");
        Self { devices }
    }

    /// The devices, first one first.
    pub fn devices(&self) -> &[B::Device] {
        &self.devices
    }

    /// Splits a batch (dimension 0) into one contiguous shard per device, as [`shard_rows`]
    /// does, each on its device: PyTorch's `scatter`. The copies go through host memory on the
    /// calling thread (cubecl's device-to-device copies from worker threads failed on GPUs).
    ///
    /// # Panics
    /// If the batch has fewer rows than there are devices.
    pub fn scatter<const D: usize, K: TensorKind<B> + BasicOps<B>>(
        &self,
        batch: Tensor<B, D, K>,
    ) -> Vec<Tensor<B, D, K>> {
        let rows = batch.dims()[0];
        shard_rows(rows, self.devices.len())
            .into_iter()
            .zip(&self.devices)
            .map(|(r, device)| move_via_host(batch.clone().slice([r]), device))
            .collect()
    }

    /// Forward and backward of `loss_of(replica, i, device)` — which returns the mean loss of
    /// shard `i` of a `batch`-row batch (see [`scatter`](Self::scatter)) computed on `device`,
    /// and anything else the caller wants back (e.g. a correct-prediction count) — on every
    /// device in its own thread, then the gradients reduced onto the first device.
    ///
    /// # Panics
    /// If a device thread panics, or `batch` is smaller than the number of devices.
    pub fn step<M, T, F>(&self, model: M, batch: usize, loss_of: F) -> DataParallelStep<M, T>
    where
        M: AutodiffModule<B> + Send,
        T: Send,
        F: Fn(M, usize, &B::Device) -> (Tensor<B, 1>, T) + Sync,
    {
        let shards = shard_rows(batch, self.devices.len());
        // Burn draws a parameter's initial value when it is first read; a clone made before
        // that would draw its own. Read them all once so every replica holds the same values.
        model.visit(&mut Materialize);
        let results: Vec<(M, GradientsParams, f64, f64, T)> = std::thread::scope(|scope| {
            let handles: Vec<_> = shards
                .iter()
                .zip(&self.devices)
                .enumerate()
                .map(|(i, (rows, device))| {
                    let replica = replica(&model, device);
                    let loss_of = &loss_of;
                    let weight = rows.len() as f64 / batch as f64;
                    scope.spawn(move || {
                        let (loss, extra) = loss_of(replica.clone(), i, device);
                        let value: f64 = loss.clone().into_scalar().elem();
                        let grads = GradientsParams::from_grads(loss.backward(), &replica);
                        (replica, grads, weight, value, extra)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a DataParallel device thread panicked")).collect()
        });
        let loss = results.iter().map(|r| r.2 * r.3).sum();
        let mut it = results.into_iter();
        let (first, g0, w0, _, x0) = it.next().expect("at least one device");
        let (mut parts, mut outputs) = (vec![(g0, w0)], vec![x0]);
        for (_, g, w, _, x) in it {
            parts.push((g, w));
            outputs.push(x);
        }
        let mut combine =
            Combine::<B> { parts: &mut parts, device: self.devices[0].clone(), out: GradientsParams::new() };
        first.visit(&mut combine);
        DataParallelStep { model: first, loss, grads: combine.out, outputs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_once() {
        assert_eq!(shard_rows(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(shard_rows(4, 4), vec![0..1, 1..2, 2..3, 3..4]);
        let s = shard_rows(257, 8);
        assert_eq!(s.iter().map(|r| r.len()).sum::<usize>(), 257);
        assert!(s.windows(2).all(|w| w[0].end == w[1].start));
    }

    #[test]
    #[should_panic(expected = "each device needs at least one row")]
    fn too_small_a_batch_is_refused() {
        shard_rows(1, 2);
    }
}
