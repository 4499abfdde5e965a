//! Work on a CUDA stream of someone else's (NCCL's collectives) on buffers of burn's, ordered
//! on the device: it starts after burn's kernels that produced the buffers, burn reads its
//! results only after it has finished, and neither the training thread nor cubecl's device
//! thread waits for anything in between — burn keeps computing while the other stream works.
//!
//! [`fork`] is an operation of burn-fusion's stream (see `fusion_op`) over any number of
//! buffers: on cubecl's device thread, in order with burn's kernels, it records a CUDA event on
//! burn's stream where the same-stream path knows that stream (`CudnnOptions::direct_fences`),
//! else stores a flag on it (`stream_bridge`, its own [`Channel::Side`] flags), and hands the buffers' addresses —
//! each input's, its output's, and scratch buffers' — and a [`SideFence`] to the caller's work,
//! which enqueues on its stream the fence's wait, its computation and the fence's signal. An
//! output is its input's own buffer, written in place, when nothing else can see that buffer
//! (the fork is its tensor's last user and no view shares it), else a fresh buffer; nothing of
//! burn's touches the outputs until [`join`], another operation of the stream, makes burn's
//! stream wait for that signal, and the sources read and the scratch buffers stay allocated
//! until then. Between the two, burn's stream runs on (a DDP backward keeps computing the next
//! buckets' gradients).
//!
//! [`fork_held`] keeps all outputs but the first (its token) out of burn-fusion's sight until
//! [`join_held`] (or the last bucket's [`fork_and_join`]) is given the token and hands them all
//! back: a DDP bucket's gradients then pass through burn-fusion once rather than twice.
//!
//! Should the work fail to enqueue, it is logged, [`join`] does not wait (nothing would signal),
//! and the next [`fork`] returns the error: the caller's own checks (the process group's
//! error) report what the values are worth.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::types::fail;
use crate::nn::cuda::runtime::device_thread;
use crate::nn::cuda::runtime::fusion_op::{self, Cube};
use crate::nn::cuda::runtime::launch::{Prim, empty_of};
use crate::nn::cuda::runtime::same_stream;
use crate::nn::cuda::runtime::stream_bridge::{self, Channel, DeviceKernels, Fence};
use crate::trace::DDP_BACKEND_THREADS;
use burn::tensor::{DType, Shape};
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::ComputeClient;
use cudarc::driver::{CudaContext, sys as driver};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The fence kernels of one device, for other streams of its primary context, and its spare
/// CUDA events.
struct SideKernels {
    ctx: Arc<CudaContext>,
    kernels: DeviceKernels,
    events: Vec<driver::CUevent>,
}

// SAFETY: the events are plain driver handles of the primary context, used under the mutex.
unsafe impl Send for SideKernels {}

impl SideKernels {
    /// A spare event, or a new one (no timing: the cheapest kind to record and wait for).
    fn event(&mut self) -> Result<driver::CUevent> {
        if let Some(e) = self.events.pop() {
            return Ok(e);
        }
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the context is bound (`bound`).
        unsafe { driver::cuEventCreate(&mut e, driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .map_err(|e| fail("creating a CUDA event", e))?;
        Ok(e)
    }
}

/// How a fork's work is ordered with burn's stream.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// `stream_bridge`'s flags: a flag stored on burn's stream that a one-thread kernel on the
    /// work's stream waits for, and back.
    Flags(Fence),
    /// Where the same-stream path knows burn's CUDA stream (`same_stream::direct_fence_stream`):
    /// `fork` recorded on burn's stream, `join` on the work's, each waited for by the other
    /// stream's `cuStreamWaitEvent` — no kernel, so no multiprocessor held by a spinning wait
    /// while burn's stream catches up (PyTorch's DDP orders its streams so).
    Events { burn: driver::CUstream, fork: driver::CUevent, join: driver::CUevent },
}

// SAFETY: plain driver handles; a stream or event may be used from any thread of its context.
unsafe impl Send for Order {}

/// What the work enqueues on its stream around its computation.
pub struct SideFence {
    order: Order,
    kernels: Arc<Mutex<SideKernels>>,
}

/// `side` locked, its context bound on the calling thread: ready to launch its kernels.
fn bound(side: &Mutex<SideKernels>) -> Result<std::sync::MutexGuard<'_, SideKernels>> {
    let k = side.lock().unwrap_or_else(|p| p.into_inner());
    k.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
    Ok(k)
}

