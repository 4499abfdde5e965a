//! RandAugment (Cubuk et al. 2020) with torchvision's `RandAugment(num_ops, magnitude,
//! num_magnitude_bins=31)` semantics: per image, `num_ops` operations drawn uniformly from 14
//! (identity, shear x/y, translate x/y, rotate, brightness, colour, contrast, sharpness,
//! posterize, solarize, autocontrast, equalize), each at the strength `magnitude` of 31 bins
//! (the signed ones negated half the time). Geometric operations sample the nearest pixel and
//! fill with black, as torchvision does. Every draw comes from the per-sample RNG.

use super::augment::{RAND_AUGMENT_BINS as BINS, blend, luma};
use image::{DynamicImage, Rgb, RgbImage};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The operations, in torchvision's order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
}

const OPS: [Op; 14] = [
    Op::Identity,
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
];

/// `k/(BINS−1)` of the way from `lo` to `hi` (torchvision's `linspace(lo, hi, 31)[k]`).
fn lin(lo: f64, hi: f64, k: u32) -> f64 {
    lo + (hi - lo) * f64::from(k) / f64::from(BINS - 1)
}

/// Op `op`'s strength at magnitude `k` for a `w`×`h` image, and whether it takes a random sign.
fn strength(op: Op, k: u32, (w, h): (u32, u32)) -> (f64, bool) {
    match op {
        Op::ShearX | Op::ShearY => (lin(0.0, 0.3, k), true),
        Op::TranslateX => (lin(0.0, 150.0 / 331.0 * f64::from(w), k), true),
        Op::TranslateY => (lin(0.0, 150.0 / 331.0 * f64::from(h), k), true),
        Op::Rotate => (lin(0.0, 30.0, k), true),
        Op::Brightness | Op::Color | Op::Contrast | Op::Sharpness => (lin(0.0, 0.9, k), true),
        Op::Posterize => (8.0 - (f64::from(k) / (f64::from(BINS - 1) / 4.0)).round(), false),
        Op::Solarize => (lin(255.0, 0.0, k), false),
        Op::Identity | Op::AutoContrast | Op::Equalize => (0.0, false),
    }
}

/// `ops` operations at magnitude `magnitude` (0..=30), drawn from `rng`.
pub fn rand_augment(img: DynamicImage, ops: u32, magnitude: u32, rng: &mut ChaCha8Rng) -> DynamicImage {
    let gray = matches!(
        img,
        DynamicImage::ImageLuma8(_)
            | DynamicImage::ImageLuma16(_)
            | DynamicImage::ImageLumaA8(_)
            | DynamicImage::ImageLumaA16(_)
    );
    let mut rgb = img.into_rgb8();
    for _ in 0..ops {
        let op = OPS[rng.random_range(0..OPS.len())];
        let (mut m, signed) = strength(op, magnitude, rgb.dimensions());
        if signed && rng.random_bool(0.5) {
            m = -m;
        }
        rgb = apply(rgb, op, m);
    }
    if gray {
        DynamicImage::ImageLuma8(DynamicImage::ImageRgb8(rgb).into_luma8())
    } else {
        DynamicImage::ImageRgb8(rgb)
    }
}

