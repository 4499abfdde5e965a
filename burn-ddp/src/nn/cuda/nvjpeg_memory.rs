//! The memory nvJPEG allocates for itself (its bitstream and intermediate buffers, grown when a
//! batch needs more). By default nvJPEG's own allocators provide it (`cudaMalloc`/`cudaFree`,
//! `cudaHostAlloc`/`cudaFreeHost`), and freeing either waits for the whole device, the
//! training's work included. Two diagnoses route it through allocators of ours, which count
//! every call ([`counts`]), chosen by `BURN_DDP_DECODE_ALLOC` when a decoder is created:
//! - `counted` ([`Allocators::Counted`]): what nvJPEG's defaults do, through the driver —
//!   `cuMemAlloc`/`cuMemFree` and `cuMemHostAlloc`/`cuMemFreeHost`.
//! - `stream` ([`Allocators::StreamOrdered`], a trial; needs `nvjpegCreateExV2`, else `counted`
//!   runs): device memory from the device's stream-ordered pool (`cuMemAllocAsync`/
//!   `cuMemFreeAsync` on the stream nvJPEG names), and pinned host memory kept once freed and
//!   handed out again once the stream nvJPEG named at its free has passed that point (an
//!   event): no free waits for the device.
//!
//! The callbacks are `extern "C"` functions nvJPEG calls on the thread that decodes, where the
//! device's context is bound (elsewhere the driver refuses, and the refusal goes back to
//! nvJPEG as a failed allocation); they never unwind.

use cudarc::driver::sys as driver;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

/// Which allocators a decoder gives nvJPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allocators {
    /// nvJPEG's own (the default), not counted.
    Library,
    Counted,
    StreamOrdered,
}

impl Allocators {
    /// `BURN_DDP_DECODE_ALLOC`: `counted`, `stream`, or anything else (or nothing) for nvJPEG's
    /// own; read once per process.
    pub(super) fn from_env() -> Self {
        static KIND: OnceLock<Allocators> = OnceLock::new();
        *KIND.get_or_init(|| match std::env::var("BURN_DDP_DECODE_ALLOC").as_deref() {
            Ok("counted") => Allocators::Counted,
            Ok("stream") => Allocators::StreamOrdered,
            _ => Allocators::Library,
        })
    }
}

/// Whether this process's decoders count nvJPEG's allocations (`BURN_DDP_DECODE_ALLOC` set to
/// `counted` or `stream`).
pub(crate) fn counting() -> bool {
    Allocators::from_env() != Allocators::Library
}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the allocating one.
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// nvJPEG's calls to its allocators, summed over this process: device allocations, device
/// frees, pinned allocations, pinned frees (a pinned block handed out again counts as an
/// allocation too).
static COUNTS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
const DEVICE_ALLOCS: usize = 0;
const DEVICE_FREES: usize = 1;
const PINNED_ALLOCS: usize = 2;
const PINNED_FREES: usize = 3;

/// [`COUNTS`] as they stand: `[device allocations, device frees, pinned allocations, pinned frees]`.
pub(crate) fn counts() -> [u64; 4] {
    COUNTS.each_ref().map(|c| c.load(Ordering::Relaxed))
}

fn count(which: usize) {
    COUNTS[which].fetch_add(1, Ordering::Relaxed);
}

fn status(r: driver::CUresult) -> c_int {
    match r {
        driver::CUresult::CUDA_SUCCESS => 0,
        e => e as c_int,
    }
}

/// `nvjpegDevAllocator_t`.
#[repr(C)]
pub(super) struct DevAllocator {
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// `nvjpegPinnedAllocator_t`.
#[repr(C)]
pub(super) struct PinnedAllocator {
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// `nvjpegDevAllocatorV2_t`.
#[repr(C)]
pub(super) struct DevAllocatorV2 {
    malloc: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, usize, driver::CUstream) -> c_int,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, driver::CUstream) -> c_int,
    ctx: *mut c_void,
}

/// `nvjpegPinnedAllocatorV2_t`.
#[repr(C)]
pub(super) struct PinnedAllocatorV2 {
    malloc: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, usize, driver::CUstream) -> c_int,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, driver::CUstream) -> c_int,
    ctx: *mut c_void,
}

// SAFETY (both): their context pointer is always null, and the functions are plain code.
unsafe impl Sync for DevAllocatorV2 {}
unsafe impl Sync for PinnedAllocatorV2 {}

