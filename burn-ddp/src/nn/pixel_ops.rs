//! What training augmentation does to an image's pixels after its crop — RandAugment's
//! operations, colour jitter, random erasing — on 8-bit RGB with torchvision's arithmetic for
//! 8-bit images (every result rounded and clamped to 0–255), in the one form both paths run:
//! [`apply_on_host`] here (a data loader's threads), and the CUDA kernel
//! `cuda::kernels::pixel_ops` (a GPU-decoded batch), which does the same arithmetic in the same
//! order: a test runs the kernel's source on the CPU and compares byte for byte.
//!
//! The draws (which operation, how strong) are the caller's; here the operations only run.

/// One operation on an 8-bit RGB image; each leaves the image's size as it was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PixelOp {
    /// Output pixel centre `(x, y)` takes the input pixel nearest to `(a·x + b·y + c,
    /// d·x + e·y + f)` (`[a, b, c, d, e, f]`, pixel centres at `i + 0.5`); black outside. Shear,
    /// translation and rotation, as torchvision's nearest-neighbour `affine`.
    Warp([f64; 6]),
    /// Blend with black: `f · v` (torchvision's `adjust_brightness`).
    Brightness(f32),
    /// Blend with the pixel's grey (ITU-R 601 luma): saturation (`adjust_saturation`).
    Saturation(f32),
    /// Blend with the image's mean grey (`adjust_contrast`).
    Contrast(f32),
    /// Blend with the image smoothed by PIL's SMOOTH filter, the border kept (`adjust_sharpness`).
    Sharpness(f32),
    /// Keep the top `bits` bits (0–8) of each value (`posterize`).
    Posterize(u8),
    /// Invert the values at or above the threshold (`solarize`).
    Solarize(f64),
    /// Each channel stretched so that its darkest value becomes 0 and its brightest 255.
    AutoContrast,
    /// Each channel's histogram equalized (PIL's `ImageOps.equalize`).
    Equalize,
}

/// A rectangle of random values written over the image after its operations (random erasing):
/// value `erase_noise(seed, i)` for the `i`-th byte of the image (`(y · width + x) · 3 + c`), or
/// of its pixel (`y · width + x`) on all three channels when `gray`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Erase {
    /// `[x, y, width, height]` in pixels, inside the image.
    pub rect: [u32; 4],
    /// The noise's seed.
    pub seed: u32,
    /// One value per pixel (a grey image's erasing) instead of one per byte.
    pub gray: bool,
}

/// The operations, in order, then the erasing, for one image.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PixelOps {
    /// Applied in order.
    pub ops: Vec<PixelOp>,
    /// Written last.
    pub erase: Option<Erase>,
}

impl PixelOps {
    /// Whether nothing happens to the pixels.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.erase.is_none()
    }
}

/// Operations one image may take on the GPU (RandAugment's 16 and colour jitter's 3, with room).
pub const MAX_OPS: usize = 20;

/// The erasing's random byte number `index` for `seed` (a murmur3 finaliser of both).
pub fn erase_noise(seed: u32, index: u32) -> u8 {
    let mut h = seed ^ index.wrapping_mul(0x9E37_79B9);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    (h >> 24) as u8
}

/// `rgb` (`width · height` pixels of 3 bytes, rows top to bottom) after `ops`.
///
/// # Panics
/// If `rgb` is not `3 · width · height` bytes, or an erasing rectangle leaves the image.
pub fn apply_on_host(rgb: &mut Vec<u8>, (width, height): (u32, u32), ops: &PixelOps) {
    let (w, h) = (width as usize, height as usize);
    assert_eq!(rgb.len(), 3 * w * h, "Got {} bytes for a {width}×{height} RGB image", rgb.len());
    for op in &ops.ops {
        match *op {
            PixelOp::Warp(m) => *rgb = warp(rgb, (w, h), m),
            PixelOp::Brightness(f) => blend_with(rgb, 0.0, f),
            PixelOp::Saturation(f) => saturate(rgb, f),
            PixelOp::Contrast(f) => {
                let mean = mean_luma(rgb);
                blend_with(rgb, mean, f);
            }
            PixelOp::Sharpness(f) => *rgb = sharpness(rgb, (w, h), f),
            PixelOp::Posterize(bits) => {
                let mask = ((0xFFu16 << (8 - u32::from(bits).min(8))) & 0xFF) as u8;
                rgb.iter_mut().for_each(|v| *v &= mask);
            }
            PixelOp::Solarize(t) => rgb.iter_mut().for_each(|v| *v = if f64::from(*v) >= t { 255 - *v } else { *v }),
            PixelOp::AutoContrast => (0..3).for_each(|c| autocontrast(rgb, c)),
            PixelOp::Equalize => (0..3).for_each(|c| equalize(rgb, c)),
        }
    }
    if let Some(e) = ops.erase {
        let [x0, y0, ew, eh] = e.rect.map(|v| v as usize);
        assert!(x0 + ew <= w && y0 + eh <= h, "Got erasing rectangle {:?} in a {width}×{height} image", e.rect);
        for y in y0..y0 + eh {
            for x in x0..x0 + ew {
                let p = y * w + x;
                for c in 0..3 {
                    let i = if e.gray { p } else { 3 * p + c };
                    rgb[3 * p + c] = erase_noise(e.seed, i as u32);
                }
            }
        }
    }
}

