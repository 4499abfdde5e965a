//! Copies between many buffers and one flat buffer on a stream of the caller's (DDP packs a
//! bucket's gradients into one buffer for its collective and back, on NCCL's stream): one
//! kernel launch per [`PARTS`] buffers, their addresses travelling as the launch's argument (no
//! upload), each part scaled on the way in (`1 / world` averages before the sum, as PyTorch's
//! DDP divides into its buckets) and stored as f32, bf16 or f16 in the flat buffer (PyTorch's
//! `bf16_compress_hook` / `fp16_compress_hook`), converted back to f32 on the way out.
//!
//! The kernels are CUDA C compiled by NVRTC once per process ([`crate::nn::cuda::kernels::nvrtc`]).

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use burn::tensor::DType;
use cudarc::driver::sys as driver;
use std::ffi::c_void;

/// Parts per launch: their descriptions fill 1.5 KiB of the 4 KiB kernel-argument space.
const PARTS: usize = 64;

const KERNEL: &str = r#"
struct Part { unsigned long long at; unsigned long long offset; unsigned int n; float scale; };
struct Parts { Part p[64]; };
// Round to nearest even; NaN stays NaN (quiet).
__device__ unsigned short to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ float from_bf16(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ unsigned short to_f16(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ float from_f16(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
// kind: 0 f32, 1 bf16, 2 f16 (the flat buffer's type). Block row y is part y of the launch.
extern "C" __global__ void gather(const Parts b, void* flat, int kind) {
    const Part s = b.p[blockIdx.y];
    const float* src = (const float*)s.at;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += gridDim.x * blockDim.x) {
        float v = src[i] * s.scale;
        if (kind == 0) ((float*)flat)[s.offset + i] = v;
        else if (kind == 1) ((unsigned short*)flat)[s.offset + i] = to_bf16(v);
        else ((unsigned short*)flat)[s.offset + i] = to_f16(v);
    }
}
extern "C" __global__ void scatter(const Parts b, const void* flat, int kind) {
    const Part s = b.p[blockIdx.y];
    float* dst = (float*)s.at;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += gridDim.x * blockDim.x) {
        unsigned long long j = s.offset + i;
        dst[i] = kind == 0 ? ((const float*)flat)[j] : kind == 1 ? from_bf16(((const unsigned short*)flat)[j]) : from_f16(((const unsigned short*)flat)[j]);
    }
}
"#;

static KERNELS: Kernels = Kernels::new("bucket copy", KERNEL);

/// One f32 buffer of the many: `len` elements at device address `at`, at element `offset` of
/// the flat buffer, multiplied by `scale` on the way in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Part {
    pub at: u64,
    pub offset: usize,
    pub len: usize,
    pub scale: f32,
}

/// A part as the kernels' `Part` reads it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PartArg {
    at: u64,
    offset: u64,
    n: u32,
    scale: f32,
}

/// Whether the kernels compile here (NVRTC works); the first call compiles them.
pub(crate) fn available() -> bool {
    KERNELS.ptx().is_some()
}

/// The element types a flat buffer may hold, and the kernels' code for each.
fn kind(flat: DType) -> Result<i32> {
    match flat {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F16 => Ok(2),
        other => {
            Err(Error::Kernel { op: "bucket copy", reason: format!("a flat buffer of {other:?} (f32, bf16 or f16)") })
        }
    }
}

/// Copies every part into the flat buffer at `flat` (of `dtype`), scaled, on `stream`.
///
/// # Safety
/// The parts are live f32 buffers of `device`, `flat` holds every part's range; the device's
/// context is bound on this thread, and nothing writes those buffers until `stream` is past
/// this copy.
pub(crate) unsafe fn gather(
    device: usize,
    stream: driver::CUstream,
    parts: &[Part],
    flat: u64,
    dtype: DType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch(device, c"gather", stream, parts, flat, dtype) }
}

/// Copies the flat buffer's ranges back out into every part (as f32; `scale` is not applied),
/// on `stream`.
///
/// # Safety
/// As [`gather`], the parts being written.
pub(crate) unsafe fn scatter(
    device: usize,
    stream: driver::CUstream,
    parts: &[Part],
    flat: u64,
    dtype: DType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch(device, c"scatter", stream, parts, flat, dtype) }
}

/// Launches `entry` over `parts` in batches of [`PARTS`].
///
/// # Safety
/// As [`gather`].
unsafe fn launch(
    device: usize,
    entry: &'static std::ffi::CStr,
    stream: driver::CUstream,
    parts: &[Part],
    flat: u64,
    dtype: DType,
) -> Result<()> {
    let f = KERNELS.function(device, entry)?;
    let mut kind = kind(dtype)?;
    for (batch, chunk) in parts.chunks(PARTS).enumerate() {
        let mut args = [PartArg::default(); PARTS];
        for (arg, p) in args.iter_mut().zip(chunk) {
            let n = u32::try_from(p.len).map_err(|_| Error::Kernel {
                op: "bucket copy",
                reason: format!("a buffer of {} elements (at most 2^32 - 1)", p.len),
            })?;
            *arg = PartArg { at: p.at, offset: p.offset as u64, n, scale: p.scale };
        }
        let longest = chunk.iter().map(|p| p.len).max().unwrap_or(0);
        let blocks_x = longest.div_ceil(256).clamp(1, 512) as u32;
        let mut flat = flat;
        let mut params = [
            args.as_mut_ptr() as *mut c_void,
            &mut flat as *mut u64 as *mut c_void,
            &mut kind as *mut i32 as *mut c_void,
        ];
        // SAFETY: the arguments match the entry's signature (a 64-part batch by value, a
        // pointer, an int); the caller vouches for the addresses.
        unsafe { launch_256(f, (blocks_x, chunk.len() as u32), stream, &mut params) }.map_err(|e| Error::Kernel {
            op: "bucket copy",
            reason: format!("launching {} batch {batch}: {e:?}", entry.to_string_lossy()),
        })?;
    }
    Ok(())
}