impl SideFence {
    /// Enqueues on `stream` (of the device's primary context) a wait until burn's stream has
    /// run everything queued before the fork. Enqueue it before the computation.
    ///
    /// # Errors
    /// When the launch fails.
    pub fn wait_on(&self, stream: driver::CUstream) -> Result<()> {
        let k = bound(&self.kernels)?;
        match self.order {
            Order::Flags(fence) => k.kernels.wait(stream, &fence),
            // SAFETY: a live stream and event of the bound context.
            Order::Events { fork, .. } => unsafe { driver::cuStreamWaitEvent(stream, fork, 0) }
                .result()
                .map_err(|e| fail("ordering a stream after burn's", e)),
        }
    }

    /// Enqueues on `stream` the signal [`join`] waits for. Enqueue it after the computation.
    ///
    /// # Errors
    /// When the launch fails (then [`join`] would wait forever: the caller must not join).
    pub fn signal_on(&self, stream: driver::CUstream) -> Result<()> {
        let k = bound(&self.kernels)?;
        match self.order {
            Order::Flags(fence) => k.kernels.signal(stream, &fence),
            // SAFETY: as `wait_on`.
            Order::Events { join, .. } => {
                unsafe { driver::cuEventRecord(join, stream) }.result().map_err(|e| fail("recording a CUDA event", e))
            }
        }
    }
}

enum JoinState {
    /// The fork has not run on the device thread yet.
    Pending,
    /// The work and its signal are enqueued, or handed to the enqueue thread (then the ticket
    /// says when that thread is done with it); the buffers it reads or writes that no tensor
    /// holds (sources copied from, scratch) stay allocated until the join has made burn's
    /// stream wait for it.
    Enqueued(Order, Vec<Cube>, Option<Ticket>),
    /// The work failed to enqueue: nothing to wait for.
    Failed,
}

/// What [`join`] waits for: the signal of one [`fork`]'s work; for a [`fork_held`], also the
/// outputs it keeps back until joined.
#[derive(Clone)]
pub struct Join(Arc<Mutex<JoinState>>, Option<Arc<Held>>);

/// A [`fork_held`]'s outputs after its token, which no operation of burn-fusion's stream sees
/// until the join hands them over: their shapes and types (known when the fork is queued) and
/// their buffers (set when it runs on the fusion thread, always before its join runs there).
struct Held {
    like: Vec<(Shape, DType)>,
    cubes: Mutex<Vec<Cube>>,
}

impl Join {
    fn new(hold: Option<Vec<(Shape, DType)>>) -> Self {
        let held = hold.map(|like| Arc::new(Held { like, cubes: Mutex::new(Vec::new()) }));
        Self(Arc::new(Mutex::new(JoinState::Pending)), held)
    }

    /// The outputs a join of this fork's token makes readable: the token's, then the held ones.
    fn expanded(&self, token: (Shape, DType)) -> impl Iterator<Item = (Shape, DType)> + '_ {
        std::iter::once(token).chain(self.1.iter().flat_map(|h| h.like.iter().cloned()))
    }

    /// The held outputs' buffers, taken (on the fusion thread, in the join's operation).
    fn take_held(&self) -> Vec<Cube> {
        self.1
            .as_ref()
            .map(|h| std::mem::take(&mut *h.cubes.lock().unwrap_or_else(|p| p.into_inner())))
            .unwrap_or_default()
    }
}

/// The device addresses a [`fork`]'s work reads and writes: per input its buffer (packed,
/// row-major in its dims' order) and the output's (the same address where the output is the
/// input's buffer, written in place), then the scratch buffers asked for.
#[derive(Debug, Clone, Default)]
pub struct ForkBuffers {
    pub inputs: Vec<u64>,
    pub outputs: Vec<u64>,
    pub scratch: Vec<u64>,
}

fn failure() -> &'static Mutex<Option<String>> {
    static FAILURE: OnceLock<Mutex<Option<String>>> = OnceLock::new();
    FAILURE.get_or_init(Default::default)
}

