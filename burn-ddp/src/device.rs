//! CUDA device discovery without panicking when the driver or NCCL is absent.

use crate::error::{Error, Result};

/// The variable CUDA reads when it creates a context: how many hardware work queues the
/// context's streams are spread over (1 to 32; 8 when unset).
pub const CUDA_QUEUES_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Has CUDA contexts made later in this process spread their streams over 32 hardware work
/// queues instead of 8, unless the environment already names a number. Work on one queue runs
/// in order, whatever stream it came from: with 8, the training's streams, cuDNN's, NCCL's and
/// the JPEG decoder's share queues, and on an H100 nvJPEG's calls waited behind the training's
/// kernels (17–19 ms a batch of 256 photos instead of 12) and ResNet-18 fed by the GPU decode
/// trained 20 % slower (2026-12-07, docs/benchmarks.md "CUDA's hardware queues"). burn-vision,
/// the launcher and the GPU checks call it; a program of yours can, or set the variable.
///
/// # Safety
/// It writes the environment: call it first in `main`, before any thread starts (the contract
/// of [`std::env::set_var`]).
pub unsafe fn use_all_cuda_queues() {
    if std::env::var_os(CUDA_QUEUES_VAR).is_none() {
        // SAFETY: the caller's contract: no other thread reads or writes the environment.
        unsafe { std::env::set_var(CUDA_QUEUES_VAR, ALL_CUDA_QUEUES.to_string()) };
    }
}

/// The most hardware work queues CUDA gives a context, what [`use_all_cuda_queues`] sets.
pub const ALL_CUDA_QUEUES: usize = 32;

/// The hardware work queues a CUDA context made now spreads its streams over: the value of
/// [`CUDA_QUEUES_VAR`], or CUDA's 8 where it is unset or not a number.
pub fn cuda_queues() -> usize {
    queues_from(std::env::var(CUDA_QUEUES_VAR).ok().as_deref())
}

fn queues_from(value: Option<&str>) -> usize {
    value.and_then(parse_queues).unwrap_or(8)
}

/// A value of [`CUDA_QUEUES_VAR`] as CUDA reads it: a number, blanks around it allowed.
pub fn parse_queues(value: &str) -> Option<usize> {
    value.trim().parse().ok()
}

/// Number of CUDA GPUs visible to this process.
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] when the driver library
/// (`libcuda.so`) cannot be loaded or fails to initialise.
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        driver()?;
        let n = cudarc::driver::result::device::get_count()
            .map_err(|e| Error::Cuda { op: "cuDeviceGetCount".into(), reason: e.to_string() })?;
        Ok(n as usize)
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::CudaNotCompiled)
}

/// Checks that the driver is new enough for the bindings and that every id in `ids` names a
/// visible GPU.
///
/// # Errors
/// [`Error::Cuda`] naming a too-old driver ([`check_driver`]), the bad id and the ids that
/// exist, or the errors of [`cuda_device_count`].
pub fn check_gpu_ids(ids: &[usize]) -> Result<()> {
    let count = cuda_device_count()?;
    check_driver(driver_version()?)?;
    if let Some(bad) = ids.iter().find(|&&id| id >= count) {
        let exist = if count == 0 { "none".to_string() } else { format!("0..={}", count - 1) };
        return Err(Error::Cuda {
            op: format!("GPU {bad}"),
            reason: format!("does not exist; this machine has {count} GPU(s): {exist}"),
        });
    }
    Ok(())
}

/// Bytes of GPU `ordinal`'s memory in use (by every process on it), from the driver.
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] when the driver fails.
pub fn gpu_memory_used(ordinal: usize) -> Result<u64> {
    #[cfg(feature = "cuda")]
    {
        let ctx = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| Error::Cuda { op: format!("context on GPU {ordinal}"), reason: e.to_string() })?;
        ctx.bind_to_thread().map_err(|e| Error::Cuda { op: "binding the context".into(), reason: e.to_string() })?;
        let (free, total) = cudarc::driver::result::mem_get_info()
            .map_err(|e| Error::Cuda { op: "cuMemGetInfo".into(), reason: e.to_string() })?;
        Ok((total - free) as u64)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Error::CudaNotCompiled)
    }
}

