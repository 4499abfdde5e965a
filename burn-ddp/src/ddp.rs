//! DistributedDataParallel: one process per device; parameters start identical (broadcast from
//! rank 0), and after every backward pass gradients are averaged across ranks in buckets
//! (reverse registration order, flattened so the collective sees few large calls).
//!
//! Policy lives here (what to broadcast, when to average); the mechanism is the
//! [`ProcessGroup`](crate::ProcessGroup) and the tensor helpers.

use crate::error::{Error, Result};
use crate::process_group::ProcessGroup;
use crate::tensor;
use crate::ReduceOp;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_optim::{GradientsAccumulator, GradientsParams};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// DDP settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdpConfig {
    /// Largest bucket of flattened gradients per collective (PyTorch's default: 25 MiB).
    pub bucket_bytes: usize,
    /// PyTorch's `find_unused_parameters`: a parameter without a gradient on some ranks counts
    /// as a zero gradient there, one without a gradient anywhere is skipped. Off: either is
    /// [`Error::UnusedParameter`] naming the parameter (never a hang).
    pub find_unused_parameters: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self { bucket_bytes: 25 << 20, find_unused_parameters: false }
    }
}

/// Gradient-sync accounting, for the "sync share of the step" report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Calls to `sync_gradients`.
    pub steps: usize,
    /// Seconds spent in them (collectives and flattening).
    pub seconds: f64,
    /// Gradient bytes averaged, summed over steps.
    pub bytes: usize,
    /// Collectives issued, summed over steps.
    pub buckets: usize,
}

/// The DDP wrapper's state: the group, the settings and the statistics.
pub struct DistributedDataParallel {
    pg: Arc<dyn ProcessGroup>,
    config: DdpConfig,
    stats: Mutex<SyncStats>,
}

struct Broadcast<'a> {
    pg: &'a dyn ProcessGroup,
    error: Option<Error>,
}

impl<B: Backend> ModuleMapper<B> for Broadcast<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, value, mapper) = param.consume();
        if self.error.is_some() {
            return Param::from_mapped_value(id, value, mapper);
        }
        let grad = value.is_require_grad();
        let result = tensor::broadcast(self.pg, value.clone().detach(), 0);
        let new = match result {
            Ok(t) if grad => t.require_grad(),
            Ok(t) => t,
            Err(e) => {
                self.error = Some(e);
                value
            }
        };
        Param::from_mapped_value(id, new, mapper)
    }
}

/// One parameter's gradient, flattened, in visiting order.
struct Flat<B: Backend> {
    id: ParamId,
    shape: Vec<usize>,
    grad: Option<Tensor<B, 1>>,
}

struct Collect<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    out: Vec<Flat<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // Buffers (BatchNorm running statistics) are not trained: they have no gradient to sync.
        if !param.val().is_require_grad() {
            return;
        }
        let grad = self.grads.remove::<B::InnerBackend, D>(param.id);
        let shape = param.shape().dims::<D>().to_vec();
        self.out.push(Flat { id: param.id, shape, grad: grad.map(|g| g.reshape([-1])) });
    }
}

impl DistributedDataParallel {
    /// Wraps `pg` with `config`.
    pub fn new(pg: Arc<dyn ProcessGroup>, config: DdpConfig) -> Self {
        Self { pg, config, stats: Mutex::new(SyncStats::default()) }
    }

    /// The process group.
    pub fn process_group(&self) -> &dyn ProcessGroup {
        &*self.pg
    }

    /// Statistics so far.
    pub fn stats(&self) -> SyncStats {
        *self.stats.lock().expect("stats poisoned")
    }

    /// Replaces every float tensor of `module` (parameters and BatchNorm running statistics) with
    /// rank 0's, so all ranks start identical whatever their initialisation.
    ///
    /// # Errors
    /// As the broadcast collective.
    pub fn broadcast_module<B: Backend, M: Module<B>>(&self, module: M) -> Result<M> {
        let mut mapper = Broadcast { pg: &*self.pg, error: None };
        let module = module.map(&mut mapper);
        match mapper.error {
            Some(e) => Err(e),
            None => Ok(module),
        }
    }

    /// PyTorch's `no_sync`: adds one micro-batch's `grads` to `acc` on this rank only, with no
    /// communication. After the last micro-batch, pass `acc.grads()` to
    /// [`sync_gradients`](Self::sync_gradients) once: k micro-batches cost one all-reduce. Scale
    /// each micro-batch's loss by 1/k to average rather than sum them.
    pub fn no_sync<B: AutodiffBackend, M: AutodiffModule<B>>(&self, acc: &mut GradientsAccumulator<M>, module: &M, grads: GradientsParams) {
        acc.accumulate(module, grads);
    }