/// `device`'s fence kernels, loaded and tested on first use.
fn kernels(device: usize) -> Result<Arc<Mutex<SideKernels>>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<Mutex<SideKernels>>>>> = OnceLock::new();
    let mut map = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = map.get(&device) {
        return Ok(k.clone());
    }
    let ctx = CudaContext::new(device).map_err(|e| fail("opening the CUDA context", e))?;
    ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
    let kernels = DeviceKernels::load()?;
    let stream = ctx.new_stream().map_err(|e| fail("creating a CUDA stream", e))?;
    kernels.self_test(&stream)?;
    let k = Arc::new(Mutex::new(SideKernels { ctx, kernels, events: Vec::new() }));
    map.insert(device, k.clone());
    Ok(k)
}

/// Whether work on other streams can be ordered with burn's on `device` (loads the fence
/// kernels on first call).
///
/// # Errors
/// Why not: no driver, or the kernels failed to load or to run.
pub fn ready(device: usize) -> Result<()> {
    kernels(device).map(|_| ())
}

/// The device addresses of `cubes` (on cubecl's device thread: direct calls), and what keeps
/// them valid while held.
fn addresses(client: &ComputeClient<CudaRuntime>, cubes: &[Cube]) -> Result<(Vec<u64>, Vec<impl Sized + use<>>)> {
    let held = cubes
        .iter()
        .map(|c| client.get_resource(c.handle.clone()).map_err(|e| fail("device pointer", e)))
        .collect::<Result<Vec<_>>>()?;
    Ok((held.iter().map(|r| r.resource().ptr).collect(), held))
}

/// A fork's [`ForkBuffers`], and what keeps them valid while held: one address per buffer,
/// asked of cubecl once (an output written in place, `in_place[i]`, is its input's buffer).
fn fork_addresses(
    client: &ComputeClient<CudaRuntime>,
    sources: &[Cube],
    (outs, in_place): (&[Cube], &[bool]),
    scratch: &[Cube],
) -> Result<(ForkBuffers, Vec<impl Sized + use<>>)> {
    let fresh: Vec<Cube> = outs.iter().zip(in_place).filter(|(_, p)| !**p).map(|(o, _)| o.clone()).collect();
    let (inputs, mut held) = addresses(client, sources)?;
    let (fresh_at, held_fresh) = addresses(client, &fresh)?;
    let (scratch, held_scratch) = addresses(client, scratch)?;
    let mut fresh_at = fresh_at.into_iter();
    let outputs = in_place
        .iter()
        .zip(&inputs)
        .map(|(&p, &at)| if p { at } else { fresh_at.next().expect("one address per fresh output") })
        .collect();
    held.extend(held_fresh);
    held.extend(held_scratch);
    Ok((ForkBuffers { inputs, outputs, scratch }, held))
}

/// One input's buffer on the fusion thread, packed, and the output buffer of the same shape:
/// the input's own when no one else can see it (this operation is its tensor's last user and
/// no view shares it, or it is a packed copy of ours), else a fresh one (then the input is
/// kept until the join: the work still reads it).
fn place(cube: Cube, last_user: bool) -> (Cube, Cube, Option<Cube>) {
    let row_major = fusion_op::is_row_major(cube.meta.shape().as_slice(), cube.meta.strides());
    let (cube, mine) = if row_major {
        let mine = last_user && cube.handle.can_mut();
        (cube, mine)
    } else {
        (fusion_op::dense(cube), true)
    };
    if mine {
        return (cube.clone(), cube, None);
    }
    let out = empty_of(&cube, cube.meta.shape().as_slice(), cube.dtype);
    (cube.clone(), out, Some(cube))
}

/// Hands `inputs`' buffers (and `scratch` buffers of the given shapes and types, fresh) to
/// `work` once burn's producers of the inputs are queued (see the module docs); returns one
/// output per input, of its shape and type, that only [`join`] may be given, and what it waits
/// for. `work` runs on cubecl's device thread with the buffers' addresses ([`ForkBuffers`])
/// and must enqueue `fence.wait_on`, its computation — which writes every output — and
/// `fence.signal_on` on its stream, and not block. Every output must be joined: the work may
/// still be writing it.
///
/// # Errors
/// When device-side ordering is unavailable on the inputs' device ([`ready`]), or an earlier
/// work failed to enqueue.
///
/// # Panics
/// When `inputs` is empty.
pub fn fork(
    inputs: Vec<Prim>,
    scratch: Vec<(Shape, DType)>,
    work: impl FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send + 'static,
) -> Result<(Vec<Prim>, Join)> {
    let side = fork_checks(&inputs)?;
    let (outputs, _, join) = fork_joining(side, (inputs, false), scratch, work, None);
    Ok((outputs, join))
}

