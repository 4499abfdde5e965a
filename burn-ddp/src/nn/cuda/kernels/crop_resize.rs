//! From decoded images to a training batch in one kernel: each image's region resized to the
//! output size with an antialiased bilinear (triangle) filter — the filter widened by the
//! shrink factor, as Pillow, torchvision's antialiased resize and `fast_image_resize`'s bilinear
//! convolution do — mirrored when asked, scaled to `[0, 1]`, normalised per channel and stored
//! as NCHW f32. The host twin of the arithmetic on RGB bytes is `nn::decode::crop_resize_on_host`.
//!
//! An image comes as interleaved RGB bytes or as a JPEG's Y, Cb and Cr planes (chroma at full
//! or half resolution each way). From planes, Y takes the filter RGB would; chroma takes the
//! same filter as if it had first been enlarged to the luma grid by bilinear interpolation
//! (samples centred on the luma samples they cover, as JFIF sites them — the decoders' "fancy"
//! upsampling), summed directly over the chroma samples with the combined weights; the filtered
//! values are converted to RGB with JFIF's full-range BT.601 matrix and clamped to 0–255. The
//! colour conversion nvJPEG would run on every pixel of the whole image runs here on the crop's
//! output pixels only; what differs from converting first is rounding and the clamp's place.
//!
//! The kernel is CUDA C compiled by NVRTC once per process ([`crate::nn::cuda::kernels::nvrtc`]).

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use crate::nn::cuda::nvjpeg::Decoded;
use cudarc::driver::sys as driver;
use std::ffi::c_void;

/// Images per launch: their descriptions fill 3.4 KiB of the 4 KiB kernel-argument space.
const IMAGES: usize = 48;
const _: () = assert!(IMAGES * std::mem::size_of::<ImgArg>() + 8 + 4 + 4 + 24 <= 4096);

