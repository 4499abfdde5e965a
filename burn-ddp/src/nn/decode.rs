//! A batch of encoded images to a training device, cropped, resized, mirrored, augmented and
//! normalised there: on burn-cuda, JPEGs are decoded by nvJPEG (the GPU's hardware JPEG decoder
//! where it has one) and one kernel makes the batch — two when images carry pixel operations
//! (`nn::pixel_ops`: the crop to bytes, then the operations) — so the host only reads files and
//! draws crop windows and operations; on every other backend, images already decoded to RGB
//! take the same arithmetic on the host ([`crop_resize_on_host`]).
//!
//! The resize is an antialiased bilinear (triangle) filter over the region, widened by the
//! shrink factor, as Pillow's, torchvision's antialiased and `fast_image_resize`'s bilinear
//! resizes are; values are `(v / 255 − mean) / std`, channel-first (NCHW), f32.

use crate::error::{Error, Result};
use crate::nn::crop::{CropResize, Normalize, Pixels};
use burn::prelude::*;

/// What makes batches of crops on a device, ahead of the step that reads them: a GPU's nvJPEG
/// decoder ([`DeviceDecoder::for_device`]), or nothing ahead ([`DeviceDecoder::deferred`]).
/// A cheap handle: clones share the device's decoder, and a data loader's thread may hold one.
#[derive(Clone)]
pub struct DeviceDecoder {
    kind: DecoderKind,
}

#[derive(Clone, Copy)]
enum DecoderKind {
    #[cfg(feature = "cuda")]
    Gpu {
        index: usize,
        backend: crate::nn::cuda::nvjpeg::Backend,
    },
    Deferred,
}

impl std::fmt::Debug for DeviceDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            #[cfg(feature = "cuda")]
            DecoderKind::Gpu { index, .. } => write!(f, "DeviceDecoder({} on GPU {index})", self.name()),
            DecoderKind::Deferred => f.write_str("DeviceDecoder(deferred)"),
        }
    }
}

impl DeviceDecoder {
    /// `device`'s JPEG decoder, set up now (nvJPEG with the GPU's hardware decoder where it has
    /// one, its CUDA kernels elsewhere).
    ///
    /// # Errors
    /// Why JPEGs cannot be decoded there (not burn-cuda, no libnvjpeg, no NVRTC), as a sentence.
    pub fn for_device<B: Backend>(device: &B::Device) -> std::result::Result<Self, String> {
        #[cfg(feature = "cuda")]
        {
            crate::nn::cuda::runtime::decode::backend::<B>(device)
                .map(|(index, backend)| Self { kind: DecoderKind::Gpu { index, backend } })
                .map_err(|e| e.to_string())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = device;
            Err("this build has no CUDA (the `cuda` feature is off)".into())
        }
    }

    /// One that starts nothing ahead: a batch is made by [`crops_to_device`] when it is made
    /// into a tensor (decoded RGB images on any backend; JPEGs on burn-cuda).
    pub fn deferred() -> Self {
        Self { kind: DecoderKind::Deferred }
    }