/// [`fork`] whose outputs after the first stay out of burn-fusion's sight until joined: the
/// operation has one output, the first input's (its token), and [`join_held`] or
/// [`fork_and_join`] given that token make every output readable. Burn-fusion handles one
/// tensor less per output kept back — what a DDP bucket of many gradients costs its stream.
///
/// # Errors
/// As [`fork`].
///
/// # Panics
/// When `inputs` is empty.
pub fn fork_held(
    inputs: Vec<Prim>,
    scratch: Vec<(Shape, DType)>,
    work: impl FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send + 'static,
) -> Result<(Prim, Join)> {
    let side = fork_checks(&inputs)?;
    let (mut token, _, join) = fork_joining(side, (inputs, true), scratch, work, None);
    Ok((token.remove(0), join))
}

/// [`fork`], and in the same operation of burn-fusion's stream right after it [`join_held`] of
/// this fork and of `joins` (earlier [`fork_held`]s, `tokens` their tokens, one each, in the
/// same order): DDP's last bucket and its step's join as one operation, where nothing of
/// burn's runs between them anyway. Returns this fork's outputs and every earlier fork's, all
/// readable.
///
/// # Errors
/// As [`fork`]; then nothing was queued, and the tokens still need their join.
///
/// # Panics
/// When `inputs` is empty, or `tokens` and `joins` differ in length.
pub fn fork_and_join(
    inputs: Vec<Prim>,
    scratch: Vec<(Shape, DType)>,
    work: impl FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send + 'static,
    (tokens, joins): (Vec<Prim>, &[Join]),
) -> std::result::Result<(Vec<Prim>, Vec<Prim>), Unjoined> {
    let side = match fork_checks(&inputs) {
        Ok(side) => side,
        Err(e) => return Err((e, tokens)),
    };
    let (outputs, earlier, _) = fork_joining(side, (inputs, false), scratch, work, Some((tokens, joins)));
    Ok((outputs, earlier))
}

/// A failed [`fork_and_join`]'s error, and the earlier tokens it was given, still to be joined.
pub type Unjoined = (Error, Vec<Prim>);

/// What every fork checks first: no earlier work failed to enqueue, and the inputs' device
/// orders other streams ([`ready`]). Returns that device's fence kernels.
fn fork_checks(inputs: &[Prim]) -> Result<Arc<Mutex<SideKernels>>> {
    if let Some(e) = failure().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Err(Error::Cuda { op: "work on another CUDA stream".into(), reason: e.clone() });
    }
    kernels(inputs.first().expect("a fork has inputs").client.device().index)
}

