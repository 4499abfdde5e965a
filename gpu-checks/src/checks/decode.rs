//! Batches decoded on the GPU: nvJPEG's decode against the `image` crate's (what the CPU path
//! trains on), the crop-and-resize kernel against its f64 host twin, the pixel operations
//! (RandAugment, colour jitter, random erasing) against theirs, and batches started ahead by
//! another thread (as the data loader does) against the same twin.
//!
//! The JPEGs are made here (smooth gradients, edges and noise, quality 90, several sizes, odd
//! ones included); `BURN_DDP_CHECK_JPEGS=DIR` adds up to 64 of the JPEG files of DIR (real
//! photos) to them.

use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::crop::{CropResize, Normalize, Pixels};
use burn_ddp::nn::decode::{DeviceDecoder, crop_resize_on_host, crops_to_device};
use burn_ddp::nn::pixel_ops::{Erase, PixelOp, PixelOps};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const UNIT: Normalize = Normalize { mean: [0.0; 3], std: [1.0; 3] };
/// The bound: the GPU's decode within the decoders' documented rounding of the CPU's.
const MIN_PSNR_DB: f64 = 40.0;

fn synthetic_jpeg(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let edge = if (x / 23 + y / 17) % 2 == 0 { 60 } else { 0 };
        let n: u8 = rng.random_range(0..24);
        image::Rgb([
            ((x * 255 / w.max(1)) as u8).saturating_add(n) / 2 + edge,
            ((y * 255 / h.max(1)) as u8).saturating_add(n) / 2 + edge / 2,
            (((x + y) * 3 % 256) as u8) / 2 + n,
        ])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode_image(&img).expect("encoding a JPEG");
    out
}

/// The check's JPEGs: made here, plus the directory's of `BURN_DDP_CHECK_JPEGS`.
fn jpegs() -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = [(500, 375), (333, 500), (64, 48), (17, 9), (1024, 768), (225, 225)]
        .iter()
        .enumerate()
        .map(|(i, &(w, h))| (format!("synthetic {w}x{h}"), synthetic_jpeg(w, h, i as u64)))
        .collect();
    if let Ok(dir) = std::env::var("BURN_DDP_CHECK_JPEGS") {
        let mut files: Vec<_> = walk(std::path::Path::new(&dir));
        files.sort();
        for path in files.into_iter().take(64) {
            if let Ok(bytes) = std::fs::read(&path) {
                all.push((path.display().to_string(), bytes));
            }
        }
    }
    all
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("jpg") || x.eq_ignore_ascii_case("jpeg")) {
                vec![p]
            } else {
                Vec::new()
            }
        })
        .collect()
}

fn psnr(gpu: &[f32], cpu: &[f32]) -> f64 {
    let mse = gpu.iter().zip(cpu).map(|(a, b)| (f64::from(*a - *b) * 255.0).powi(2)).sum::<f64>() / gpu.len() as f64;
    if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64.powi(2) / mse).log10() }
}

const IMAGENET: Normalize = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };

/// `items` made into an ImageNet-normalised batch on the GPU and read back, or `None` after a
/// FAIL line for `check`.
fn made_on_gpu(check: &str, items: &[CropResize], hw: [usize; 2], device: &CudaDevice) -> Option<Vec<f32>> {
    match crops_to_device::<Cuda>(items.to_vec(), hw, IMAGENET, device) {
        Ok(t) => Some(t.into_data().into_vec::<f32>().expect("f32 values")),
        Err(e) => {
            println!("RESULT check={check} error: {e} FAIL");
            None
        }
    }
}

/// One image, or a batch, made on the GPU and read back.
fn on_gpu(items: Vec<CropResize>, out_hw: [usize; 2], device: &CudaDevice) -> Result<Vec<f32>, String> {
    let t = crops_to_device::<Cuda>(items, out_hw, UNIT, device).map_err(|e| e.to_string())?;
    Ok(t.into_data().into_vec::<f32>().expect("f32 values"))
}

