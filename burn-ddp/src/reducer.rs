//! DDP's mechanism: trained parameters assigned to buckets (reverse registration order, up to
//! `bucket_bytes` each) by a [`Plan`] built once per model, each bucket's gradients summed over
//! the ranks by one collective, launched in bucket order as soon as every gradient of the
//! bucket (and of the buckets before it) is final — during backward when the layers report them
//! ([`crate::grad_ready`]), else all at once after it.
//!
//! Two routes. On the device ([`Route::Device`]: burn-cuda on NCCL) a bucket costs burn one
//! operation whatever its size, which hands its gradients to NCCL's stream (one NCCL group:
//! the large gradients summed in their own buffers, the small ones packed by a kernel into one
//! flat buffer and back: `cuda_tensor::all_reduce_bucket`); the step's last bucket, started
//! after backward, also makes burn's stream wait for all of the step's buckets in that same
//! operation (nothing of burn's would run between them) — and nobody waits on the host. On
//! host-memory groups (tcp) the bucket is flattened with burn's operations (one copy, the
//! presence counts at its tail) and averaged on the communication thread, where the collective
//! divides its sum by the world (the mean of `ReduceOp::Mean`): its members are then slices of
//! the result.
//!
//! Presence counts (one per parameter: 1 where this rank has the gradient, 0 where not) travel
//! with a bucket's sum where ranks must agree on missing gradients: always on host-memory
//! groups, and with `find_unused_parameters` on the device. Every rank then learns in the same
//! collective which parameters some rank did not use, so no rank can take a different path
//! (PyTorch's `find_unused_parameters` semantics, or an error naming the parameter). Without
//! them, on the device, a rank that lacks a gradient stops with that error after starting its
//! collectives, and its peers learn of it from the group.

use crate::diagnose::Diagnose;
use crate::error::{Error, Result};
use crate::grad_ready::GradSink;
use crate::process_group::ProcessGroup;
use crate::process_group::buffer::ReduceOp;
use crate::tensor;
use burn::module::ParamId;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

/// One trained parameter's place.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub id: ParamId,
    pub shape: Vec<usize>,
    /// Index in registration (visiting) order, for error messages.
    pub index: usize,
}

/// Parameters (in registration order) → slots and buckets: slots in `order` (registration
/// indices; by default reverse registration order, since the last layers' gradients are final
/// first), cut into a new bucket when one would pass `bucket_bytes` (f32 gradients).
pub(crate) fn plan(
    params: &[(ParamId, Vec<usize>)],
    bucket_bytes: usize,
    order: Option<&[usize]>,
) -> (Vec<Slot>, Vec<Vec<usize>>) {
    let reverse: Vec<usize> = (0..params.len()).rev().collect();
    let mut slots = Vec::with_capacity(params.len());
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0;
    for &index in order.unwrap_or(&reverse) {
        let (id, shape) = &params[index];
        let bytes = shape.iter().product::<usize>() * 4;
        if buckets.is_empty() || (filled + bytes > bucket_bytes && filled > 0) {
            buckets.push(Vec::new());
            filled = 0;
        }
        filled += bytes;
        buckets.last_mut().expect("pushed above").push(slots.len());
        slots.push(Slot { id: *id, shape: shape.clone(), index });
    }
    (slots, buckets)
}

/// A model's buckets, built once for its trained parameters and a bucket order, and kept by DDP
/// for every step they still describe.
pub(crate) struct Plan {
    /// The trained parameters (id and shape, registration order) it was built for.
    pub params: Vec<(ParamId, Vec<usize>)>,
    /// The bucket order it follows (registration indices), `None`: reverse registration.
    pub order: Option<Vec<usize>>,
    pub slots: Vec<Slot>,
    pub buckets: Vec<Vec<usize>>,
    /// Each trained parameter's slot.
    pub slot_of: Arc<HashMap<ParamId, usize>>,
}

impl Plan {
    pub fn new(params: Vec<(ParamId, Vec<usize>)>, bucket_bytes: usize, order: Option<Vec<usize>>) -> Self {
        let (slots, buckets) = plan(&params, bucket_bytes, order.as_deref());
        let slot_of = Arc::new(slots.iter().enumerate().map(|(i, s)| (s.id, i)).collect());
        Self { params, order, slots, buckets, slot_of }
    }
}