/// [`fork`] once checked (`side`: the device's fence kernels), its outputs after the first
/// kept back when `hold` ([`fork_held`]), joined in the same operation with `then_join`'s
/// earlier held forks when given ([`fork_and_join`]); returns this fork's outputs (its token
/// alone when held), every earlier fork's outputs and this fork's join.
fn fork_joining(
    side: Arc<Mutex<SideKernels>>,
    (inputs, hold): (Vec<Prim>, bool),
    scratch: Vec<(Shape, DType)>,
    work: impl FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send + 'static,
    then_join: Option<(Vec<Prim>, &[Join])>,
) -> (Vec<Prim>, Vec<Prim>, Join) {
    let like: Vec<(Shape, DType)> = inputs.iter().map(fusion_op::like).collect();
    let join = Join::new(hold.then(|| like[1..].to_vec()));
    let (state, held) = (join.0.clone(), join.clone());
    let (tokens, joins) = then_join.map_or((Vec::new(), None), |(t, j)| (t, Some(j.to_vec())));
    // The joins this operation ends with: the earlier forks' and its own, when it joins.
    let states: Vec<Arc<Mutex<JoinState>>> =
        joins.iter().flatten().map(|j| j.0.clone()).chain(joins.as_ref().map(|_| state.clone())).collect();
    let mine = if hold { 1 } else { inputs.len() };
    let mut outputs: Vec<(Shape, DType)> = like.into_iter().take(mine).collect();
    outputs.extend(expanded(&tokens, joins.as_deref().unwrap_or_default()));
    let work = Mutex::new(Some(work));
    let (n_in, earlier_joins) = (inputs.len(), joins.clone().unwrap_or_default());
    let exec = move |mut ins: Vec<(Cube, bool)>| {
        let tokens = ins.split_off(n_in);
        let work = work.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut outs = hand_over(ins, &scratch, work, (state.clone(), side.clone()));
        if hold {
            *held.1.as_ref().expect("a held fork keeps its outputs").cubes.lock().unwrap_or_else(|p| p.into_inner()) =
                outs.split_off(1);
        }
        if !states.is_empty() {
            crate::diagnose::spin(crate::diagnose::HostThread::Fusion);
            submit_joins(&outs[0], states.clone());
        }
        outs.extend(hand_back(tokens.into_iter().map(|(cube, _)| cube), &earlier_joins));
        outs
    };
    let name = if joins.is_some() { "side-stream fork and join" } else { "side-stream fork" };
    let inputs: Vec<Prim> = inputs.into_iter().chain(tokens).collect();
    let mut outs = fusion_op::queue_owned(name, inputs, &outputs, exec);
    let earlier = outs.split_off(mine);
    (outs, earlier, join)
}

/// The shapes and types of what joining held forks makes readable: per fork its token's and
/// its held outputs'.
fn expanded(tokens: &[Prim], joins: &[Join]) -> Vec<(Shape, DType)> {
    assert_eq!(tokens.len(), joins.len(), "one token per held fork");
    tokens.iter().zip(joins).flat_map(|(t, j)| j.expanded(fusion_op::like(t)).collect::<Vec<_>>()).collect()
}

/// The buffers of held forks once joined (on the fusion thread): per fork its token's, then
/// its held outputs'.
fn hand_back(tokens: impl Iterator<Item = Cube>, joins: &[Join]) -> Vec<Cube> {
    tokens.zip(joins).flat_map(|(t, j)| std::iter::once(t).chain(j.take_held())).collect()
}

/// A fork's work on the fusion thread: places `ins`' buffers and the scratch buffers, and
/// submits to cubecl's device thread the hand-over (addresses, the fence on burn's stream) and
/// `work` (or its hand-over to the enqueue thread), which sets `state`. Returns the outputs.
fn hand_over(
    ins: Vec<(Cube, bool)>,
    scratch: &[(Shape, DType)],
    work: Option<impl FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send + 'static>,
    (state, side): (Arc<Mutex<JoinState>>, Arc<Mutex<SideKernels>>),
) -> Vec<Cube> {
    crate::trace::span("ddp: hand a bucket over (fusion thread)", DDP_BACKEND_THREADS, || {
        let (mut sources, mut outs, mut keep, mut in_place) =
            (Vec::with_capacity(ins.len()), Vec::with_capacity(ins.len()), Vec::new(), Vec::new());
        span("ddp: place the buffers", || {
            for (cube, last_user) in ins {
                let (src, out, kept) = place(cube, last_user);
                sources.push(src);
                outs.push(out);
                in_place.push(kept.is_none());
                keep.extend(kept);
            }
        });
        let scratch: Vec<Cube> = span("ddp: scratch buffers", || {
            scratch.iter().map(|(shape, dtype)| empty_of(&sources[0], shape.as_slice(), *dtype)).collect()
        });
        let (device, client) = (sources[0].device.clone(), sources[0].client.clone());
        let (buffers, returned) = ((sources, outs.clone(), in_place, scratch), outs);
        device_thread::submit(&device, move || {
            let (sources, outs, in_place, scratch) = buffers;
            let hand_over = |side: &Mutex<SideKernels>| -> Result<(Order, ForkBuffers)> {
                // The resources are held until the addresses are taken; the cubes keep the
                // buffers until the join.
                let (bufs, _held) = span("ddp: buffers' addresses", || {
                    fork_addresses(&client, &sources, (&outs, &in_place), &scratch)
                })?;
                let order = span("ddp: flag on burn's stream", || order_on_burn(side, device.index, &client))?;
                Ok((order, bufs))
            };
            let outcome =
                match crate::trace::span("ddp: hand a bucket over (device thread)", DDP_BACKEND_THREADS, || {
                    let (order, bufs) = hand_over(&side)?;
                    let work = work.ok_or_else(|| fail("forking to another stream", "the operation ran twice"))?;
                    let side = SideFence { order, kernels: side };
                    let ticket = match enqueue_thread() {
                        Some(thread) => Some(thread.send(bufs, side, Box::new(work))),
                        None => {
                            span("ddp: enqueue the collective", || work(&bufs, &side))?;
                            None
                        }
                    };
                    Ok((order, ticket))
                }) {
                    Ok((order, ticket)) => {
                        JoinState::Enqueued(order, keep.into_iter().chain(scratch).collect(), ticket)
                    }
                    Err(e) => {
                        enqueue_failed(&e);
                        JoinState::Failed
                    }
                };
            *state.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
        });
        returned
    })
}

