//! DistributedDataParallel: one process per device; parameters start identical (broadcast from
//! rank 0), and every step's gradients are averaged across ranks in buckets — by default while
//! backward still runs ([`DistributedDataParallel::step`]: a bucket's all-reduce starts as soon
//! as its gradients are final), or after it ([`DistributedDataParallel::sync_gradients`]).
//!
//! Policy lives here (what to broadcast, when to average, the bucket order); the mechanism is
//! [`crate::reducer`] (buckets, the communication thread), [`crate::grad_ready`] (gradient
//! notifications) and the [`ProcessGroup`](crate::ProcessGroup).

use crate::error::{Error, Result};
use crate::grad_ready::{GradSink, Scope};
use crate::process_group::ProcessGroup;
use crate::process_group::buffer::MemoryKind;
use crate::reducer::{CommThread, Plan, Route, Settings, StepReducer};
use crate::tensor;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorPrimitive};
use burn_optim::{GradientsAccumulator, GradientsParams};
use std::sync::{Arc, Mutex, OnceLock};
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
    /// Start each bucket's all-reduce during backward, as soon as its gradients are final
    /// (for parameters read through [`crate::grad_ready::param_val`], as burn-ddp's layers
    /// do), on a communication thread; the first step also re-orders the buckets by the order
    /// rank 0 saw the gradients finish. Off: all buckets after backward. On by default.
    ///
    /// With burn-cuda on an NCCL group a bucket's all-reduce is not run by a thread at all: it
    /// is enqueued on NCCL's stream behind a device-side fence on the kernels that produce it,
    /// and burn's stream waits for it only where the averaged gradients are read — the host
    /// waits for neither (`BURN_DDP_NCCL_HOST_SYNC=1` restores blocking collectives after
    /// backward, for comparison); the step's last bucket, whose gradients are the last that
    /// backward finishes, starts after it, in the operation that joins the step's buckets.
    /// There the collectives are issued in program order, so SyncBatchNorm may share the
    /// group. On host-memory groups the communication thread runs them: nothing else may use
    /// the group while backward runs, so turn overlap off with SyncBatchNorm on the same group
    /// (its backward exchanges statistics).
    pub overlap: bool,
    /// The type gradients travel in (PyTorch's `bf16_compress_hook` / `fp16_compress_hook`):
    /// each rank's f32 gradients, divided by the world size, are sent as bf16 or f16 — half
    /// the bytes — and the average comes back as f32; parameters and optimizer state stay
    /// f32. Off ([`GradCompression::None`]) by default: what pays across nodes, not within
    /// one.
    pub compression: GradCompression,
}

/// The type of DDP's gradient all-reduce ([`DdpConfig::compression`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GradCompression {
    /// f32, as computed.
    #[default]
    None,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half precision: 11 bits of mantissa, a range to ±65504 (gradients are divided by
    /// the world size first, as PyTorch's hook does).
    Fp16,
}

impl GradCompression {
    /// The element type gradients travel in.
    pub fn wire_type(self) -> DType {
        match self {
            Self::None => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::Fp16 => DType::F16,
        }
    }
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_bytes: 25 << 20,
            find_unused_parameters: false,
            overlap: true,
            compression: GradCompression::None,
        }
    }
}

/// Gradient-sync accounting, for the "sync share of the step" report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Calls to `sync_gradients`.
    pub steps: usize,
    /// Seconds the caller waited for them: `sync_gradients`'s whole time, or after an
    /// overlapped backward the wait for the buckets not yet done (the exposed sync).
    pub seconds: f64,
    /// Gradient bytes averaged, summed over steps.
    pub bytes: usize,
    /// Collectives issued, summed over steps.
    pub buckets: usize,
    /// Of those, the ones started while backward still ran.
    pub overlapped: usize,
    /// Of those, the ones summed on the device (NCCL ordered after burn's stream; the host
    /// waited for none of them).
    pub on_device: usize,
    /// burn tensor operations the reduction itself enqueued, summed over steps (on the
    /// device one per bucket — the last also joins them all — plus one per sum of a parameter
    /// read more than once).
    pub operations: usize,
}

/// The DDP wrapper's state: the group, the settings, the bucket plan and the statistics.
pub struct DistributedDataParallel {
    pg: Arc<dyn ProcessGroup>,
    config: DdpConfig,
    stats: Mutex<SyncStats>,
    /// The buckets of the model last stepped: built once, rebuilt in the order of finished
    /// gradients after the first overlapped step, and again only for other parameters.
    plan: Mutex<Option<Arc<Plan>>>,
    comm: OnceLock<Arc<CommThread>>,
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

/// The trained parameters (require a gradient) of a module, in registration order, and the
/// device of the first.
struct Params<B: Backend> {
    list: Vec<(ParamId, Vec<usize>)>,
    device: Option<B::Device>,
}

impl<B: Backend> ModuleVisitor<B> for Params<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // Buffers (BatchNorm running statistics) are not trained: they have no gradient to sync.
        // Read through the reference (`Deref`): no clone of the tensor.
        let value: &Tensor<B, D> = param;
        if value.is_require_grad() {
            self.device.get_or_insert_with(|| value.device());
            self.list.push((param.id, value.dims().to_vec()));
        }
    }
}