static CUDA_DEVICE: DevAllocator = DevAllocator { malloc: dev_malloc, free: dev_free };
static CUDA_PINNED: PinnedAllocator = PinnedAllocator { malloc: pinned_malloc, free: pinned_free };
static ORDERED_DEVICE: DevAllocatorV2 =
    DevAllocatorV2 { malloc: dev_malloc_async, free: dev_free_async, ctx: std::ptr::null_mut() };
static ORDERED_PINNED: PinnedAllocatorV2 =
    PinnedAllocatorV2 { malloc: pinned_reuse, free: pinned_keep, ctx: std::ptr::null_mut() };

/// The device and pinned allocator structs of `kind`, for `nvjpegCreateEx` (`Counted`) or
/// `nvjpegCreateExV2` (`StreamOrdered`); they live as long as the process. Null for nvJPEG's own.
pub(super) fn allocators(kind: Allocators) -> (*mut c_void, *mut c_void) {
    match kind {
        Allocators::Library => (std::ptr::null_mut(), std::ptr::null_mut()),
        Allocators::Counted => {
            (&CUDA_DEVICE as *const DevAllocator as *mut c_void, &CUDA_PINNED as *const PinnedAllocator as *mut c_void)
        }
        Allocators::StreamOrdered => (
            &ORDERED_DEVICE as *const DevAllocatorV2 as *mut c_void,
            &ORDERED_PINNED as *const PinnedAllocatorV2 as *mut c_void,
        ),
    }
}

unsafe extern "C" fn dev_malloc(at: *mut *mut c_void, size: usize) -> c_int {
    count(DEVICE_ALLOCS);
    // SAFETY: nvJPEG's out-pointer; the device's context is bound on the calling thread.
    unsafe { status(driver::cuMemAlloc_v2(at.cast(), size)) }
}

unsafe extern "C" fn dev_free(at: *mut c_void) -> c_int {
    count(DEVICE_FREES);
    // SAFETY: memory this allocator handed out.
    unsafe { status(driver::cuMemFree_v2(at as driver::CUdeviceptr)) }
}

unsafe extern "C" fn pinned_malloc(at: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    count(PINNED_ALLOCS);
    // SAFETY: nvJPEG's out-pointer; its flags are cudaHostAlloc's, which equal cuMemHostAlloc's.
    unsafe { status(driver::cuMemHostAlloc(at, size, flags)) }
}

unsafe extern "C" fn pinned_free(at: *mut c_void) -> c_int {
    count(PINNED_FREES);
    // SAFETY: memory this allocator handed out.
    unsafe { status(driver::cuMemFreeHost(at)) }
}

unsafe extern "C" fn dev_malloc_async(_: *mut c_void, at: *mut *mut c_void, size: usize, s: driver::CUstream) -> c_int {
    count(DEVICE_ALLOCS);
    // SAFETY: nvJPEG's out-pointer and stream, of the bound context.
    unsafe { status(driver::cuMemAllocAsync(at.cast(), size, s)) }
}

unsafe extern "C" fn dev_free_async(_: *mut c_void, at: *mut c_void, _: usize, s: driver::CUstream) -> c_int {
    count(DEVICE_FREES);
    // SAFETY: memory of the stream-ordered pool, freed after its last use on `s`.
    unsafe { status(driver::cuMemFreeAsync(at as driver::CUdeviceptr, s)) }
}

/// A pinned block nvJPEG freed: its address, its size as allocated, and the event recorded at
/// the free on the stream nvJPEG named.
struct Kept {
    at: usize,
    size: usize,
    event: usize,
}

/// The stream-ordered allocators' pinned blocks: those nvJPEG holds (address → size as
/// allocated: a kept block handed out for a smaller request keeps its whole size, whatever size
/// nvJPEG names at its free) and those it freed, kept for reuse.
#[derive(Default)]
struct PinnedPool {
    lent: HashMap<usize, usize>,
    kept: Vec<Kept>,
}

impl PinnedPool {
    /// Takes the smallest kept block of at least `size` bytes (and at most twice that) whose
    /// event has `passed`, and lends it: its address, and its event (to be destroyed).
    fn take(&mut self, size: usize, passed: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
        let fits = |k: &Kept| k.size >= size && k.size <= size.saturating_mul(2) && passed(k.event);
        let best = self.kept.iter().enumerate().filter(|(_, k)| fits(k)).min_by_key(|(_, k)| k.size).map(|(i, _)| i)?;
        let block = self.kept.swap_remove(best);
        self.lent.insert(block.at, block.size);
        Some((block.at, block.event))
    }

    /// A new block of `size` bytes at `at`, lent to nvJPEG.
    fn lend(&mut self, at: usize, size: usize) {
        self.lent.insert(at, size);
    }