/// A job for the communication thread.
type Job = Box<dyn FnOnce() + Send>;

/// The thread that runs a group's bucket collectives, one after another, in launch order.
pub(crate) struct CommThread {
    jobs: Mutex<Sender<Job>>,
}

impl CommThread {
    pub fn spawn(rank: usize) -> Self {
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name(format!("burn-ddp-comm-{rank}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .expect("spawning DDP's communication thread");
        Self { jobs: Mutex::new(tx) }
    }

    fn run(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .expect("DDP's communication thread is alive while its DDP is");
    }
}

struct StepState<B: Backend> {
    /// Per slot: its gradient so far (summed over the uses reported).
    grads: Vec<Option<FloatTensor<B>>>,
    /// Per slot: uses reported.
    reported: Vec<usize>,
    /// Per slot: uses expected (0 until the forward pass has run).
    expected: Vec<usize>,
    /// Buckets launched so far (they launch in order).
    launched: usize,
    /// Slots in the order their gradients became final during backward.
    ready_order: Vec<usize>,
    /// Per launched bucket: its sum under way, and whether this rank had each member's gradient.
    results: Vec<(Pending<B>, Vec<bool>)>,
    /// Tensor operations this step's reduction enqueued.
    operations: usize,
}

/// A bucket's sum under way.
enum Pending<B: Backend> {
    /// On the communication thread (or done on the calling one): the flat sum, and the
    /// presence counts' sum when they travelled apart (compressed gradients).
    Host(Receiver<Result<Vec<Tensor<B, 1>>>>),
    /// On the device (NCCL after burn's stream): join before reading.
    Device(tensor::DeviceBucket<B>),
    /// Left as backward made them (`BURN_DDP_DIAGNOSE=no-device-ops`, a world of one).
    Kept(Vec<FloatTensor<B>>),
    /// Summed on the device and joined (by the step's last bucket's operation).
    Joined(Reduced<B>),
    /// Could not be started.
    Failed(Error),
}

/// A bucket's result: each member's average over the ranks (in its shape), and the summed
/// presence counts when they travelled.
struct Reduced<B: Backend> {
    grads: Vec<FloatTensor<B>>,
    presence: Option<Tensor<B, 1>>,
}

/// A bucket's gradients, whether this rank had each, and its presence counts where they travel.
type BucketInputs<B> = (Vec<FloatTensor<B>>, Vec<bool>, Option<Tensor<B, 1>>);

/// A step's result: each parameter's averaged gradient (slot, value in the parameter's shape),
/// in bucket order, and the bytes averaged.
pub(crate) type Averaged<B> = (Vec<(usize, FloatTensor<B>)>, usize);

/// How a step's buckets are summed.
#[derive(Clone)]
pub(crate) enum Route {
    /// On the calling thread, after backward (blocking collectives).
    Inline,
    /// On the communication thread, each as soon as it is ready (blocking collectives there).
    Thread(Arc<CommThread>),
    /// On the device, each as soon as it is ready: NCCL ordered after burn's stream; nobody
    /// waits (`tensor::all_reduce_bucket_on_device`).
    Device { overlap: bool },
}

/// What a step's reduction does with the gradients.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// PyTorch's `find_unused_parameters` (see `DdpConfig`).
    pub find_unused: bool,
    /// The type gradients travel in: f32, or bf16 / f16 (compressed).
    pub wire: DType,
}

/// One step's gradient reduction.
pub(crate) struct StepReducer<B: Backend> {
    plan: Arc<Plan>,
    pg: Arc<dyn ProcessGroup>,
    route: Route,
    settings: Settings,
    device: B::Device,
    state: Mutex<StepState<B>>,
}

impl<B: Backend> StepReducer<B> {
    pub fn new(
        plan: Arc<Plan>,
        pg: Arc<dyn ProcessGroup>,
        route: Route,
        settings: Settings,
        device: B::Device,
    ) -> Self {
        let n = plan.slots.len();
        let state = StepState {
            grads: vec![None; n],
            reported: vec![0; n],
            expected: vec![0; n],
            launched: 0,
            ready_order: Vec::new(),
            results: Vec::new(),
            operations: 0,
        };
        Self { plan, pg, route, settings, device, state: Mutex::new(state) }
    }

