//! Training augmentation on a GPU-decoded batch: each image's 8-bit crop (made by
//! `crop_resize::crop_resize_bytes`) goes through its own list of pixel operations —
//! RandAugment's, colour jitter's — then its erasing rectangle, then is normalised into the NCHW
//! f32 batch. One block per image, so the operations that need the whole image (mean grey,
//! per-channel range, histograms) reduce in shared memory between passes.
//!
//! The arithmetic is `nn::pixel_ops::apply_on_host`'s, operation for operation and in the same
//! order, with the roundings spelled out (`__fmul_rn` and friends: NVRTC would otherwise fuse
//! multiply-adds) so that both give the same bytes; `benches/emulate_pixel_ops.py` runs this
//! source on the CPU against the host code. Compiled by NVRTC once per process.

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use cudarc::driver::sys as driver;
use std::ffi::c_void;

const KERNEL: &str = r#"
struct Op { unsigned code, pad; double p[6]; };
struct Prog { unsigned n_ops, erase, rect[4], seed, gray; Op ops[20]; };
struct Norm { float mean[3]; float inv_std[3]; };

__device__ __forceinline__ float luma(const unsigned char* px) {
    return __fadd_rn(__fadd_rn(__fmul_rn(0.299f, (float)px[0]), __fmul_rn(0.587f, (float)px[1])), __fmul_rn(0.114f, (float)px[2]));
}
// other + f · (v − other), rounded half away from zero, clamped to 0–255.
__device__ __forceinline__ unsigned char blend(unsigned char v, float other, float f) {
    const float r = roundf(__fadd_rn(other, __fmul_rn(f, __fsub_rn((float)v, other))));
    return (unsigned char)fminf(fmaxf(r, 0.f), 255.f);
}
__device__ __forceinline__ unsigned char erase_noise(unsigned seed, unsigned i) {
    unsigned h = seed ^ (i * 0x9E3779B9u);
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    return (unsigned char)(h >> 24);
}

