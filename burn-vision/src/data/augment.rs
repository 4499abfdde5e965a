//! The training augmentation a user controls from the command line (timm's train-script flags):
//! horizontal-flip probability, RandomResizedCrop's scale and ratio, colour jitter and random
//! erasing, RandAugment (its operations in a file of their own) — and the draws of colour jitter
//! and random erasing, run as burn-ddp's pixel operations (on the host here, on the GPU for a
//! GPU-decoded batch). Every random choice comes from the per-sample RNG (a pure function of
//! seed, epoch and sample).

use crate::error::{Error, Result};
use burn_ddp::nn::pixel_ops::{Erase, PixelOp, PixelOps, apply_on_host};
use image::{DynamicImage, GenericImageView, RgbImage};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// RandAugment's magnitude bins (torchvision's default): magnitudes run 0..=30.
pub const RAND_AUGMENT_BINS: u32 = 31;

/// What training does to each image. The default is torchvision's ImageNet recipe
/// (RandomResizedCrop with scale 0.08–1 and ratio 3/4–4/3, a flip half the time, nothing else)
/// and, for 28² IDX data, the flip alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct Augment {
    /// Probability of a horizontal flip in training (default 0.5; 0 for digits, text, X-rays).
    #[arg(long, value_name = "P", required = false)]
    pub hflip: f64,
    /// RandomResizedCrop's range of the crop's area as fractions of the image, MIN,MAX
    /// (default 0.08,1; folder data).
    #[arg(long = "rrc-scale", value_name = "MIN,MAX", value_parser = |s: &str| parse_pair("--rrc-scale", s), required = false)]
    pub scale: [f64; 2],
    /// RandomResizedCrop's range of the crop's aspect ratio, MIN,MAX (default 0.75,1.333;
    /// folder data).
    #[arg(long = "rrc-ratio", value_name = "MIN,MAX", value_parser = |s: &str| parse_pair("--rrc-ratio", s), required = false)]
    pub ratio: [f64; 2],
    /// Colour jitter strength S: brightness, contrast and saturation factors drawn from
    /// [1 − S, 1 + S] (torchvision's `ColorJitter(S, S, S)`), in a random order; default 0 =
    /// off, e.g. 0.4.
    #[arg(long, value_name = "S", required = false)]
    pub color_jitter: f64,
    /// Probability of erasing one random rectangle (2–33 % of the area, aspect 0.3–3.3) with
    /// random pixels (timm's `--reprob` in its per-pixel mode); default 0 = off, e.g. 0.25.
    #[arg(long, value_name = "P", required = false)]
    pub random_erasing: f64,
    /// RandAugment's number of operations per image (torchvision's `num_ops`); 0 is off. Set
    /// with `--randaugment N,M`.
    #[arg(skip)]
    pub rand_augment_ops: u32,
    /// RandAugment's magnitude, 0–30 of 31 bins (torchvision's default 9).
    #[arg(skip = 9u32)]
    pub rand_augment_magnitude: u32,
}

impl Default for Augment {
    fn default() -> Self {
        Self {
            hflip: 0.5,
            scale: [0.08, 1.0],
            ratio: [3.0 / 4.0, 4.0 / 3.0],
            color_jitter: 0.0,
            random_erasing: 0.0,
            rand_augment_ops: 0,
            rand_augment_magnitude: 9,
        }
    }
}

impl Augment {
    /// Checks the ranges, naming the flag.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a probability outside [0, 1], an empty or non-positive
    /// range, or a negative jitter.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, reason: &str| Err(Error::InvalidConfig { name, value, reason: reason.into() });
        for (name, p) in [("--hflip", self.hflip), ("--random-erasing", self.random_erasing)] {
            if !(0.0..=1.0).contains(&p) {
                return bad(name, p.to_string(), "a probability: give a number in [0, 1]");
            }
        }
        let [lo, hi] = self.scale;
        if !(lo > 0.0 && lo <= hi && hi <= 1.0) {
            return bad("--rrc-scale", format!("{lo},{hi}"), "give MIN,MAX with 0 < MIN ≤ MAX ≤ 1, e.g. 0.08,1");
        }
        let [lo, hi] = self.ratio;
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return bad("--rrc-ratio", format!("{lo},{hi}"), "give MIN,MAX with 0 < MIN ≤ MAX, e.g. 0.75,1.333");
        }
        if self.rand_augment_magnitude >= RAND_AUGMENT_BINS || self.rand_augment_ops > 16 {
            let value = format!("{},{}", self.rand_augment_ops, self.rand_augment_magnitude);
            return bad("--randaugment", value, "give N,M: N operations (0–16, e.g. 2) at magnitude M (0–30, e.g. 9)");
        }
        if !(0.0..=1.0).contains(&self.color_jitter) {
            return bad("--color-jitter", self.color_jitter.to_string(), "give a strength in [0, 1], e.g. 0.4");
        }
        Ok(())
    }

    /// One line for the run's log.
    pub fn describe(&self) -> String {
        format!(
            "flip {}, crop scale {}–{} ratio {:.3}–{:.3}, RandAugment {}, colour jitter {}, random erasing {}",
            self.hflip,
            self.scale[0],
            self.scale[1],
            self.ratio[0],
            self.ratio[1],
            if self.rand_augment_ops == 0 {
                "off".to_string()
            } else {
                format!("{} ops at magnitude {}", self.rand_augment_ops, self.rand_augment_magnitude)
            },
            self.color_jitter,
            self.random_erasing
        )
    }
}

