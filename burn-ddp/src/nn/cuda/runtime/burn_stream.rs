//! burn-cuda's own CUDA streams, found from outside cubecl (which does not expose them) through
//! CUPTI, NVIDIA's profiling interface: while [`capture`] runs its closure, CUPTI's callback on
//! the driver's `cuLaunchKernel` records the stream of every kernel launch, with the launching
//! thread. Called around one of cubecl's launches on its device thread (a fence store of
//! `stream_bridge`), it names the stream burn's kernels of the calling burn stream run on —
//! where cuDNN, cuBLAS and our kernels can run with no fence (`launch`, with
//! `CudnnOptions::same_stream`).
//!
//! libcupti is opened at run time (`BURN_DDP_CUPTI`, else `libcupti.so`, `.so.13`, `.so.12` on
//! the library path, else the CUDA toolkit's `extras/CUPTI/lib64`: CUDA toolkits and PyTorch's
//! `nvidia-cuda-cupti` wheels ship it). CUPTI takes one subscriber per process: under Nsight
//! Systems or Compute, or without the library, [`capture`] returns an error and the callers
//! keep the fences.

use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

/// CUPTI's `CUpti_CallbackData` (cupti_callbacks.h).
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const std::ffi::c_char,
    function_params: *const c_void,
    function_return_value: *mut c_void,
    symbol_name: *const std::ffi::c_char,
    context: *mut c_void,
    context_uid: u32,
    correlation_data: *mut u64,
    correlation_id: u32,
}

/// The driver's `cuLaunchKernel_params` (CUPTI's generated_cuda_meta.h).
#[repr(C)]
struct LaunchParams {
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

const DOMAIN_DRIVER_API: u32 = 1;
const API_ENTER: u32 = 0;
/// `CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel` and `..._cuLaunchKernel_ptsz` (cupti_driver_cbid.h).
const LAUNCH_IDS: [u32; 2] = [307, 442];

type Callback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> i32;
type EnableCallback = unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> i32;

/// The library and this process's subscription, kept for the process's life.
struct Cupti {
    _lib: libloading::Library,
    enable: EnableCallback,
    subscriber: usize,
    name: String,
}

// SAFETY: the subscriber is an opaque handle CUPTI lets any thread use; the function pointers
// are plain code.
unsafe impl Send for Cupti {}
unsafe impl Sync for Cupti {}

/// Launches recorded while a capture is on: (thread, stream address).
static SEEN: Mutex<Vec<(ThreadId, usize)>> = Mutex::new(Vec::new());
/// One capture at a time.
static CAPTURE: Mutex<()> = Mutex::new(());

unsafe extern "C" fn on_launch(_user: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    if domain != DOMAIN_DRIVER_API || !LAUNCH_IDS.contains(&cbid) || data.is_null() {
        return;
    }
    // SAFETY: for the driver-API domain CUPTI passes a `CUpti_CallbackData` whose parameters are
    // the called function's: `cuLaunchKernel_params` for both ids.
    let (site, stream) = unsafe {
        let d = &*(data as *const CallbackData);
        (d.callback_site, (*(d.function_params as *const LaunchParams)).stream as usize)
    };
    if site == API_ENTER {
        SEEN.lock().unwrap_or_else(|p| p.into_inner()).push((std::thread::current().id(), stream));
    }
}

fn open() -> Result<Cupti> {
    let unavailable = |reason: String| Error::Cuda { op: "finding burn's CUDA stream through CUPTI".into(), reason };
    let names: Vec<String> = std::env::var("BURN_DDP_CUPTI")
        .into_iter()
        .chain(["libcupti.so", "libcupti.so.13", "libcupti.so.12"].map(String::from))
        .chain(toolkit_cupti())
        .collect();
    // SAFETY: loading CUPTI runs its initialisers, which have no preconditions.
    let (lib, name) = names
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(n) }.ok().map(|l| (l, n.clone())))
        .ok_or_else(|| unavailable(format!("libcupti not found ({}; BURN_DDP_CUPTI names it)", names.join(", "))))?;
    // SAFETY: the symbols' types are CUPTI's prototypes (cupti_callbacks.h).
    let (subscribe, enable) = unsafe {
        let get = |s: &[u8]| lib.get::<*mut c_void>(s).map(|f| *f).map_err(|e| unavailable(format!("{name}: {e}")));
        (
            std::mem::transmute::<*mut c_void, Subscribe>(get(b"cuptiSubscribe\0")?),
            std::mem::transmute::<*mut c_void, EnableCallback>(get(b"cuptiEnableCallback\0")?),
        )
    };
    let mut subscriber = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the callback is a plain function that lives as long as
    // the process.
    let code = unsafe { subscribe(&mut subscriber, on_launch, std::ptr::null_mut()) };
    if code != 0 {
        return Err(unavailable(format!("cuptiSubscribe returned {code} (is a profiler attached?)")));
    }
    Ok(Cupti { _lib: lib, enable, subscriber: subscriber as usize, name })
}