/// nvJPEG's decode of every JPEG (whole, at its own size: the kernel then copies pixels
/// exactly) against the `image` crate's, then one batch of random crops of them against the
/// host twin on the CPU's decode: PSNR ≥ 40 dB for every image.
pub(crate) fn check_jpeg_decode(device: &CudaDevice) -> bool {
    match DeviceDecoder::for_device::<Cuda>(device) {
        Ok(d) => println!("RESULT check=jpeg-decode decoder=\"{}\" hardware={}", d.name(), d.is_hardware()),
        Err(reason) => {
            println!("RESULT check=jpeg-decode no decoder: {reason} FAIL");
            return false;
        }
    }
    let mut ok = true;
    let mut crops = Vec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (name, bytes) in jpegs() {
        let cpu = match image::load_from_memory(&bytes) {
            Ok(img) => img.into_rgb8(),
            Err(e) => {
                println!("RESULT check=jpeg-decode image=\"{name}\" skipped: the CPU decoder refuses it ({e})");
                continue;
            }
        };
        let (w, h) = cpu.dimensions();
        let whole = CropResize {
            pixels: Pixels::Jpeg(bytes.clone()),
            size: [w, h],
            region: [0.0, 0.0, w as f32, h as f32],
            flip: false,
            ops: Default::default(),
        };
        let mut reference = vec![0.0; 3 * (w * h) as usize];
        crop_resize_on_host(cpu.as_raw(), &whole, [h as usize, w as usize], &UNIT, &mut reference);
        let db = match on_gpu(vec![whole], [h as usize, w as usize], device) {
            Ok(gpu) => psnr(&gpu, &reference),
            Err(e) => {
                println!("RESULT check=jpeg-decode image=\"{name}\" error: {e} FAIL");
                ok = false;
                continue;
            }
        };
        let pass = db >= MIN_PSNR_DB;
        println!(
            "RESULT check=jpeg-decode image=\"{name}\" size={w}x{h} psnr_db={db:.2} {}",
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
        let (cw, ch) = (rng.random_range(w / 4..=w).max(1), rng.random_range(h / 4..=h).max(1));
        let (x, y) = (rng.random_range(0..=w - cw), rng.random_range(0..=h - ch));
        let crop = CropResize {
            region: [x as f32, y as f32, cw as f32, ch as f32],
            flip: rng.random_bool(0.5),
            ..whole_of(&bytes, w, h)
        };
        crops.push((crop, cpu.into_raw()));
    }
    ok & check_crop_batch(crops, device)
}

/// `n` whole images of the check's JPEGs (see [`jpegs`]), in turn, each with its size read
/// from its header: a batch for timing nvJPEG.
pub(crate) fn batch_of_photos(n: usize) -> Vec<CropResize> {
    let sized: Vec<CropResize> = jpegs()
        .into_iter()
        .filter_map(|(_, bytes)| {
            let (w, h) = image::ImageReader::new(std::io::Cursor::new(&bytes))
                .with_guessed_format()
                .ok()?
                .into_dimensions()
                .ok()?;
            Some(whole_of(&bytes, w, h))
        })
        .collect();
    (0..n).map(|i| sized[i % sized.len()].clone()).collect()
}

fn whole_of(bytes: &[u8], w: u32, h: u32) -> CropResize {
    CropResize {
        pixels: Pixels::Jpeg(bytes.to_vec()),
        size: [w, h],
        region: [0.0, 0.0, w as f32, h as f32],
        flip: false,
        ops: Default::default(),
    }
}

/// One batch of random crops of the JPEGs at 224², against the host twin on the CPU's decode.
fn check_crop_batch(crops: Vec<(CropResize, Vec<u8>)>, device: &CudaDevice) -> bool {
    let hw = [224, 224];
    let per = 3 * hw[0] * hw[1];
    let gpu = match on_gpu(crops.iter().map(|(c, _)| c.clone()).collect(), hw, device) {
        Ok(v) => v,
        Err(e) => {
            println!("RESULT check=jpeg-decode batch of {} crops error: {e} FAIL", crops.len());
            return false;
        }
    };
    let mut worst = f64::INFINITY;
    for (i, (c, rgb)) in crops.iter().enumerate() {
        let mut reference = vec![0.0; per];
        crop_resize_on_host(rgb, c, hw, &UNIT, &mut reference);
        worst = worst.min(psnr(&gpu[i * per..(i + 1) * per], &reference));
    }
    let pass = worst >= MIN_PSNR_DB;
    println!(
        "RESULT check=jpeg-decode batch={} crops at 224x224, flips, lowest psnr_db={worst:.2} {}",
        crops.len(),
        if pass { "ok" } else { "FAIL" }
    );
    pass
}

/// The crop-and-resize kernel on decoded RGB images (shrinking, enlarging, fractional regions,
/// flips; a batch longer than one launch's 48 images) against its f64 host twin.
pub(crate) fn check_crop_resize(device: &CudaDevice) -> bool {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let hw = [56, 40];
    let items: Vec<CropResize> = (0..70)
        .map(|i| {
            let (w, h) = (rng.random_range(8..300u32), rng.random_range(8..300u32));
            let rgb: Vec<u8> = (0..w * h * 3).map(|_| rng.random()).collect();
            let (rw, rh) = (rng.random_range(1.0..=w as f32), rng.random_range(1.0..=h as f32));
            let (x, y) = (rng.random_range(0.0..=w as f32 - rw), rng.random_range(0.0..=h as f32 - rh));
            CropResize {
                pixels: Pixels::Rgb(rgb),
                size: [w, h],
                region: [x, y, rw, rh],
                flip: i % 3 == 0,
                ops: Default::default(),
            }
        })
        .collect();
    let norm = IMAGENET;
    let Some(gpu) = made_on_gpu("crop-resize", &items, hw, device) else { return false };
    let per = 3 * hw[0] * hw[1];
    let mut worst = 0.0f64;
    for (i, c) in items.iter().enumerate() {
        let Pixels::Rgb(rgb) = &c.pixels else { unreachable!("RGB items") };
        let mut reference = vec![0.0; per];
        crop_resize_on_host(rgb, c, hw, &norm, &mut reference);
        let err = gpu[i * per..(i + 1) * per]
            .iter()
            .zip(&reference)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max);
        worst = worst.max(err);
    }
    // f32 sums of up to a few hundred taps against f64, on values of about ±2.6.
    let pass = worst <= 1e-4;
    println!(
        "RESULT check=crop-resize images={} out={}x{} max_abs_err={worst:.2e} bound=1e-4 {}",
        items.len(),
        hw[1],
        hw[0],
        if pass { "ok" } else { "FAIL" }
    );
    pass
}

