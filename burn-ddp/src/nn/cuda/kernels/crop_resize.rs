//! From decoded RGB bytes to a training batch in one kernel: each image's region resized to the
//! output size with an antialiased bilinear (triangle) filter — the filter widened by the
//! shrink factor, as Pillow, torchvision's antialiased resize and `fast_image_resize`'s bilinear
//! convolution do — mirrored when asked, scaled to `[0, 1]`, normalised per channel and stored
//! as NCHW f32. The host twin of the arithmetic is `nn::decode::crop_resize_on_host`.
//!
//! The kernel is CUDA C compiled by NVRTC once per process ([`crate::nn::cuda::kernels::nvrtc`]).

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use cudarc::driver::sys as driver;
use std::ffi::c_void;

/// Images per launch: their descriptions fill 3 KiB of the 4 KiB kernel-argument space.
const IMAGES: usize = 64;

const KERNEL: &str = r#"
struct Img { unsigned long long src; unsigned int pitch, w, h, flip; float x0, y0, bw, bh; unsigned int index, pad; };
struct Imgs { Img i[64]; };
struct Norm { float mean[3]; float inv_std[3]; };
// Image im's region resampled at output pixel (ox, oy) of out_w × out_h: its R, G, B in 0–255.
__device__ void resample(const Img im, int ox, int oy, int out_h, int out_w, float* rgb) {
    const unsigned char* src = (const unsigned char*)im.src;
    const float sx = im.bw / out_w, sy = im.bh / out_h;
    const float fx = fmaxf(sx, 1.0f), fy = fmaxf(sy, 1.0f);
    const int sox = im.flip ? out_w - 1 - ox : ox;
    const float cx = im.x0 + (sox + 0.5f) * sx, cy = im.y0 + (oy + 0.5f) * sy;
    const int xa = max((int)floorf(cx - fx), 0), xb = min((int)ceilf(cx + fx), (int)im.w - 1);
    const int ya = max((int)floorf(cy - fy), 0), yb = min((int)ceilf(cy + fy), (int)im.h - 1);
    float r = 0.f, g = 0.f, bl = 0.f, wsum_x = 0.f, wsum_y = 0.f;
    for (int x = xa; x <= xb; ++x) wsum_x += fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) / fx));
    for (int y = ya; y <= yb; ++y) {
        const float wy = fmaxf(0.f, 1.f - fabsf((y + 0.5f - cy) / fy));
        if (wy == 0.f) continue;
        wsum_y += wy;
        const unsigned char* row = src + (unsigned long long)y * im.pitch;
        float rr = 0.f, gg = 0.f, bb = 0.f;
        for (int x = xa; x <= xb; ++x) {
            const float wx = fmaxf(0.f, 1.f - fabsf((x + 0.5f - cx) / fx));
            rr += wx * row[3 * x]; gg += wx * row[3 * x + 1]; bb += wx * row[3 * x + 2];
        }
        r += wy * rr; g += wy * gg; bl += wy * bb;
    }
    const float scale = 1.f / (wsum_x * wsum_y);
    rgb[0] = r * scale; rgb[1] = g * scale; rgb[2] = bl * scale;
}
// Block row y is image y of the launch; threads stride over its output pixels.
extern "C" __global__ void crop_resize(const Imgs b, float* out, int out_h, int out_w, const Norm n) {
    const Img im = b.i[blockIdx.y];
    const int plane = out_h * out_w;
    float* dst = out + (unsigned long long)im.index * 3 * plane;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < plane; p += gridDim.x * blockDim.x) {
        const int oy = p / out_w, ox = p - oy * out_w;
        float rgb[3];
        resample(im, ox, oy, out_h, out_w, rgb);
        for (int c = 0; c < 3; ++c) dst[c * plane + p] = (rgb[c] * (1.f / 255.f) - n.mean[c]) * n.inv_std[c];
    }
}
// The same crops as 8-bit RGB rows (h · w · 3 bytes an image), rounded half away from zero:
// the input of the pixel operations (`pixel_ops`).
extern "C" __global__ void crop_resize_bytes(const Imgs b, unsigned char* out, int out_h, int out_w) {
    const Img im = b.i[blockIdx.y];
    const int plane = out_h * out_w;
    unsigned char* dst = out + (unsigned long long)im.index * 3 * plane;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < plane; p += gridDim.x * blockDim.x) {
        const int oy = p / out_w, ox = p - oy * out_w;
        float rgb[3];
        resample(im, ox, oy, out_h, out_w, rgb);
        for (int c = 0; c < 3; ++c) dst[p * 3 + c] = (unsigned char)fminf(fmaxf(roundf(rgb[c]), 0.f), 255.f);
    }
}
"#;

