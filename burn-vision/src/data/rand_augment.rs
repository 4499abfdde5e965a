//! RandAugment (Cubuk et al. 2020) with torchvision's `RandAugment(num_ops, magnitude,
//! num_magnitude_bins=31)` semantics: per image, `num_ops` operations drawn uniformly from 14
//! (identity, shear x/y, translate x/y, rotate, brightness, colour, contrast, sharpness,
//! posterize, solarize, autocontrast, equalize), each at the strength `magnitude` of 31 bins
//! (the signed ones negated half the time). Geometric operations sample the nearest pixel and
//! fill with black, as torchvision does. Every draw comes from the per-sample RNG; the draws are
//! made here and run as burn-ddp's pixel operations (`burn_ddp::nn::pixel_ops`), on the host or,
//! for a GPU-decoded batch, on the GPU with the same arithmetic.

use super::augment::{RAND_AUGMENT_BINS as BINS, back_to, is_gray, on_host};
use burn_ddp::nn::pixel_ops::{PixelOp, PixelOps};
use image::DynamicImage;
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

/// `ops` operations at magnitude `magnitude` (0..=30), drawn from `rng`, run on the host.
pub fn rand_augment(img: DynamicImage, ops: u32, magnitude: u32, rng: &mut ChaCha8Rng) -> DynamicImage {
    let gray = is_gray(&img);
    let rgb = img.into_rgb8();
    let ops = PixelOps { ops: draw(ops, magnitude, rgb.dimensions(), rng), erase: None };
    back_to(gray, on_host(rgb, &ops))
}

/// The operations RandAugment draws from `rng` for a `w`×`h` image: `ops` of them at magnitude
/// `magnitude`, identities left out.
pub fn draw(ops: u32, magnitude: u32, (w, h): (u32, u32), rng: &mut ChaCha8Rng) -> Vec<PixelOp> {
    (0..ops)
        .filter_map(|_| {
            let op = OPS[rng.random_range(0..OPS.len())];
            let (mut m, signed) = strength(op, magnitude, (w, h));
            if signed && rng.random_bool(0.5) {
                m = -m;
            }
            pixel_op(op, m, (w, h))
        })
        .collect()
}

/// `op` at strength `m` as the pixel operation that does it (`None` for the identity).
fn pixel_op(op: Op, m: f64, (w, h): (u32, u32)) -> Option<PixelOp> {
    let f = (1.0 + m) as f32;
    Some(match op {
        Op::Identity => return None,
        // Inverse maps: output pixel (x, y) reads input (a·x + b·y + c, d·x + e·y + f).
        Op::ShearX => PixelOp::Warp([1.0, m, 0.0, 0.0, 1.0, 0.0]),
        Op::ShearY => PixelOp::Warp([1.0, 0.0, 0.0, m, 1.0, 0.0]),
        Op::TranslateX => PixelOp::Warp([1.0, 0.0, -m.trunc(), 0.0, 1.0, 0.0]),
        Op::TranslateY => PixelOp::Warp([1.0, 0.0, 0.0, 0.0, 1.0, -m.trunc()]),
        Op::Rotate => {
            // About the image's centre, counter-clockwise for a positive angle.
            let (c, s) = (m.to_radians().cos(), m.to_radians().sin());
            let (cx, cy) = (f64::from(w) * 0.5, f64::from(h) * 0.5);
            PixelOp::Warp([c, s, cx - c * cx - s * cy, -s, c, cy + s * cx - c * cy])
        }
        Op::Brightness => PixelOp::Brightness(f),
        Op::Color => PixelOp::Saturation(f),
        Op::Contrast => PixelOp::Contrast(f),
        Op::Sharpness => PixelOp::Sharpness(f),
        Op::Posterize => PixelOp::Posterize(m.clamp(0.0, 8.0) as u8),
        Op::Solarize => PixelOp::Solarize(m),
        Op::AutoContrast => PixelOp::AutoContrast,
        Op::Equalize => PixelOp::Equalize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    use image::{Rgb, RgbImage};

    /// `op` at strength `m` run on the host.
    fn apply(img: RgbImage, op: Op, m: f64) -> RgbImage {
        let dims = img.dimensions();
        on_host(img, &PixelOps { ops: pixel_op(op, m, dims).into_iter().collect(), erase: None })
    }

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