    /// Whether models on backend `B` can have a device decoder at all (burn-cuda, in a build
    /// with the `cuda` feature); a cheap test, before [`DeviceDecoder::for_device`] sets one up.
    pub fn backend_has_one<B: Backend>() -> bool {
        #[cfg(feature = "cuda")]
        {
            crate::nn::cuda::runtime::launch::cuda_backend::<B>().is_some()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// What decodes, as a sentence.
    pub fn name(&self) -> String {
        match self.kind {
            #[cfg(feature = "cuda")]
            DecoderKind::Gpu { backend, .. } => backend.to_string(),
            DecoderKind::Deferred => "decoding when the batch is made into a tensor".into(),
        }
    }

    /// Whether a GPU's hardware JPEG decoder runs (A100, H100, H200 and later data-centre GPUs).
    pub fn is_hardware(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let DecoderKind::Gpu { backend, .. } = self.kind {
            return backend == crate::nn::cuda::nvjpeg::Backend::Hardware;
        }
        false
    }

    /// Starts making `images` into a batch of `out_hw` (`[height, width]`), normalised by
    /// `norm`. On a GPU their decode is submitted now, from this thread, on the decoder's own
    /// stream, so it runs while the steps already queued compute; [`Decoding::to_device`] later
    /// adds the crop-and-resize kernel behind it (and the pixel operations' kernel where images
    /// carry some). The decoder holds two batches: this waits
    /// until the batch started two calls back was made into a tensor or dropped — call it from
    /// a thread that hands batches over in order (a data loader's), not from one that must make
    /// the earlier batch into a tensor first.
    ///
    /// # Errors
    /// A region outside its image, RGB bytes that do not fill the image, more than
    /// [`crate::nn::pixel_ops::MAX_OPS`] operations or an erasing rectangle outside the output,
    /// or the GPU's decoder failing.
    pub fn start(&self, images: Vec<CropResize>, out_hw: [usize; 2], norm: Normalize) -> Result<Decoding> {
        for (i, c) in images.iter().enumerate() {
            check(i, c, out_hw)?;
        }
        match self.kind {
            #[cfg(feature = "cuda")]
            DecoderKind::Gpu { index, .. } => {
                let started = crate::nn::cuda::runtime::decode::start(index, images, out_hw, norm)?;
                Ok(Decoding { kind: DecodingKind::Started(started) })
            }
            DecoderKind::Deferred => Ok(Decoding { kind: DecodingKind::Deferred { images, out_hw, norm } }),
        }
    }
}

/// A batch of crops started by [`DeviceDecoder::start`]. Dropping it unread frees its place in
/// the decoder.
pub struct Decoding {
    kind: DecodingKind,
}

enum DecodingKind {
    #[cfg(feature = "cuda")]
    Started(crate::nn::cuda::runtime::decode::Started),
    Deferred {
        images: Vec<CropResize>,
        out_hw: [usize; 2],
        norm: Normalize,
    },
}

impl std::fmt::Debug for Decoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            #[cfg(feature = "cuda")]
            DecodingKind::Started(s) => write!(f, "Decoding(started, {} images)", s.len()),
            DecodingKind::Deferred { images, .. } => write!(f, "Decoding(deferred, {} images)", images.len()),
        }
    }
}

impl Decoding {
    /// Images in the batch.
    pub fn len(&self) -> usize {
        match &self.kind {
            #[cfg(feature = "cuda")]
            DecodingKind::Started(s) => s.len(),
            DecodingKind::Deferred { images, .. } => images.len(),
        }
    }

    /// Whether the batch has no image.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The images with their crops, the batch's `[height, width]` and its normalisation, when
    /// nothing was started ahead ([`DeviceDecoder::deferred`]).
    pub fn deferred(&self) -> Option<(&[CropResize], [usize; 2], Normalize)> {
        match &self.kind {
            DecodingKind::Deferred { images, out_hw, norm } => Some((images, *out_hw, *norm)),
            #[cfg(feature = "cuda")]
            DecodingKind::Started(_) => None,
        }
    }

    /// The batch as a normalised `[n, 3, h, w]` f32 tensor on `device`: on a GPU, one kernel
    /// enqueued behind the decode (neither this thread nor the GPU's stream waits for it on the
    /// host).
    ///
    /// # Errors
    /// A batch started on a GPU made into a tensor on another device or backend; a JPEG of a
    /// deferred batch on a backend that cannot decode one.
    pub fn to_device<B: Backend>(self, device: &B::Device) -> Result<Tensor<B, 4>> {
        match self.kind {
            #[cfg(feature = "cuda")]
            DecodingKind::Started(started) => crate::nn::cuda::runtime::decode::to_device(started, device),
            DecodingKind::Deferred { images, out_hw, norm } => crops_to_device(images, out_hw, norm, device),
        }
    }
}

/// `(images nvJPEG decoded, images it could not decode)` in this process so far; the second
/// ones entered their batches black.
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