/// A [`fork_held`] that hands nothing to another stream: one operation of burn-fusion's stream
/// whose outputs are its inputs' buffers (the first as its token, the rest held), and a
/// [`Join`] that waits for nothing — what a fork and its join cost burn-fusion alone
/// (`BURN_DDP_DIAGNOSE=no-stream-work`, a world of one).
///
/// # Panics
/// When `inputs` is empty.
pub fn pass_through(inputs: Vec<Prim>) -> (Prim, Join) {
    let like: Vec<(Shape, DType)> = inputs.iter().map(fusion_op::like).collect();
    let join = Join::new(Some(like[1..].to_vec()));
    *join.0.lock().unwrap_or_else(|p| p.into_inner()) = JoinState::Failed;
    let held = join.clone();
    let exec = move |ins: Vec<(Cube, bool)>| {
        let mut outs: Vec<Cube> = ins.into_iter().map(|(cube, _)| cube).collect();
        *held.1.as_ref().expect("held").cubes.lock().unwrap_or_else(|p| p.into_inner()) = outs.split_off(1);
        outs
    };
    (fusion_op::queue_owned("side-stream pass-through", inputs, &like[..1], exec).remove(0), join)
}

/// A fork's first step, in order with burn's kernels: with `CudnnOptions::direct_fences`, where
/// the current burn stream owns the device's same-stream path (`same_stream::direct_fence_stream`),
/// an event recorded on burn's CUDA stream ([`Order::Events`]); else the flag stored on burn's
/// stream through cubecl (`stream_bridge`).
fn order_on_burn(side: &Mutex<SideKernels>, device: usize, client: &ComputeClient<CudaRuntime>) -> Result<Order> {
    let Some(stream) = same_stream::direct_fence_stream(device) else {
        crate::nn::runtime::profile::count_fork(false);
        return stream_bridge::before(Channel::Side, device, client, false).map(Order::Flags);
    };
    let burn = stream as driver::CUstream;
    let mut k = bound(side)?;
    let (fork, join) = (k.event()?, k.event()?);
    // SAFETY: burn's live stream of the bound (primary) context; an event of it.
    match unsafe { driver::cuEventRecord(fork, burn) }.result() {
        Ok(()) => {
            crate::nn::runtime::profile::count_fork(true);
            Ok(Order::Events { burn, fork, join })
        }
        Err(e) => {
            k.events.extend([fork, join]);
            Err(fail("recording a CUDA event on burn's stream", e))
        }
    }
}

/// A join's last step: burn's stream waits for the work's signal, as `order` was made.
fn wait_on_burn(device: usize, order: &Order) {
    match *order {
        Order::Flags(fence) => stream_bridge::after(Channel::Side, device, &fence),
        Order::Events { burn, fork, join } => {
            if let Err(e) = wait_for_event(device, burn, join) {
                log::error!("{e}; burn's stream may read the collective's buffers early");
            }
            // Waits already enqueued keep the records they saw: the events may serve again.
            if let Ok(side) = kernels(device) {
                side.lock().unwrap_or_else(|p| p.into_inner()).events.extend([fork, join]);
            }
        }
    }
}