/// Random pixel operations of every kind, 0–6 an image, erasing half the time.
fn random_ops(rng: &mut ChaCha8Rng, (w, h): (u32, u32)) -> PixelOps {
    let ops = (0..rng.random_range(0..=6))
        .map(|_| {
            let f = rng.random_range(0.1f32..1.9);
            match rng.random_range(0..9) {
                0 => {
                    let (a, s) = (rng.random_range(-0.5f64..0.5), rng.random_range(-0.3..0.3));
                    PixelOp::Warp([a.cos(), a.sin() + s, rng.random_range(-9.0..9.0), -a.sin(), a.cos(), 3.0])
                }
                1 => PixelOp::Brightness(f),
                2 => PixelOp::Saturation(f),
                3 => PixelOp::Contrast(f),
                4 => PixelOp::Sharpness(f),
                5 => PixelOp::Posterize(rng.random_range(1..=8)),
                6 => PixelOp::Solarize(rng.random_range(0.0..256.0)),
                7 => PixelOp::AutoContrast,
                _ => PixelOp::Equalize,
            }
        })
        .collect();
    let erase = rng.random_bool(0.5).then(|| {
        let (ew, eh) = (rng.random_range(1..=w), rng.random_range(1..=h));
        let rect = [rng.random_range(0..=w - ew), rng.random_range(0..=h - eh), ew, eh];
        Erase { rect, seed: rng.random(), gray: false }
    });
    PixelOps { ops, erase }
}

