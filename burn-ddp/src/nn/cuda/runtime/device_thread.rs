//! Runs cuDNN work on cubecl's device thread, so the training thread never waits for it.
//!
//! burn-cuda (cubecl 0.10) launches every kernel of a device from one thread of its own; the
//! training thread hands it closures through a queue. Looking up a buffer's device address,
//! launching a flag kernel or flushing are each a blocking round trip through that queue from
//! any other thread (about 50 µs, and the wait for everything queued before), but a direct call
//! on the device thread. So each cuDNN computation becomes one closure, queued behind the
//! kernels that produce its inputs and ahead of the ones that read its outputs, run by a
//! [`DeviceService`] of ours that lives on that same thread.
//!
//! The first computation of each kind and shape waits for its result, so that a cuDNN refusal
//! (no algorithm, not enough memory) can still fall back to burn's kernels; once a kind has
//! succeeded, later ones are queued and the caller moves on. Should one of those fail after
//! all, its output is unusable: the error is logged at once and the next cuDNN call panics with
//! it, rather than let training go on with wrong values.

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl::device_handle::DeviceHandle;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

type Server = <CudaRuntime as cubecl::Runtime>::Server;

/// Our service on cubecl's device thread: it has no state, it only gives us a queue there.
struct CudnnService;

impl DeviceService for CudnnService {
    fn init(_device: DeviceId) -> Self {
        Self
    }
    fn utilities(&self) -> ServerUtilitiesHandle {
        Arc::new(())
    }
}

fn handle(device: &CudaDevice) -> DeviceHandle<CudnnService> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, DeviceHandle<CudnnService>>>> = OnceLock::new();
    let mut map = HANDLES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.entry(device.index).or_insert_with(|| DeviceHandle::new(device.to_id())).clone()
}

/// cubecl's own server for `device` (burn's buffers and kernels), reached through the same
/// device thread: from a job running there, a call on it is direct.
pub(crate) fn server(device: &CudaDevice) -> DeviceHandle<Server> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, DeviceHandle<Server>>>> = OnceLock::new();
    let mut map = HANDLES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.entry(device.index).or_insert_with(|| DeviceHandle::new(device.to_id())).clone()
}

fn proven() -> &'static Mutex<HashSet<u64>> {
    static PROVEN: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    PROVEN.get_or_init(Default::default)
}

fn failure() -> &'static Mutex<Option<String>> {
    static FAILURE: OnceLock<Mutex<Option<String>>> = OnceLock::new();
    FAILURE.get_or_init(Default::default)
}

/// Panics when a queued computation failed earlier (its output was wrong; see the module
/// docs). Called on the training thread wherever a cuDNN computation is queued.
pub(crate) fn check_failure() {
    if let Some(e) = failure().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        panic!("{e}");
    }
}

/// Runs `job` on `device`'s cubecl thread, in order with burn's kernels. `kind` identifies the
/// computation and its shapes: the first `job` of a kind is waited for and its error returned
/// (the caller falls back); later ones are queued and `Ok` comes back at once. After a queued
/// computation has failed, every call returns that error without running `job` (the caller
/// falls back; [`check_failure`] stops the training thread).
pub(crate) fn run(device: &CudaDevice, kind: u64, job: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    if let Some(e) = failure().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Err(fail("an earlier queued cuDNN computation", e.clone()));
    }
    let handle = handle(device);
    if proven().lock().unwrap_or_else(|p| p.into_inner()).contains(&kind) {
        handle.submit(move |_| {
            if let Err(e) = job() {
                let msg = format!(
                    "cuDNN failed on the device thread after the same computation had succeeded: {e}; \
                     the output of that step is invalid — rerun with BURN_DDP_CUDNN=0 to use burn's kernels"
                );
                log::error!("{msg}");
                failure().lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(msg);
            }
        });
        return Ok(());
    }
    let result = handle.submit_blocking(move |_| job()).map_err(|e| fail("running on cubecl's device thread", e))?;
    if result.is_ok() {
        proven().lock().unwrap_or_else(|p| p.into_inner()).insert(kind);
    }
    result
}

/// Queues `job` on `device`'s cubecl thread, in order with burn's kernels, and returns at once:
/// for work whose failure the job reports itself.
pub(crate) fn submit(device: &CudaDevice, job: impl FnOnce() + Send + 'static) {
    handle(device).submit(move |_| job());
}

/// Whether a computation of `kind` has succeeded before (later ones are queued without waiting).
pub(crate) fn is_proven(kind: u64) -> bool {
    proven().lock().unwrap_or_else(|p| p.into_inner()).contains(&kind)
}

/// Makes `device`'s device thread run everything queued so far: cubecl's queue hands tasks over
/// in batches, so a queued computation may otherwise wait until more work arrives.
pub(crate) fn flush(device: &CudaDevice) {
    handle(device).flush_queue();
}

/// A stable key for a computation kind: any hashable description of it.
pub(crate) fn kind(what: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(what)
}