/// The CUDA driver API version the bindings were generated for (cudarc's `cuda-12080`): the
/// oldest driver this build runs on. It is the oldest cubecl-cuda 0.10 (burn-cuda 0.21)
/// compiles with: it calls CUDA 12.8's tensor-map functions. A newer driver runs it (the
/// driver API is backward compatible).
pub const CUDA_BINDING_VERSION: i32 = 12080;

/// A driver supporting CUDA `driver` (as [`driver_version`] gives it) runs this build, or a
/// one-line error says what to update (instead of a panic at the first missing function).
///
/// # Errors
/// [`Error::Cuda`] when `driver` is older than [`CUDA_BINDING_VERSION`].
pub fn check_driver(driver: i32) -> Result<()> {
    if driver >= CUDA_BINDING_VERSION {
        return Ok(());
    }
    let v = |v: i32| format!("{}.{}", v / 1000, v % 1000 / 10);
    Err(Error::Cuda {
        op: "CUDA driver".into(),
        reason: format!(
            "it supports CUDA {}, this build needs CUDA {} or newer (NVIDIA driver 570 or newer): update the driver",
            v(driver),
            v(CUDA_BINDING_VERSION)
        ),
    })
}

#[cfg(feature = "cuda")]
fn driver() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Cuda {
            op: "loading libcuda.so".into(),
            reason: "no NVIDIA driver found on this machine (install one to use GPUs; CPU training needs none)".into(),
        });
    }
    cudarc::driver::result::init().map_err(|e| Error::Cuda { op: "cuInit".into(), reason: e.to_string() })
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (13000 = 13.0).
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] without a driver.
pub fn driver_version() -> Result<i32> {
    #[cfg(feature = "cuda")]
    {
        driver()?;
        let mut v = 0;
        // SAFETY: writes one int.
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Cuda { op: "cuDriverGetVersion".into(), reason: format!("{r:?}") });
        }
        Ok(v)
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::CudaNotCompiled)
}

/// GPU `ordinal`'s name.
///
/// # Errors
/// As [`driver_version`], or when the ordinal does not exist.
pub fn gpu_name(ordinal: usize) -> Result<String> {
    #[cfg(feature = "cuda")]
    {
        driver()?;
        let dev = cudarc::driver::result::device::get(ordinal as i32)
            .map_err(|e| Error::Cuda { op: format!("GPU {ordinal}"), reason: e.to_string() })?;
        cudarc::driver::result::device::get_name(dev)
            .map_err(|e| Error::Cuda { op: "cuDeviceGetName".into(), reason: e.to_string() })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Error::CudaNotCompiled)
    }
}

/// Whether GPU `a` can access GPU `b`'s memory directly (NVLink or PCIe peer to peer).
///
/// # Errors
/// As [`gpu_name`].
pub fn can_access_peer(a: usize, b: usize) -> Result<bool> {
    #[cfg(feature = "cuda")]
    {
        driver()?;
        let get = |o: usize| {
            cudarc::driver::result::device::get(o as i32)
                .map_err(|e| Error::Cuda { op: format!("GPU {o}"), reason: e.to_string() })
        };
        let (da, db) = (get(a)?, get(b)?);
        let mut ok = 0;
        // SAFETY: writes one int; both devices exist.
        let r = unsafe { cudarc::driver::sys::cuDeviceCanAccessPeer(&mut ok, da, db) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Cuda { op: "cuDeviceCanAccessPeer".into(), reason: format!("{r:?}") });
        }
        Ok(ok != 0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (a, b);
        Err(Error::CudaNotCompiled)
    }
}