/// Burn's stream `burn` waits for `join` on the device. Where the joining burn stream is not
/// the one the events were recorded for, or that wait cannot be enqueued, the host waits for
/// the work instead: slower, never unordered.
fn wait_for_event(device: usize, burn: driver::CUstream, join: driver::CUevent) -> Result<()> {
    // The context stays bound on this thread once the lock is released.
    let side = kernels(device)?;
    drop(bound(&side)?);
    if matches!(same_stream::direct_fence_stream(device), Some(s) if s as driver::CUstream == burn) {
        // SAFETY: live handles of the bound context.
        match unsafe { driver::cuStreamWaitEvent(burn, join, 0) }.result() {
            Ok(()) => return Ok(()),
            Err(e) => log::warn!("ordering burn's stream after a collective failed ({e:?}); the host waits for it"),
        }
    }
    // SAFETY: as above.
    unsafe { driver::cuEventSynchronize(join) }.result().map_err(|e| fail("waiting for a collective on the host", e))
}

/// A part of a fork's or a join's work on the backend's threads, timed as its own span inside
/// theirs (`bench --ddp`'s `backend_thread_spans` lists each part).
fn span<T>(name: &str, f: impl FnOnce() -> T) -> T {
    crate::trace::span(name, DDP_BACKEND_THREADS, f)
}

fn enqueue_failed(e: &Error) {
    log::error!("work on another CUDA stream failed to enqueue: {e}");
    failure().lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.to_string());
}

/// A fork's work, as [`fork`] takes it.
type Work = Box<dyn FnOnce(&ForkBuffers, &SideFence) -> Result<()> + Send>;

/// Set once the enqueue thread has enqueued a fork's work (or, where that failed, its signal).
type Ticket = Arc<(Mutex<bool>, std::sync::Condvar)>;

/// Blocks until the enqueue thread is done with the ticket's work.
fn wait_for(ticket: &Ticket) {
    let (done, changed) = &**ticket;
    let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
    while !*done {
        done = changed.wait(done).unwrap_or_else(|p| p.into_inner());
    }
}

/// The thread that enqueues forks' work on their streams, in the order the forks ran, instead
/// of cubecl's device thread (`BURN_DDP_ENQUEUE_THREAD=1`, experimental, off by default: on an
/// H100, 2026-12-05, it gained nothing, since the joins then wait for the enqueue). The device
/// thread only takes the buffers' addresses and stores the fence on burn's stream (what must
/// happen in order with burn's kernels); a DDP bucket's NCCL
/// enqueue — the wait, the bucket copies, the grouped all-reduce, the signal: about 94 µs of
/// the device thread's time per ViT-B/16 bucket on an H200 (2026-12-05), where that thread
/// sets a host-bound step's pace — runs here. A [`join`] (on the device thread, usually long
/// after) waits until its fork's work is enqueued before burn's stream waits for the signal, as
/// `stream_bridge::after` requires. Work that fails to enqueue still signals, so burn's stream
/// never waits for nothing; the failure is reported by the next [`fork`].
struct EnqueueThread(Mutex<std::sync::mpsc::Sender<(ForkBuffers, SideFence, Work, Ticket)>>);

impl EnqueueThread {
    fn send(&self, bufs: ForkBuffers, fence: SideFence, work: Work) -> Ticket {
        let ticket: Ticket = Arc::default();
        let sent = self.0.lock().unwrap_or_else(|p| p.into_inner()).send((bufs, fence, work, ticket.clone()));
        if let Err(std::sync::mpsc::SendError((bufs, fence, work, ticket))) = sent {
            // The thread is gone (it never panics by design): enqueue here instead.
            run(&bufs, &fence, work, &ticket);
        }
        ticket
    }
}

/// Enqueues `work` (with the device's context current: off the device thread none is), and
/// where that fails the signal alone; then sets `ticket`.
fn run(bufs: &ForkBuffers, fence: &SideFence, work: Work, ticket: &Ticket) {
    let bound = fence.kernels.lock().unwrap_or_else(|p| p.into_inner()).ctx.bind_to_thread();
    if let Err(e) = bound.map_err(|e| fail("binding the CUDA context", e)).and_then(|()| work(bufs, fence)) {
        enqueue_failed(&e);
        // The work's own stream is unknown here: the signal goes on a stream of its own.
        let signalled = fence.kernels.lock().unwrap_or_else(|p| p.into_inner()).ctx.new_stream();
        match signalled.map_err(|e| fail("creating a CUDA stream", e)) {
            Ok(stream) => {
                if let Err(e) = fence.signal_on(stream.cu_stream()) {
                    log::error!("signalling a failed fork's fence: {e}; burn's stream may wait forever");
                }
                let _ = stream.synchronize();
            }
            Err(e) => log::error!("signalling a failed fork's fence: {e}; burn's stream may wait forever"),
        }
    }
    *ticket.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
    ticket.1.notify_all();
}