/// The pixel-operations kernel (after the 8-bit crop) on decoded RGB images against its host
/// twin: 70 images (two crop launches), each with its own random operations. Both round the
/// crop to bytes and then run the same arithmetic, so they differ only where the crop's f32
/// and f64 sums round to different bytes — a level here and there, which a threshold
/// (solarize, posterize) or a histogram (equalize) can widen for a few pixels.
pub(crate) fn check_pixel_ops(device: &CudaDevice) -> bool {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let hw = [64, 48];
    let items: Vec<CropResize> = (0..70)
        .map(|i| {
            let (w, h) = (rng.random_range(40..300u32), rng.random_range(40..300u32));
            let rgb = image::load_from_memory(&synthetic_jpeg(w, h, i)).expect("a JPEG made here").into_rgb8();
            let (rw, rh) = (rng.random_range(8.0..=w as f32), rng.random_range(8.0..=h as f32));
            let (x, y) = (rng.random_range(0.0..=w as f32 - rw), rng.random_range(0.0..=h as f32 - rh));
            let ops = random_ops(&mut rng, (hw[1] as u32, hw[0] as u32));
            CropResize {
                pixels: Pixels::Rgb(rgb.into_raw()),
                size: [w, h],
                region: [x, y, rw, rh],
                flip: i % 3 == 0,
                ops,
            }
        })
        .collect();
    let norm = IMAGENET;
    let Some(gpu) = made_on_gpu("pixel-ops", &items, hw, device) else { return false };
    let per = 3 * hw[0] * hw[1];
    let (mut worst_db, mut off, mut ok) = (f64::INFINITY, 0usize, true);
    for (i, c) in items.iter().enumerate() {
        let Pixels::Rgb(rgb) = &c.pixels else { unreachable!("RGB items") };
        let mut reference = vec![0.0; per];
        crop_resize_on_host(rgb, c, hw, &norm, &mut reference);
        let got = &gpu[i * per..(i + 1) * per];
        // In 8-bit levels.
        let levels: Vec<f64> = (0..per)
            .map(|k| f64::from((got[k] - reference[k]).abs() * norm.std[k / (hw[0] * hw[1])] * 255.0))
            .collect();
        let far = levels.iter().filter(|&&l| l > 1.01).count();
        let mse = levels.iter().map(|l| l * l).sum::<f64>() / per as f64;
        let db = if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64.powi(2) / mse).log10() };
        worst_db = worst_db.min(db);
        off += far;
        if far * 100 > per {
            println!(
                "RESULT check=pixel-ops image={i} ops={:?} values_off_by_more_than_1_level={far} of {per} FAIL",
                c.ops
            );
            ok = false;
        }
    }
    let pass = ok && worst_db >= MIN_PSNR_DB;
    println!(
        "RESULT check=pixel-ops images={} out={}x{} values_off_by_more_than_1_level={off} lowest_psnr_db={worst_db:.2} {}",
        items.len(),
        hw[1],
        hw[0],
        if pass { "ok" } else { "FAIL" }
    );
    pass
}

/// Batches started by a producer thread a few batches ahead of their use, as the data loader
/// starts them, one of them dropped unread, made into tensors in order by this thread, all
/// before the first is read back: every image of every batch against the host twin on the
/// `image` crate's decode (PSNR ≥ 40 dB), and no batch waiting for a decode slot that only a
/// later synchronisation would free. Both threads fill fresh host memory after each batch, as
/// a loader reading the next files does: a batch whose encoded bytes were freed before its
/// decode had read them decodes other bytes.
pub(crate) fn check_decode_ahead(device: &CudaDevice) -> bool {
    decode_ahead("decode-ahead", device, None)
}

