//! CUDA device discovery without panicking when the driver or NCCL is absent.

use crate::error::{Error, Result};

/// Number of CUDA GPUs visible to this process.
///
/// # Errors
/// [`Error::CudaNotCompiled`] without the `cuda` feature; [`Error::Cuda`] when the driver library
/// (`libcuda.so`) cannot be loaded or fails to initialise.
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Cuda { op: "loading libcuda.so".into(), reason: "no NVIDIA driver found on this machine".into() });
        }
        cudarc::driver::result::init().map_err(|e| Error::Cuda { op: "cuInit".into(), reason: e.to_string() })?;
        let n = cudarc::driver::result::device::get_count().map_err(|e| Error::Cuda { op: "cuDeviceGetCount".into(), reason: e.to_string() })?;
        Ok(n as usize)
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::CudaNotCompiled)
}

/// Checks that every id in `ids` names a visible GPU.
///
/// # Errors
/// [`Error::Cuda`] naming the bad id and the ids that exist, or the errors of
/// [`cuda_device_count`].
pub fn check_gpu_ids(ids: &[usize]) -> Result<()> {
    let count = cuda_device_count()?;
    if let Some(bad) = ids.iter().find(|&&id| id >= count) {
        let exist = if count == 0 { "none".to_string() } else { format!("0..={}", count - 1) };
        return Err(Error::Cuda { op: format!("GPU {bad}"), reason: format!("does not exist; this machine has {count} GPU(s): {exist}") });
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
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| Error::Cuda { op: format!("context on GPU {ordinal}"), reason: e.to_string() })?;
        ctx.bind_to_thread().map_err(|e| Error::Cuda { op: "binding the context".into(), reason: e.to_string() })?;
        let (free, total) = cudarc::driver::result::mem_get_info().map_err(|e| Error::Cuda { op: "cuMemGetInfo".into(), reason: e.to_string() })?;
        Ok((total - free) as u64)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Error::CudaNotCompiled)
    }
}
