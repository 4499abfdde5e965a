//! A batch of encoded images to a training device, cropped, resized, mirrored and normalised
//! there: on burn-cuda, JPEGs are decoded by nvJPEG (the GPU's hardware JPEG decoder where it
//! has one) and one kernel makes the batch, so the host only reads files and draws crop
//! windows; on every other backend, images already decoded to RGB take the same arithmetic on
//! the host ([`crop_resize_on_host`]).
//!
//! The resize is an antialiased bilinear (triangle) filter over the region, widened by the
//! shrink factor, as Pillow's, torchvision's antialiased and `fast_image_resize`'s bilinear
//! resizes are; values are `(v / 255 − mean) / std`, channel-first (NCHW), f32.

use crate::error::{Error, Result};
use crate::nn::crop::{CropResize, Normalize, Pixels};
use burn::prelude::*;

/// What decodes JPEGs on `device`: `Ok` with a sentence naming nvJPEG's backend (the hardware
/// decoder, or CUDA kernels with host Huffman decoding) and whether it is the hardware one;
/// `Err` with the reason when JPEGs cannot be decoded there (not burn-cuda, no libnvjpeg, no
/// NVRTC). The first call sets the device's decoder up.
///
/// # Errors
/// The reason no device decoder runs, as a sentence.
pub fn device_decoder<B: Backend>(device: &B::Device) -> std::result::Result<(String, bool), String> {
    #[cfg(feature = "cuda")]
    {
        crate::nn::cuda::runtime::decode::backend::<B>(device)
            .map(|b| (b.to_string(), b == crate::nn::cuda::nvjpeg::Backend::Hardware))
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Err("this build has no CUDA (the `cuda` feature is off)".into())
    }
}

/// `(images nvJPEG decoded, images it could not decode)` in this process so far; the second
/// ones entered their batches as zeros.
pub fn device_decode_counts() -> (u64, u64) {
    #[cfg(feature = "cuda")]
    {
        crate::nn::cuda::runtime::decode::counts()
    }
    #[cfg(not(feature = "cuda"))]
    {
        (0, 0)
    }
}

/// `images`, each cut to its region and resized to `out_hw` (`[height, width]`), as a
/// normalised `[n, 3, h, w]` tensor on `device`: made on the device for burn-cuda, on the host
/// (decoded images only) elsewhere.
///
/// # Errors
/// A region outside its image, RGB bytes that do not fill the image, a JPEG on a backend that
/// cannot decode one, or the device's decoder failing to start.
pub fn crops_to_device<B: Backend>(
    images: Vec<CropResize>,
    out_hw: [usize; 2],
    norm: Normalize,
    device: &B::Device,
) -> Result<Tensor<B, 4>> {
    for (i, c) in images.iter().enumerate() {
        check(i, c)?;
    }
    #[cfg(feature = "cuda")]
    if crate::nn::cuda::runtime::launch::cuda_backend::<B>().is_some() {
        return crate::nn::cuda::runtime::decode::to_device(images, out_hw, norm, device);
    }
    let per_image = 3 * out_hw[0] * out_hw[1];
    let mut values = vec![0.0f32; per_image * images.len()];
    for (c, out) in images.iter().zip(values.chunks_exact_mut(per_image)) {
        let Pixels::Rgb(rgb) = &c.pixels else {
            return Err(bad("JPEG bytes reach only a CUDA device's decoder; decode them on the host first".into()));
        };
        crop_resize_on_host(rgb, c, out_hw, &norm, out);
    }
    Ok(super::upload::images_to_device(values, [images.len(), 3, out_hw[0], out_hw[1]], device))
}

fn bad(reason: String) -> Error {
    Error::Kernel { op: "decoding a batch", reason }
}

fn check(i: usize, c: &CropResize) -> Result<()> {
    let [w, h] = c.size;
    let [x, y, rw, rh] = c.region;
    let slack = 1e-3;
    if w == 0 || h == 0 || !(rw > 0.0 && rh > 0.0 && x >= -slack && y >= -slack) {
        return Err(bad(format!("image {i}: region {:?} of a {w}×{h} image is empty or negative", c.region)));
    }
    if x + rw > w as f32 + slack || y + rh > h as f32 + slack {
        return Err(bad(format!("image {i}: region {:?} runs outside the {w}×{h} image", c.region)));
    }
    if let Pixels::Rgb(rgb) = &c.pixels
        && rgb.len() != w as usize * h as usize * 3
    {
        return Err(bad(format!("image {i}: {} RGB bytes for a {w}×{h} image ({} expected)", rgb.len(), w * h * 3)));
    }
    Ok(())
}

