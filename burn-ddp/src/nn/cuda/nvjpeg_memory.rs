//! nvJPEG's own device and pinned host memory (its bitstream copies, its intermediate buffers),
//! kept between its calls instead of handed back to the driver. nvJPEG's default allocators are
//! `cudaMalloc`/`cudaFree` and `cudaHostAlloc`/`cudaFreeHost`, and freeing either waits for all
//! work on the device: while a model trains, for the training's queued kernels. The decoder's
//! handle is created with nvJPEG's extended allocators (`nvjpegCreateExV2`), which call a
//! [`Pool`] of this device's: a block nvJPEG frees is kept, with an event recorded on the stream
//! nvJPEG names, and lent again to a later request of about its size: a device block after that
//! stream's work (the new stream waits for the event), a pinned block once the event has passed
//! (the host writes it at once). Driver allocations and frees are counted and timed
//! ([`driver_times`]).
//!
//! `BURN_DDP_DECODE_MEMORY=driver` lends nothing twice (every request and free reaches the
//! driver, still counted); `BURN_DDP_DECODE_MEMORY=nvjpeg` leaves nvJPEG its own allocators.

use cudarc::driver::sys as driver;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Who allocates nvJPEG's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Blocks kept between calls (the default).
    Pool,
    /// Every request and free to the driver, counted.
    Driver,
    /// nvJPEG's own allocators (not counted).
    Library,
}

/// The mode `BURN_DDP_DECODE_MEMORY` asks for (`pool`, `driver`, `nvjpeg`; `pool` when unset).
pub(crate) fn mode() -> Mode {
    static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("BURN_DDP_DECODE_MEMORY").as_deref() {
        Ok("driver") => Mode::Driver,
        Ok("nvjpeg") => Mode::Library,
        _ => Mode::Pool,
    })
}

/// Driver calls made for nvJPEG's memory in this process, and nanoseconds spent in them.
static DRIVER_CALLS: AtomicU64 = AtomicU64::new(0);
static DRIVER_NS: AtomicU64 = AtomicU64::new(0);

/// `(driver allocations and frees, nanoseconds in them)` for nvJPEG's memory so far.
pub(crate) fn driver_times() -> (u64, u64) {
    (DRIVER_CALLS.load(Ordering::Relaxed), DRIVER_NS.load(Ordering::Relaxed))
}

/// Most bytes of idle blocks a pool keeps; a block freed beyond it goes back to the driver.
const IDLE_LIMIT: usize = 1 << 30;

/// Where a pool's memory comes from, and how it orders reuse: the driver, or a fake in tests.
trait Backing {
    /// Marks the end of a block's last use on a stream.
    type Marker;
    fn alloc(&self, size: usize) -> Option<u64>;
    fn free(&self, at: u64);
    fn marker(&self) -> Option<Self::Marker>;
    /// Records `marker` after the work now queued on `stream`.
    fn record(&self, marker: &Self::Marker, stream: driver::CUstream) -> bool;
    /// Whether the work `marker` was recorded after has ended.
    fn passed(&self, marker: &Self::Marker) -> bool;
    /// Makes `stream`'s later work wait for `marker`.
    fn order(&self, marker: &Self::Marker, stream: driver::CUstream) -> bool;
}

/// Whether a block's host may write it at once (pinned memory): reused only after its marker
/// has passed. Device blocks are reused with the new stream ordered after the marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    Ordered,
    Passed,
}

struct Idle<M> {
    at: u64,
    size: usize,
    freed: M,
}

/// Blocks lent to nvJPEG and idle ones kept for it.
struct Pool<B: Backing> {
    backing: B,
    reuse: Reuse,
    /// Idle bytes kept at most (0: every free reaches the driver).
    limit: usize,
    idle: Vec<Idle<B::Marker>>,
    idle_bytes: usize,
    /// Address → (size, the marker it carried when last idle).
    lent: HashMap<u64, (usize, Option<B::Marker>)>,
}

/// Sizes are rounded up so that a later request of about the same size fits: to 2 MiB above
/// 1 MiB, to a power of two (at least 512 bytes) below.
fn rounded(size: usize) -> usize {
    const MIB: usize = 1 << 20;
    if size > MIB { size.div_ceil(2 * MIB) * 2 * MIB } else { size.next_power_of_two().max(512) }
}

impl<B: Backing> Pool<B> {
    fn new(backing: B, reuse: Reuse, limit: usize) -> Self {
        Self { backing, reuse, limit, idle: Vec::new(), idle_bytes: 0, lent: HashMap::new() }
    }

