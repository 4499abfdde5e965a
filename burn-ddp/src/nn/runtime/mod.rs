//! What the GPU layers keep and count across a process: burn-cuda's persistent kernel caches,
//! where its memory goes, host-time counters, and which implementation each layer kind runs.

pub mod kernel_cache;
pub mod memory;
pub mod profile;
pub(crate) mod report;