/// ITU-R 601 luma in f32, unrounded, summed in this order (the kernel's order).
fn luma(p: [u8; 3]) -> f32 {
    0.299 * f32::from(p[0]) + 0.587 * f32::from(p[1]) + 0.114 * f32::from(p[2])
}

/// Every f32 luma is a multiple of 2⁻²⁷ below 256: scaled by 2²⁷ it is an integer, so a sum in
/// any order is exact (the kernel sums across threads).
const LUMA_SCALE: f64 = (1u64 << 27) as f64;

/// The image's mean luma, from an exact sum.
fn mean_luma(rgb: &[u8]) -> f32 {
    // Below 2³⁵ each: a signed conversion (one instruction) gives the unsigned value.
    let sum: i64 = rgb.chunks_exact(3).map(|p| (f64::from(luma([p[0], p[1], p[2]])) * LUMA_SCALE) as i64).sum();
    (sum as u64 as f64 / ((rgb.len() / 3).max(1) as f64 * LUMA_SCALE)) as f32
}

/// `x` rounded half away from zero (C's `roundf`, the kernel's) and clamped to 0–255. Without
/// SSE4.1 `f32::round` is a library call per value, the largest cost of colour jitter on the
/// host; truncating (one instruction) and comparing the exact remainder gives the same result.
fn round_to_byte(x: f32) -> u8 {
    // Clamping first changes no result: anything past 256 or below −1 ends at 255 or 0 anyway.
    let x = x.clamp(-1.0, 256.0);
    let t = x as i32;
    let rest = x - t as f32; // exact: t has x's integer digits
    (t + i32::from(rest >= 0.5) - i32::from(rest <= -0.5)).clamp(0, 255) as u8
}

/// `x` rounded half away from zero (`f64::round`, C's `round`) for |x| < 2⁵², by truncation.
fn round_f64(x: f64) -> f64 {
    if x.is_nan() || x.abs() >= 4.5e15 {
        return x.round();
    }
    let t = x as i64;
    let rest = x - t as f64;
    (if rest >= 0.5 {
        t + 1
    } else if rest <= -0.5 {
        t - 1
    } else {
        t
    }) as f64
}

/// `other + f · (v − other)`, rounded half away from zero and clamped to 0–255 (torchvision's
/// `_blend`).
fn blend(v: u8, other: f32, f: f32) -> u8 {
    round_to_byte(other + f * (f32::from(v) - other))
}

/// Every value blended with the same `other`: through a table of the 256 results.
fn blend_with(rgb: &mut [u8], other: f32, f: f32) {
    let table: [u8; 256] = std::array::from_fn(|v| blend(v as u8, other, f));
    rgb.iter_mut().for_each(|v| *v = table[usize::from(*v)]);
}

/// Every pixel blended with its own grey.
fn saturate(rgb: &mut [u8], f: f32) {
    for p in rgb.chunks_exact_mut(3) {
        let grey = luma([p[0], p[1], p[2]]);
        p.iter_mut().for_each(|v| *v = blend(*v, grey, f));
    }
}