/// The NCCL library's version as NCCL writes it (e.g. 22703 = 2.27.3).
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] when libnccl cannot
/// be loaded.
pub fn nccl_version() -> Result<i32> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(Error::Cuda {
                op: "loading libnccl.so".into(),
                reason: "NCCL not found; install libnccl2 or point LD_LIBRARY_PATH at it".into(),
            });
        }
        cudarc::nccl::result::get_nccl_version()
            .map_err(|e| Error::Cuda { op: "ncclGetVersion".into(), reason: format!("{e:?}") })
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::CudaNotCompiled)
}

/// What NVML says about one GPU right now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuUse {
    /// Percent of the last sample period (1/6 s to 1 s) in which a kernel ran.
    pub utilization_pct: u32,
    /// Bytes of the GPU's memory this process holds (`None` where NVML cannot tell, e.g. in a
    /// container without the host's process ids).
    pub process_bytes: Option<u64>,
}

#[cfg(feature = "cuda")]
fn nvml() -> Option<&'static nvml_wrapper::Nvml> {
    static NVML: std::sync::OnceLock<Option<nvml_wrapper::Nvml>> = std::sync::OnceLock::new();
    NVML.get_or_init(|| nvml_wrapper::Nvml::init().ok()).as_ref()
}

/// GPU `ordinal`'s (CUDA's numbering, matched to NVML's by PCI bus id) utilisation and this
/// process's memory on it, from NVML.
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] when the driver or
/// NVML (`libnvidia-ml.so`) is missing or fails.
pub fn gpu_use(ordinal: usize) -> Result<GpuUse> {
    #[cfg(feature = "cuda")]
    {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        driver()?;
        let fail = |op: &str, e: String| Error::Cuda { op: op.into(), reason: e };
        let dev =
            cudarc::driver::result::device::get(ordinal as i32).map_err(|e| fail("cuDeviceGet", e.to_string()))?;
        let mut bus = [0 as std::ffi::c_char; 32];
        // SAFETY: writes at most `bus.len()` bytes, NUL-terminated.
        let r = unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(fail("cuDeviceGetPCIBusId", format!("{r:?}")));
        }
        // SAFETY: NUL-terminated by the driver.
        let bus = unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        let nvml = nvml().ok_or_else(|| fail("loading libnvidia-ml.so", "NVML not available".into()))?;
        let device = nvml
            .device_by_pci_bus_id(bus.as_str())
            .map_err(|e| fail("nvmlDeviceGetHandleByPciBusId", e.to_string()))?;
        let utilization_pct =
            device.utilization_rates().map_err(|e| fail("nvmlDeviceGetUtilizationRates", e.to_string()))?.gpu;
        let me = std::process::id();
        let process_bytes = device.running_compute_processes().ok().and_then(|ps| {
            ps.into_iter().find(|p| p.pid == me).and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
        });
        Ok(GpuUse { utilization_pct, process_bytes })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Error::CudaNotCompiled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_count_is_the_variables_number_or_cudas_eight() {
        assert_eq!(queues_from(Some("32")), 32);
        assert_eq!(queues_from(Some(" 4\n")), 4);
        assert_eq!(queues_from(Some("many")), 8);
        assert_eq!(queues_from(None), 8);
    }

    #[test]
    fn a_queue_value_is_a_number_or_none() {
        assert_eq!(parse_queues("32"), Some(32));
        assert_eq!(parse_queues(" 4\n"), Some(4));
        assert_eq!(parse_queues("many"), None);
        assert_eq!(parse_queues(""), None);
    }

    #[test]
    fn a_driver_older_than_the_bindings_is_one_line_that_says_what_to_do() {
        assert!(check_driver(CUDA_BINDING_VERSION).is_ok());
        assert!(check_driver(13000).is_ok());
        let e = check_driver(12040).unwrap_err().to_string();
        assert!(
            e.contains("CUDA 12.4") && e.contains("12.8") && e.contains("update the driver") && !e.contains('\n'),
            "{e}"
        );
    }
}