const KERNEL: &str = r#"
// format: 0 interleaved RGB in plane[0]; else 1 | chroma shift across << 1 | shift down << 2,
// with Y, Cb, Cr in plane[0..3] (Y rows pitch[0] apart, chroma rows pitch[1]).
struct Img { unsigned long long plane[3]; unsigned int pitch[2]; unsigned int w, h, flip, format; float x0, y0, bw, bh; unsigned int index, pad; };
struct Imgs { Img i[48]; };
struct Norm { float mean[3]; float inv_std[3]; };
// The triangle filter's weight at distance d from its centre, for support 1 / inv_f.
__device__ float tent(float d, float inv_f) { return fmaxf(0.f, 1.f - fabsf(d) * inv_f); }
// The taps of one axis: source indices [*a, *b] of a plane `len` long around centre c, support f.
__device__ void taps(float c, float f, int len, int* a, int* b) {
    *a = max((int)floorf(c - f), 0);
    *b = min((int)ceilf(c + f), len - 1);
}
// Most taps one axis of a filter has whose weights are kept in registers; a wider filter (a
// region over about 7 times the output's size across, 12 for halved chroma) works them out
// again per row.
#define TAPS 16
// A w × h plane of N interleaved bytes, rows `pitch` apart, filtered at (cx, cy) with supports
// (fx, fy): out[c] in 0–255.
template <int N>
__device__ void filter(const unsigned char* src, unsigned int pitch, int w, int h, float cx, float cy, float fx, float fy, float* out) {
    int xa, xb, ya, yb;
    taps(cx, fx, w, &xa, &xb);
    taps(cy, fy, h, &ya, &yb);
    const float ix = 1.f / fx, iy = 1.f / fy;
    const int n = xb - xa + 1;
    float wx[TAPS], acc[N], wsum_x = 0.f, wsum_y = 0.f;
#pragma unroll
    for (int k = 0; k < TAPS; ++k) {
        if (k >= n) break;
        wx[k] = tent(xa + k + 0.5f - cx, ix);
        wsum_x += wx[k];
    }
    if (n > TAPS) {
        wsum_x = 0.f;
        for (int x = xa; x <= xb; ++x) wsum_x += tent(x + 0.5f - cx, ix);
    }
    for (int c = 0; c < N; ++c) acc[c] = 0.f;
    for (int y = ya; y <= yb; ++y) {
        const float wy = tent(y + 0.5f - cy, iy);
        if (wy == 0.f) continue;
        wsum_y += wy;
        const unsigned char* row = src + (unsigned long long)y * pitch + N * xa;
        float r[N];
        for (int c = 0; c < N; ++c) r[c] = 0.f;
        if (n <= TAPS) {
#pragma unroll
            for (int k = 0; k < TAPS; ++k) {
                if (k >= n) break;
                for (int c = 0; c < N; ++c) r[c] += wx[k] * row[N * k + c];
            }
        } else {
            for (int k = 0; k < n; ++k) {
                const float wk = tent(xa + k + 0.5f - cx, ix);
                for (int c = 0; c < N; ++c) r[c] += wk * row[N * k + c];
            }
        }
        for (int c = 0; c < N; ++c) acc[c] += wy * r[c];
    }
    const float scale = 1.f / (wsum_x * wsum_y);
    for (int c = 0; c < N; ++c) out[c] = acc[c] * scale;
}
// What chroma sample i (an index past an edge stands for the edge sample) weighs in the filter
// over luma taps [a, b] (centre c, support 1 / inv_f) once chroma is enlarged to the luma grid
// by bilinear interpolation, samples centred on what they cover: halved chroma (shift 1) gives
// luma samples 2i − 1 … 2i + 2 a quarter, three quarters, three quarters and a quarter of it;
// full-size chroma gives sample i all of it.
__device__ float chroma_weight(int i, int a, int b, float c, float inv_f, int shift) {
    if (shift == 0) return i >= a && i <= b ? tent(i + 0.5f - c, inv_f) : 0.f;
    float w = 0.f;
    for (int d = 0; d < 4; ++d) {
        const int x = 2 * i - 1 + d;
        if (x >= a && x <= b) w += (d == 0 || d == 3 ? 0.25f : 0.75f) * tent(x + 0.5f - c, inv_f);
    }
    return w;
}
// Cb and Cr (0–255) as the luma filter at (cx, cy) sees them after that enlargement: the
// decoders' "fancy" upsampling and the filter in one pass over the chroma samples.
__device__ void chroma(const Img& im, float cx, float cy, float fx, float fy, float* cbcr) {
    const int hx = (im.format >> 1) & 1, vy = (im.format >> 2) & 1;
    const int cw = (im.w + hx) >> hx, ch = (im.h + vy) >> vy;
    int xa, xb, ya, yb;
    taps(cx, fx, im.w, &xa, &xb);
    taps(cy, fy, im.h, &ya, &yb);
    const float ix = 1.f / fx, iy = 1.f / fy;
    // The chroma samples whose enlargement reaches the luma taps: below luma sample x lies
    // chroma sample ⌊x/2 − 1/4⌋ = (x − 1) >> 1, and the next one above it.
    const int ia = hx ? (xa - 1) >> 1 : xa, ib = hx ? ((xb - 1) >> 1) + 1 : xb;
    const int ja = vy ? (ya - 1) >> 1 : ya, jb = vy ? ((yb - 1) >> 1) + 1 : yb;
    const int n = ib - ia + 1;
    float wx[TAPS], wsum_x = 0.f, wsum_y = 0.f;
#pragma unroll
    for (int k = 0; k < TAPS; ++k) {
        if (k >= n) break;
        wx[k] = chroma_weight(ia + k, xa, xb, cx, ix, hx);
        wsum_x += wx[k];
    }
    if (n > TAPS) {
        wsum_x = 0.f;
        for (int i = ia; i <= ib; ++i) wsum_x += chroma_weight(i, xa, xb, cx, ix, hx);
    }
    const unsigned char* cb = (const unsigned char*)im.plane[1];
    const unsigned char* cr = (const unsigned char*)im.plane[2];
    float acc_b = 0.f, acc_r = 0.f;
    for (int j = ja; j <= jb; ++j) {
        const float wy = chroma_weight(j, ya, yb, cy, iy, vy);
        if (wy == 0.f) continue;
        wsum_y += wy;
        const unsigned long long row = (unsigned long long)min(max(j, 0), ch - 1) * im.pitch[1];
        float rb = 0.f, rr = 0.f;
        if (n <= TAPS) {
#pragma unroll
            for (int k = 0; k < TAPS; ++k) {
                if (k >= n) break;
                const int at = min(max(ia + k, 0), cw - 1);
                rb += wx[k] * cb[row + at];
                rr += wx[k] * cr[row + at];
            }
        } else {
            for (int i = ia; i <= ib; ++i) {
                const float w = chroma_weight(i, xa, xb, cx, ix, hx);
                const int at = min(max(i, 0), cw - 1);
                rb += w * cb[row + at];
                rr += w * cr[row + at];
            }
        }
        acc_b += wy * rb;
        acc_r += wy * rr;
    }
    const float scale = 1.f / (wsum_x * wsum_y);
    cbcr[0] = acc_b * scale;
    cbcr[1] = acc_r * scale;
}
// Image im's region resampled at output pixel (ox, oy) of out_w × out_h: its R, G, B in 0–255.
__device__ void resample(const Img& im, int ox, int oy, int out_h, int out_w, float* rgb) {
    const float sx = im.bw / out_w, sy = im.bh / out_h;
    const float fx = fmaxf(sx, 1.0f), fy = fmaxf(sy, 1.0f);
    const int sox = im.flip ? out_w - 1 - ox : ox;
    const float cx = im.x0 + (sox + 0.5f) * sx, cy = im.y0 + (oy + 0.5f) * sy;
    if (im.format == 0) {
        filter<3>((const unsigned char*)im.plane[0], im.pitch[0], im.w, im.h, cx, cy, fx, fy, rgb);
        return;
    }
    float y, c[2];
    filter<1>((const unsigned char*)im.plane[0], im.pitch[0], im.w, im.h, cx, cy, fx, fy, &y);
    chroma(im, cx, cy, fx, fy, c);
    const float cb = c[0] - 128.f, cr = c[1] - 128.f;
    rgb[0] = fminf(fmaxf(y + 1.402f * cr, 0.f), 255.f);
    rgb[1] = fminf(fmaxf(y - 0.344136f * cb - 0.714136f * cr, 0.f), 255.f);
    rgb[2] = fminf(fmaxf(y + 1.772f * cb, 0.f), 255.f);
}
// Block row y is image y of the launch; threads stride over its output pixels.
extern "C" __global__ void crop_resize(const Imgs b, float* out, int out_h, int out_w, const Norm n) {
    const Img& im = b.i[blockIdx.y];
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
    const Img& im = b.i[blockIdx.y];
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

/// One image to crop and resize: where its decoded pixels lie, its size, the region
/// `[x, y, width, height]` (pixels, fractional allowed) and whether to mirror.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Crop {
    pub pixels: Decoded,
    pub size: [u32; 2],
    pub region: [f32; 4],
    pub flip: bool,
}