fn warp(rgb: &[u8], (w, h): (usize, usize), [a, b, c, d, e, f]: [f64; 6]) -> Vec<u8> {
    let mut out = vec![0u8; rgb.len()];
    // The products of `a·x + b·y + c` once per column and row; the sums per pixel, in order.
    let (ax, dx): (Vec<f64>, Vec<f64>) = (0..w).map(|x| (a * (x as f64 + 0.5), d * (x as f64 + 0.5))).unzip();
    for y in 0..h {
        let (by, ey) = (b * (y as f64 + 0.5), e * (y as f64 + 0.5));
        for x in 0..w {
            let (sx, sy) = (ax[x] + by + c, dx[x] + ey + f);
            let (ix, iy) = (round_f64(sx - 0.5), round_f64(sy - 0.5));
            if ix >= 0.0 && iy >= 0.0 && ix < w as f64 && iy < h as f64 {
                let (from, to) = (3 * (iy as usize * w + ix as usize), 3 * (y * w + x));
                out[to..to + 3].copy_from_slice(&rgb[from..from + 3]);
            }
        }
    }
    out
}

fn sharpness(rgb: &[u8], (w, h): (usize, usize), f: f32) -> Vec<u8> {
    let mut out = rgb.to_vec();
    if w < 3 || h < 3 {
        return out;
    }
    let row = 3 * w;
    for y in 1..h - 1 {
        let (above, here, below) =
            (&rgb[(y - 1) * row..y * row], &rgb[y * row..(y + 1) * row], &rgb[(y + 1) * row..(y + 2) * row]);
        for i in 3..row - 3 {
            let sum3 = |r: &[u8]| u32::from(r[i - 3]) + u32::from(r[i]) + u32::from(r[i + 3]);
            let around = sum3(above) + sum3(here) + sum3(below);
            // round(s / 13) for the integer s: no quotient lies within 1/26 of a tie, so the
            // kernel's rounded f32 division gives the same.
            let smooth = ((2 * (around + 4 * u32::from(here[i])) + 13) / 26) as f32;
            out[y * row + i] = blend(here[i], smooth, f);
        }
    }
    out
}

fn autocontrast(rgb: &mut [u8], c: usize) {
    let (lo, hi) = rgb.chunks_exact(3).fold((255u8, 0u8), |(lo, hi), p| (lo.min(p[c]), hi.max(p[c])));
    if hi > lo {
        let scale = 255.0 / f32::from(hi - lo);
        let table: [u8; 256] = std::array::from_fn(|v| round_to_byte(f32::from((v as u8).saturating_sub(lo)) * scale));
        rgb.chunks_exact_mut(3).for_each(|p| p[c] = table[usize::from(p[c])]);
    }
}

/// PIL's equalize lookup table for a channel's histogram, or `None` when it changes nothing.
fn equalize_lut(hist: &[u32; 256]) -> Option<[u8; 256]> {
    let last = hist.iter().rposition(|&n| n > 0).map_or(0, |i| hist[i]);
    let step = (hist.iter().map(|&n| u64::from(n)).sum::<u64>() - u64::from(last)) / 255;
    if step == 0 {
        return None;
    }
    let mut lut = [0u8; 256];
    let mut n = step / 2;
    for (v, &count) in hist.iter().enumerate() {
        lut[v] = (n / step).min(255) as u8;
        n += u64::from(count);
    }
    Some(lut)
}

fn equalize(rgb: &mut [u8], c: usize) {
    let mut hist = [0u32; 256];
    rgb.chunks_exact(3).for_each(|p| hist[usize::from(p[c])] += 1);
    if let Some(lut) = equalize_lut(&hist) {
        rgb.chunks_exact_mut(3).for_each(|p| p[c] = lut[usize::from(p[c])]);
    }
}

#[cfg(any(feature = "cuda", test))]
pub(crate) use kernel_form::kernel_programs;

/// The operations as `cuda::kernels::pixel_ops` reads them.
#[cfg(any(feature = "cuda", test))]
mod kernel_form {
    use crate::nn::pixel_ops::{MAX_OPS, PixelOp, PixelOps};

    /// Operation codes as the kernel reads them.
    mod code {
        pub const WARP: u32 = 1;
        pub const BRIGHTNESS: u32 = 2;
        pub const SATURATION: u32 = 3;
        pub const CONTRAST: u32 = 4;
        pub const SHARPNESS: u32 = 5;
        pub const POSTERIZE: u32 = 6;
        pub const SOLARIZE: u32 = 7;
        pub const AUTOCONTRAST: u32 = 8;
        pub const EQUALIZE: u32 = 9;
    }

    /// One operation as the kernel's `Op` reads it (56 bytes).
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct OpArg {
        code: u32,
        pad: u32,
        p: [f64; 6],
    }