    /// A block of at least `size` bytes for use on `stream`: the smallest idle one that fits
    /// (and is at most twice the request), else a new one. `None` when the driver has none.
    fn take(&mut self, size: usize, stream: driver::CUstream) -> Option<u64> {
        let want = rounded(size);
        let fits = |b: &Idle<B::Marker>| {
            b.size >= want && b.size <= 2 * want && (self.reuse == Reuse::Ordered || self.backing.passed(&b.freed))
        };
        let best = self.idle.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.size).map(|(i, _)| i);
        if let Some(i) = best {
            let block = self.idle.swap_remove(i);
            if self.reuse == Reuse::Passed || self.backing.order(&block.freed, stream) {
                self.idle_bytes -= block.size;
                self.lent.insert(block.at, (block.size, Some(block.freed)));
                return Some(block.at);
            }
            self.idle.push(block);
        }
        let at = self.backing.alloc(want)?;
        self.lent.insert(at, (want, None));
        Some(at)
    }

    /// Takes back a block nvJPEG last used on `stream`: kept idle, or freed beyond the limit.
    /// `false` for an address this pool did not lend.
    fn give(&mut self, at: u64, stream: driver::CUstream) -> bool {
        let Some((size, marker)) = self.lent.remove(&at) else { return false };
        if self.idle_bytes + size <= self.limit
            && let Some(freed) = marker.or_else(|| self.backing.marker())
            && self.backing.record(&freed, stream)
        {
            self.idle.push(Idle { at, size, freed });
            self.idle_bytes += size;
            return true;
        }
        self.backing.free(at);
        true
    }
}

/// Times one driver call into the counters.
fn counted<T>(call: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = call();
    DRIVER_NS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    DRIVER_CALLS.fetch_add(1, Ordering::Relaxed);
    out
}

/// Device memory or pinned host memory from the driver, in the context bound on the thread.
struct Driver {
    pinned: bool,
}

/// An event of the driver's, timing off.
struct Event(driver::CUevent);

// SAFETY: an event is a plain handle, used under its pool's mutex.
unsafe impl Send for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once; pending work that records it is unaffected.
        unsafe { driver::cuEventDestroy_v2(self.0) };
    }
}

impl Backing for Driver {
    type Marker = Event;

    fn alloc(&self, size: usize) -> Option<u64> {
        // SAFETY: out-pointers to locals; the pool's context is bound (`Memory::bound`).
        counted(|| unsafe {
            if self.pinned {
                let mut at = std::ptr::null_mut();
                (driver::cuMemHostAlloc(&mut at, size, 0) == driver::CUresult::CUDA_SUCCESS).then_some(at as u64)
            } else {
                let mut at = 0;
                (driver::cuMemAlloc_v2(&mut at, size) == driver::CUresult::CUDA_SUCCESS).then_some(at)
            }
        })
    }

    fn free(&self, at: u64) {
        // SAFETY: a block this backing allocated, no longer lent; the driver's free waits for
        // the device's work that may still use it.
        counted(|| unsafe {
            if self.pinned { driver::cuMemFreeHost(at as *mut c_void) } else { driver::cuMemFree_v2(at) }
        });
    }

    fn marker(&self) -> Option<Event> {
        let mut event = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local, in the bound context.
        let made = unsafe { driver::cuEventCreate(&mut event, driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) };
        (made == driver::CUresult::CUDA_SUCCESS).then_some(Event(event))
    }

    fn record(&self, marker: &Event, stream: driver::CUstream) -> bool {
        // SAFETY: a live event and the stream nvJPEG named, of the bound context.
        unsafe { driver::cuEventRecord(marker.0, stream) == driver::CUresult::CUDA_SUCCESS }
    }

    fn passed(&self, marker: &Event) -> bool {
        // SAFETY: a live event.
        unsafe { driver::cuEventQuery(marker.0) == driver::CUresult::CUDA_SUCCESS }
    }

    fn order(&self, marker: &Event, stream: driver::CUstream) -> bool {
        // SAFETY: a live event and the stream nvJPEG named.
        unsafe { driver::cuStreamWaitEvent(stream, marker.0, 0) == driver::CUresult::CUDA_SUCCESS }
    }
}

/// nvJPEG's `nvjpegDevAllocatorV2_t` and `nvjpegPinnedAllocatorV2_t` (the same layout): an
/// allocation and a free function, each given the context pointer, and that pointer.
#[repr(C)]
pub(crate) struct AllocatorV2 {
    malloc: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, usize, driver::CUstream) -> c_int,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, driver::CUstream) -> c_int,
    ctx: *mut c_void,
}