    /// Keeps the block at `at` that nvJPEG freed (naming `size`), with its free's `event`.
    fn keep(&mut self, at: usize, size: usize, event: usize) {
        let size = self.lent.remove(&at).unwrap_or(size);
        self.kept.push(Kept { at, size, event });
    }

    /// Forgets the block at `at`, freed outright.
    fn forget(&mut self, at: usize) {
        self.lent.remove(&at);
    }
}

/// The pinned blocks of every decoder of this process.
static PINNED: LazyLock<Mutex<PinnedPool>> = LazyLock::new(Mutex::default);

fn pinned_pool<T>(f: impl FnOnce(&mut PinnedPool) -> T) -> T {
    f(&mut PINNED.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Whether `event` has completed.
fn passed(event: usize) -> bool {
    // SAFETY: an event this module created and has not destroyed.
    (unsafe { driver::cuEventQuery(event as driver::CUevent) }) == driver::CUresult::CUDA_SUCCESS
}

/// Hands out the smallest kept block of at least `size` bytes (and at most twice that) whose
/// free the device has passed, or a new one.
unsafe extern "C" fn pinned_reuse(_: *mut c_void, at: *mut *mut c_void, size: usize, _: driver::CUstream) -> c_int {
    count(PINNED_ALLOCS);
    if let Some((block, event)) = pinned_pool(|p| p.take(size, passed)) {
        // SAFETY: an event of this module, completed; nvJPEG's out-pointer.
        unsafe {
            driver::cuEventDestroy_v2(event as driver::CUevent);
            *at = block as *mut c_void;
        }
        return 0;
    }
    // SAFETY: nvJPEG's out-pointer; the device's context is bound on the calling thread.
    // Portable: a kept block may next serve another device's decoder.
    let r = unsafe { driver::cuMemHostAlloc(at, size, CU_MEMHOSTALLOC_PORTABLE) };
    if r == driver::CUresult::CUDA_SUCCESS {
        // SAFETY: set by the successful allocation just above.
        pinned_pool(|p| p.lend(unsafe { *at } as usize, size));
    }
    status(r)
}

/// Keeps a freed pinned block for [`pinned_reuse`], with an event on `s` marking the point
/// after which the device no longer reads it.
unsafe extern "C" fn pinned_keep(_: *mut c_void, at: *mut c_void, size: usize, s: driver::CUstream) -> c_int {
    count(PINNED_FREES);
    let mut event = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, then a live event and nvJPEG's stream.
    let recorded = unsafe {
        driver::cuEventCreate(&mut event, driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            == driver::CUresult::CUDA_SUCCESS
            && driver::cuEventRecord(event, s) == driver::CUresult::CUDA_SUCCESS
    };
    if !recorded {
        // No event to wait by: give the block back the way the default would.
        pinned_pool(|p| p.forget(at as usize));
        // SAFETY: memory this allocator handed out; `event` is null or live.
        unsafe {
            if !event.is_null() {
                driver::cuEventDestroy_v2(event);
            }
            return status(driver::cuMemFreeHost(at));
        }
    }
    pinned_pool(|p| p.keep(at as usize, size, event as usize));
    0
}

#[cfg(test)]
mod tests {
    use super::PinnedPool;

    #[test]
    fn a_kept_block_keeps_its_whole_size_and_waits_for_its_event() {
        let mut pool = PinnedPool::default();
        pool.lend(0x1000, 4096);
        pool.keep(0x1000, 4096, 7);
        assert_eq!(pool.take(3000, |_| false), None, "its free not yet passed on the device");
        assert_eq!(pool.take(3000, |e| e == 7), Some((0x1000, 7)));
        // nvJPEG frees it naming the size it asked for; the block still holds 4096 bytes.
        pool.keep(0x1000, 3000, 8);
        assert_eq!(pool.take(3500, |_| true), Some((0x1000, 8)), "3500 bytes fit the 4096-byte block");
        pool.keep(0x1000, 3500, 9);
        assert_eq!(pool.take(1024, |_| true), None, "a block over twice the request stays kept");
        assert_eq!(pool.take(4097, |_| true), None, "too small");
    }

    #[test]
    fn the_smallest_fitting_block_is_taken() {
        let mut pool = PinnedPool::default();
        for (at, size) in [(1, 8000), (2, 5000), (3, 6000)] {
            pool.lend(at, size);
            pool.keep(at, size, at);
        }
        assert_eq!(pool.take(4500, |_| true), Some((2, 2)));
        assert_eq!(pool.take(4500, |_| true), Some((3, 3)));
        assert_eq!(pool.take(4500, |_| true), Some((1, 1)));
        assert_eq!(pool.take(4500, |_| true), None);
    }
}