/// The enqueue thread when `BURN_DDP_ENQUEUE_THREAD=1` (read once), started on first use.
fn enqueue_thread() -> Option<&'static EnqueueThread> {
    static THREAD: OnceLock<Option<EnqueueThread>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            if !std::env::var("BURN_DDP_ENQUEUE_THREAD").is_ok_and(|v| v == "1") {
                return None;
            }
            let (tx, rx) = std::sync::mpsc::channel::<(ForkBuffers, SideFence, Work, Ticket)>();
            let spawned = std::thread::Builder::new().name("burn-ddp-enqueue".into()).spawn(move || {
                for (bufs, fence, work, ticket) in rx {
                    crate::trace::span("ddp: enqueue a bucket's collective", crate::trace::DDP_ENQUEUE_THREAD, || {
                        run(&bufs, &fence, work, &ticket)
                    });
                }
            });
            match spawned {
                Ok(_) => Some(EnqueueThread(Mutex::new(tx))),
                Err(e) => {
                    log::warn!(
                        "BURN_DDP_ENQUEUE_THREAD: could not start the enqueue thread ({e}); the device thread enqueues"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// `outputs` (a [`fork`]'s) once burn's stream has waited for the work's signal: what burn
/// launches after this reads the work's results, as one operation of burn-fusion's stream.
/// The host does not wait.
///
/// # Panics
/// When `outputs` is empty.
pub fn join(outputs: Vec<Prim>, join: &Join) -> Vec<Prim> {
    let state = vec![join.0.clone()];
    let shapes: Vec<(Shape, DType)> = outputs.iter().map(fusion_op::like).collect();
    let exec = move |inputs: Vec<Cube>| {
        submit_joins(&inputs[0], state.clone());
        inputs
    };
    fusion_op::queue("side-stream join", outputs, &shapes, exec)
}

/// Every output of held forks ([`fork_held`]: `tokens` their tokens, one each, in the order of
/// `joins`), readable once burn's stream has waited for each fork's signal, as one operation
/// of burn-fusion's stream: per fork its token, then its held outputs. The host does not wait.
///
/// # Panics
/// When `tokens` is empty, or `tokens` and `joins` differ in length.
pub fn join_held(tokens: Vec<Prim>, joins: &[Join]) -> Vec<Prim> {
    let outputs = expanded(&tokens, joins);
    let (states, joins): (Vec<Arc<Mutex<JoinState>>>, Vec<Join>) =
        (joins.iter().map(|j| j.0.clone()).collect(), joins.to_vec());
    let exec = move |tokens: Vec<Cube>| {
        crate::trace::span("ddp: join buckets (fusion thread)", DDP_BACKEND_THREADS, || {
            submit_joins(&tokens[0], states.clone());
            hand_back(tokens.into_iter(), &joins)
        })
    };
    fusion_op::queue("side-stream join", tokens, &outputs, exec)
}

/// Submits to cubecl's device thread of `like`'s device: burn's stream waits for each of
/// `states`' work, in order; then their buffers may serve burn again.
fn submit_joins(like: &Cube, states: Vec<Arc<Mutex<JoinState>>>) {
    let device = like.device.clone();
    device_thread::submit(&like.device, move || {
        crate::diagnose::spin(crate::diagnose::HostThread::Device);
        crate::trace::span("ddp: join buckets (device thread)", DDP_BACKEND_THREADS, || {
            for state in &states {
                let done = std::mem::replace(&mut *state.lock().unwrap_or_else(|p| p.into_inner()), JoinState::Failed);
                if let JoinState::Enqueued(order, keep, ticket) = done {
                    if let Some(ticket) = ticket {
                        wait_for(&ticket);
                    }
                    wait_on_burn(device.index, &order);
                    // Burn's stream now waits for the work: its buffers may serve burn again.
                    drop(keep);
                }
            }
        })
    });
}