/// Where CUDA toolkits keep libcupti, off the library path: `$CUDA_HOME` (or `$CUDA_PATH`,
/// else `/usr/local/cuda`) `/extras/CUPTI/lib64/libcupti.so`.
fn toolkit_cupti() -> Vec<String> {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .chain(std::iter::once("/usr/local/cuda".to_string()))
        .map(|root| format!("{root}/extras/CUPTI/lib64/libcupti.so"))
        .collect()
}

fn cupti() -> Result<&'static Cupti> {
    static CUPTI: OnceLock<std::result::Result<Cupti, String>> = OnceLock::new();
    CUPTI
        .get_or_init(|| open().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Cuda { op: "finding burn's CUDA stream through CUPTI".into(), reason: e.clone() })
}

/// Opens CUPTI and subscribes to it (once per process).
///
/// # Errors
/// When libcupti cannot be found or subscribed to (another profiler holds it).
pub fn ready() -> Result<()> {
    cupti().map(|_| ())
}

/// The library CUPTI was opened from, once it has been.
pub fn library() -> Option<String> {
    cupti().ok().map(|c| c.name.clone())
}

/// Runs `f` with CUPTI recording the stream of every kernel launch in the process; returns
/// its result and the launches' (thread, stream address) in order.
///
/// # Errors
/// When CUPTI cannot be opened or subscribed to (the closure does not run then).
pub fn capture<T>(f: impl FnOnce() -> T) -> Result<(T, Vec<(ThreadId, usize)>)> {
    let c = cupti()?;
    let _one = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    let set = |on: u32| {
        for id in LAUNCH_IDS {
            // SAFETY: the process's live subscriber; plain values.
            unsafe { (c.enable)(on, c.subscriber as *mut c_void, DOMAIN_DRIVER_API, id) };
        }
    };
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).clear();
    set(1);
    let out = f();
    set(0);
    Ok((out, std::mem::take(&mut *SEEN.lock().unwrap_or_else(|p| p.into_inner()))))
}

/// The one stream the calling thread launched on in `seen` (a [`capture`]'s), if it launched
/// on exactly one that is not the legacy default stream.
pub fn only_stream_of_this_thread(seen: &[(ThreadId, usize)]) -> Option<usize> {
    let me = std::thread::current().id();
    let mut streams: Vec<usize> = seen.iter().filter(|(t, _)| *t == me).map(|(_, s)| *s).collect();
    streams.sort_unstable();
    streams.dedup();
    (streams.len() == 1 && streams[0] != 0).then(|| streams[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_of_this_thread_is_found_and_ambiguity_is_not() {
        let me = std::thread::current().id();
        let other = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
        assert_eq!(only_stream_of_this_thread(&[(me, 7), (other, 9), (me, 7)]), Some(7));
        assert_eq!(only_stream_of_this_thread(&[(me, 7), (me, 8)]), None, "two streams");
        assert_eq!(only_stream_of_this_thread(&[(other, 9)]), None, "none of this thread's");
        assert_eq!(only_stream_of_this_thread(&[(me, 0)]), None, "the legacy default stream");
    }
}