fn apply(mut img: RgbImage, op: Op, m: f64) -> RgbImage {
    let (w, h) = (f64::from(img.width()), f64::from(img.height()));
    let f = (1.0 + m) as f32;
    match op {
        Op::Identity => {}
        // Inverse maps: output pixel (x, y) reads input (x', y').
        Op::ShearX => return warp(&img, |x, y| (x + m * y, y)),
        Op::ShearY => return warp(&img, |x, y| (x, y + m * x)),
        Op::TranslateX => return warp(&img, |x, y| (x - m.trunc(), y)),
        Op::TranslateY => return warp(&img, |x, y| (x, y - m.trunc())),
        Op::Rotate => {
            let (c, s) = (m.to_radians().cos(), m.to_radians().sin());
            let (cx, cy) = (w * 0.5, h * 0.5);
            return warp(&img, |x, y| (c * (x - cx) + s * (y - cy) + cx, -s * (x - cx) + c * (y - cy) + cy));
        }
        Op::Brightness => blend(&mut img, f, |_| [0.0; 3]),
        Op::Color => blend(&mut img, f, |p| [luma(p); 3]),
        Op::Contrast => {
            let mean = img.pixels().map(|p| luma(p.0)).sum::<f32>() / (img.width() * img.height()).max(1) as f32;
            blend(&mut img, f, |_| [mean; 3]);
        }
        Op::Sharpness => return sharpness(&img, f),
        Op::Posterize => {
            let mask = ((0xFFu16 << (8 - (m as u32).min(8))) & 0xFF) as u8;
            img.pixels_mut().for_each(|p| p.0 = p.0.map(|v| v & mask));
        }
        Op::Solarize => img.pixels_mut().for_each(|p| p.0 = p.0.map(|v| if f64::from(v) >= m { 255 - v } else { v })),
        Op::AutoContrast => autocontrast(&mut img),
        Op::Equalize => equalize(&mut img),
    }
    img
}

/// The image resampled through `map` (output pixel centre → input coordinates), nearest
/// neighbour, black outside.
fn warp(img: &RgbImage, map: impl Fn(f64, f64) -> (f64, f64)) -> RgbImage {
    let (w, h) = img.dimensions();
    RgbImage::from_fn(w, h, |x, y| {
        let (sx, sy) = map(f64::from(x) + 0.5, f64::from(y) + 0.5);
        let (ix, iy) = ((sx - 0.5).round(), (sy - 0.5).round());
        if ix >= 0.0 && iy >= 0.0 && ix < f64::from(w) && iy < f64::from(h) {
            *img.get_pixel(ix as u32, iy as u32)
        } else {
            Rgb([0; 3])
        }
    })
}

/// Blend with the image smoothed by PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1, ÷13), the
/// border pixels kept (torchvision's `adjust_sharpness`).
fn sharpness(img: &RgbImage, f: f32) -> RgbImage {
    let (w, h) = img.dimensions();
    let mut out = img.clone();
    if w < 3 || h < 3 {
        return out;
    }
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            let smooth: [f32; 3] = std::array::from_fn(|c| {
                let around: u32 = (0..3)
                    .flat_map(|dy| (0..3).map(move |dx| (dx, dy)))
                    .map(|(dx, dy)| u32::from(img.get_pixel(x + dx - 1, y + dy - 1).0[c]))
                    .sum();
                let centre = u32::from(img.get_pixel(x, y).0[c]);
                ((around + 4 * centre) as f32 / 13.0).round()
            });
            let p = img.get_pixel(x, y).0;
            out.put_pixel(
                x,
                y,
                Rgb(std::array::from_fn(|c| {
                    (smooth[c] + f * (p[c] as f32 - smooth[c])).round().clamp(0.0, 255.0) as u8
                })),
            );
        }
    }
    out
}

/// Each channel stretched so that its darkest value becomes 0 and its brightest 255.
fn autocontrast(img: &mut RgbImage) {
    for c in 0..3 {
        let (lo, hi) = img.pixels().fold((255u8, 0u8), |(lo, hi), p| (lo.min(p.0[c]), hi.max(p.0[c])));
        if hi > lo {
            let scale = 255.0 / f32::from(hi - lo);
            img.pixels_mut().for_each(|p| p.0[c] = ((f32::from(p.0[c] - lo)) * scale).round().clamp(0.0, 255.0) as u8);
        }
    }
}

