//! DDP's mechanism: trained parameters assigned to buckets (reverse registration order, up to
//! `bucket_bytes` each), each bucket's gradients flattened into one buffer and summed over the
//! ranks by one collective, launched in bucket order as soon as every gradient of the bucket
//! (and of the buckets before it) is final — during backward when the layers report them
//! ([`crate::grad_ready`]), else all at once after it. The collective runs on a communication
//! thread (host-memory groups), or on the device without anyone waiting ([`Route::Device`]:
//! burn-cuda on NCCL).
//!
//! Each buffer ends with one presence count per parameter (1 where this rank has the gradient,
//! 0 where not), summed with the gradients: every rank learns in the same collective which
//! parameters some rank did not use, so there is no separate exchange and no rank can take a
//! different path (PyTorch's `find_unused_parameters` semantics, or an error naming the
//! parameter, decided identically everywhere).

use crate::error::{Error, Result};
use crate::grad_ready::GradSink;
use crate::process_group::ProcessGroup;
use crate::{ReduceOp, tensor};
use burn::module::ParamId;
use burn::prelude::*;
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
pub(crate) fn plan(params: &[(ParamId, Vec<usize>)], bucket_bytes: usize, order: Option<&[usize]>) -> (Vec<Slot>, Vec<Vec<usize>>) {
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
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).send(job).expect("DDP's communication thread is alive while its DDP is");
    }
}

struct StepState<B: Backend> {
    /// Per slot: its gradient so far (summed over the uses reported).
    grads: Vec<Option<Tensor<B, 1>>>,
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
}

/// A bucket's sum under way.
enum Pending<B: Backend> {
    /// On the communication thread (or done on the calling one).
    Host(Receiver<Result<Tensor<B, 1>>>),
    /// On the device (NCCL after burn's stream): join before reading.
    Device(Tensor<B, 1>, tensor::DeviceJoin),
    /// Could not be started.
    Failed(Error),
}

impl<B: Backend> Pending<B> {
    fn wait(self) -> Result<Tensor<B, 1>> {
        match self {
            Self::Host(rx) => rx.recv().map_err(|_| Error::Unsupported { what: "DDP's communication thread stopped".into() })?,
            Self::Device(t, join) => Ok(tensor::join_on_device(t, &join)),
            Self::Failed(e) => Err(e),
        }
    }
}

/// How a step's buckets are summed.
#[derive(Clone)]
pub(crate) enum Route {
    /// On the calling thread, after backward (blocking collectives).
    Inline,
    /// On the communication thread, each as soon as it is ready (blocking collectives there).
    Thread(Arc<CommThread>),
    /// On the device, each as soon as it is ready: NCCL ordered after burn's stream; nobody
    /// waits (`tensor::all_reduce_on_device`).
    Device { overlap: bool },
}

/// One step's gradient reduction.
pub(crate) struct StepReducer<B: Backend> {
    slots: Vec<Slot>,
    buckets: Vec<Vec<usize>>,
    pg: Arc<dyn ProcessGroup>,
    route: Route,
    device: B::Device,
    state: Mutex<StepState<B>>,
}

