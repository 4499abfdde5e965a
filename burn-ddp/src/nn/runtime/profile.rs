//! Where the host's time goes around the cuDNN path: a few process-wide counters, cheap enough
//! to be always on (two clock reads per phase), read by `burn-vision bench`. cuBLAS's products
//! go through the same ordered launch and are counted with cuDNN's calls (`calls`, and the
//! `cuda::cudnn::convolution` phase is the library call either way).
//!
//! With host-side ordering (`CudnnOptions::host_sync`) each call drains burn's stream
//! before cuDNN runs and cuDNN's after, so `wait_burn` is (roughly) the device time of burn's own
//! kernels queued since the last call and `cuda::cudnn::convolution` the device time of cuDNN's; with the default
//! device-side ordering both are only the host's cost of enqueueing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One phase of a cuDNN call.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Phase {
    /// Resolving burn's lazy tensors, packing pitched inputs, allocating the output.
    Prepare,
    /// Looking up the device addresses of the buffers.
    Resources,
    /// Ordering with burn's stream: the flag kernels on the device, or draining it on the host.
    WaitBurn,
    /// cuDNN's calls (and, ordered on the host, the wait for its stream).
    Cudnn,
    /// Handing the result back to burn's fusion graph.
    Register,
    /// Handing a computation to cubecl's device thread (and, the first time for its kind and
    /// shape, waiting for it there).
    Submit,
}

static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static CALLS: AtomicU64 = AtomicU64::new(0);
static DEVICE_ORDERED: AtomicU64 = AtomicU64::new(0);
static ON_BURNS_STREAM: AtomicU64 = AtomicU64::new(0);
static FORKS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// Runs `f`, adding its wall time to `phase`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn timed<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    NANOS[phase as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    out
}

/// Counts one call through the cuDNN path, whether it was ordered on the device, and whether
/// it ran on burn's own stream (no fence: `CudnnOptions::same_stream`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count_call(device_ordered: bool, on_burns_stream: bool) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    DEVICE_ORDERED.fetch_add(u64::from(device_ordered), Ordering::Relaxed);
    ON_BURNS_STREAM.fetch_add(u64::from(on_burns_stream), Ordering::Relaxed);
}

/// Counts one piece of work handed to another CUDA stream (a DDP bucket's or a SyncBatchNorm
/// exchange's collective) and how it was ordered with burn's stream: by CUDA events
/// (`CudnnOptions::direct_fences`) or by flags and fence kernels.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count_fork(by_events: bool) {
    FORKS[usize::from(by_events)].fetch_add(1, Ordering::Relaxed);
}

/// Totals since the process started; subtract two snapshots for a span.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, PartialEq)]
pub struct CudnnTimes {
    /// Computations (convolutions, batch norms) that went through the cuDNN path.
    pub calls: u64,
    /// Of those, the ones ordered with burn's stream on the device (the host did not wait).
    pub device_ordered: u64,
    /// Of those, the ones run on burn's own stream, with no fence (`CudnnOptions::same_stream`).
    pub on_burns_stream: u64,
    /// Work handed to another stream (collectives) ordered with burn's by CUDA events.
    pub forks_by_events: u64,
    /// The same, ordered by flags and fence kernels.
    pub forks_by_flags: u64,
    /// Seconds resolving and packing inputs, allocating outputs.
    pub prepare_s: f64,
    /// Seconds looking up device addresses (on cubecl's device thread unless host-ordered).
    pub resources_s: f64,
    /// Seconds ordering with burn's stream (flag kernels on the device thread, or waiting for it).
    pub wait_burn_s: f64,
    /// Seconds in cuDNN's calls (with host ordering: until its stream drained; otherwise on
    /// the device thread).
    pub cudnn_s: f64,
    /// Seconds registering outputs with burn.
    pub register_s: f64,
    /// Seconds the training thread spent handing work to the device thread (including the
    /// first call of each kind, which it waits for).
    pub submit_s: f64,
}

impl CudnnTimes {
    /// The counters now.
    pub fn now() -> Self {
        let s = |p: Phase| NANOS[p as usize].load(Ordering::Relaxed) as f64 * 1e-9;
        Self {
            calls: CALLS.load(Ordering::Relaxed),
            device_ordered: DEVICE_ORDERED.load(Ordering::Relaxed),
            on_burns_stream: ON_BURNS_STREAM.load(Ordering::Relaxed),
            forks_by_events: FORKS[1].load(Ordering::Relaxed),
            forks_by_flags: FORKS[0].load(Ordering::Relaxed),
            prepare_s: s(Phase::Prepare),
            resources_s: s(Phase::Resources),
            wait_burn_s: s(Phase::WaitBurn),
            cudnn_s: s(Phase::Cudnn),
            register_s: s(Phase::Register),
            submit_s: s(Phase::Submit),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            calls: self.calls - earlier.calls,
            device_ordered: self.device_ordered - earlier.device_ordered,
            on_burns_stream: self.on_burns_stream - earlier.on_burns_stream,
            forks_by_events: self.forks_by_events - earlier.forks_by_events,
            forks_by_flags: self.forks_by_flags - earlier.forks_by_flags,
            prepare_s: self.prepare_s - earlier.prepare_s,
            resources_s: self.resources_s - earlier.resources_s,
            wait_burn_s: self.wait_burn_s - earlier.wait_burn_s,
            cudnn_s: self.cudnn_s - earlier.cudnn_s,
            register_s: self.register_s - earlier.register_s,
            submit_s: self.submit_s - earlier.submit_s,
        }
    }
}

/// Starts (`true`) or stops the CUDA profiler's collection range on GPU `device` when the
/// environment variable `BURN_DDP_CUDA_PROFILER` is set (for `ncu --profile-from-start off`);
/// does nothing otherwise or without the `cuda` feature.
///
/// The range belongs to a CUDA context, and the calling thread (a training loop's) has none
/// current: burn launches from cubecl's device thread. The device's primary context (burn's) is
/// made current here first; without it the driver refuses the call and the profiler sees the
/// whole run, the algorithm searches of the first steps included, which it distorts (see
/// `cuda::cudnn::conv_graph`).
pub fn cuda_profiler_range(start: bool, device: usize) {
    if std::env::var_os("BURN_DDP_CUDA_PROFILER").is_none() {
        return;
    }
    #[cfg(feature = "cuda")]
    {
        let bound = cudarc::driver::CudaContext::new(device).and_then(|ctx| ctx.bind_to_thread());
        // SAFETY: plain driver calls without arguments, with a context current on this thread;
        // an error only means no profiler is attached.
        let r = bound.and_then(|()| {
            unsafe {
                if start { cudarc::driver::sys::cuProfilerStart() } else { cudarc::driver::sys::cuProfilerStop() }
            }
            .result()
        });
        log::info!("cuProfiler{} on GPU {device}: {r:?}", if start { "Start" } else { "Stop" });
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (start, device);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_between_snapshots() {
        let a = CudnnTimes::now();
        timed(Phase::Cudnn, || std::thread::sleep(std::time::Duration::from_millis(5)));
        count_call(true, true);
        count_fork(true);
        count_fork(false);
        let d = CudnnTimes::now().since(&a);
        assert!(d.calls >= 1 && d.device_ordered >= 1 && d.on_burns_stream >= 1);
        assert!(d.forks_by_events >= 1 && d.forks_by_flags >= 1);
        assert!(d.cudnn_s >= 0.004, "{d:?}");
    }
}