/// Each channel's histogram equalized (PIL's `ImageOps.equalize`).
fn equalize(img: &mut RgbImage) {
    for c in 0..3 {
        let mut hist = [0usize; 256];
        img.pixels().for_each(|p| hist[usize::from(p.0[c])] += 1);
        let last = hist.iter().rposition(|&n| n > 0).map_or(0, |i| hist[i]);
        let step = (hist.iter().sum::<usize>() - last) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut n = step / 2;
        for (v, count) in hist.iter().enumerate() {
            lut[v] = (n / step).min(255) as u8;
            n += count;
        }
        img.pixels_mut().for_each(|p| p.0[c] = lut[usize::from(p.0[c])]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn gradient() -> RgbImage {
        RgbImage::from_fn(16, 12, |x, y| Rgb([(x * 15) as u8, (y * 20) as u8, ((x + y) * 9) as u8]))
    }

    #[test]
    fn magnitudes_follow_torchvisions_table() {
        let near = |(got, signed): (f64, bool), want: f64| (got - want).abs() < 1e-12 && signed;
        assert!(near(strength(Op::Rotate, 30, (10, 10)), 30.0));
        assert!(near(strength(Op::ShearX, 15, (10, 10)), 0.15));
        assert!(near(strength(Op::Brightness, 9, (1, 1)), 0.27));
        assert!((strength(Op::TranslateX, 30, (331, 10)).0 - 150.0).abs() < 1e-9);
        assert_eq!(strength(Op::Posterize, 0, (1, 1)).0, 8.0);
        assert_eq!(strength(Op::Posterize, 30, (1, 1)).0, 4.0);
        assert_eq!(strength(Op::Solarize, 0, (1, 1)).0, 255.0);
    }

    #[test]
    fn geometric_ops_move_pixels_as_stated() {
        let img = gradient();
        let moved = apply(img.clone(), Op::TranslateX, 3.0);
        assert_eq!(moved.get_pixel(5, 4), img.get_pixel(2, 4), "content moves right by 3");
        assert_eq!(moved.get_pixel(1, 4), &Rgb([0; 3]), "black fills the gap");
        let turned = apply(img.clone(), Op::Rotate, 180.0);
        assert_eq!(turned.get_pixel(0, 0), img.get_pixel(15, 11), "a half turn about the centre");
        assert_eq!(apply(img.clone(), Op::ShearX, 0.0), img);
    }

    #[test]
    fn pixel_ops_match_their_definitions() {
        let img = gradient();
        let post = apply(img.clone(), Op::Posterize, 4.0);
        assert!(post.pixels().zip(img.pixels()).all(|(a, b)| a.0.iter().zip(b.0).all(|(&x, y)| x == y & 0xF0)));
        let sol = apply(img.clone(), Op::Solarize, 128.0);
        assert!(
            sol.pixels().zip(img.pixels()).all(|(a, b)| a
                .0
                .iter()
                .zip(b.0)
                .all(|(&x, y)| x == if y >= 128 { 255 - y } else { y }))
        );
        let dark = RgbImage::from_fn(4, 4, |x, _| Rgb([100 + x as u8 * 10; 3]));
        let stretched = apply(dark, Op::AutoContrast, 0.0);
        assert_eq!((stretched.get_pixel(0, 0).0[0], stretched.get_pixel(3, 0).0[0]), (0, 255));
        assert_eq!(apply(img.clone(), Op::Brightness, 0.0), img, "factor 1 is the identity");
        assert_eq!(apply(img.clone(), Op::Sharpness, 0.0), img, "factor 1 is the identity");
        let eq = apply(img.clone(), Op::Equalize, 0.0);
        let spread =
            |i: &RgbImage| i.pixels().map(|p| p.0[1]).max().unwrap() - i.pixels().map(|p| p.0[1]).min().unwrap();
        assert!(spread(&eq) >= spread(&img), "equalizing spreads the values");
    }

    #[test]
    fn reproducible_per_rng_and_keeps_size_and_mode() {
        let img = DynamicImage::ImageRgb8(gradient());
        let run = |seed| rand_augment(img.clone(), 2, 9, &mut ChaCha8Rng::seed_from_u64(seed));
        assert_eq!(run(1), run(1));
        assert!((0..20).any(|s| run(s) != run(1)), "different draws change the image");
        assert_eq!((run(3).width(), run(3).height()), (16, 12));
        let gray = DynamicImage::ImageLuma8(DynamicImage::ImageRgb8(gradient()).into_luma8());
        assert!(matches!(rand_augment(gray, 2, 9, &mut ChaCha8Rng::seed_from_u64(0)), DynamicImage::ImageLuma8(_)));
        assert_eq!(rand_augment(img.clone(), 0, 9, &mut ChaCha8Rng::seed_from_u64(0)), img, "no operations, no change");
    }
}