/// `decode-ahead` with burn's stream kept busy: before each batch is made into a tensor, this
/// thread queues about 60 ms of matrix products, so every crop kernel waits on the GPU behind
/// them while the producer decodes the batches after it — as in training on a host that runs
/// far ahead of the GPU. A batch whose slot was decoded into again before its crop kernel ran
/// holds another batch's images (the check says which). (It also passed with the slot's reuse
/// ordered on the decoder's stream only, the order under which tutorial runs did not learn on
/// fast hosts: it guards the order, the training runs of `tutorial_learning.sh` show the fix.)
pub(crate) fn check_decode_behind_busy_stream(device: &CudaDevice) -> bool {
    let busy = Busy::new(device);
    println!(
        "RESULT check=decode-behind-busy-stream products_per_batch={} queued_ms_per_batch={:.1}",
        busy.count,
        busy.count as f64 * busy.product_ms
    );
    decode_ahead("decode-behind-busy-stream", device, Some(&busy))
}

/// Work queued on burn's stream and never waited for: `count` products of two 4096² matrices
/// (cuBLAS, each about `product_ms`).
pub(crate) struct Busy {
    a: burn::tensor::Tensor<Cuda, 2>,
    pub count: usize,
    pub product_ms: f64,
}

impl Busy {
    /// Enough products for about 60 ms, timed here.
    pub(crate) fn new(device: &CudaDevice) -> Self {
        use burn::tensor::backend::Backend;
        let a = burn::tensor::Tensor::<Cuda, 2>::full([4096, 4096], 1e-4, device);
        let once = || drop(burn_ddp::nn::matmul(a.clone(), a.clone()));
        once();
        <Cuda as Backend>::sync(device).expect("synchronising the device");
        let t = std::time::Instant::now();
        for _ in 0..10 {
            once();
        }
        <Cuda as Backend>::sync(device).expect("synchronising the device");
        let product_ms = t.elapsed().as_secs_f64() * 100.0;
        Self { a, count: (60.0 / product_ms).ceil().clamp(1.0, 1000.0) as usize, product_ms }
    }

    pub(crate) fn queue(&self) {
        for _ in 0..self.count {
            drop(burn_ddp::nn::matmul(self.a.clone(), self.a.clone()));
        }
    }
}

/// Seven batches of 12 random crops (some mirrored) of `sources`, each with its source's index.
fn ahead_batches(sources: &[(Vec<u8>, image::RgbImage)]) -> Vec<Vec<(CropResize, usize)>> {
    (0..7u64)
        .map(|b| {
            let mut rng = ChaCha8Rng::seed_from_u64(100 + b);
            (0..12)
                .map(|_| {
                    let k = rng.random_range(0..sources.len());
                    let (w, h) = sources[k].1.dimensions();
                    let (cw, ch) = (rng.random_range(w / 3..=w).max(1), rng.random_range(h / 3..=h).max(1));
                    let (x, y) = (rng.random_range(0..=w - cw), rng.random_range(0..=h - ch));
                    let c = CropResize {
                        region: [x as f32, y as f32, cw as f32, ch as f32],
                        flip: rng.random_bool(0.5),
                        ..whole_of(&sources[k].0, w, h)
                    };
                    (c, k)
                })
                .collect()
        })
        .collect()
}

const AHEAD_HW: [usize; 2] = [96, 128];