/// Parses `A,B` (a flag's range).
///
/// # Errors
/// [`Error::InvalidConfig`] naming `flag`.
pub fn parse_pair(flag: &'static str, text: &str) -> Result<[f64; 2]> {
    let bad = || Error::InvalidConfig { name: flag, value: text.into(), reason: "give two numbers: MIN,MAX".into() };
    let (a, b) = text.split_once(',').ok_or_else(bad)?;
    Ok([a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?])
}

/// Brightness, contrast and saturation each scaled by a factor in [1 − s, 1 + s], in a random
/// order (torchvision's ColorJitter without hue), run on the host. Grayscale images get
/// brightness and contrast.
pub fn color_jitter(img: DynamicImage, strength: f64, rng: &mut ChaCha8Rng) -> DynamicImage {
    let gray = is_gray(&img);
    let ops = PixelOps { ops: jitter_ops(strength, gray, rng), erase: None };
    back_to(gray, on_host(img.into_rgb8(), &ops))
}

/// The operations colour jitter of `strength` draws from `rng`, in their drawn order (no
/// saturation for a `gray` image).
pub fn jitter_ops(strength: f64, gray: bool, rng: &mut ChaCha8Rng) -> Vec<PixelOp> {
    let mut order = [0usize, 1, 2];
    for i in (1..3).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let factors: [f32; 3] =
        std::array::from_fn(|_| rng.random_range((1.0 - strength).max(0.0)..=1.0 + strength) as f32);
    order
        .into_iter()
        .filter_map(|op| match op {
            0 => Some(PixelOp::Brightness(factors[0])),
            1 => Some(PixelOp::Contrast(factors[1])),
            _ if !gray => Some(PixelOp::Saturation(factors[2])),
            _ => None,
        })
        .collect()
}

/// `ops` run on `rgb` by burn-ddp's host arithmetic (the GPU's, byte for byte).
pub(super) fn on_host(rgb: RgbImage, ops: &PixelOps) -> RgbImage {
    let (w, h) = rgb.dimensions();
    let mut raw = rgb.into_raw();
    apply_on_host(&mut raw, (w, h), ops);
    RgbImage::from_raw(w, h, raw).expect("the operations keep the image's size")
}

/// Whether `img` is a grey image (the operations run on its RGB form, and it goes back grey).
pub(super) fn is_gray(img: &DynamicImage) -> bool {
    matches!(
        img,
        DynamicImage::ImageLuma8(_)
            | DynamicImage::ImageLuma16(_)
            | DynamicImage::ImageLumaA8(_)
            | DynamicImage::ImageLumaA16(_)
    )
}

/// `rgb` as the image kind it came from: grey again when `gray`.
pub(super) fn back_to(gray: bool, rgb: RgbImage) -> DynamicImage {
    if gray {
        DynamicImage::ImageLuma8(DynamicImage::ImageRgb8(rgb).into_luma8())
    } else {
        DynamicImage::ImageRgb8(rgb)
    }
}

/// With probability `p`, one rectangle of random pixels (timm's RandomErasing: 10 tries at an
/// area of 2–33 % and a log-uniform aspect of 0.3–3.3), run on the host.
pub fn random_erasing(img: DynamicImage, p: f64, rng: &mut ChaCha8Rng) -> DynamicImage {
    let gray = is_gray(&img);
    match erase_draw(p, img.dimensions(), gray, rng) {
        Some(erase) => back_to(gray, on_host(img.into_rgb8(), &PixelOps { ops: Vec::new(), erase: Some(erase) })),
        None => img,
    }
}

