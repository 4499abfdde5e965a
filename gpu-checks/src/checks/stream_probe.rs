//! Whether burn-cuda's CUDA streams can be found from outside cubecl, which does not expose
//! them: CUPTI's driver-API callback on `cuLaunchKernel` names the stream of every launch.
//!
//! Why it matters: every cuDNN or cuBLAS call (and burn-ddp's own CUDA C kernels) runs on a
//! stream of burn-ddp's and is ordered with burn's by four one-thread fence kernels
//! (`nn::cuda::runtime::stream_bridge`), about 2 µs of GPU time each: 0.83 ms of a ResNet-50
//! step and 2.0 ms of a ViT-B/16 step on an H200 (Nsight Compute, 2026-12-04). On burn's own
//! stream those calls would need no fence at all. This probe checks the premise: that each
//! burn stream is one CUDA stream CUPTI reports, a different one per thread (burn-cuda gives
//! each thread its own), and that work recorded on the reported stream really runs after
//! burn's kernels queued before it.

use burn::prelude::*;
use burn_cuda::{Cuda, CudaDevice};
use cudarc::driver::sys as driver;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// CUPTI's `CUpti_CallbackData` (cupti_callbacks.h).
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const c_char,
    function_params: *const c_void,
    function_return_value: *mut c_void,
    symbol_name: *const c_char,
    context: *mut c_void,
    context_uid: u32,
    correlation_data: *mut u64,
    correlation_id: u32,
}

/// The driver's `cuLaunchKernel_params` (generated_cuda_meta.h).
#[repr(C)]
struct LaunchParams {
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: driver::CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

const DOMAIN_DRIVER_API: u32 = 1;
const API_ENTER: u32 = 0;
/// `CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel` and its per-thread-default-stream twin.
const LAUNCH_IDS: [u32; 2] = [307, 442];

type Callback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> i32;
type EnableCallback = unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> i32;
type Unsubscribe = unsafe extern "C" fn(*mut c_void) -> i32;

/// Launches seen while the callback is on: (phase, stream address, kernel symbol).
static SEEN: Mutex<Vec<(usize, usize, String)>> = Mutex::new(Vec::new());
/// Which part of the probe is running (launches are tagged with it).
static PHASE: Mutex<usize> = Mutex::new(0);

unsafe extern "C" fn on_launch(_user: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    if domain != DOMAIN_DRIVER_API || !LAUNCH_IDS.contains(&cbid) || data.is_null() {
        return;
    }
    // SAFETY: for the driver-API domain CUPTI hands a `CUpti_CallbackData` whose parameters are
    // the called function's: `cuLaunchKernel_params` for these two ids.
    let (d, p) = unsafe {
        let d = &*(data as *const CallbackData);
        (d, &*(d.function_params as *const LaunchParams))
    };
    if d.callback_site != API_ENTER {
        return;
    }
    let symbol = match d.symbol_name.is_null() {
        true => "?".to_string(),
        // SAFETY: a NUL-terminated name CUPTI owns for the callback's duration.
        false => unsafe { CStr::from_ptr(d.symbol_name) }.to_string_lossy().into_owned(),
    };
    let phase = *PHASE.lock().unwrap_or_else(|p| p.into_inner());
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).push((phase, p.stream as usize, symbol));
}

/// A few of burn's kernels on the calling thread's stream, waited for.
fn burn_work(device: &CudaDevice) {
    let x = Tensor::<Cuda, 1>::ones([1 << 20], device);
    let _ = ((x + 1.0) * 2.0).sum().into_data();
}

/// Opens libcupti (`BURN_DDP_CUPTI`, else the library path).
fn open_cupti() -> Option<(libloading::Library, String)> {
    let names: Vec<String> = std::env::var("BURN_DDP_CUPTI")
        .into_iter()
        .chain(["libcupti.so", "libcupti.so.13", "libcupti.so.12"].map(String::from))
        .collect();
    // SAFETY: loading CUPTI runs its initialisers, which have no preconditions.
    names.into_iter().find_map(|n| unsafe { libloading::Library::new(&n) }.ok().map(|l| (l, n)))
}

