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

/// CUDA C helpers for kernels over tensors of any of burn's float storage types, as a string
/// literal to `concat!` before a source: `t` = 0 f32, 1 bf16, 2 f16; `ld`/`st` one element,
/// `ld4`/`st4` four (index a multiple of 4, the buffer 16-byte aligned for f32, 8 for 16-bit
/// types), all converting to and from f32 by hand (round to nearest even; NVRTC needs no
/// headers); `warp_sum` a sum over a warp's 32 lanes.
macro_rules! storage_types {
    () => {
        r#"
// Storage types: t = 0 f32, 1 bf16, 2 f16 (converted by hand: NVRTC needs no headers).
__device__ __forceinline__ float from16(unsigned short s, int t) {
    if (t == 1) return __uint_as_float(((unsigned)s) << 16);
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s)); return f;
}
__device__ __forceinline__ unsigned short to16(float f, int t) {
    if (t == 1) {
        unsigned u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float ld(const void* p, long long i, int t) {
    return t == 0 ? ((const float*)p)[i] : from16(((const unsigned short*)p)[i], t);
}
__device__ __forceinline__ void st(void* p, long long i, int t, float v) {
    if (t == 0) ((float*)p)[i] = v; else ((unsigned short*)p)[i] = to16(v, t);
}
// Four elements from i (a multiple of 4; the buffer 16-byte aligned for f32, 8 for 16-bit types).
__device__ __forceinline__ void ld4(const void* p, long long i, int t, float v[4]) {
    if (t == 0) {
        float4 q = *(const float4*)((const float*)p + i);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        return;
    }
    uint2 q = *(const uint2*)((const unsigned short*)p + i);
    v[0] = from16((unsigned short)(q.x & 0xffffu), t); v[1] = from16((unsigned short)(q.x >> 16), t);
    v[2] = from16((unsigned short)(q.y & 0xffffu), t); v[3] = from16((unsigned short)(q.y >> 16), t);
}
__device__ __forceinline__ void st4(void* p, long long i, int t, const float v[4]) {
    if (t == 0) { *(float4*)((float*)p + i) = make_float4(v[0], v[1], v[2], v[3]); return; }
    uint2 q;
    q.x = (unsigned)to16(v[0], t) | ((unsigned)to16(v[1], t) << 16);
    q.y = (unsigned)to16(v[2], t) | ((unsigned)to16(v[3], t) << 16);
    *(uint2*)((unsigned short*)p + i) = q;
}
// Eight elements from i (a multiple of 8; the buffer 16-byte aligned): 16 or 32 bytes a thread,
// enough loads in flight per SM to run a streaming kernel at the memory's speed.
__device__ __forceinline__ void ld8(const void* p, long long i, int t, float v[8]) {
    if (t == 0) { ld4(p, i, t, v); ld4(p, i + 4, t, v + 4); return; }
    uint4 q = *(const uint4*)((const unsigned short*)p + i);
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; k++) {
        v[2 * k] = from16((unsigned short)(w[k] & 0xffffu), t);
        v[2 * k + 1] = from16((unsigned short)(w[k] >> 16), t);
    }
}
__device__ __forceinline__ void st8(void* p, long long i, int t, const float v[8]) {
    if (t == 0) { st4(p, i, t, v); st4(p, i + 4, t, v + 4); return; }
    unsigned w[4];
    for (int k = 0; k < 4; k++) w[k] = (unsigned)to16(v[2 * k], t) | ((unsigned)to16(v[2 * k + 1], t) << 16);
    uint4 q; q.x = w[0]; q.y = w[1]; q.z = w[2]; q.w = w[3];
    *(uint4*)((unsigned short*)p + i) = q;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
"#
    };
}
pub(crate) use storage_types;