/// Whether a module's trained parameters are still those `expect` lists (ids and shapes, in
/// order), and the device of the first: the per-step check of the plan in force, one visit
/// that allocates nothing and clones no tensor.
struct SameParams<'a, B: Backend> {
    expect: &'a [(ParamId, Vec<usize>)],
    seen: usize,
    same: bool,
    device: Option<B::Device>,
}

impl<B: Backend> ModuleVisitor<B> for SameParams<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value: &Tensor<B, D> = param;
        if value.is_require_grad() {
            self.device.get_or_insert_with(|| value.device());
            let dims = value.dims();
            self.same &= self.expect.get(self.seen).is_some_and(|(id, s)| *id == param.id && s[..] == dims[..]);
            self.seen += 1;
        }
    }
}

/// The trained parameters' paths in the module (`layer1.0.conv1.weight`), in the order of
/// [`Params`]: only visited to name one in an error, off the per-step path.
#[derive(Default)]
struct ParamNames {
    names: Vec<String>,
    path: Vec<String>,
}

impl<B: Backend> ModuleVisitor<B> for ParamNames {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.val().is_require_grad() {
            self.names.push(self.path.join("."));
        }
    }
}

/// Fills in the module path of the parameter an [`Error::UnusedParameter`] names by index.
fn name_parameter<B: Backend, M: Module<B>>(e: Error, module: &M) -> Error {
    match e {
        Error::UnusedParameter { index, shape, everywhere, rank, .. } => {
            let mut names = ParamNames::default();
            module.visit(&mut names);
            Error::UnusedParameter {
                name: names.names.get(index).cloned().unwrap_or_default(),
                index,
                shape,
                everywhere,
                rank,
            }
        }
        other => other,
    }
}

/// Moves this rank's gradients from `grads` into the reducer. A slot the layers already
/// reported has no gradient left there (the hook took it): one that does was also read
/// directly, and that use would be lost (`mixed`).
struct Hand<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    plan: &'a Plan,
    reducer: &'a StepReducer<B::InnerBackend>,
    reported: &'a [bool],
    mixed: Option<usize>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Hand<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&slot) = self.plan.slot_of.get(&param.id) else { return };
        let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) else { return };
        match self.reported[slot] {
            true => _ = self.mixed.get_or_insert(self.plan.slots[slot].index),
            false => self.reducer.put(slot, g.into_primitive().tensor()),
        }
    }
}

/// One training step under DDP: open while the forward pass runs (burn-ddp's layers report
/// their parameters' gradients to it during backward), closed by [`DdpStep::backward`].
pub struct DdpStep<'a, B: AutodiffBackend> {
    ddp: &'a DistributedDataParallel,
    reducer: Arc<StepReducer<B::InnerBackend>>,
    scope: Option<Scope>,
}

impl<B: AutodiffBackend> DdpStep<'_, B> {
    /// Runs backward from `loss` (all-reducing buckets as they finish, when overlapping) and
    /// returns `module`'s gradients averaged over the ranks, ready for the optimizer.
    ///
    /// # Errors
    /// As [`DistributedDataParallel::sync_gradients`].
    pub fn backward<M: AutodiffModule<B>>(mut self, loss: Tensor<B, 1>, module: &M) -> Result<GradientsParams> {
        let uses = self.scope.take().map(|s| s.uses()).unwrap_or_default();
        self.reducer.expect_uses(&uses);
        let grads = GradientsParams::from_grads(loss.backward(), module);
        // What follows is the exposed part of the sync: waiting for buckets not yet done.
        let reported: Vec<bool> = self.reducer.reported();
        self.ddp.finish(module, grads, &self.reducer, &reported, Instant::now())
    }
}

impl DistributedDataParallel {
    /// Wraps `pg` with `config`.
    pub fn new(pg: Arc<dyn ProcessGroup>, config: DdpConfig) -> Self {
        Self { pg, config, stats: Mutex::new(SyncStats::default()), plan: Mutex::new(None), comm: OnceLock::new() }
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
        // Burn's `RunningState` (BatchNorm statistics) keeps training-mode updates per thread
        // until read, and `map` sees only the value from before them. Making a record folds
        // them in (clones share the state, so the module itself is synced) — after an identity
        // pass has drawn any lazily initialised parameter, which a clone would draw again.
        let module = crate::params::initialized(module);
        let _ = module.clone().into_record();
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
    pub fn no_sync<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        acc: &mut GradientsAccumulator<M>,
        module: &M,
        grads: GradientsParams,
    ) {
        acc.accumulate(module, grads);
    }

