//! Work on a CUDA stream of someone else's (NCCL's collectives) on a buffer of burn's, ordered
//! on the device: it starts after burn's kernels that produced the buffer, burn reads the buffer
//! again only after it has finished, and neither the training thread nor cubecl's device thread
//! waits for anything in between — burn keeps computing while the other stream works.
//!
//! [`fork`] is an operation of burn-fusion's stream (see `fusion_op`): on cubecl's device thread,
//! in order with burn's kernels, it stores a flag on burn's stream (`stream_bridge`, its own
//! [`Channel::Side`] flags) and hands the buffer's address and a [`SideFence`] to the caller's
//! work, which enqueues on its stream the fence's wait, its computation and the fence's signal.
//! Its output is the same buffer, which nothing of burn's touches until [`join`], another
//! operation of the stream, makes burn's stream wait for that signal. Between the two, burn's
//! stream runs on (a DDP backward keeps computing the next buckets' gradients).
//!
//! Should the work fail to enqueue, it is logged, [`join`] does not wait (nothing would signal),
//! and the next [`fork`] returns the error: the caller's own checks (the process group's
//! error) report what the values are worth.

use super::cudnn_burn::device_index;
use super::fusion_op::{self, Cube};
use super::stream_bridge::{self, Channel, DeviceKernels, Fence};
use super::{cudnn_types::fail, device_thread};
use crate::error::{Error, Result};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_cuda::Cuda;
use cudarc::driver::{CudaContext, sys as driver};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The fence kernels of one device, for other streams of its primary context.
struct SideKernels {
    ctx: Arc<CudaContext>,
    kernels: DeviceKernels,
}

/// What the work enqueues on its stream around its computation.
pub struct SideFence {
    fence: Fence,
    kernels: Arc<Mutex<SideKernels>>,
}

impl SideFence {
    /// Enqueues on `stream` (of the device's primary context) a wait until burn's stream has
    /// run everything queued before the fork. Enqueue it before the computation.
    ///
    /// # Errors
    /// When the launch fails.
    pub fn wait_on(&self, stream: driver::CUstream) -> Result<()> {
        let k = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        k.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
        k.kernels.wait(stream, &self.fence)
    }

    /// Enqueues on `stream` the signal [`join`] waits for. Enqueue it after the computation.
    ///
    /// # Errors
    /// When the launch fails (then [`join`] would wait forever: the caller must not join).
    pub fn signal_on(&self, stream: driver::CUstream) -> Result<()> {
        let k = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        k.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
        k.kernels.signal(stream, &self.fence)
    }
}

enum JoinState {
    /// The fork has not run on the device thread yet.
    Pending,
    /// The work and its signal are enqueued.
    Enqueued(Fence),
    /// The work failed to enqueue: nothing to wait for.
    Failed,
}

/// What [`join`] waits for: the signal of one [`fork`]'s work.
#[derive(Clone)]
pub struct Join(Arc<Mutex<JoinState>>);

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
    let k = Arc::new(Mutex::new(SideKernels { ctx, kernels }));
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

/// Hands `t`'s buffer to `work` once burn's producers of it are queued (see the module docs);
/// returns the same buffer as a tensor that only [`join`] may be given, and what it waits for.
/// `work` runs on cubecl's device thread with the buffer's address (the tensor packed, as
/// `t.dims()` row-major) and must enqueue `fence.wait_on`, its computation and
/// `fence.signal_on` on its stream, and not block.
///
/// # Errors
/// When device-side ordering is unavailable on `t`'s device ([`ready`]), or an earlier work
/// failed to enqueue.
pub fn fork<const D: usize>(t: Tensor<Cuda, D>, work: impl FnOnce(u64, &SideFence) -> Result<()> + Send + 'static) -> Result<(Tensor<Cuda, D>, Join)> {
    if let Some(e) = failure().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Err(Error::Cuda { op: "work on another CUDA stream".into(), reason: e.clone() });
    }
    let side = kernels(device_index(&t))?;
    let join = Join(Arc::new(Mutex::new(JoinState::Pending)));
    let state = join.0.clone();
    let work = Mutex::new(Some(work));
    let prim = t.into_primitive().tensor();
    let out = fusion_op::like(&prim);
    let exec = move |inputs: Vec<Cube>| {
        let cube = fusion_op::dense(inputs.into_iter().next().expect("one input"));
        let (device, client, handle) = (cube.device.clone(), cube.client.clone(), cube.handle.clone());
        let (work, state, side) = (work.lock().unwrap_or_else(|p| p.into_inner()).take(), state.clone(), side.clone());
        device_thread::submit(&device, move || {
            let enqueue = || -> Result<Fence> {
                let work = work.ok_or_else(|| fail("forking to another stream", "the operation ran twice"))?;
                let resource = client.get_resource(handle).map_err(|e| fail("device pointer", e))?;
                let fence = stream_bridge::before(Channel::Side, device.index, &client, false)?;
                work(resource.resource().ptr, &SideFence { fence, kernels: side })?;
                Ok(fence)
            };
            let outcome = match enqueue() {
                Ok(fence) => JoinState::Enqueued(fence),
                Err(e) => {
                    log::error!("work on another CUDA stream failed to enqueue: {e}");
                    failure().lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.to_string());
                    JoinState::Failed
                }
            };
            *state.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
        });
        vec![cube]
    };
    let forked = fusion_op::queue("side-stream fork", vec![prim], &[out], exec).remove(0);
    Ok((Tensor::from_primitive(TensorPrimitive::Float(forked)), join))
}

/// `t` (a [`fork`]'s output) once burn's stream has waited for the work's signal: what burn
/// launches after this reads the work's result. The host does not wait.
pub fn join<const D: usize>(t: Tensor<Cuda, D>, join: &Join) -> Tensor<Cuda, D> {
    let state = join.0.clone();
    let prim = t.into_primitive().tensor();
    let out = fusion_op::like(&prim);
    let exec = move |inputs: Vec<Cube>| {
        let cube = inputs.into_iter().next().expect("one input");
        let (device, state) = (cube.device.clone(), state.clone());
        device_thread::submit(&device, move || {
            if let JoinState::Enqueued(fence) = *state.lock().unwrap_or_else(|p| p.into_inner()) {
                stream_bridge::after(Channel::Side, device.index, &fence);
            }
        });
        vec![cube]
    };
    let joined = fusion_op::queue("side-stream join", vec![prim], &[out], exec).remove(0);
    Tensor::from_primitive(TensorPrimitive::Float(joined))
}