    /// One image's program as the kernel's `Prog` reads it.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct ProgArg {
        n_ops: u32,
        erase: u32,
        rect: [u32; 4],
        seed: u32,
        gray: u32,
        ops: [OpArg; MAX_OPS],
    }

    impl From<&PixelOp> for OpArg {
        fn from(op: &PixelOp) -> Self {
            let (code, p0) = match *op {
                PixelOp::Warp(m) => return Self { code: code::WARP, pad: 0, p: m },
                PixelOp::Brightness(f) => (code::BRIGHTNESS, f64::from(f)),
                PixelOp::Saturation(f) => (code::SATURATION, f64::from(f)),
                PixelOp::Contrast(f) => (code::CONTRAST, f64::from(f)),
                PixelOp::Sharpness(f) => (code::SHARPNESS, f64::from(f)),
                PixelOp::Posterize(bits) => (code::POSTERIZE, f64::from(bits)),
                PixelOp::Solarize(t) => (code::SOLARIZE, t),
                PixelOp::AutoContrast => (code::AUTOCONTRAST, 0.0),
                PixelOp::Equalize => (code::EQUALIZE, 0.0),
            };
            Self { code, pad: 0, p: [p0, 0.0, 0.0, 0.0, 0.0, 0.0] }
        }
    }

    /// The kernel's per-image programs for `images`, as bytes to upload (`Prog` after `Prog`).
    ///
    /// # Panics
    /// If an image has more than [`MAX_OPS`] operations.
    pub(crate) fn kernel_programs<'a>(images: impl IntoIterator<Item = &'a PixelOps>) -> Vec<u8> {
        let mut bytes = Vec::new();
        for ops in images {
            assert!(
                ops.ops.len() <= MAX_OPS,
                "Got {} pixel operations for one image; at most {MAX_OPS}",
                ops.ops.len()
            );
            let mut prog = ProgArg {
                n_ops: ops.ops.len() as u32,
                erase: ops.erase.is_some() as u32,
                rect: ops.erase.map_or([0; 4], |e| e.rect),
                seed: ops.erase.map_or(0, |e| e.seed),
                gray: ops.erase.is_some_and(|e| e.gray) as u32,
                ops: [OpArg::default(); MAX_OPS],
            };
            for (arg, op) in prog.ops.iter_mut().zip(&ops.ops) {
                *arg = op.into();
            }
            // SAFETY: `ProgArg` is plain old data of `size_of` bytes (repr(C), no padding holes
            // that matter: the kernel reads only the fields written above).
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts((&prog as *const ProgArg).cast::<u8>(), std::mem::size_of::<ProgArg>())
            });
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A `w`×`h` image with a gradient, texture and a few saturated pixels.
    fn photo(w: u32, h: u32, seed: u32) -> Vec<u8> {
        (0..w * h)
            .flat_map(|p| {
                let (x, y) = (p % w, p / w);
                let n = u32::from(erase_noise(seed, p));
                [
                    (x * 255 / w.max(2)) as u8,
                    ((y * 7 + n / 4) % 256) as u8,
                    if n > 250 { 255 } else { (n / 2 + 40) as u8 },
                ]
            })
            .collect()
    }

    fn rotation(deg: f64, (w, h): (u32, u32)) -> PixelOp {
        let (c, s) = (deg.to_radians().cos(), deg.to_radians().sin());
        let (cx, cy) = (f64::from(w) * 0.5, f64::from(h) * 0.5);
        PixelOp::Warp([c, s, cx - c * cx - s * cy, -s, c, cy + s * cx - c * cy])
    }

    /// Every operation alone at several strengths, then chains of them with erasing.
    fn programs(size: (u32, u32)) -> Vec<PixelOps> {
        let one = |op| PixelOps { ops: vec![op], erase: None };
        let mut all = vec![PixelOps::default()];
        for f in [0.1f32, 0.73, 1.0, 1.9] {
            all.extend(
                [PixelOp::Brightness(f), PixelOp::Saturation(f), PixelOp::Contrast(f), PixelOp::Sharpness(f)].map(one),
            );
        }
        all.extend((0..=8).map(|b| one(PixelOp::Posterize(b))));
        all.extend([0.0, 127.5, 128.0, 255.0, 256.0].map(|t| one(PixelOp::Solarize(t))));
        all.extend([PixelOp::AutoContrast, PixelOp::Equalize].map(one));
        all.extend([
            one(PixelOp::Warp([1.0, 0.3, 0.0, 0.0, 1.0, 0.0])),
            one(PixelOp::Warp([1.0, 0.0, 0.0, -0.27, 1.0, 0.0])),
            one(PixelOp::Warp([1.0, 0.0, -5.0, 0.0, 1.0, 0.0])),
            one(PixelOp::Warp([1.0, 0.0, 0.0, 0.0, 1.0, 3.0])),
            one(rotation(17.0, size)),
            one(rotation(-30.0, size)),
            one(rotation(90.0, size)),
        ]);
        // The rectangle `[x, y, w, h]` cut to the image.
        let erase = |[x, y, w, h]: [u32; 4], gray| {
            let (x, y) = (x.min(size.0 - 1), y.min(size.1 - 1));
            Some(Erase { rect: [x, y, w.min(size.0 - x), h.min(size.1 - y)], seed: 77, gray })
        };
        all.extend([
            PixelOps { ops: vec![], erase: erase([2, 3, 7, 5], false) },
            PixelOps { ops: vec![PixelOp::Equalize], erase: erase([0, 0, size.0, size.1], true) },
            PixelOps { ops: vec![rotation(9.0, size), PixelOp::Contrast(1.36), PixelOp::Solarize(100.0)], erase: None },
            PixelOps {
                ops: vec![
                    PixelOp::Posterize(5),
                    PixelOp::Brightness(1.31),
                    PixelOp::Contrast(0.7),
                    PixelOp::Saturation(1.2),
                    PixelOp::Sharpness(0.2),
                    PixelOp::AutoContrast,
                ],
                erase: erase([size.0.saturating_sub(4), size.1.saturating_sub(3), 4, 3], false),
            },
            PixelOps { ops: vec![PixelOp::Warp([1.0, -0.3, 4.0, 0.0, 1.0, 0.0]), PixelOp::Equalize], erase: None },
        ]);
        all
    }

    fn tool_runs(program: &str) -> bool {
        Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
    }

    /// Runs the kernel's source on the CPU (`benches/emulate_pixel_ops.py`) over `crops`.
    fn emulate(
        crops: &[Vec<u8>],
        progs: &[PixelOps],
        (w, h): (u32, u32),
        inv_std: [f32; 3],
        mean: [f32; 3],
    ) -> Vec<f32> {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in"), dir.path().join("out"));
        let mut bytes: Vec<u8> = [crops.len() as u32, h, w, 32].iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend(mean.iter().chain(&inv_std).flat_map(|v| v.to_le_bytes()));
        bytes.extend(crops.iter().flatten());
        bytes.extend(kernel_programs(progs));
        std::fs::write(&input, bytes).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/emulate_pixel_ops.py");
        let run = Command::new("python3").arg(script).arg(&input).arg(&output).output().unwrap();
        assert!(
            run.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(&output).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    #[test]
    fn the_kernel_gives_the_hosts_bytes() {
        if !tool_runs("python3") || !tool_runs("g++") {
            eprintln!("SKIPPED: emulating the pixel-operations kernel needs python3 and g++ (C++20)");
            return;
        }
        // 64×48 has more pixels than levels, so equalize changes the image.
        for size in [(23u32, 17u32), (2, 2), (64, 48)] {
            let progs = programs(size);
            let crops: Vec<Vec<u8>> = (0..progs.len()).map(|i| photo(size.0, size.1, i as u32)).collect();
            let (mean, inv_std) = ([0.485f32, 0.456, 0.406], [1.0 / 0.229f32, 1.0 / 0.224, 1.0 / 0.225]);
            let got = emulate(&crops, &progs, size, inv_std, mean);
            let plane = (size.0 * size.1) as usize;
            for (i, (crop, ops)) in crops.iter().zip(&progs).enumerate() {
                let mut want = crop.clone();
                apply_on_host(&mut want, size, ops);
                for p in 0..plane {
                    for c in 0..3 {
                        let v = (f32::from(want[3 * p + c]) / 255.0 - mean[c]) * inv_std[c];
                        let g = got[(i * 3 + c) * plane + p];
                        assert_eq!(g, v, "{size:?} image {i} ({ops:?}): pixel {p} channel {c}: {g} vs {v}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_fast_roundings_are_std_s() {
        let mut x = -3.0f32;
        while x < 260.0 {
            for v in [x, x.next_up(), x.next_down(), x + 0.5, (x + 0.5).next_down(), (x + 0.5).next_up()] {
                assert_eq!(round_to_byte(v), v.round().clamp(0.0, 255.0) as u8, "{v}");
                let d = f64::from(v) * 1.37;
                assert_eq!(round_f64(d), d.round(), "{d}");
            }
            x += 0.25;
        }
        assert_eq!((round_to_byte(1e9), round_to_byte(-1e9), round_to_byte(f32::NAN)), (255, 0, 0));
        assert_eq!((round_f64(-2.5), round_f64(2.5), round_f64(1e300)), (-3.0, 3.0, 1e300));
    }

    #[test]
    fn operations_do_what_torchvision_does() {
        let (w, h) = (16u32, 12u32);
        let img = photo(w, h, 3);
        let run = |ops: Vec<PixelOp>| {
            let mut out = img.clone();
            apply_on_host(&mut out, (w, h), &PixelOps { ops, erase: None });
            out
        };
        let at = |v: &[u8], x: u32, y: u32| [0, 1, 2].map(|c| v[(3 * (y * w + x)) as usize + c]);
        let moved = run(vec![PixelOp::Warp([1.0, 0.0, -3.0, 0.0, 1.0, 0.0])]);
        assert_eq!(at(&moved, 5, 4), at(&img, 2, 4), "content moves right by 3");
        assert_eq!(at(&moved, 1, 4), [0; 3], "black fills the gap");
        let turned = run(vec![rotation(180.0, (w, h))]);
        assert_eq!(at(&turned, 0, 0), at(&img, 15, 11), "a half turn about the centre");
        assert_eq!(run(vec![PixelOp::Brightness(1.0), PixelOp::Sharpness(1.0), PixelOp::Contrast(1.0)]), img);
        assert!(run(vec![PixelOp::Posterize(4)]).iter().zip(&img).all(|(&a, &b)| a == b & 0xF0));
        assert!(
            run(vec![PixelOp::Solarize(128.0)])
                .iter()
                .zip(&img)
                .all(|(&a, &b)| a == if b >= 128 { 255 - b } else { b })
        );
        let half = run(vec![PixelOp::Brightness(0.5)]);
        assert!(half.iter().zip(&img).all(|(&a, &b)| a == (f32::from(b) * 0.5).round() as u8));
        let grey = run(vec![PixelOp::Saturation(0.0)]);
        assert!(grey.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]), "saturation 0 leaves grey");
        let stretched = run(vec![PixelOp::AutoContrast]);
        for c in 0..3 {
            let channel = || stretched.iter().skip(c).step_by(3);
            assert_eq!((channel().min(), channel().max()), (Some(&0), Some(&255)), "channel {c}");
        }
        let flat = run(vec![PixelOp::Contrast(0.0)]);
        assert!(flat.chunks_exact(3).all(|p| p == &flat[..3]), "contrast 0 is the mean grey everywhere");
    }

    #[test]
    fn equalize_spreads_values_and_erasing_is_a_pure_function_of_its_seed() {
        // More pixels than levels: PIL's equalize leaves an image of fewer than 256 alone.
        let (w, h) = (40u32, 30u32);
        let narrow: Vec<u8> = photo(w, h, 5).iter().map(|v| 100 + v / 8).collect();
        let mut eq = narrow.clone();
        apply_on_host(&mut eq, (w, h), &PixelOps { ops: vec![PixelOp::Equalize], erase: None });
        let spread = |v: &[u8]| v.iter().max().unwrap() - v.iter().min().unwrap();
        assert!(spread(&eq) > 2 * spread(&narrow), "{} vs {}", spread(&eq), spread(&narrow));
        let erase = |seed| {
            let mut v = narrow.clone();
            let rect = [3, 2, 5, 4];
            apply_on_host(&mut v, (w, h), &PixelOps { ops: vec![], erase: Some(Erase { rect, seed, gray: false }) });
            v
        };
        assert_eq!(erase(9), erase(9));
        assert_ne!(erase(9), erase(10));
        let changed = erase(9).iter().zip(&narrow).filter(|(a, b)| a != b).count();
        assert!(changed > 5 * 4 * 3 * 9 / 10 && changed <= 5 * 4 * 3, "{changed} bytes changed");
        let mean = (0..100_000u32).map(|i| f64::from(erase_noise(1, i))).sum::<f64>() / 1e5;
        assert!((mean - 127.5).abs() < 1.0, "the noise is uniform over the bytes: mean {mean}");
    }
}