    /// Starts a training step: run the forward pass after this and finish with
    /// [`DdpStep::backward`]. With [`DdpConfig::overlap`] (a host-memory group, or burn-cuda
    /// on an NCCL group), each bucket's all-reduce starts during backward as soon as its
    /// gradients are final.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a module without trained parameters, or for an autodiff
    /// backend other than burn's `Autodiff<_>` when overlapping.
    pub fn step<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: &M) -> Result<DdpStep<'_, B>> {
        let reducer = crate::trace::span("ddp: plan the step (host)", crate::trace::DDP, || {
            self.reducer::<B, M>(module, self.config.overlap)
        })?;
        let scope = match reducer.overlapping() {
            true => Some(Scope::enter::<B>(
                reducer.clone() as Arc<dyn GradSink<B::InnerBackend>>,
                reducer.plan().slot_of.clone(),
            )?),
            false => None,
        };
        Ok(DdpStep { ddp: self, reducer, scope })
    }

    /// Averages `grads` (of `module`) across ranks after backward and returns them, ready for
    /// the optimiser. For gradient accumulation, collect micro-batches with
    /// [`no_sync`](Self::no_sync) and call this once per optimiser step.
    ///
    /// # Errors
    /// [`Error::UnusedParameter`] when a parameter has a gradient on some ranks but not others,
    /// or on none (unless `find_unused_parameters`), collective errors otherwise.
    pub fn sync_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams> {
        let reducer = self.reducer::<B, M>(module, false)?;
        let reported = vec![false; reducer.plan().slots.len()];
        self.finish(module, grads, &reducer, &reported, Instant::now())
    }

    /// This step's reducer over `module`'s trained parameters, in the bucket order in force;
    /// `overlap`: whether buckets may start during backward.
    fn reducer<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        overlap: bool,
    ) -> Result<Arc<StepReducer<B::InnerBackend>>> {
        let (plan, device) = self.plan_for(module);
        let device =
            device.ok_or_else(|| Error::Unsupported { what: "DDP on a module without trained parameters".into() })?;
        let route = if tensor::orders_on_device::<B::InnerBackend>(&*self.pg, &device) {
            Route::Device { overlap }
        } else if overlap && self.pg.memory() == MemoryKind::Host {
            Route::Thread(self.comm.get_or_init(|| Arc::new(CommThread::spawn(self.pg.rank()))).clone())
        } else {
            Route::Inline
        };
        let settings =
            Settings { find_unused: self.config.find_unused_parameters, wire: self.config.compression.wire_type() };
        Ok(Arc::new(StepReducer::new(plan, self.pg.clone(), route, settings, device)))
    }

    /// The plan of the model last stepped when `module`'s trained parameters are still its
    /// parameters; else a new one, its buckets in reverse registration order until an
    /// overlapped step fixes theirs. With the device of the first trained parameter (none when
    /// there is none).
    fn plan_for<B: Backend, M: Module<B>>(&self, module: &M) -> (Arc<Plan>, Option<B::Device>) {
        let mut plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plan.as_ref() {
            let mut check = SameParams::<B> { expect: &p.params, seen: 0, same: true, device: None };
            module.visit(&mut check);
            if check.same && check.seen == p.params.len() {
                return (p.clone(), check.device);
            }
        }
        let mut params = Params::<B> { list: Vec::new(), device: None };
        module.visit(&mut params);
        let built = Arc::new(Plan::new(params.list, self.config.bucket_bytes, None));
        (plan.insert(built).clone(), params.device)
    }

    /// Hands the rest of this rank's gradients to `reducer`, waits for every bucket and
    /// returns the averages; the first overlapped step also fixes the bucket order.
    fn finish<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        mut grads: GradientsParams,
        reducer: &StepReducer<B::InnerBackend>,
        reported: &[bool],
        started: Instant,
    ) -> Result<GradientsParams> {
        let plan = reducer.plan().clone();
        let mut hand = Hand::<B> { grads: &mut grads, plan: &plan, reducer, reported, mixed: None };
        crate::trace::span("ddp: hand over the gradients (host)", crate::trace::DDP, || module.visit(&mut hand));
        let mixed = hand.mixed;
        let early = reducer.launched_early();
        let (reduced, bytes) = crate::trace::span("ddp: finish (host)", crate::trace::DDP, || reducer.finish())
            .map_err(|e| name_parameter(e, module))?;
        if let Some(index) = mixed {
            let mut names = ParamNames::default();
            module.visit(&mut names);
            let name = names.names.get(index).cloned().unwrap_or_default();
            return Err(Error::Unsupported {
                what: format!(
                    "DDP: parameter `{name}` was read both through burn_ddp::grad_ready::param_val and directly in one forward pass, so its bucket was summed without the direct use; read it one way"
                ),
            });
        }
        if reducer.overlapping() && plan.order.is_none() {
            self.fix_order::<B::InnerBackend>(&plan, reducer.finish_order(), &reducer.device())?;
        }
        let mut out = GradientsParams::new();
        for (slot, grad) in reduced {
            let slot = &plan.slots[slot];
            register::<B::InnerBackend>(&mut out, slot.id, grad, slot.shape.len());
        }
        let mut stats = self.stats.lock().expect("stats poisoned");
        stats.steps += 1;
        stats.seconds += started.elapsed().as_secs_f64();
        stats.bytes += bytes;
        stats.buckets += reducer.bucket_count();
        stats.overlapped += early;
        stats.on_device += if reducer.on_device() { reducer.bucket_count() } else { 0 };
        stats.operations += reducer.operations();
        Ok(out)
    }

    /// Keeps rank 0's order of finished gradients (every rank the same) for the next steps'
    /// buckets, as PyTorch rebuilds its buckets after the first iteration.
    fn fix_order<D: Backend>(&self, plan: &Plan, order: Vec<usize>, device: &D::Device) -> Result<()> {
        let values: Vec<f32> = order.iter().map(|&i| i as f32).collect();
        let shared = tensor::broadcast(&*self.pg, Tensor::<D, 1>::from_floats(values.as_slice(), device), 0)?;
        let order: Vec<usize> =
            shared.into_data().convert::<f32>().to_vec::<f32>().expect("f32").into_iter().map(|v| v as usize).collect();
        log::debug!("DDP buckets re-ordered by the first step's gradient order");
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Arc::new(Plan::new(plan.params.clone(), self.config.bucket_bytes, Some(order))));
        Ok(())
    }
}