/// Where the data loader's threads spent their time handing batches to the GPU's decoder, in
/// this process so far ([`device_decode_times`]): what tells a decode bound by the GPU's JPEG
/// engines from one bound by the host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceDecodeTimes {
    /// Batches submitted.
    pub batches: u64,
    /// Seconds waiting for a free decode slot: the training step had not yet taken the batch
    /// the slot held (the consumer sets the pace).
    pub slot_wait_s: f64,
    /// Seconds waiting for the slot's previous decode and its reads to end (the GPU's JPEG
    /// engines and the crop kernel set the pace).
    pub reuse_wait_s: f64,
    /// Seconds in nvJPEG's calls, reading the JPEG headers' markers for the planes' layout and
    /// copying images decoded on the host (the submitting thread's own work).
    pub submit_s: f64,
}

impl DeviceDecodeTimes {
    /// What was added since `before` (an earlier reading).
    pub fn since(&self, before: &Self) -> Self {
        Self {
            batches: self.batches - before.batches,
            slot_wait_s: self.slot_wait_s - before.slot_wait_s,
            reuse_wait_s: self.reuse_wait_s - before.reuse_wait_s,
            submit_s: self.submit_s - before.submit_s,
        }
    }

    /// Milliseconds per batch: `[slot wait, reuse wait, submit]` (zeros without batches).
    pub fn ms_per_batch(&self) -> [f64; 3] {
        let per = |s: f64| if self.batches == 0 { 0.0 } else { 1e3 * s / self.batches as f64 };
        [per(self.slot_wait_s), per(self.reuse_wait_s), per(self.submit_s)]
    }
}