fn decode_ahead(check: &str, device: &CudaDevice, busy: Option<&Busy>) -> bool {
    let decoder = match DeviceDecoder::for_device::<Cuda>(device) {
        Ok(d) => d,
        Err(reason) => {
            println!("RESULT check={check} no decoder: {reason} FAIL");
            return false;
        }
    };
    let sources: Vec<(Vec<u8>, image::RgbImage)> = jpegs()
        .into_iter()
        .filter_map(|(_, bytes)| image::load_from_memory(&bytes).ok().map(|img| (bytes, img.into_rgb8())))
        .collect();
    let batches = ahead_batches(&sources);
    const DROPPED: usize = 3;
    let (tx, rx) = std::sync::mpsc::sync_channel(2);
    let jobs: Vec<Vec<CropResize>> = batches.iter().map(|b| b.iter().map(|(c, _)| c.clone()).collect()).collect();
    let producer = std::thread::spawn(move || {
        for (i, images) in jobs.into_iter().enumerate() {
            let started = decoder.start(images, AHEAD_HW, UNIT).map_err(|e| e.to_string());
            scribble();
            if i == DROPPED {
                continue; // started and dropped unread: its slot must come free
            }
            if tx.send((i, started)).is_err() {
                return;
            }
        }
    });
    // Every batch made into a tensor before any is read back (nothing else synchronises the
    // device meanwhile, as in `bench-data`): each must free its slot for the producer.
    let tensors: Vec<(usize, Result<burn::tensor::Tensor<Cuda, 4>, String>)> = rx
        .iter()
        .map(|(i, started)| {
            if let Some(busy) = busy {
                busy.queue();
            }
            let tensor = started.and_then(|d| d.to_device::<Cuda>(device).map_err(|e| e.to_string()));
            scribble();
            (i, tensor)
        })
        .collect();
    let references: Vec<Vec<Vec<f32>>> = batches
        .iter()
        .map(|b| {
            b.iter()
                .map(|(c, k)| {
                    let mut reference = vec![0.0; 3 * AHEAD_HW[0] * AHEAD_HW[1]];
                    crop_resize_on_host(sources[*k].1.as_raw(), c, AHEAD_HW, &UNIT, &mut reference);
                    reference
                })
                .collect()
        })
        .collect();
    let mut ok = producer.join().is_ok();
    for (i, tensor) in tensors {
        ok &= ahead_batch_matches(check, i, tensor, &references);
    }
    println!(
        "RESULT check={check} batches={} (batch {DROPPED} dropped unread) {}",
        batches.len(),
        if ok { "ok" } else { "FAIL" }
    );
    ok
}

/// Batch `i` read back against its images' host twins; when it fails, which batch's images it
/// holds instead (the one whose twins it is closest to).
fn ahead_batch_matches(
    check: &str,
    i: usize,
    tensor: Result<burn::tensor::Tensor<Cuda, 4>, String>,
    references: &[Vec<Vec<f32>>],
) -> bool {
    let values = match tensor.map(|t| t.into_data().into_vec::<f32>().expect("f32 values")) {
        Ok(v) => v,
        Err(e) => {
            println!("RESULT check={check} batch={i} error: {e} FAIL");
            return false;
        }
    };
    let per = 3 * AHEAD_HW[0] * AHEAD_HW[1];
    let against = |b: &[Vec<f32>], f: fn(f64, f64) -> f64, start: f64| {
        b.iter().enumerate().fold(start, |acc, (j, r)| f(acc, psnr(&values[j * per..(j + 1) * per], r)))
    };
    let worst = against(&references[i], f64::min, f64::INFINITY);
    if worst >= MIN_PSNR_DB {
        println!("RESULT check={check} batch={i} lowest psnr_db={worst:.2} ok");
        return true;
    }
    let closest = (0..references.len())
        .map(|j| (j, against(&references[j], |a, b| a + b.min(99.0), 0.0) / references[j].len() as f64))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one batch");
    println!(
        "RESULT check={check} batch={i} lowest psnr_db={worst:.2}; closest to batch {}'s images (mean psnr_db={:.2}) FAIL",
        closest.0, closest.1
    );
    false
}

/// Allocates, fills and frees host memory of a JPEG's size many times: what freed encoded
/// bytes would be overwritten with.
fn scribble() {
    let noise: Vec<Vec<u8>> = (0..64).map(|i| vec![0xA5 ^ i as u8; 3 << 12]).collect();
    std::hint::black_box(&noise);
}