/// A crop as the kernel's `Img` reads it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ImgArg {
    plane: [u64; 3],
    pitch: [u32; 2],
    w: u32,
    h: u32,
    flip: u32,
    format: u32,
    region: [f32; 4],
    index: u32,
    pad: u32,
}

impl ImgArg {
    fn new(c: &Crop, index: usize) -> Self {
        let (plane, pitch, format) = match c.pixels {
            Decoded::Rgb { at, pitch } => ([at, 0, 0], [pitch, 0], 0),
            Decoded::YCbCr { planes, pitch, shift } => {
                (planes, pitch, 1 | u32::from(shift[0]) << 1 | u32::from(shift[1]) << 2)
            }
        };
        let [w, h] = c.size;
        Self { plane, pitch, w, h, flip: c.flip as u32, format, region: c.region, index: index as u32, pad: 0 }
    }
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
/// Every crop's planes are live device memory of `device` holding its size as they say; `out`
/// holds `crops.len() · 3 · h · w` f32 (normalised) or bytes; the device's
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
            *arg = ImgArg::new(c, batch * IMAGES + k);
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
        // SAFETY: the arguments match the entry's signature (a 48-image batch by value, a
        // pointer, two ints, and for `crop_resize` the norm by value); the caller vouches for
        // the addresses.
        unsafe { launch_256(f, (blocks_x, chunk.len() as u32), stream, &mut params) }
            .map_err(|e| Error::Kernel { op: "crop and resize", reason: format!("launching batch {batch}: {e:?}") })?;
    }
    Ok(())
}
