//! burn-ddp's own CUDA C kernels (the fused SGD step, the fused cross-entropy): each source is
//! compiled by NVRTC once per process — the library cubecl compiles its kernels with — and its
//! module loaded once per device. A failed compilation is logged once and reported as `None`,
//! so callers fall back to burn's operations.

use crate::error::{Error, Result};
use crate::nn::cuda::runtime::launch::{BURN_RUNS, warn_once};
use cudarc::driver::sys as driver;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::{Mutex, OnceLock};

/// A CUDA C source and its compiled, loaded forms.
pub(crate) struct Kernels {
    /// The operation's name, for messages.
    op: &'static str,
    source: &'static str,
    ptx: OnceLock<Option<CString>>,
    loaded: OnceLock<Mutex<HashMap<(usize, &'static CStr), Function>>>,
}

/// A loaded kernel of one device's context.
struct Function(driver::CUfunction);
// SAFETY: a driver function handle, used only with its context bound (by the caller).
unsafe impl Send for Function {}

impl Kernels {
    /// `source`'s kernels, compiled on first use.
    pub(crate) const fn new(op: &'static str, source: &'static str) -> Self {
        Self { op, source, ptx: OnceLock::new(), loaded: OnceLock::new() }
    }

    /// The PTX, compiled on first call (`None` when NVRTC failed; logged once).
    pub(crate) fn ptx(&self) -> Option<&CString> {
        self.ptx
            .get_or_init(|| match cudarc::nvrtc::compile_ptx(self.source) {
                Ok(ptx) => CString::new(ptx.to_src()).ok(),
                Err(e) => {
                    warn_once(
                        &format!("compiling the {} kernel", self.op),
                        &Error::Kernel { op: self.op, reason: format!("NVRTC: {e}") },
                        BURN_RUNS,
                    );
                    None
                }
            })
            .as_ref()
    }

    /// `entry` of `device`'s module, loaded on first use; call with that device's context bound.
    ///
    /// # Errors
    /// [`Error::Kernel`] when the source did not compile or the driver refuses the module.
    pub(crate) fn function(&self, device: usize, entry: &'static CStr) -> Result<driver::CUfunction> {
        let mut map = self.loaded.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(&(device, entry)) {
            return Ok(f.0);
        }
        let fail = |what: String, e: cudarc::driver::DriverError| Error::Kernel {
            op: self.op,
            reason: format!("{what}: {e:?}"),
        };
        let ptx =
            self.ptx().ok_or_else(|| Error::Kernel { op: self.op, reason: "the kernel did not compile".into() })?;
        let (mut module, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: NUL-terminated PTX and entry name; out-pointers to locals; the context is bound.
        unsafe {
            driver::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void)
                .result()
                .map_err(|e| fail("loading the PTX".into(), e))?;
            driver::cuModuleGetFunction(&mut f, module, entry.as_ptr())
                .result()
                .map_err(|e| fail(format!("finding {}", entry.to_string_lossy()), e))?;
        }
        map.insert((device, entry), Function(f));
        Ok(f)
    }
}

/// Launches `f` on `stream` over a grid of `blocks` (x, y) of 256 threads, with `params`
/// pointing at each argument in the entry's order.
///
/// # Safety
/// `params` match `f`'s signature and point at live values; the device buffers they name are
/// live on `f`'s device, whose context is bound.
pub(crate) unsafe fn launch_256(
    f: driver::CUfunction,
    blocks: (u32, u32),
    stream: driver::CUstream,
    params: &mut [*mut c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    // SAFETY: the caller vouches for the function, the arguments and the context.
    unsafe {
        driver::cuLaunchKernel(
            f,
            blocks.0,
            blocks.1,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}