/// A device's pools, the context they allocate in, and the allocators handed to nvJPEG (which
/// point back here). Made once per decoder and never dropped: nvJPEG's handle lives as long as
/// the process.
pub(crate) struct Memory {
    context: driver::CUcontext,
    device: Mutex<Pool<Driver>>,
    pinned: Mutex<Pool<Driver>>,
    pub device_allocator: AllocatorV2,
    pub pinned_allocator: AllocatorV2,
}

impl Memory {
    /// The pools of `context`, lending blocks again unless `mode` is [`Mode::Driver`].
    pub(crate) fn leak(context: driver::CUcontext, mode: Mode) -> &'static mut Memory {
        let limit = if mode == Mode::Pool { IDLE_LIMIT } else { 0 };
        let memory = Box::leak(Box::new(Memory {
            context,
            device: Mutex::new(Pool::new(Driver { pinned: false }, Reuse::Ordered, limit)),
            pinned: Mutex::new(Pool::new(Driver { pinned: true }, Reuse::Passed, limit)),
            device_allocator: AllocatorV2 { malloc: device_malloc, free: device_free, ctx: std::ptr::null_mut() },
            pinned_allocator: AllocatorV2 { malloc: pinned_malloc, free: pinned_free, ctx: std::ptr::null_mut() },
        }));
        let ctx = memory as *mut Memory as *mut c_void;
        memory.device_allocator.ctx = ctx;
        memory.pinned_allocator.ctx = ctx;
        memory
    }

    /// Runs `f` with this pool's context bound on the thread (nvJPEG may call from its own).
    fn bound<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut current = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; pushing a live context and popping it after.
        unsafe {
            driver::cuCtxGetCurrent(&mut current);
            if current == self.context {
                return f();
            }
            driver::cuCtxPushCurrent_v2(self.context);
            let out = f();
            driver::cuCtxPopCurrent_v2(&mut current);
            out
        }
    }

    fn pool(&self, pinned: bool) -> std::sync::MutexGuard<'_, Pool<Driver>> {
        let pool = if pinned { &self.pinned } else { &self.device };
        pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// nvJPEG's request: 0 and the block's address in `out`, or `cudaErrorMemoryAllocation`.
    ///
    /// # Safety
    /// `ctx` is a [`Memory`] made by [`Memory::leak`]; `out` is writable.
    unsafe fn malloc(
        ctx: *mut c_void,
        out: *mut *mut c_void,
        size: usize,
        stream: driver::CUstream,
        pinned: bool,
    ) -> c_int {
        // SAFETY: the caller's contract.
        let memory = unsafe { &*(ctx as *const Memory) };
        let at = if size == 0 { Some(0) } else { memory.bound(|| memory.pool(pinned).take(size, stream)) };
        // SAFETY: the caller's contract.
        unsafe { *out = at.unwrap_or(0) as *mut c_void };
        if at.is_some() { 0 } else { CUDA_ERROR_MEMORY_ALLOCATION }
    }

    /// nvJPEG's free: 0, or `cudaErrorInvalidValue` for an address the pool did not lend.
    ///
    /// # Safety
    /// `ctx` is a [`Memory`] made by [`Memory::leak`].
    unsafe fn free(ctx: *mut c_void, at: *mut c_void, stream: driver::CUstream, pinned: bool) -> c_int {
        if at.is_null() {
            return 0;
        }
        // SAFETY: the caller's contract.
        let memory = unsafe { &*(ctx as *const Memory) };
        if memory.bound(|| memory.pool(pinned).give(at as u64, stream)) { 0 } else { CUDA_ERROR_INVALID_VALUE }
    }
}

/// `cudaErrorInvalidValue` and `cudaErrorMemoryAllocation`, what nvJPEG's allocators return.
const CUDA_ERROR_INVALID_VALUE: c_int = 1;
const CUDA_ERROR_MEMORY_ALLOCATION: c_int = 2;

unsafe extern "C" fn device_malloc(ctx: *mut c_void, out: *mut *mut c_void, size: usize, s: driver::CUstream) -> c_int {
    // SAFETY: nvJPEG passes back the context pointer of the allocator it was given.
    unsafe { Memory::malloc(ctx, out, size, s, false) }
}

unsafe extern "C" fn device_free(ctx: *mut c_void, at: *mut c_void, _size: usize, s: driver::CUstream) -> c_int {
    // SAFETY: as above.
    unsafe { Memory::free(ctx, at, s, false) }
}

unsafe extern "C" fn pinned_malloc(ctx: *mut c_void, out: *mut *mut c_void, size: usize, s: driver::CUstream) -> c_int {
    // SAFETY: as above.
    unsafe { Memory::malloc(ctx, out, size, s, true) }
}