/// The streams burn-cuda launched on, phase by phase: 1, this thread's work; 2, another
/// thread's.
fn streams_seen(device: &CudaDevice, lib: &libloading::Library) -> Result<Vec<(usize, usize, String)>, String> {
    // SAFETY: the symbols' types are CUPTI's prototypes (cupti_callbacks.h).
    let (subscribe, enable, unsubscribe) = unsafe {
        let get = |name: &[u8]| lib.get::<*mut c_void>(name).map(|s| *s).map_err(|e| e.to_string());
        (
            std::mem::transmute::<*mut c_void, Subscribe>(get(b"cuptiSubscribe\0")?),
            std::mem::transmute::<*mut c_void, EnableCallback>(get(b"cuptiEnableCallback\0")?),
            std::mem::transmute::<*mut c_void, Unsubscribe>(get(b"cuptiUnsubscribe\0")?),
        )
    };
    let mut subscriber = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the callback is a plain function for the process's life.
    let code = unsafe { subscribe(&mut subscriber, on_launch, std::ptr::null_mut()) };
    if code != 0 {
        return Err(format!("cuptiSubscribe returned {code} (another profiler attached?)"));
    }
    for id in LAUNCH_IDS {
        // SAFETY: a live subscriber; plain values.
        unsafe { enable(1, subscriber, DOMAIN_DRIVER_API, id) };
    }
    *PHASE.lock().unwrap_or_else(|p| p.into_inner()) = 1;
    burn_work(device);
    *PHASE.lock().unwrap_or_else(|p| p.into_inner()) = 2;
    let other = device.clone();
    std::thread::spawn(move || burn_work(&other)).join().map_err(|_| "the second thread panicked".to_string())?;
    *PHASE.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    // SAFETY: the subscriber made above, released once.
    unsafe { unsubscribe(subscriber) };
    Ok(std::mem::take(&mut *SEEN.lock().unwrap_or_else(|p| p.into_inner())))
}

/// Whether an event recorded on `stream` (burn's, as CUPTI reported it) stays pending while
/// burn's long work queued before it runs, and completes once that work is done.
fn orders_after_burn(device: &CudaDevice, stream: usize) -> Result<(bool, bool), String> {
    let ctx = cudarc::driver::CudaContext::new(device.index).map_err(|e| format!("{e:?}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
    let x = Tensor::<Cuda, 2>::ones([8192, 8192], device);
    let _ = x.clone().matmul(x.clone()).sum().into_data(); // tuned and compiled before timing
    let mut y = x.clone();
    for _ in 0..40 {
        y = y.matmul(x.clone()).mul_scalar(1.0 / 8192.0);
    }
    // A read from another thread makes burn launch the products (about a second of GPU work,
    // queued on this thread's stream); this thread records its event meanwhile.
    let sum = y.sum();
    let reader = std::thread::spawn(move || {
        let t = Instant::now();
        let _ = sum.into_data();
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut event = std::ptr::null_mut();
    // SAFETY: the context is bound; a fresh event recorded on a live stream of it.
    let pending = unsafe {
        driver::cuEventCreate(&mut event, 0).result().map_err(|e| format!("{e:?}"))?;
        driver::cuEventRecord(event, stream as driver::CUstream).result().map_err(|e| format!("{e:?}"))?;
        driver::cuEventQuery(event) == driver::CUresult::CUDA_ERROR_NOT_READY
    };
    let took = reader.join().map_err(|_| "the reading thread panicked".to_string())?;
    // SAFETY: as above; the event is destroyed once.
    let done = unsafe {
        let done = driver::cuEventSynchronize(event) == driver::CUresult::CUDA_SUCCESS;
        driver::cuEventDestroy_v2(event);
        done
    };
    println!(
        "  burn's 40 products took {:.0} ms to read back; the event was recorded at 300 ms",
        took.as_secs_f64() * 1e3
    );
    Ok((pending, done))
}

/// The probe (see the module documentation). A machine without libcupti skips it visibly.
pub(crate) fn check_stream_probe(device: &CudaDevice) -> bool {
    burn_work(device); // kernels compiled and streams created before the callback is on
    let Some((lib, name)) = open_cupti() else {
        println!(
            "RESULT check=burn_stream_probe SKIPPED: libcupti not found (set BURN_DDP_CUPTI=/path/to/libcupti.so)"
        );
        return true;
    };
    let seen = match streams_seen(device, &lib) {
        Ok(seen) => seen,
        Err(e) => {
            println!("RESULT check=burn_stream_probe cupti={name} error=\"{e}\" FAIL");
            return false;
        }
    };
    let streams = |phase: usize| {
        let mut s: Vec<usize> = seen.iter().filter(|l| l.0 == phase).map(|l| l.1).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let (mine, other) = (streams(1), streams(2));
    for (phase, stream, symbol) in &seen {
        println!("  phase {phase}: stream {stream:#x} {symbol}");
    }
    // One stream for this thread's work (its own: whether another thread's differs is reported,
    // cubecl may share a pool of streams between threads).
    let one = mine.len() == 1 && mine[0] != 0;
    let (pending, done) = match one.then(|| orders_after_burn(device, mine[0])) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            println!("  ordering test failed: {e}");
            (false, false)
        }
        None => (false, false),
    };
    let pass = one && pending && done;
    println!(
        "RESULT check=burn_stream_probe cupti={name} launches={} this_thread_streams={mine:x?} other_thread_streams={other:x?} per_thread={} event_pending_behind_burn={pending} event_done_after_drain={done} {}",
        seen.len(),
        other.len() == 1 && mine != other,
        if pass { "ok" } else { "FAIL" }
    );
    pass
}
