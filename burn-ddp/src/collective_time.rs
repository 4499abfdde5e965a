//! The process's clock of time spent inside all-reduce collectives on tensors (the health
//! table's sync share), shared by the host path (`tensor`) and the NCCL path (`cuda_tensor`).

use crate::error::Result;

/// Nanoseconds spent inside all-reduce calls on tensors, process-wide.
static COLLECTIVE_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Seconds this process has spent inside all-reduce collectives on tensors so far: the groups'
/// own work (the transfer and reduction, NCCL's included), not the copy to the host nor the
/// wait for the kernels that produced the tensor; on NCCL groups the device time between CUDA
/// events around each collective. The health table's sync share.
pub fn collective_seconds() -> f64 {
    COLLECTIVE_NANOS.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
}

/// Adds `seconds` measured elsewhere (an NCCL collective's device time, from CUDA events).
#[cfg(feature = "cuda")]
pub(crate) fn add_seconds(seconds: f64) {
    COLLECTIVE_NANOS.fetch_add((seconds * 1e9) as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Runs one collective call, adding its time to [`collective_seconds`].
pub(crate) fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = std::time::Instant::now();
    let out = f();
    COLLECTIVE_NANOS.fetch_add(started.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    out
}