/// The rectangle random erasing with probability `p` draws from `rng` for a `w`×`h` image, and
/// the seed of its noise (one value per pixel when `gray`); `None` when it erases nothing.
pub fn erase_draw(p: f64, (w, h): (u32, u32), gray: bool, rng: &mut ChaCha8Rng) -> Option<Erase> {
    if !rng.random_bool(p) {
        return None;
    }
    for _ in 0..10 {
        let area = (w * h) as f64 * rng.random_range(0.02..=1.0 / 3.0);
        let aspect = rng.random_range(0.3f64.ln()..=(1.0f64 / 0.3).ln()).exp();
        let (ew, eh) = ((area * aspect).sqrt().round() as u32, (area / aspect).sqrt().round() as u32);
        if ew == 0 || eh == 0 || ew >= w || eh >= h {
            continue;
        }
        let (x0, y0) = (rng.random_range(0..=w - ew), rng.random_range(0..=h - eh));
        return Some(Erase { rect: [x0, y0, ew, eh], seed: rng.random(), gray });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;
    use rand::SeedableRng;

    fn photo() -> DynamicImage {
        DynamicImage::ImageRgb8(RgbImage::from_fn(40, 30, |x, y| Rgb([(x * 6) as u8, (y * 8) as u8, 120])))
    }

    #[test]
    fn defaults_are_torchvisions_recipe_and_bad_ranges_name_the_flag() {
        let d = Augment::default();
        assert_eq!((d.hflip, d.scale, d.color_jitter, d.random_erasing), (0.5, [0.08, 1.0], 0.0, 0.0));
        assert!(d.validate().is_ok());
        for (a, flag) in [
            (Augment { hflip: 1.5, ..d }, "--hflip"),
            (Augment { scale: [0.5, 0.1], ..d }, "--rrc-scale"),
            (Augment { ratio: [0.0, 1.0], ..d }, "--rrc-ratio"),
            (Augment { color_jitter: -0.1, ..d }, "--color-jitter"),
            (Augment { random_erasing: 2.0, ..d }, "--random-erasing"),
        ] {
            assert!(a.validate().unwrap_err().to_string().contains(flag), "{flag}");
        }
        assert_eq!(parse_pair("--rrc-scale", "0.35, 1").unwrap(), [0.35, 1.0]);
        assert!(parse_pair("--rrc-scale", "0.35").is_err());
    }

    #[test]
    fn color_jitter_with_one_factor_is_identity_and_scales_brightness_as_torchvision() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(color_jitter(photo(), 0.0, &mut rng), photo(), "strength 0 changes nothing");
        // Brightness alone, by hand: factor f scales every value (torchvision blends with black).
        let img = on_host(photo().into_rgb8(), &PixelOps { ops: vec![PixelOp::Brightness(0.5)], erase: None });
        assert_eq!(img.get_pixel(10, 10).0, [30, 40, 60]);
        // Each of the three, once, in the drawn order; no saturation for grey images.
        let ops = jitter_ops(0.4, false, &mut ChaCha8Rng::seed_from_u64(5));
        assert_eq!(ops.len(), 3);
        assert!(ops.iter().any(|o| matches!(o, PixelOp::Saturation(f) if (0.6..=1.4).contains(f))));
        assert_eq!(jitter_ops(0.4, true, &mut ChaCha8Rng::seed_from_u64(5)).len(), 2);
        // A real jitter changes the image and keeps its size and kind.
        let out = color_jitter(photo(), 0.4, &mut rng);
        assert_ne!(out, photo());
        assert_eq!((out.width(), out.height(), out.color()), (40, 30, image::ColorType::Rgb8));
    }

    #[test]
    fn erasing_replaces_one_rectangle_and_is_reproducible() {
        let erase = |seed| random_erasing(photo(), 1.0, &mut ChaCha8Rng::seed_from_u64(seed));
        let (a, b) = (erase(3), erase(3));
        assert_eq!(a, b, "a pure function of the sample's RNG");
        let changed = a.to_rgb8().pixels().zip(photo().to_rgb8().pixels()).filter(|(x, y)| x != y).count();
        let area = 40 * 30;
        assert!(changed > area / 100 && changed <= area / 3 + 40, "{changed} of {area} pixels changed");
        assert_eq!(random_erasing(photo(), 0.0, &mut ChaCha8Rng::seed_from_u64(3)), photo(), "p = 0 never erases");
    }
}