    /// The buckets this step follows.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The uses of each slot's parameter in the forward pass (from the hook scope); until this
    /// is called nothing launches during backward.
    pub fn expect_uses(&self, uses: &[usize]) {
        let mut s = self.lock();
        for (e, &u) in s.expected.iter_mut().zip(uses) {
            *e = u;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StepState<B>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn complete(s: &StepState<B>, slot: usize) -> bool {
        s.expected[slot] > 0 && s.reported[slot] == s.expected[slot]
    }

    /// Launches, in order, every bucket whose gradients are all final — on the device all but
    /// the step's last, which [`finish`](Self::finish) starts together with the join.
    fn launch_ready(&self, s: &mut StepState<B>) {
        while s.launched < self.early_buckets() && self.plan.buckets[s.launched].iter().all(|&i| Self::complete(s, i)) {
            let b = s.launched;
            crate::trace::span("ddp: start a bucket (host)", crate::trace::DDP, || self.launch(s, b));
        }
    }

    /// The buckets that start on their own: all of them, or on the device all but the step's
    /// last (started with the join, [`launch_last_and_join`](Self::launch_last_and_join)).
    fn early_buckets(&self) -> usize {
        self.plan.buckets.len().saturating_sub(usize::from(self.on_device()))
    }

    /// Whether presence counts travel with the buckets (see the module docs).
    fn sends_presence(&self) -> bool {
        !matches!(self.route, Route::Device { .. }) || self.settings.find_unused
    }

    /// Bucket `b`'s gradients (zeros for those this rank lacks), whether this rank had each,
    /// and its presence counts where they travel.
    fn bucket_inputs(&self, s: &mut StepState<B>, b: usize) -> BucketInputs<B> {
        let members = &self.plan.buckets[b];
        let mut present = Vec::with_capacity(members.len());
        let mut grads = Vec::with_capacity(members.len());
        for &i in members {
            present.push(s.grads[i].is_some());
            grads.push(s.grads[i].take().unwrap_or_else(|| {
                s.operations += 1;
                B::float_zeros(self.plan.slots[i].shape.clone().into(), &self.device, FloatDType::F32)
            }));
        }
        let presence = self.sends_presence().then(|| {
            s.operations += 1 + usize::from(!present.iter().all(|&p| p)) * present.len();
            self.presence(&present)
        });
        (grads, present, presence)
    }

    /// Starts bucket `b`'s sum over the ranks, with its presence counts where they travel.
    fn launch(&self, s: &mut StepState<B>, b: usize) {
        let (grads, present, presence) = self.bucket_inputs(s, b);
        let pending = match (&self.route, Diagnose::get(self.pg.world_size())) {
            (Route::Device { .. }, Diagnose::NoDeviceOps) if presence.is_none() => Pending::Kept(grads),
            (Route::Device { .. }, diagnose) => match self.start_on_device(s, (b, diagnose), (grads, presence), None) {
                Ok(tensor::Started::InFlight(bucket)) => Pending::Device(bucket),
                Ok(tensor::Started::Joined(_)) => unreachable!("a bucket joins others only when given them"),
                Err(e) => Pending::Failed(e),
            },
            (Route::Inline | Route::Thread(_), _) => {
                Pending::Host(self.launch_blocking(s, b, grads, presence, format!("all-reduce bucket {b}")))
            }
        };
        s.results.push((pending, present));
        s.launched += 1;
    }

    /// Starts the step's last bucket on the device and, in the same operation, joins it and
    /// every bucket still in flight: the step's buckets then cost burn one operation each and
    /// no join of their own. Every bucket in flight is joined, also when the last one fails to
    /// start (then each reports that failure).
    fn launch_last_and_join(&self, s: &mut StepState<B>) {
        crate::diagnose::spin(crate::diagnose::HostThread::Training);
        let b = s.launched;
        let (grads, present, presence) = self.bucket_inputs(s, b);
        let diagnose = Diagnose::get(self.pg.world_size());
        if diagnose == Diagnose::NoDeviceOps && presence.is_none() {
            s.results.push((Pending::Kept(grads), present));
            s.launched += 1;
            return;
        }
        let mut earlier = Vec::new();
        let results: Vec<(Option<Pending<B>>, Vec<bool>)> = std::mem::take(&mut s.results)
            .into_iter()
            .map(|(p, had)| match p {
                Pending::Device(bucket) => {
                    earlier.push(bucket);
                    (None, had)
                }
                other => (Some(other), had),
            })
            .collect();
        let mut joined = match self.start_on_device(s, (b, diagnose), (grads, presence), Some(earlier)) {
            Ok(tensor::Started::Joined(all)) => Ok(all.into_iter()),
            Ok(tensor::Started::InFlight(_)) => unreachable!("a bucket given others to join comes back joined"),
            Err(e) => Err(Some(e)),
        };
        let mut next = || -> Pending<B> {
            match &mut joined {
                Ok(all) => {
                    let (grads, presence) = all.next().expect("one joined bucket per bucket in flight");
                    Pending::Joined(Reduced {
                        grads,
                        presence: presence.map(|p| Tensor::from_primitive(TensorPrimitive::Float(p))),
                    })
                }
                // The first bucket reports why; the others that it failed.
                Err(e) => Pending::Failed(e.take().unwrap_or_else(|| Error::Unsupported {
                    what: format!("DDP: the step's last bucket ({b}) failed to start, so this bucket was not averaged"),
                })),
            }
        };
        s.results = results.into_iter().map(|(p, had)| (p.unwrap_or_else(&mut next), had)).collect();
        s.results.push((next(), present));
        s.launched += 1;
    }

    /// Starts bucket `b`'s sum on the device (one operation of burn's), joined with `join_with`'s
    /// buckets in the same operation when given.
    fn start_on_device(
        &self,
        s: &mut StepState<B>,
        (b, diagnose): (usize, Diagnose),
        (grads, presence): (Vec<FloatTensor<B>>, Option<Tensor<B, 1>>),
        join_with: Option<Vec<tensor::DeviceBucket<B>>>,
    ) -> Result<tensor::Started<B>> {
        s.operations += 1;
        tensor::all_reduce_bucket_on_device(
            self.pg.clone(),
            (grads, presence.map(|p| p.into_primitive().tensor())),
            self.settings.wire,
            (format!("all-reduce bucket {b}"), diagnose),
            join_with,
        )
    }

    /// This rank's presence counts (1 where it has the gradient), filled on the device: a
    /// tensor made from host values costs burn-cuda an upload, milliseconds per bucket.
    fn presence(&self, present: &[bool]) -> Tensor<B, 1> {
        if present.iter().all(|&p| p) {
            return Tensor::ones([present.len()], &self.device);
        }
        Tensor::cat(present.iter().map(|&p| Tensor::full([1], if p { 1.0 } else { 0.0 }, &self.device)).collect(), 0)
    }

    /// Flattens `grads` (and `presence`) with burn's operations and averages them with blocking
    /// collectives, on the communication thread when there is one. f32 gradients travel as one
    /// flat copy averaged where it is summed (the collective's mean: no operation per gradient
    /// after it), the presence counts at its tail; compressed ones pre-divided by the world and
    /// converted, with the presence counts in a summing collective of their own (they must stay
    /// exact).
    fn launch_blocking(
        &self,
        s: &mut StepState<B>,
        b: usize,
        grads: Vec<FloatTensor<B>>,
        presence: Option<Tensor<B, 1>>,
        label: String,
    ) -> Receiver<Result<Vec<Tensor<B, 1>>>> {
        s.operations += grads.len() + 1;
        let mut parts: Vec<Tensor<B, 1>> = grads
            .into_iter()
            .map(|g| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(flatten::<B>(g))))
            .collect();
        let payloads: Vec<(Tensor<B, 1>, ReduceOp)> = match (self.settings.wire, presence) {
            // f32: the presence counts ride at the tail of the one flat copy, averaged with it.
            (DType::F32, p) => {
                parts.extend(p);
                vec![(Tensor::cat(parts, 0), ReduceOp::Mean)]
            }
            (wire, p) => {
                s.operations += 2;
                let flat = Tensor::cat(parts, 0);
                let scaled = flat.mul_scalar(1.0 / self.pg.world_size() as f64).cast(wire);
                std::iter::once(scaled).chain(p).map(|t| (t, ReduceOp::Sum)).collect()
            }
        };
        let (tx, rx) = channel();
        let pg = self.pg.clone();
        let (params, queued) = (self.plan.buckets[b].len(), std::time::Instant::now());
        let job = move || {
            let started = std::time::Instant::now();
            let bytes: usize = payloads.iter().map(|(t, _)| t.shape().num_elements() * t.dtype().size()).sum();
            let sums: Result<Vec<_>> = payloads.into_iter().map(|(t, op)| tensor::all_reduce(&*pg, t, op)).collect();
            // Recorded before the result is handed over: the caller may stop the trace next.
            if crate::trace::enabled() {
                let args = serde_json::json!({ "bytes": bytes, "params": params, "queued_us": (started - queued).as_secs_f64() * 1e6, "backend": pg.backend() });
                crate::trace::record(label, "comm", started, std::time::Instant::now(), args);
            }
            let _ = tx.send(sums);
        };
        match &self.route {
            Route::Thread(comm) => comm.run(Box::new(job)),
            _ => job(),
        }
        rx
    }

    /// Bucket `b`'s result from the flat averages a host route returned: each member's slice
    /// (converted back to f32 when compressed) in its shape, and the summed presence counts.
    fn unflatten(&self, s: &mut StepState<B>, b: usize, mut sums: Vec<Tensor<B, 1>>) -> Reduced<B> {
        let compressed = self.settings.wire != DType::F32;
        let mut flat = sums.remove(0);
        if compressed {
            s.operations += 1;
            flat = flat.cast(DType::F32);
        }
        let mut offset = 0;
        let grads = self.plan.buckets[b]
            .iter()
            .map(|&i| {
                let shape = &self.plan.slots[i].shape;
                let n = shape.iter().product::<usize>();
                let part = flat.clone().slice([offset..offset + n]);
                s.operations += 2;
                offset += n;
                B::float_reshape(part.into_primitive().tensor(), shape.clone().into())
            })
            .collect();
        let presence = match compressed {
            true => sums.pop(),
            // Averaged with the bucket: the world times that is their sum.
            false => self.sends_presence().then(|| {
                s.operations += 2;
                flat.clone().slice([offset..flat.dims()[0]]).mul_scalar(self.pg.world_size() as f64)
            }),
        };
        Reduced { grads, presence }
    }

    /// Launches what is left, waits for (joins) every bucket, and returns each parameter's
    /// averaged gradient (slot, value in the parameter's shape) — or the error every rank
    /// reaches alike for a parameter some rank did not use — and the bytes averaged.
    ///
    /// # Errors
    /// [`Error::UnusedParameter`] (without `find_unused`), and collective errors.
    pub fn finish(&self) -> Result<Averaged<B>> {
        let mut s = self.lock();
        while s.launched < self.early_buckets() {
            let b = s.launched;
            crate::trace::span("ddp: start a bucket (host)", crate::trace::DDP, || self.launch(&mut s, b));
        }
        if s.launched < self.plan.buckets.len() {
            crate::trace::span("ddp: start the last bucket and join (host)", crate::trace::DDP, || {
                self.launch_last_and_join(&mut s)
            });
        }
        let (pending, present): (Vec<_>, Vec<_>) = std::mem::take(&mut s.results).into_iter().unzip();
        // Every bucket is joined, failed or not: its buffers must not serve burn again while
        // NCCL may still write them.
        let reduced: Vec<Result<Reduced<B>>> =
            crate::trace::span("ddp: wait for / join the buckets (host)", crate::trace::DDP, || {
                self.wait_all(&mut s, pending)
            });
        drop(s);
        if let Some(nccl) = self.pg.as_nccl() {
            nccl.check()?;
        }
        let reduced = reduced.into_iter().collect::<Result<Vec<_>>>()?;
        let counts =
            crate::trace::span("ddp: presence counts (host)", crate::trace::DDP, || self.counts(&reduced, &present));
        self.averages(reduced, counts)
    }

    /// Each bucket's result, once its sum is done (host routes) or joined (the device: every
    /// bucket in one operation, `tensor::join_buckets_on_device`).
    fn wait_all(&self, s: &mut StepState<B>, pending: Vec<Pending<B>>) -> Vec<Result<Reduced<B>>> {
        let mut on_device = Vec::new();
        let mut reduced: Vec<Option<Result<Reduced<B>>>> = pending
            .into_iter()
            .enumerate()
            .map(|(b, p)| match p {
                Pending::Host(rx) => Some(
                    rx.recv()
                        .map_err(|_| Error::Unsupported { what: "DDP's communication thread stopped".into() })
                        .and_then(|sums| sums.map(|sums| self.unflatten(s, b, sums))),
                ),
                Pending::Device(bucket) => {
                    on_device.push((b, bucket));
                    None
                }
                Pending::Kept(grads) => Some(Ok(Reduced { grads, presence: None })),
                Pending::Joined(r) => Some(Ok(r)),
                Pending::Failed(e) => Some(Err(e)),
            })
            .collect();
        let (at, buckets): (Vec<usize>, Vec<_>) = on_device.into_iter().unzip();
        if !buckets.is_empty() {
            s.operations += 1;
        }
        for (b, (grads, presence)) in at.into_iter().zip(tensor::join_buckets_on_device(buckets)) {
            let presence = presence.map(|p| Tensor::from_primitive(TensorPrimitive::Float(p)));
            reduced[b] = Some(Ok(Reduced { grads, presence }));
        }
        reduced.into_iter().map(|r| r.expect("every bucket waited for or joined")).collect()
    }

    /// Per bucket and member: how many ranks had its gradient, from the summed presence counts
    /// (one read for all buckets) where they travelled; else from this rank's own presence (a
    /// member it lacks counts 0, one it has counts every rank), so the host never waits for the
    /// device: a rank missing a gradient stops with the error after its collectives were
    /// started, and the others learn of it from the group (a peer left).
    fn counts(&self, reduced: &[Reduced<B>], present: &[Vec<bool>]) -> Vec<Vec<usize>> {
        let world = self.pg.world_size();
        if !self.sends_presence() {
            return present.iter().map(|p| p.iter().map(|&had| if had { world } else { 0 }).collect()).collect();
        }
        let sums: Vec<Tensor<B, 1>> =
            reduced.iter().map(|r| r.presence.clone().expect("presence counts travel on this route")).collect();
        let all: Vec<f32> = Tensor::cat(sums, 0).into_data().convert::<f32>().to_vec().expect("f32 counts");
        let mut at = 0;
        present
            .iter()
            .map(|p| {
                let c = all[at..at + p.len()].iter().map(|v| v.round() as usize).collect();
                at += p.len();
                c
            })
            .collect()
    }

    /// The averaged gradients of the parameters some rank had, in bucket order, and their bytes;
    /// the error naming a parameter some rank lacked (without `find_unused`).
    fn averages(&self, reduced: Vec<Reduced<B>>, counts: Vec<Vec<usize>>) -> Result<Averaged<B>> {
        let world = self.pg.world_size();
        let (mut out, mut bytes) = (Vec::with_capacity(self.plan.slots.len()), 0);
        for ((b, r), counts) in reduced.into_iter().enumerate().zip(counts) {
            for ((&i, grad), count) in self.plan.buckets[b].iter().zip(r.grads).zip(counts) {
                let slot = &self.plan.slots[i];
                if count < world && !self.settings.find_unused {
                    // DDP, which holds the module, names it (`name_parameter`).
                    return Err(Error::UnusedParameter {
                        name: String::new(),
                        index: slot.index,
                        shape: slot.shape.clone(),
                        everywhere: count == 0,
                        rank: self.pg.rank(),
                    });
                }
                if count > 0 {
                    bytes += slot.shape.iter().product::<usize>() * 4;
                    out.push((i, grad));
                }
            }
        }
        Ok((out, bytes))
    }

    /// Records this rank's gradient of `slot` (already complete: after backward).
    pub fn put(&self, slot: usize, grad: FloatTensor<B>) {
        self.lock().grads[slot] = Some(grad);
    }

    /// Buckets the layers' notifications launched before [`finish`](Self::finish).
    pub fn launched_early(&self) -> usize {
        self.lock().launched
    }

    /// Tensor operations this step's reduction enqueued so far.
    pub fn operations(&self) -> usize {
        self.lock().operations
    }

    /// Per slot: whether the layers reported its whole gradient.
    pub fn reported(&self) -> Vec<bool> {
        let s = self.lock();
        (0..self.plan.slots.len()).map(|i| Self::complete(&s, i)).collect()
    }

    /// Whether buckets are summed on the device ([`Route::Device`]).
    pub fn on_device(&self) -> bool {
        matches!(self.route, Route::Device { .. })
    }

    /// Whether buckets start while backward runs.
    pub fn overlapping(&self) -> bool {
        matches!(self.route, Route::Thread(_) | Route::Device { overlap: true })
    }

    /// Registration indices in the order this step finished their gradients: the reported
    /// ones as backward finished them, then the rest in slot order.
    pub fn finish_order(&self) -> Vec<usize> {
        let s = self.lock();
        let slots = &self.plan.slots;
        let mut order: Vec<usize> = s.ready_order.iter().map(|&i| slots[i].index).collect();
        let seen: std::collections::HashSet<usize> = s.ready_order.iter().copied().collect();
        order.extend((0..slots.len()).filter(|i| !seen.contains(i)).map(|i| slots[i].index));
        order
    }

    /// The device the gradients live on.
    pub fn device(&self) -> B::Device {
        self.device.clone()
    }

    /// Buckets of this step.
    pub fn bucket_count(&self) -> usize {
        self.plan.buckets.len()
    }
}

impl<B: Backend> GradSink<B> for StepReducer<B> {
    fn ready(&self, slot: usize, grad: FloatTensor<B>) {
        let mut s = self.lock();
        let sum = match s.grads[slot].take() {
            Some(g) => {
                s.operations += 1;
                B::float_add(g, grad)
            }
            None => grad,
        };
        s.grads[slot] = Some(sum);
        s.reported[slot] += 1;
        if Self::complete(&s, slot) {
            s.ready_order.push(slot);
            self.launch_ready(&mut s);
        }
    }
}

/// `g` as one dimension (a reshape: burn's operation, free for a packed tensor).
fn flatten<B: Backend>(g: FloatTensor<B>) -> FloatTensor<B> {
    let n = burn::tensor::TensorMetadata::shape(&g).num_elements();
    B::float_reshape(g, Shape::new([n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_reverse_registration_order_and_the_size_limit() {
        let params: Vec<(ParamId, Vec<usize>)> =
            [vec![10, 10], vec![10], vec![50], vec![3, 3]].into_iter().map(|s| (ParamId::new(), s)).collect();
        // 4 bytes per element: 400, 40, 200, 36 bytes; limit 250.
        let (slots, buckets) = plan(&params, 250, None);
        assert_eq!(slots.iter().map(|s| s.index).collect::<Vec<_>>(), [3, 2, 1, 0]);
        assert_eq!(buckets, [vec![0, 1], vec![2], vec![3]]);
        // A given order (registration indices): 1, 3, 0, 2 → 40+36 | 400 | 200.
        let (slots, buckets) = plan(&params, 250, Some(&[1, 3, 0, 2]));
        assert_eq!(slots.iter().map(|s| s.index).collect::<Vec<_>>(), [1, 3, 0, 2]);
        assert_eq!(buckets, [vec![0, 1], vec![2], vec![3]]);
        // The plan keeps each parameter's slot.
        let plan = Plan::new(params.clone(), 250, None);
        assert_eq!(params.iter().map(|(id, _)| plan.slot_of[id]).collect::<Vec<_>>(), [3, 2, 1, 0]);
    }
}