/// [`DeviceDecodeTimes`] so far in this process (zeros where nothing was decoded on a GPU).
pub fn device_decode_times() -> DeviceDecodeTimes {
    #[cfg(feature = "cuda")]
    {
        let [batches, slot, reuse, submit] = crate::nn::cuda::nvjpeg::submit_times();
        DeviceDecodeTimes {
            batches,
            slot_wait_s: slot as f64 * 1e-9,
            reuse_wait_s: reuse as f64 * 1e-9,
            submit_s: submit as f64 * 1e-9,
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        DeviceDecodeTimes::default()
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
        check(i, c, out_hw)?;
    }
    #[cfg(feature = "cuda")]
    if crate::nn::cuda::runtime::launch::cuda_backend::<B>().is_some() {
        // Started and read on this thread: the decode cannot run ahead of the step, as it does
        // when a loader's thread starts it (`DeviceDecoder::start`).
        let decoder = DeviceDecoder::for_device::<B>(device).map_err(bad)?;
        return decoder.start(images, out_hw, norm)?.to_device(device);
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

fn check(i: usize, c: &CropResize, [out_h, out_w]: [usize; 2]) -> Result<()> {
    if c.ops.ops.len() > crate::nn::pixel_ops::MAX_OPS {
        return Err(bad(format!(
            "image {i}: {} pixel operations, at most {} run on a device",
            c.ops.ops.len(),
            crate::nn::pixel_ops::MAX_OPS
        )));
    }
    if let Some(e) = c.ops.erase
        && (e.rect[0] as usize + e.rect[2] as usize > out_w || e.rect[1] as usize + e.rect[3] as usize > out_h)
    {
        return Err(bad(format!("image {i}: erasing rectangle {:?} runs outside the {out_w}×{out_h} crop", e.rect)));
    }
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

/// One image made on the host with the device kernels' arithmetic: `rgb` (rows of
/// `size[0] · 3` bytes) cut to `c.region`, resized to `out_hw`, mirrored when `c.flip`, put
/// through `c.ops` (then as 8-bit values, rounded half away from zero, as the device does), and
/// normalised into `out` (CHW, `3 · h · w` values).
pub fn crop_resize_on_host(rgb: &[u8], c: &CropResize, out_hw: [usize; 2], norm: &Normalize, out: &mut [f32]) {
    let mut levels = resampled(rgb, c, out_hw);
    if !c.ops.is_empty() {
        let mut bytes: Vec<u8> = levels.iter().map(|&v| v.round().clamp(0.0, 255.0) as u8).collect();
        crate::nn::pixel_ops::apply_on_host(&mut bytes, (out_hw[1] as u32, out_hw[0] as u32), &c.ops);
        levels = bytes.into_iter().map(f64::from).collect();
    }
    let plane = out_hw[0] * out_hw[1];
    for (p, px) in levels.chunks_exact(3).enumerate() {
        for ch in 0..3 {
            out[ch * plane + p] = ((px[ch] / 255.0 - f64::from(norm.mean[ch])) / f64::from(norm.std[ch])) as f32;
        }
    }
}

/// The region of `c` resampled to `out_hw` with the antialiased triangle filter: HWC values
/// in 0–255 (for bytes), unrounded.
fn resampled<T: Copy + Into<f64>>(rgb: &[T], c: &CropResize, out_hw: [usize; 2]) -> Vec<f64> {
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
    let mut levels = vec![0.0f64; 3 * ow * oh];
    for oy in 0..oh {
        let (ya, wy) = taps(y0 + (oy as f64 + 0.5) * sy, fy, h);
        for ox in 0..ow {
            let sox = if c.flip { ow - 1 - ox } else { ox };
            let (xa, wx) = taps(x0 + (sox as f64 + 0.5) * sx, fx, w);
            let acc = &mut levels[3 * (oy * ow + ox)..][..3];
            for (j, wy) in wy.iter().enumerate() {
                let row = (ya as usize + j) * w as usize * 3;
                for (i, wx) in wx.iter().enumerate() {
                    let px = row + (xa as usize + i) * 3;
                    for (ch, a) in acc.iter_mut().enumerate() {
                        *a += wy * wx * rgb[px + ch].into();
                    }
                }
            }
        }
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::pixel_ops::{Erase, PixelOp, PixelOps};
    use burn_flex::Flex;

    const UNIT: Normalize = Normalize { mean: [0.0; 3], std: [1.0; 3] };

    /// Two readings of the decode's times give what the batches between them cost each; a
    /// span without batches gives zeros, not a division by zero.
    #[test]
    fn decode_times_between_two_readings_are_per_batch() {
        let before = DeviceDecodeTimes { batches: 2, slot_wait_s: 0.5, reuse_wait_s: 0.25, submit_s: 1.0 };
        let after = DeviceDecodeTimes { batches: 6, slot_wait_s: 0.5, reuse_wait_s: 0.45, submit_s: 1.012 };
        let span = after.since(&before);
        assert_eq!(span.batches, 4);
        let [slot, reuse, submit] = span.ms_per_batch();
        assert!(
            slot.abs() < 1e-9 && (reuse - 50.0).abs() < 1e-9 && (submit - 3.0).abs() < 1e-9,
            "{slot} {reuse} {submit}"
        );
        assert_eq!(after.since(&after).ms_per_batch(), [0.0; 3]);
    }

    fn gradient(w: u32, h: u32) -> Vec<u8> {
        (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [(x * 9 % 256) as u8, (y * 5 % 256) as u8, ((x + y) % 256) as u8]))
            .collect()
    }

    #[test]
    fn the_whole_image_at_its_own_size_is_the_image_itself() {
        let rgb = gradient(6, 4);
        let c = CropResize {
            pixels: Pixels::Rgb(rgb.clone()),
            size: [6, 4],
            region: [0.0, 0.0, 6.0, 4.0],
            flip: false,
            ops: Default::default(),
        };
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
        let plain =
            CropResize { pixels: Pixels::Rgb(rgb.clone()), size: [8, 2], region, flip: false, ops: Default::default() };
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

    fn tool_runs(program: &str) -> bool {
        std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
    }

    /// A JPEG's planes as the GPU decoder leaves them: Y at `w × h`, Cb and Cr halved across
    /// and down by `shift`, rows packed; smooth ramps with some ripple, Cb and Cr far from grey.
    fn planes(w: u32, h: u32, shift: [u32; 2], seed: u32) -> [Vec<u8>; 3] {
        let (cw, ch) = (w.div_ceil(1 << shift[0]), h.div_ceil(1 << shift[1]));
        let wave = |x: u32, y: u32, k: u32| {
            let t = f64::from(x * (3 + k) + y * (5 + seed)) * 0.37 + f64::from(seed);
            (128.0 + 90.0 * t.sin() * (f64::from(y + k) * 0.11).cos()).round() as u8
        };
        let plane = |pw: u32, ph: u32, k: u32| (0..ph).flat_map(|y| (0..pw).map(move |x| wave(x, y, k))).collect();
        [plane(w, h, 0), plane(cw, ch, 1), plane(cw, ch, 2)]
    }

    /// What the decoders make of `planes` before any resize: chroma enlarged to the luma grid by
    /// bilinear interpolation (samples centred on the luma samples they cover, edges repeated),
    /// then JFIF's YCbCr → RGB, unclamped and unrounded: HWC values.
    fn upsampled_rgb(planes: &[Vec<u8>; 3], w: u32, h: u32, shift: [u32; 2]) -> Vec<f64> {
        let (cw, ch) = (w.div_ceil(1 << shift[0]) as i64, h.div_ceil(1 << shift[1]) as i64);
        let at = |p: &[u8], i: i64, j: i64| f64::from(p[(j.clamp(0, ch - 1) * cw + i.clamp(0, cw - 1)) as usize]);
        let mut rgb = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            let v = (f64::from(y) + 0.5) / f64::from(1 << shift[1]) - 0.5;
            let (j, fv) = (v.floor() as i64, v - v.floor());
            for x in 0..w {
                let u = (f64::from(x) + 0.5) / f64::from(1 << shift[0]) - 0.5;
                let (i, fu) = (u.floor() as i64, u - u.floor());
                let chroma = |p: &[u8]| {
                    let row = |j: i64| (1.0 - fu) * at(p, i, j) + fu * at(p, i + 1, j);
                    (1.0 - fv) * row(j) + fv * row(j + 1) - 128.0
                };
                let (luma, cb, cr) =
                    (f64::from(planes[0][(y * w + x) as usize]), chroma(&planes[1]), chroma(&planes[2]));
                rgb.extend([luma + 1.402 * cr, luma - 0.344136 * cb - 0.714136 * cr, luma + 1.772 * cb]);
            }
        }
        rgb
    }

    /// The crop kernel's source run on the CPU (`benches/emulate_crop_resize.py`) on a JPEG's
    /// planes — 4:4:4, 4:2:2, 4:4:0 and 4:2:0, odd sizes, shrinking a little and a lot,
    /// enlarging, fractional regions and flips — against the reference that enlarges chroma and
    /// converts first, then filters (f64): the kernel's one pass over the chroma samples with
    /// combined weights is the same filter.
    #[test]
    fn planes_give_what_upsampling_first_gives() {
        if !tool_runs("python3") || !tool_runs("g++") {
            eprintln!("SKIPPED: emulating the crop kernel needs python3 and g++ (C++20)");
            return;
        }
        let out_hw = [24usize, 20];
        // (width, height, chroma shifts, region, flip)
        type Case = (u32, u32, [u32; 2], [f32; 4], bool);
        let cases: Vec<Case> = vec![
            (61, 45, [1, 1], [0.0, 0.0, 61.0, 45.0], false),
            (61, 45, [1, 1], [7.25, 3.5, 30.5, 20.0], true),
            (50, 37, [1, 0], [2.0, 1.0, 44.0, 30.0], false),
            (50, 37, [0, 1], [0.0, 0.0, 50.0, 37.0], true),
            (33, 29, [0, 0], [3.0, 4.0, 25.0, 20.0], false),
            (17, 9, [1, 1], [1.5, 0.5, 9.0, 6.0], false),
            (131, 97, [1, 1], [10.0, 5.0, 120.0, 90.0], true),
            // Wider filters than the kernel keeps weights for in registers, luma and chroma.
            (400, 300, [1, 1], [0.0, 0.0, 400.0, 300.0], false),
            (400, 300, [0, 0], [20.0, 10.0, 370.0, 280.0], true),
        ];
        let mut input: Vec<u8> =
            [cases.len() as u32, out_hw[0] as u32, out_hw[1] as u32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut want = Vec::new();
        for (k, &(w, h, shift, region, flip)) in cases.iter().enumerate() {
            let p = planes(w, h, shift, k as u32);
            let format = 1 | shift[0] << 1 | shift[1] << 2;
            input.extend([w, h, format, flip as u32].iter().flat_map(|v| v.to_le_bytes()));
            input.extend(region.iter().flat_map(|v| v.to_le_bytes()));
            input.extend(p.iter().flatten());
            let c = CropResize { pixels: Pixels::Rgb(Vec::new()), size: [w, h], region, flip, ops: Default::default() };
            let levels = resampled(&upsampled_rgb(&p, w, h, shift), &c, out_hw);
            let plane = out_hw[0] * out_hw[1];
            let mut chw = vec![0.0f64; 3 * plane];
            for (i, px) in levels.chunks_exact(3).enumerate() {
                for ch in 0..3 {
                    chw[ch * plane + i] = px[ch].clamp(0.0, 255.0) / 255.0;
                }
            }
            want.extend(chw);
        }
        let dir = tempfile::tempdir().unwrap();
        let (in_path, out_path) = (dir.path().join("in"), dir.path().join("out"));
        std::fs::write(&in_path, input).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/emulate_crop_resize.py");
        let run = std::process::Command::new("python3").arg(script).arg(&in_path).arg(&out_path).output().unwrap();
        assert!(
            run.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        let got: Vec<f32> = std::fs::read(&out_path)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got.len(), want.len());
        let worst = got.iter().zip(&want).map(|(g, w)| (f64::from(*g) - w).abs() * 255.0).fold(0.0, f64::max);
        // f32 sums of a few dozen taps against f64, in levels of 0–255.
        assert!(worst < 2e-3, "the kernel is {worst:.2e} levels from upsampling first");
    }

    #[test]
    fn bad_regions_and_short_pixels_are_one_line_errors() {
        let c = CropResize {
            pixels: Pixels::Rgb(vec![0; 12]),
            size: [2, 2],
            region: [1.0, 0.0, 2.0, 2.0],
            flip: false,
            ops: Default::default(),
        };
        let e = crops_to_device::<Flex>(vec![c.clone()], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("runs outside"), "{e}");
        let short = CropResize { pixels: Pixels::Rgb(vec![0; 11]), region: [0.0, 0.0, 2.0, 2.0], ..c.clone() };
        let e = crops_to_device::<Flex>(vec![short], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("11 RGB bytes"), "{e}");
        let jpeg = CropResize { pixels: Pixels::Jpeg(vec![0xFF, 0xD8]), region: [0.0, 0.0, 2.0, 2.0], ..c.clone() };
        let e = crops_to_device::<Flex>(vec![jpeg], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("CUDA device"), "{e}");
        let whole = CropResize { region: [0.0, 0.0, 2.0, 2.0], ..c };
        let many = PixelOps { ops: vec![PixelOp::Equalize; 21], erase: None };
        let e =
            crops_to_device::<Flex>(vec![CropResize { ops: many, ..whole.clone() }], [2, 2], UNIT, &Default::default())
                .unwrap_err()
                .to_string();
        assert!(e.contains("21 pixel operations, at most 20"), "{e}");
        let erase = Some(Erase { rect: [1, 0, 2, 2], seed: 0, gray: false });
        let outside = CropResize { ops: PixelOps { ops: vec![], erase }, ..whole };
        let e = crops_to_device::<Flex>(vec![outside], [2, 2], UNIT, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("runs outside the 2×2 crop"), "{e}");
    }

    #[test]
    fn operations_on_the_host_path_change_the_batch_as_apply_on_host_does() {
        let rgb = gradient(6, 4);
        let ops = PixelOps { ops: vec![PixelOp::Solarize(100.0), PixelOp::Posterize(3)], erase: None };
        let c = CropResize {
            pixels: Pixels::Rgb(rgb.clone()),
            size: [6, 4],
            region: [0.0, 0.0, 6.0, 4.0],
            flip: false,
            ops,
        };
        let t = crops_to_device::<Flex>(vec![c.clone()], [4, 6], UNIT, &Default::default()).unwrap();
        let v = t.into_data().into_vec::<f32>().unwrap();
        let mut want = rgb;
        crate::nn::pixel_ops::apply_on_host(&mut want, (6, 4), &c.ops);
        for (p, px) in want.chunks_exact(3).enumerate() {
            for ch in 0..3 {
                assert!((v[ch * 24 + p] - f32::from(px[ch]) / 255.0).abs() < 1e-6, "pixel {p} channel {ch}");
            }
        }
    }
}