static KERNELS: Kernels = Kernels::new("crop and resize", KERNEL);

/// One image to crop and resize: its RGB bytes at `at` (rows `pitch` bytes apart), its size,
/// the region `[x, y, width, height]` (pixels, fractional allowed) and whether to mirror.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Crop {
    pub at: u64,
    pub pitch: u32,
    pub size: [u32; 2],
    pub region: [f32; 4],
    pub flip: bool,
}

/// A crop as the kernel's `Img` reads it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ImgArg {
    src: u64,
    pitch: u32,
    w: u32,
    h: u32,
    flip: u32,
    region: [f32; 4],
    index: u32,
    pad: u32,
}

/// The kernel's `Norm`: channel means and reciprocal standard deviations.
#[repr(C)]
#[derive(Clone, Copy)]
struct NormArg {
    mean: [f32; 3],
    inv_std: [f32; 3],
}

/// Whether the kernel compiles here (NVRTC works); the first call compiles it.
pub(crate) fn available() -> bool {
    KERNELS.ptx().is_some()
}

/// What the kernel writes: the normalised NCHW f32 batch, or 8-bit RGB crops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// `(v / 255 − mean) / std` per channel, NCHW f32.
    Normalized { mean: [f32; 3], std: [f32; 3] },
    /// 8-bit RGB rows, `h · w · 3` bytes an image, for `pixel_ops`.
    Bytes,
}

/// Writes `crops[i]`, resized to `out_hw`, as image `i` of the batch at `out` in `target`'s
/// form, on `stream`.
///
/// # Safety
/// Every crop's bytes are live device memory of `device` holding its size in RGB rows of its
/// pitch; `out` holds `crops.len() · 3 · h · w` f32 (normalised) or bytes; the device's
/// context is bound.
pub(crate) unsafe fn crop_resize(
    device: usize,
    stream: driver::CUstream,
    crops: &[Crop],
    out: u64,
    out_hw: [u32; 2],
    target: Target,
) -> Result<()> {
    let (f, mut norm) = match target {
        Target::Normalized { mean, std } => {
            (KERNELS.function(device, c"crop_resize")?, NormArg { mean, inv_std: std.map(|s| 1.0 / s) })
        }
        Target::Bytes => {
            (KERNELS.function(device, c"crop_resize_bytes")?, NormArg { mean: [0.0; 3], inv_std: [1.0; 3] })
        }
    };
    let (mut h, mut w) = (out_hw[0] as i32, out_hw[1] as i32);
    let blocks_x = (out_hw[0] * out_hw[1]).div_ceil(256).clamp(1, 256);
    for (batch, chunk) in crops.chunks(IMAGES).enumerate() {
        let mut args = [ImgArg::default(); IMAGES];
        for (k, (arg, c)) in args.iter_mut().zip(chunk).enumerate() {
            *arg = ImgArg {
                src: c.at,
                pitch: c.pitch,
                w: c.size[0],
                h: c.size[1],
                flip: c.flip as u32,
                region: c.region,
                index: (batch * IMAGES + k) as u32,
                pad: 0,
            };
        }
        let mut out = out;
        let mut params = vec![
            args.as_mut_ptr() as *mut c_void,
            &mut out as *mut u64 as *mut c_void,
            &mut h as *mut i32 as *mut c_void,
            &mut w as *mut i32 as *mut c_void,
        ];
        if let Target::Normalized { .. } = target {
            params.push(&mut norm as *mut NormArg as *mut c_void);
        }
        // SAFETY: the arguments match the entry's signature (a 64-image batch by value, a
        // pointer, two ints, and for `crop_resize` the norm by value); the caller vouches for
        // the addresses.
        unsafe { launch_256(f, (blocks_x, chunk.len() as u32), stream, &mut params) }
            .map_err(|e| Error::Kernel { op: "crop and resize", reason: format!("launching batch {batch}: {e:?}") })?;
    }
    Ok(())
}
