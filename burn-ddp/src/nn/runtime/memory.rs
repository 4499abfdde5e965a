//! Where a GPU's memory goes, as burn-cuda holds it: cubecl keeps one set of memory pools per
//! stream (one stream per host thread that queued work), and each pool reserves pages far larger
//! than the tensors in it. [`report`] reads every stream's pools: bytes in live tensors, their
//! padding, and the pages reserved. [`release_unused`] hands back the pages that hold no live
//! tensor (cubecl's explicit clean-up; the next allocation that needs one reserves it again),
//! as `torch.cuda.empty_cache()` does for PyTorch's cache: with exact-size blocks
//! (`kernel_cache::Allocator::ExactSizes`) blocks of one batch size do not serve another, so a
//! training loop calls it when the batch size changes.

/// One stream's pools.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, PartialEq)]
pub struct StreamMemory {
    /// cubecl's id of the stream (the order in which host threads first used a device).
    pub stream: u64,
    /// Bytes in live tensors.
    pub in_use: u64,
    /// Bytes of padding around them (alignment).
    pub padding: u64,
    /// Bytes of pages reserved from the driver.
    pub reserved: u64,
}

/// Every stream's pools on one device, and their totals.
#[derive(Clone, Debug, Default, serde::Serialize, PartialEq)]
pub struct MemoryReport {
    /// Streams with pages reserved, by stream id.
    pub streams: Vec<StreamMemory>,
    /// GiB in live tensors, all streams.
    pub in_use_gib: f64,
    /// GiB of pages reserved, all streams.
    pub reserved_gib: f64,
}

impl MemoryReport {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn from_streams(streams: Vec<StreamMemory>) -> Self {
        let gib = |f: fn(&StreamMemory) -> u64| streams.iter().map(f).sum::<u64>() as f64 / (1u64 << 30) as f64;
        Self { in_use_gib: gib(|s| s.in_use), reserved_gib: gib(|s| s.reserved), streams }
    }
}

/// Stream ids probed: cubecl numbers streams by the order host threads first touch a device
/// (a process uses a few: training, fusion and loader threads), and maps id `i` to pool
/// `i % max_streams`.
#[cfg(feature = "cuda")]
fn streams_probed() -> u64 {
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    u64::from(CubeClRuntimeConfig::get().streaming.max_streams).min(64)
}

#[cfg(feature = "cuda")]
fn client(gpu: usize) -> cubecl::client::ComputeClient<cubecl::cuda::CudaRuntime> {
    use cubecl::Runtime;
    cubecl::cuda::CudaRuntime::client(&cubecl::cuda::CudaDevice::new(gpu))
}

/// The pools of burn-cuda's device `gpu`; `None` without the `cuda` feature. Call it when the
/// device is idle (after a sync): reading a stream's pools waits for its queued work.
#[must_use]
pub fn report(gpu: usize) -> Option<MemoryReport> {
    #[cfg(feature = "cuda")]
    {
        use cubecl::stream_id::StreamId;
        let client = client(gpu);
        let streams = (0..streams_probed())
            .filter_map(|value| {
                let usage = StreamId { value }.executes(|| client.memory_usage()).ok()?;
                (usage.bytes_reserved > 0).then_some(StreamMemory {
                    stream: value,
                    in_use: usage.bytes_in_use,
                    padding: usage.bytes_padding,
                    reserved: usage.bytes_reserved,
                })
            })
            .collect();
        Some(MemoryReport::from_streams(streams))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = gpu;
        None
    }
}

/// Hands the pages of burn-cuda's device `gpu` that hold no live tensor back to the driver, on
/// every stream. Nothing without the `cuda` feature.
pub fn release_unused(gpu: usize) {
    #[cfg(feature = "cuda")]
    {
        use cubecl::stream_id::StreamId;
        let client = client(gpu);
        for value in 0..streams_probed() {
            StreamId { value }.executes(|| client.memory_cleanup());
        }
        let _ = StreamId { value: 0 }.executes(|| client.memory_usage());
    }
    #[cfg(not(feature = "cuda"))]
    let _ = gpu;
}

/// [`release_unused`] on `device` when it is burn-cuda's; nothing on other backends.
pub fn release_unused_on<D: 'static>(device: &D) {
    #[cfg(feature = "cuda")]
    if let Some(d) = (device as &dyn std::any::Any).downcast_ref::<cubecl::cuda::CudaDevice>() {
        release_unused(d.index);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_the_streams() {
        let s = |stream, in_use, reserved| StreamMemory { stream, in_use, padding: 0, reserved };
        let r = MemoryReport::from_streams(vec![s(0, 1 << 29, 1 << 30), s(3, 1 << 29, 1 << 31)]);
        assert_eq!((r.in_use_gib, r.reserved_gib), (1.0, 3.0));
        assert_eq!(MemoryReport::from_streams(vec![]).reserved_gib, 0.0);
    }
}