/// Registers `grad` (already in its parameter's shape, of `rank` dimensions) as `id`'s.
fn register<B: Backend>(out: &mut GradientsParams, id: ParamId, grad: FloatTensor<B>, rank: usize) {
    macro_rules! reg {
        ($($d:literal),*) => {
            match rank {
                $( $d => out.register::<B, $d>(id, Tensor::from_primitive(TensorPrimitive::Float(grad))), )*
                d => panic!("Got a {d}-D parameter; DDP supports 1- to 6-D parameters"),
            }
        };
    }
    reg!(1, 2, 3, 4, 5, 6);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::{CommBackend, RendezvousConfig, init_process_group};
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::{Linear, LinearConfig};

    type B = Autodiff<Flex>;

    /// The plan in force serves every step while the module's trained parameters are the ones
    /// it was built for (ids and shapes, in order), and is rebuilt when they are not: another
    /// model, a parameter no longer trained, a parameter of another shape. (Trained: a
    /// parameter that requires a gradient, so only on an autodiff backend.)
    #[test]
    fn the_plan_is_kept_while_the_trained_parameters_are_the_same() {
        let device = Default::default();
        let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::single_process(0)).unwrap();
        let ddp = DistributedDataParallel::new(pg, DdpConfig::default());
        let two = |d_in| -> Vec<Linear<B>> {
            vec![LinearConfig::new(d_in, 3).init(&device), LinearConfig::new(3, 2).with_bias(false).init(&device)]
        };
        let model = two(4);
        let (first, dev) = ddp.plan_for(&model);
        assert_eq!(dev, Some(device));
        let shapes: Vec<Vec<usize>> = first.params.iter().map(|(_, s)| s.clone()).collect();
        assert_eq!(shapes, [vec![4, 3], vec![3], vec![3, 2]]);
        assert!(Arc::ptr_eq(&first, &ddp.plan_for(&model).0), "the same parameters keep the plan");
        let other = two(4);
        let second = ddp.plan_for(&other).0;
        assert!(!Arc::ptr_eq(&first, &second), "other parameter ids: a new plan");
        let mut frozen = other.clone();
        frozen[0].bias = frozen[0].bias.take().map(|p| p.set_require_grad(false));
        let third = ddp.plan_for(&frozen).0;
        assert_eq!(third.params.len(), 2, "a parameter no longer trained leaves the plan");
        assert!(Arc::ptr_eq(&third, &ddp.plan_for(&frozen).0));
        let mut reshaped = frozen.clone();
        reshaped[0].weight = Param::initialized(frozen[0].weight.id, Tensor::zeros([5, 3], &device).require_grad());
        let fourth = ddp.plan_for(&reshaped).0;
        assert!(!Arc::ptr_eq(&third, &fourth), "the same id with another shape: a new plan");
        assert_eq!(fourth.params[0].1, [5, 3]);
    }
}