impl<B: Backend> StepReducer<B> {
    pub fn new(slots: Vec<Slot>, buckets: Vec<Vec<usize>>, pg: Arc<dyn ProcessGroup>, route: Route, device: B::Device) -> Self {
        let n = slots.len();
        let state = StepState { grads: vec![None; n], reported: vec![0; n], expected: vec![0; n], launched: 0, ready_order: Vec::new(), results: Vec::new() };
        Self { slots, buckets, pg, route, device, state: Mutex::new(state) }
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

    /// Launches, in order, every bucket whose gradients are all final.
    fn launch_ready(&self, s: &mut StepState<B>) {
        while s.launched < self.buckets.len() && self.buckets[s.launched].iter().all(|&i| Self::complete(s, i)) {
            let b = s.launched;
            crate::trace::span("ddp: start a bucket (host)", "ddp", || self.launch(s, b));
        }
    }

    /// Flattens bucket `b` (zeros for gradients this rank lacks) with its presence counts and
    /// starts its sum over the ranks.
    fn launch(&self, s: &mut StepState<B>, b: usize) {
        let mut parts = Vec::with_capacity(self.buckets[b].len() + 1);
        let mut present = Vec::with_capacity(self.buckets[b].len());
        for &i in &self.buckets[b] {
            let numel = self.slots[i].shape.iter().product::<usize>();
            present.push(s.grads[i].is_some());
            parts.push(s.grads[i].take().unwrap_or_else(|| Tensor::zeros([numel], &self.device)));
        }
        parts.push(crate::trace::span("ddp: presence counts tensor (host)", "ddp", || self.presence(&present)));
        let flat = crate::trace::span("ddp: flatten a bucket (host)", "ddp", || Tensor::cat(parts, 0));
        let pending = crate::trace::span("ddp: start its sum (host)", "ddp", || match &self.route {
            Route::Device { .. } => match tensor::all_reduce_on_device(self.pg.clone(), flat, None, format!("all-reduce bucket {b}")) {
                Ok((t, join)) => Pending::Device(t, join),
                Err(e) => Pending::Failed(e),
            },
            Route::Inline | Route::Thread(_) => Pending::Host(self.launch_blocking(b, flat)),
        });
        s.results.push((pending, present));
        s.launched += 1;
    }

    /// This rank's presence counts (1 where it has the gradient), filled on the device: a
    /// tensor made from host values costs burn-cuda an upload, milliseconds per bucket.
    fn presence(&self, present: &[bool]) -> Tensor<B, 1> {
        if present.iter().all(|&p| p) {
            return Tensor::ones([present.len()], &self.device);
        }
        Tensor::cat(present.iter().map(|&p| Tensor::full([1], if p { 1.0 } else { 0.0 }, &self.device)).collect(), 0)
    }

    /// Sums `flat` with a blocking collective, on the communication thread when there is one.
    fn launch_blocking(&self, b: usize, flat: Tensor<B, 1>) -> Receiver<Result<Tensor<B, 1>>> {
        let (tx, rx) = channel();
        let pg = self.pg.clone();
        let (params, queued) = (self.buckets[b].len(), std::time::Instant::now());
        let job = move || {
            let started = std::time::Instant::now();
            let bytes = flat.shape().num_elements() * 4;
            let _ = tx.send(tensor::all_reduce(&*pg, flat, ReduceOp::Sum));
            if crate::trace::enabled() {
                let args = serde_json::json!({ "bytes": bytes, "params": params, "queued_us": (started - queued).as_secs_f64() * 1e6, "backend": pg.backend() });
                crate::trace::record(format!("all-reduce bucket {b}"), "comm", started, std::time::Instant::now(), args);
            }
        };
        match &self.route {
            Route::Thread(comm) => comm.run(Box::new(job)),
            _ => job(),
        }
        rx
    }

    /// Launches what is left, waits for every bucket, and returns the averaged gradients —
    /// or the error every rank reaches alike for a parameter some rank did not use.
    ///
    /// # Errors
    /// [`Error::UnusedParameter`] (without `find_unused`), and collective errors.
    pub fn finish(&self, find_unused: bool, out: &mut HashMap<ParamId, (Tensor<B, 1>, Vec<usize>)>) -> Result<usize> {
        let mut s = self.lock();
        while s.launched < self.buckets.len() {
            let b = s.launched;
            crate::trace::span("ddp: start a bucket (host)", "ddp", || self.launch(&mut s, b));
        }
        let results = std::mem::take(&mut s.results);
        drop(s);
        let (pending, present): (Vec<_>, Vec<_>) = results.into_iter().unzip();
        let reduced = crate::trace::span("ddp: wait for / join the buckets (host)", "ddp", || pending.into_iter().map(Pending::wait).collect::<Result<Vec<_>>>())?;
        if let Some(nccl) = self.pg.as_nccl() {
            nccl.check()?;
        }
        let world = self.pg.world_size();
        let counts = crate::trace::span("ddp: presence counts (host)", "ddp", || self.counts(&reduced, &present, find_unused));
        let mut bytes = 0;
        for ((b, reduced), counts) in reduced.into_iter().enumerate().zip(counts) {
            let mut offset = 0;
            for (&i, count) in self.buckets[b].iter().zip(counts) {
                let slot = &self.slots[i];
                let n = slot.shape.iter().product::<usize>();
                if count < world && !find_unused {
                    // DDP, which holds the module, names it (`name_parameter`).
                    return Err(Error::UnusedParameter { name: String::new(), index: slot.index, shape: slot.shape.clone(), everywhere: count == 0, rank: self.pg.rank() });
                }
                if count > 0 {
                    out.insert(slot.id, (reduced.clone().slice([offset..offset + n]).div_scalar(world as f64), slot.shape.clone()));
                    bytes += n * 4;
                }
                offset += n;
            }
        }
        Ok(bytes)
    }

    /// Per bucket and member: how many ranks had its gradient, from the summed presence counts
    /// (one read for all buckets). On the device route without `find_unused`, this rank's own
    /// presence instead (a member it lacks counts 0, one it has counts every rank), so the host
    /// never waits for the device: a rank missing a gradient stops with the error after its
    /// collectives were started, and the others learn of it from the group (a peer left).
    fn counts(&self, reduced: &[Tensor<B, 1>], present: &[Vec<bool>], find_unused: bool) -> Vec<Vec<usize>> {
        let world = self.pg.world_size();
        let device_route = matches!(self.route, Route::Device { .. });
        if device_route && !find_unused {
            return present.iter().map(|p| p.iter().map(|&had| if had { world } else { 0 }).collect()).collect();
        }
        let tails: Vec<Tensor<B, 1>> = reduced
            .iter()
            .zip(present)
            .map(|(t, p)| {
                let total = t.dims()[0];
                t.clone().slice([total - p.len()..total])
            })
            .collect();
        let all: Vec<f32> = Tensor::cat(tails, 0).into_data().convert::<f32>().to_vec().expect("f32 counts");
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

    /// Records this rank's gradient of `slot` (already complete: after backward).
    pub fn put(&self, slot: usize, grad: Tensor<B, 1>) {
        let mut s = self.lock();
        s.grads[slot] = Some(grad);
    }

    /// Buckets the layers' notifications launched before [`finish`](Self::finish).
    pub fn launched_early(&self) -> usize {
        self.lock().launched
    }

    /// Per slot: whether the layers reported its whole gradient.
    pub fn reported(&self) -> Vec<bool> {
        let s = self.lock();
        (0..self.slots.len()).map(|i| Self::complete(&s, i)).collect()
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
        let mut order: Vec<usize> = s.ready_order.iter().map(|&i| self.slots[i].index).collect();
        let seen: std::collections::HashSet<usize> = s.ready_order.iter().copied().collect();
        order.extend((0..self.slots.len()).filter(|i| !seen.contains(i)).map(|i| self.slots[i].index));
        order
    }

    /// The device the gradients live on.
    pub fn device(&self) -> B::Device {
        self.device.clone()
    }

    /// Buckets of this step.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }
}

impl<B: Backend> GradSink<B> for StepReducer<B> {
    fn ready(&self, slot: usize, grad: Tensor<B, 1>) {
        let mut s = self.lock();
        s.grads[slot] = Some(match s.grads[slot].take() {
            Some(g) => g + grad,
            None => grad,
        });
        s.reported[slot] += 1;
        if Self::complete(&s, slot) {
            s.ready_order.push(slot);
            self.launch_ready(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_reverse_registration_order_and_the_size_limit() {
        let params: Vec<(ParamId, Vec<usize>)> = [vec![10, 10], vec![10], vec![50], vec![3, 3]].into_iter().map(|s| (ParamId::new(), s)).collect();
        // 4 bytes per element: 400, 40, 200, 36 bytes; limit 250.
        let (slots, buckets) = plan(&params, 250, None);
        assert_eq!(slots.iter().map(|s| s.index).collect::<Vec<_>>(), [3, 2, 1, 0]);
        assert_eq!(buckets, [vec![0, 1], vec![2], vec![3]]);
        // A given order (registration indices): 1, 3, 0, 2 → 40+36 | 400 | 200.
        let (slots, buckets) = plan(&params, 250, Some(&[1, 3, 0, 2]));
        assert_eq!(slots.iter().map(|s| s.index).collect::<Vec<_>>(), [1, 3, 0, 2]);
        assert_eq!(buckets, [vec![0, 1], vec![2], vec![3]]);
    }
}