/// One image made on the host with the device kernel's arithmetic: `rgb` (rows of
/// `size[0] · 3` bytes) cut to `c.region`, resized to `out_hw`, mirrored when `c.flip`, and
/// normalised into `out` (CHW, `3 · h · w` values).
pub fn crop_resize_on_host(rgb: &[u8], c: &CropResize, out_hw: [usize; 2], norm: &Normalize, out: &mut [f32]) {
    let [w, h] = [c.size[0] as i64, c.size[1] as i64];
    let [x0, y0, bw, bh] = c.region.map(f64::from);
    let (ow, oh) = (out_hw[1], out_hw[0]);
    let (sx, sy) = (bw / ow as f64, bh / oh as f64);
    let (fx, fy) = (sx.max(1.0), sy.max(1.0));
    // The taps of one output coordinate: (first source index, weights), weights normalised.
    let taps = |center: f64, support: f64, len: i64| -> (i64, Vec<f64>) {
        let (a, b) = (((center - support).floor() as i64).max(0), ((center + support).ceil() as i64).min(len - 1));
        let w: Vec<f64> = (a..=b).map(|i| (1.0 - ((i as f64 + 0.5 - center) / support).abs()).max(0.0)).collect();
        let sum: f64 = w.iter().sum();
        (a, w.into_iter().map(|v| v / sum).collect())
    };
    let plane = ow * oh;
    for oy in 0..oh {
        let (ya, wy) = taps(y0 + (oy as f64 + 0.5) * sy, fy, h);
        for ox in 0..ow {
            let sox = if c.flip { ow - 1 - ox } else { ox };
            let (xa, wx) = taps(x0 + (sox as f64 + 0.5) * sx, fx, w);
            let mut acc = [0.0f64; 3];
            for (j, wy) in wy.iter().enumerate() {
                let row = (ya as usize + j) * w as usize * 3;
                for (i, wx) in wx.iter().enumerate() {
                    let px = row + (xa as usize + i) * 3;
                    for (ch, a) in acc.iter_mut().enumerate() {
                        *a += wy * wx * f64::from(rgb[px + ch]);
                    }
                }
            }
            for (ch, a) in acc.iter().enumerate() {
                out[ch * plane + oy * ow + ox] =
                    ((a / 255.0 - f64::from(norm.mean[ch])) / f64::from(norm.std[ch])) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    const UNIT: Normalize = Normalize { mean: [0.0; 3], std: [1.0; 3] };

    fn gradient(w: u32, h: u32) -> Vec<u8> {
        (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [(x * 9 % 256) as u8, (y * 5 % 256) as u8, ((x + y) % 256) as u8]))
            .collect()
    }

    #[test]
    fn the_whole_image_at_its_own_size_is_the_image_itself() {
        let rgb = gradient(6, 4);
        let c =
            CropResize { pixels: Pixels::Rgb(rgb.clone()), size: [6, 4], region: [0.0, 0.0, 6.0, 4.0], flip: false };
        let t = crops_to_device::<Flex>(vec![c], [4, 6], UNIT, &Default::default()).unwrap();
        let v = t.into_data().into_vec::<f32>().unwrap();
        for y in 0..4 {
            for x in 0..6 {
                for ch in 0..3 {
                    let want = rgb[(y * 6 + x) * 3 + ch] as f32 / 255.0;
                    assert!((v[ch * 24 + y * 6 + x] - want).abs() < 1e-6, "({x}, {y}, {ch})");
                }
            }
        }
    }

    #[test]
    fn a_flip_mirrors_and_a_halving_averages_pairs() {
        let rgb = gradient(8, 2);
        let region = [0.0, 0.0, 8.0, 2.0];
        let plain = CropResize { pixels: Pixels::Rgb(rgb.clone()), size: [8, 2], region, flip: false };
        let (mut a, mut b) = (vec![0.0; 3 * 8], vec![0.0; 3 * 8]);
        crop_resize_on_host(&rgb, &plain, [1, 8], &UNIT, &mut a);
        crop_resize_on_host(&rgb, &CropResize { flip: true, ..plain.clone() }, [1, 8], &UNIT, &mut b);
        for x in 0..8 {
            assert!((a[x] - b[7 - x]).abs() < 1e-6);
        }
        // 8 → 4 columns: the triangle filter of width 2 weighs the two covered pixels 3/8 each
        // and their neighbours 1/8 (clamped at the edges).
        let mut half = vec![0.0; 3 * 4];
        crop_resize_on_host(&rgb, &plain, [1, 4], &UNIT, &mut half);
        let r = |x: usize| f64::from(rgb[x * 3]);
        let want = (r(1) + 3.0 * r(2) + 3.0 * r(3) + r(4)) / 8.0 / 255.0;
        let rows = |y: usize| f64::from(rgb[(y * 8 + 2) * 3]);
        assert_eq!(rows(0), rows(1), "the red channel is the same on both rows");
        assert!((f64::from(half[1]) - want).abs() < 1e-6, "{} vs {want}", half[1]);
    }

    #[test]
    fn bad_regions_and_short_pixels_are_one_line_errors() {
        let c =
            CropResize { pixels: Pixels::Rgb(vec![0; 12]), size: [2, 2], region: [1.0, 0.0, 2.0, 2.0], flip: false };
        let e = crops_to_device::<Flex>(vec![c.clone()], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("runs outside"), "{e}");
        let short = CropResize { pixels: Pixels::Rgb(vec![0; 11]), region: [0.0, 0.0, 2.0, 2.0], ..c.clone() };
        let e = crops_to_device::<Flex>(vec![short], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("11 RGB bytes"), "{e}");
        let jpeg = CropResize { pixels: Pixels::Jpeg(vec![0xFF, 0xD8]), region: [0.0, 0.0, 2.0, 2.0], ..c };
        let e = crops_to_device::<Flex>(vec![jpeg], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("CUDA device"), "{e}");
    }
}