    /// Averages `grads` (of `module`) across ranks and returns them, ready for the optimiser.
    /// For gradient accumulation, collect micro-batches with [`no_sync`](Self::no_sync) and call
    /// this once per optimiser step.
    ///
    /// # Errors
    /// [`Error::UnusedParameter`] when a parameter has a gradient on some ranks but not others,
    /// or on none (unless `find_unused_parameters`), collective errors otherwise.
    pub fn sync_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: &M, mut grads: GradientsParams) -> Result<GradientsParams> {
        let started = Instant::now();
        let mut collect = Collect::<B> { grads: &mut grads, out: Vec::new() };
        module.visit(&mut collect);
        let mut flats = collect.out;
        flats.reverse(); // gradients of the last layers are ready first: PyTorch's bucket order

        // Every rank must agree on which parameters have gradients. The flags travel as a
        // tensor on the model's device, so this works on host and device (NCCL) groups alike.
        let flags: Vec<f32> = flats.iter().map(|f| f32::from(u8::from(f.grad.is_some()))).collect();
        let device = module.devices().into_iter().next().ok_or_else(|| Error::Unsupported { what: "DDP on a module without parameters".into() })?;
        // One collective: the maximum of [flags, -flags] gives "somewhere" and -"everywhere".
        let n = flags.len();
        let both: Vec<f32> = flags.iter().copied().chain(flags.iter().map(|f| -f)).collect();
        let both = Tensor::<B::InnerBackend, 1>::from_floats(both.as_slice(), &device);
        let maxed: Vec<f64> = tensor::all_reduce(&*self.pg, both, ReduceOp::Max)?.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default().into_iter().map(f64::from).collect();
        let present = &maxed[..n];
        let min: Vec<f64> = maxed[n..].iter().map(|v| -v).collect();
        let count = flats.len();
        let index_of = |i: usize| count - 1 - i;
        for (i, f) in flats.iter_mut().enumerate() {
            let (somewhere, everywhere) = (present[i] > 0.0, min[i] > 0.0);
            if everywhere {
                continue;
            }
            if !self.config.find_unused_parameters {
                return Err(Error::UnusedParameter { index: index_of(i), shape: f.shape.clone(), everywhere: !somewhere, rank: self.pg.rank() });
            }
            // Opted in (PyTorch's find_unused_parameters): unused everywhere is skipped; unused
            // here but used elsewhere contributes a zero gradient to the average.
            if somewhere && f.grad.is_none() {
                f.grad = Some(Tensor::zeros([f.shape.iter().product::<usize>()], &device));
            }
        }
        let mut out = GradientsParams::new();
        let mut bucket: Vec<Flat<B::InnerBackend>> = Vec::new();
        let mut bucket_bytes = 0;
        let (mut bytes, mut buckets) = (0, 0);
        let flush = |bucket: &mut Vec<Flat<B::InnerBackend>>, out: &mut GradientsParams| -> Result<()> {
            if bucket.is_empty() {
                return Ok(());
            }
            let parts: Vec<Tensor<B::InnerBackend, 1>> = bucket.iter_mut().map(|f| f.grad.take().expect("present")).collect();
            let sizes: Vec<usize> = parts.iter().map(|t| t.dims()[0]).collect();
            let flat = Tensor::cat(parts, 0);
            let reduced = tensor::all_reduce(&*self.pg, flat, ReduceOp::Mean)?;
            let mut offset = 0;
            for (f, n) in bucket.drain(..).zip(sizes) {
                let piece = reduced.clone().slice([offset..offset + n]);
                offset += n;
                register(out, f.id, piece, &f.shape);
            }
            Ok(())
        };
        for f in flats.into_iter().filter(|f| f.grad.is_some()) {
            let n = f.shape.iter().product::<usize>() * 4;
            if bucket_bytes + n > self.config.bucket_bytes && !bucket.is_empty() {
                flush(&mut bucket, &mut out)?;
                buckets += 1;
                bucket_bytes = 0;
            }
            bucket_bytes += n;
            bytes += n;
            bucket.push(f);
        }
        if !bucket.is_empty() {
            flush(&mut bucket, &mut out)?;
            buckets += 1;
        }
        let mut stats = self.stats.lock().expect("stats poisoned");
        stats.steps += 1;
        stats.seconds += started.elapsed().as_secs_f64();
        stats.bytes += bytes;
        stats.buckets += buckets;
        Ok(out)
    }
}

fn register<B: Backend>(out: &mut GradientsParams, id: ParamId, flat: Tensor<B, 1>, shape: &[usize]) {
    macro_rules! reg {
        ($($d:literal),*) => {
            match shape.len() {
                $( $d => out.register::<B, $d>(id, flat.reshape::<$d, _>(<[usize; $d]>::try_from(shape).expect("rank checked"))), )*
                d => panic!("Got a {d}-D parameter; DDP supports 1- to 6-D parameters"),
            }
        };
    }
    reg!(1, 2, 3, 4, 5, 6);
}