// Block x is image x: its 8-bit crop at a (h·w·3 bytes), b the same size for the passes that
// read one buffer and write the other; out the NCHW f32 batch.
extern "C" __global__ void pixel_ops(const Prog* progs, unsigned char* a, unsigned char* b, float* out, int h, int w, const Norm n) {
    __shared__ unsigned long long luma_sum;
    __shared__ unsigned lo[3], hi[3];
    __shared__ unsigned hist[3][256];
    __shared__ unsigned char lut[3][256];
    __shared__ int changes[3];
    const Prog* pr = progs + blockIdx.x;
    const int plane = h * w;
    const unsigned long long base = (unsigned long long)blockIdx.x * plane * 3;
    unsigned char* src = a + base;
    unsigned char* dst = b + base;
    for (unsigned k = 0; k < pr->n_ops; ++k) {
        const Op op = pr->ops[k];
        const float f = (float)op.p[0];
        if (op.code == 1) {  // warp: nearest pixel, black outside
            for (int p = threadIdx.x; p < plane; p += blockDim.x) {
                const int y = p / w, x = p - y * w;
                const double px = x + 0.5, py = y + 0.5;
                const double sx = __dadd_rn(__dadd_rn(__dmul_rn(op.p[0], px), __dmul_rn(op.p[1], py)), op.p[2]);
                const double sy = __dadd_rn(__dadd_rn(__dmul_rn(op.p[3], px), __dmul_rn(op.p[4], py)), op.p[5]);
                const double ix = round(sx - 0.5), iy = round(sy - 0.5);
                const bool in = ix >= 0.0 && iy >= 0.0 && ix < (double)w && iy < (double)h;
                const int q = in ? ((int)iy * w + (int)ix) * 3 : 0;
                for (int c = 0; c < 3; ++c) dst[p * 3 + c] = in ? src[q + c] : 0;
            }
            unsigned char* t = src; src = dst; dst = t;
        } else if (op.code == 2 || op.code == 3) {  // brightness, saturation
            for (int p = threadIdx.x; p < plane; p += blockDim.x) {
                unsigned char* px = src + p * 3;
                const float o = op.code == 2 ? 0.f : luma(px);
                for (int c = 0; c < 3; ++c) px[c] = blend(px[c], o, f);
            }
        } else if (op.code == 4) {  // contrast: blend with the mean grey, summed exactly
            if (threadIdx.x == 0) luma_sum = 0;
            __syncthreads();
            unsigned long long s = 0;
            for (int p = threadIdx.x; p < plane; p += blockDim.x) s += (unsigned long long)((double)luma(src + p * 3) * 134217728.0);
            atomicAdd(&luma_sum, s);
            __syncthreads();
            const float mean = (float)((double)luma_sum / ((double)(plane > 0 ? plane : 1) * 134217728.0));
            for (int p = threadIdx.x; p < plane; p += blockDim.x)
                for (int c = 0; c < 3; ++c) src[p * 3 + c] = blend(src[p * 3 + c], mean, f);
        } else if (op.code == 5) {  // sharpness: blend with PIL's SMOOTH, the border kept
            for (int p = threadIdx.x; p < plane; p += blockDim.x) {
                const int y = p / w, x = p - y * w;
                for (int c = 0; c < 3; ++c) {
                    const unsigned char v = src[p * 3 + c];
                    if (w < 3 || h < 3 || x == 0 || y == 0 || x == w - 1 || y == h - 1) { dst[p * 3 + c] = v; continue; }
                    unsigned around = 0;
                    for (int dy = -1; dy <= 1; ++dy)
                        for (int dx = -1; dx <= 1; ++dx) around += src[((y + dy) * w + x + dx) * 3 + c];
                    const float smooth = roundf(__fdiv_rn((float)(around + 4u * v), 13.0f));
                    dst[p * 3 + c] = blend(v, smooth, f);
                }
            }
            unsigned char* t = src; src = dst; dst = t;
        } else if (op.code == 6 || op.code == 7) {  // posterize, solarize
            const unsigned bits = (unsigned)op.p[0];
            const unsigned char mask = (unsigned char)((0xFFu << (8u - (bits < 8u ? bits : 8u))) & 0xFFu);
            for (int i = threadIdx.x; i < plane * 3; i += blockDim.x) {
                const unsigned char v = src[i];
                src[i] = op.code == 6 ? (unsigned char)(v & mask) : ((double)v >= op.p[0] ? (unsigned char)(255 - v) : v);
            }
        } else if (op.code == 8) {  // autocontrast: each channel's range stretched to 0–255
            if (threadIdx.x < 3) { lo[threadIdx.x] = 255; hi[threadIdx.x] = 0; }
            __syncthreads();
            unsigned l[3] = {255, 255, 255}, g[3] = {0, 0, 0};
            for (int p = threadIdx.x; p < plane; p += blockDim.x)
                for (int c = 0; c < 3; ++c) { const unsigned v = src[p * 3 + c]; l[c] = v < l[c] ? v : l[c]; g[c] = v > g[c] ? v : g[c]; }
            for (int c = 0; c < 3; ++c) { atomicMin(&lo[c], l[c]); atomicMax(&hi[c], g[c]); }
            __syncthreads();
            for (int p = threadIdx.x; p < plane; p += blockDim.x)
                for (int c = 0; c < 3; ++c) {
                    if (hi[c] <= lo[c]) continue;
                    const float scale = __fdiv_rn(255.0f, (float)(hi[c] - lo[c]));
                    const float r = roundf(__fmul_rn((float)(src[p * 3 + c] - lo[c]), scale));
                    src[p * 3 + c] = (unsigned char)fminf(fmaxf(r, 0.f), 255.f);
                }
        } else if (op.code == 9) {  // equalize: each channel through PIL's lookup table
            for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) hist[i / 256][i % 256] = 0;
            __syncthreads();
            for (int p = threadIdx.x; p < plane; p += blockDim.x)
                for (int c = 0; c < 3; ++c) atomicAdd(&hist[c][src[p * 3 + c]], 1u);
            __syncthreads();
            if (threadIdx.x < 3) {
                const int c = threadIdx.x;
                unsigned long long total = 0, last = 0;
                for (int v = 0; v < 256; ++v) { total += hist[c][v]; if (hist[c][v] > 0) last = hist[c][v]; }
                const unsigned long long step = (total - last) / 255;
                changes[c] = step != 0;
                unsigned long long m = step / 2;
                for (int v = 0; v < 256 && step != 0; ++v) {
                    const unsigned long long q = m / step;
                    lut[c][v] = (unsigned char)(q < 255 ? q : 255);
                    m += hist[c][v];
                }
            }
            __syncthreads();
            for (int p = threadIdx.x; p < plane; p += blockDim.x)
                for (int c = 0; c < 3; ++c) if (changes[c]) src[p * 3 + c] = lut[c][src[p * 3 + c]];
        }
        __syncthreads();
    }
    float* o = out + (unsigned long long)blockIdx.x * 3 * plane;
    for (int p = threadIdx.x; p < plane; p += blockDim.x) {
        const int y = p / w, x = p - y * w;
        const bool erased = pr->erase && x >= (int)pr->rect[0] && x < (int)(pr->rect[0] + pr->rect[2])
            && y >= (int)pr->rect[1] && y < (int)(pr->rect[1] + pr->rect[3]);
        for (int c = 0; c < 3; ++c) {
            const unsigned char v = erased ? erase_noise(pr->seed, pr->gray ? (unsigned)p : (unsigned)(p * 3 + c)) : src[p * 3 + c];
            o[c * plane + p] = __fmul_rn(__fsub_rn(__fdiv_rn((float)v, 255.0f), n.mean[c]), n.inv_std[c]);
        }
    }
}
"#;