unsafe extern "C" fn pinned_free(ctx: *mut c_void, at: *mut c_void, _size: usize, s: driver::CUstream) -> c_int {
    // SAFETY: as above.
    unsafe { Memory::free(ctx, at, s, true) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// Addresses counting up; markers that pass when the test says so; every call logged.
    #[derive(Default)]
    struct Fake {
        next: Cell<u64>,
        freed: RefCell<Vec<u64>>,
        passed: Cell<bool>,
        ordered: Cell<usize>,
    }

    impl Backing for Fake {
        type Marker = ();
        fn alloc(&self, size: usize) -> Option<u64> {
            let _ = size;
            self.next.set(self.next.get() + 1);
            Some(self.next.get() << 32)
        }
        fn free(&self, at: u64) {
            self.freed.borrow_mut().push(at);
        }
        fn marker(&self) -> Option<()> {
            Some(())
        }
        fn record(&self, _: &(), _: driver::CUstream) -> bool {
            true
        }
        fn passed(&self, _: &()) -> bool {
            self.passed.get()
        }
        fn order(&self, _: &(), _: driver::CUstream) -> bool {
            self.ordered.set(self.ordered.get() + 1);
            true
        }
    }

    const S: driver::CUstream = std::ptr::null_mut();

    #[test]
    fn sizes_round_up_to_what_a_like_request_reuses() {
        assert_eq!(rounded(1), 512);
        assert_eq!(rounded(600), 1024);
        assert_eq!(rounded(1 << 20), 1 << 20);
        assert_eq!(rounded((1 << 20) + 1), 2 << 20);
        assert_eq!(rounded((5 << 20) + 7), 6 << 20);
    }

    #[test]
    fn a_freed_device_block_is_lent_again_after_its_stream() {
        let mut pool = Pool::new(Fake::default(), Reuse::Ordered, IDLE_LIMIT);
        let a = pool.take(3 << 20, S).unwrap();
        assert!(pool.give(a, S));
        assert_eq!(pool.take(3 << 20, S), Some(a), "the same size again: the idle block");
        assert_eq!(pool.backing.ordered.get(), 1, "the new stream ordered after the old use");
        let b = pool.take(3 << 20, S).unwrap();
        assert_ne!(a, b, "a block lent is not lent twice");
        assert!(pool.backing.freed.borrow().is_empty(), "nothing went back to the driver");
    }

    #[test]
    fn the_smallest_idle_block_that_fits_is_taken_and_one_far_too_large_is_not() {
        let mut pool = Pool::new(Fake::default(), Reuse::Ordered, IDLE_LIMIT);
        let big = pool.take(64 << 20, S).unwrap();
        let mid = pool.take(8 << 20, S).unwrap();
        let small = pool.take(2 << 20, S).unwrap();
        for at in [big, mid, small] {
            assert!(pool.give(at, S));
        }
        assert_eq!(pool.take(5 << 20, S), Some(mid), "8 MiB fits 6 MiB best");
        let fresh = pool.take(4 << 20, S).unwrap();
        assert!(![big, small].contains(&fresh), "2 MiB is too small, 64 MiB more than twice the request");
    }

    #[test]
    fn a_pinned_block_waits_until_its_last_use_has_passed() {
        let mut pool = Pool::new(Fake::default(), Reuse::Passed, IDLE_LIMIT);
        let a = pool.take(4096, S).unwrap();
        assert!(pool.give(a, S));
        let b = pool.take(4096, S).unwrap();
        assert_ne!(a, b, "its copy may still read it: not lent to a host that writes at once");
        pool.backing.passed.set(true);
        assert!(pool.give(b, S));
        let again = pool.take(4096, S).unwrap();
        assert!([a, b].contains(&again));
        assert_eq!(pool.backing.ordered.get(), 0);
    }

    #[test]
    fn without_a_limit_every_free_reaches_the_driver_and_strangers_are_refused() {
        let mut pool = Pool::new(Fake::default(), Reuse::Ordered, 0);
        let a = pool.take(4096, S).unwrap();
        assert!(pool.give(a, S));
        assert_eq!(*pool.backing.freed.borrow(), vec![a]);
        assert_ne!(pool.take(4096, S), Some(a));
        assert!(!pool.give(12345, S), "an address the pool did not lend");
    }

    #[test]
    fn idle_blocks_beyond_the_limit_go_back_to_the_driver() {
        let mut pool = Pool::new(Fake::default(), Reuse::Ordered, 5 << 20);
        let a = pool.take(4 << 20, S).unwrap();
        let b = pool.take(4 << 20, S).unwrap();
        assert!(pool.give(a, S));
        assert!(pool.give(b, S));
        assert_eq!(*pool.backing.freed.borrow(), vec![b], "4 + 4 MiB idle is over 5 MiB");
        assert_eq!(pool.idle_bytes, 4 << 20);
    }
}