static KERNELS: Kernels = Kernels::new("pixel operations", KERNEL);

/// Whether the kernel compiles here (NVRTC works); the first call compiles it.
pub(crate) fn available() -> bool {
    KERNELS.ptx().is_some()
}

/// The kernel's `Norm`: channel means and reciprocal standard deviations.
#[repr(C)]
#[derive(Clone, Copy)]
struct NormArg {
    mean: [f32; 3],
    inv_std: [f32; 3],
}

/// Runs each image's program (`programs`: `nn::pixel_ops::kernel_programs`' bytes, uploaded)
/// over its 8-bit crop in `crops` (`n · h · w · 3` bytes; `spare` the same size, overwritten)
/// and writes the NCHW f32 batch at `out`, normalised with `mean` / `std`, on `stream`.
///
/// # Safety
/// The buffers are live device memory of `device` of the sizes above for `n` images; the
/// device's context is bound.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pixel_ops(
    device: usize,
    stream: driver::CUstream,
    n: usize,
    programs: u64,
    (crops, spare): (u64, u64),
    out: u64,
    hw: [u32; 2],
    (mean, std): ([f32; 3], [f32; 3]),
) -> Result<()> {
    let f = KERNELS.function(device, c"pixel_ops")?;
    let mut norm = NormArg { mean, inv_std: std.map(|s| 1.0 / s) };
    let (mut h, mut w) = (hw[0] as i32, hw[1] as i32);
    let (mut programs, mut crops, mut spare, mut out) = (programs, crops, spare, out);
    let mut params = [
        &mut programs as *mut u64 as *mut c_void,
        &mut crops as *mut u64 as *mut c_void,
        &mut spare as *mut u64 as *mut c_void,
        &mut out as *mut u64 as *mut c_void,
        &mut h as *mut i32 as *mut c_void,
        &mut w as *mut i32 as *mut c_void,
        &mut norm as *mut NormArg as *mut c_void,
    ];
    // SAFETY: the arguments match the entry's signature (four pointers, two ints, the norm by
    // value); the caller vouches for the addresses.
    unsafe { launch_256(f, (n as u32, 1), stream, &mut params) }
        .map_err(|e| Error::Kernel { op: "pixel operations", reason: format!("launching {n} images: {e:?}") })
}
