//! The batch loader: decodes and transforms samples on a thread pool, a few batches ahead of
//! the training loop, skipping (and counting) unreadable images.

use super::Dataset;
use crate::data::transform::Pipeline;
use crate::error::{Error, Result};
use burn_ddp::nn::crop::{CropResize, Normalize, Pixels};
use burn_ddp::nn::decode::{Decoding, DeviceDecoder};
use burn_ddp::nn::jpeg;
use image::{DynamicImage, GenericImageView};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// How many skipped paths are remembered for the final report.
const REMEMBERED_SKIPS: usize = 10;

/// One batch, channel-first, ready to become a `[n, c, h, w]` tensor.
#[derive(Debug)]
pub struct Batch {
    /// The pixels, made on the host or to be made on the device.
    pub images: BatchImages,
    /// Class labels, one per image.
    pub labels: Vec<i64>,
    /// `[n, c, h, w]`.
    pub shape: [usize; 4],
    /// Dataset indices of the images, in batch order.
    pub indices: Vec<usize>,
}

/// A batch's pixels.
#[derive(Debug)]
pub enum BatchImages {
    /// `n·c·h·w` normalised values, decoded and transformed on the host.
    Host(Vec<f32>),
    /// Encoded images (JPEG bytes, or RGB the host decoded) with the crop each gets, handed to
    /// the device's decoder by the loader's thread: the device decodes, crops, resizes and
    /// normalises them (`burn_ddp::nn::decode`).
    Device(Decoding),
}

impl BatchImages {
    /// The host values, when the host made them.
    pub fn host(&self) -> Option<&[f32]> {
        match self {
            BatchImages::Host(v) => Some(v),
            BatchImages::Device(_) => None,
        }
    }
}

/// Counts images that could not be decoded and remembers the first few.
#[derive(Debug, Default)]
pub struct SkipLog {
    count: AtomicUsize,
    first: Mutex<Vec<String>>,
}

impl SkipLog {
    /// Records one skipped sample.
    pub fn record(&self, what: String, reason: &Error) {
        self.count.fetch_add(1, Ordering::Relaxed);
        log::warn!("skipping {what}: {reason}");
        let mut first = self.first.lock().expect("skip log poisoned");
        if first.len() < REMEMBERED_SKIPS {
            first.push(what);
        }
    }
    /// How many samples were skipped.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
    /// The first skipped samples (at most ten).
    pub fn first(&self) -> Vec<String> {
        self.first.lock().expect("skip log poisoned").clone()
    }
}

/// Batching options.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    /// Images per batch.
    pub batch_size: usize,
    /// Drop a last, smaller batch.
    pub drop_last: bool,
    /// Batches prepared ahead of the consumer.
    pub prefetch: usize,
    /// Base seed of the per-sample augmentation RNGs.
    pub seed: u64,
    /// Fail on the first unreadable image instead of skipping it.
    pub strict: bool,
    /// Leave decoding, the crop-and-resize and the pixel operations to this device decoder
    /// ([`BatchImages::Device`]) when the pipeline is one it can do
    /// ([`Pipeline::is_device_plannable`]); the host only reads files, checks them and draws
    /// the crops and operations, and the loader's thread starts each batch's decode as soon as
    /// the batch is read.
    pub device_decode: Option<DeviceDecoder>,
}

/// The RNG for one sample's augmentation, a pure function of (seed, epoch, sample index):
/// the same on every machine and for every thread count.
pub fn sample_rng(seed: u64, epoch: u64, index: usize) -> ChaCha8Rng {
    let mut z = seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407) ^ (index as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ChaCha8Rng::seed_from_u64(z ^ (z >> 31))
}

/// Where the loader's threads spent their time, summed over threads (so it can exceed the wall
/// time): decoding files, and running the transforms plus normalisation.
#[derive(Debug, Default)]
pub struct StageTimes {
    decode_ns: AtomicU64,
    transform_ns: AtomicU64,
    images: AtomicU64,
    host_decoded: AtomicU64,
}

impl StageTimes {
    /// `(decode seconds, transform seconds, images)` so far.
    pub fn totals(&self) -> (f64, f64, u64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        (s(&self.decode_ns), s(&self.transform_ns), self.images.load(Ordering::Relaxed))
    }
    /// Of the images of device-decoded batches, those the host decoded (PNGs, progressive or
    /// greyscale JPEGs: formats the device decoder does not take).
    pub fn host_decoded(&self) -> u64 {
        self.host_decoded.load(Ordering::Relaxed)
    }
}

/// An iterator of batches produced by a background thread.
pub struct Loader {
    rx: Option<Receiver<Result<Batch>>>,
    worker: Option<JoinHandle<()>>,
    batches: usize,
    times: Arc<StageTimes>,
}

impl Loader {
    /// Starts producing the batches of `order` (dataset indices, already shuffled as wanted)
    /// for `epoch`.
    pub fn new(
        dataset: Arc<dyn Dataset>,
        order: Vec<usize>,
        pipeline: Pipeline,
        epoch: u64,
        config: LoaderConfig,
        skips: Arc<SkipLog>,
    ) -> Self {
        assert!(config.batch_size > 0, "Got batch_size=0, expected at least 1");
        let batches =
            if config.drop_last { order.len() / config.batch_size } else { order.len().div_ceil(config.batch_size) };
        let (tx, rx) = sync_channel(config.prefetch.max(1));
        let times = Arc::new(StageTimes::default());
        let producer = Producer { dataset, pipeline, epoch, config, skips, times: times.clone() };
        let worker = std::thread::Builder::new()
            .name("burn-vision-loader".into())
            .spawn(move || {
                let chunks = order.chunks(producer.config.batch_size).take(batches);
                producer.send_batches(chunks, tx)
            })
            .expect("spawning the loader thread");
        Self { rx: Some(rx), worker: Some(worker), batches, times }
    }

    /// The time the loader's threads have spent per stage so far.
    pub fn stage_times(&self) -> &StageTimes {
        &self.times
    }

    /// Number of batches this epoch (before any all-skipped batch is dropped).
    pub fn len(&self) -> usize {
        self.batches
    }

    /// True when there is no batch.
    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }
}

/// What the loader's threads make batches from.
struct Producer {
    dataset: Arc<dyn Dataset>,
    pipeline: Pipeline,
    epoch: u64,
    config: LoaderConfig,
    skips: Arc<SkipLog>,
    times: Arc<StageTimes>,
}

impl Producer {
    /// Sends the batches of `chunks` in order, an all-skipped one left out; stops after the
    /// first error (sent too) or when the receiver is gone.
    fn send_batches<'a>(&self, chunks: impl Iterator<Item = &'a [usize]>, tx: SyncSender<Result<Batch>>) {
        let device = self.config.device_decode.clone().filter(|_| self.pipeline.is_device_plannable());
        match device {
            Some(decoder) => self.send_device_batches(chunks, decoder, tx),
            None => send_in_order(chunks.map(|chunk| self.host_batch(chunk)), &tx),
        }
    }

    /// Device batches in two stages: this thread reads and checks each batch's files while a
    /// second one hands the batch read before it to `decoder`, whose calls keep their thread
    /// for milliseconds (nvJPEG's batched decode: about 11 ms a batch of 256 photos), so that
    /// neither waits for the other — reading from slow storage included.
    fn send_device_batches<'a>(
        &self,
        chunks: impl Iterator<Item = &'a [usize]>,
        decoder: DeviceDecoder,
        tx: SyncSender<Result<Batch>>,
    ) {
        std::thread::scope(|scope| {
            let (read_tx, read_rx) = sync_channel::<Result<ReadBatch>>(1);
            std::thread::Builder::new()
                .name("burn-vision-decode-start".into())
                .spawn_scoped(scope, move || {
                    let started = read_rx.into_iter().map(|read| read.and_then(|r| r.start(&decoder)).map(Some));
                    send_in_order(started, &tx)
                })
                .expect("spawning the loader's decode thread");
            send_in_order(chunks.map(|chunk| self.read_device_batch(chunk)), &read_tx);
        });
    }

    /// A batch decoded and transformed on the host, on the loader's thread pool.
    fn host_batch(&self, chunk: &[usize]) -> Result<Option<Batch>> {
        let Producer { dataset, pipeline, epoch, config, skips, times } = self;
        let (dataset, epoch) = (&**dataset, *epoch);
        let elapsed = |t: Instant| t.elapsed().as_nanos() as u64;
        // Decode and transform in parallel; normalise straight into the batch (below).
        let decoded: Vec<(usize, Result<DynamicImage>)> = chunk
            .par_iter()
            .map(|&index| {
                let t = Instant::now();
                let loaded = dataset.load(index);
                times.decode_ns.fetch_add(elapsed(t), Ordering::Relaxed);
                let result = loaded.map(|img| {
                    let t = Instant::now();
                    let img = pipeline.transform(img, &mut sample_rng(config.seed, epoch, index));
                    times.transform_ns.fetch_add(elapsed(t), Ordering::Relaxed);
                    img
                });
                (index, result)
            })
            .collect();
        let mut kept = Vec::with_capacity(decoded.len());
        let (mut labels, mut indices) = (Vec::new(), Vec::new());
        let mut size = None;
        for (index, result) in decoded {
            match result {
                Ok(img) => {
                    let hw = img.dimensions();
                    if *size.get_or_insert(hw) != hw {
                        return Err(Error::InvalidConfig {
                            name: "transforms",
                            value: format!("{hw:?} vs {:?}", size.unwrap()),
                            reason: format!(
                                "images in one batch differ in size ({}); add a Resize/CenterCrop",
                                dataset.describe(index)
                            ),
                        });
                    }
                    kept.push(img);
                    labels.push(dataset.label(index) as i64);
                    indices.push(index);
                }
                Err(e) if !config.strict => skips.record(dataset.describe(index), &e),
                Err(e) => return Err(e),
            }
        }
        let Some((w, h)) = size else { return Ok(None) };
        let per_image = (w * h) as usize * pipeline.channels;
        // Zeroed pages come from the OS on first write, so the threads below fault them in.
        let mut images = vec![0.0f32; per_image * kept.len()];
        images.par_chunks_mut(per_image).zip(kept.into_par_iter()).for_each(|(out, img)| {
            let t = Instant::now();
            pipeline.normalize_into(img, out);
            times.transform_ns.fetch_add(elapsed(t), Ordering::Relaxed);
        });
        times.images.fetch_add(labels.len() as u64, Ordering::Relaxed);
        Ok(Some(Batch {
            shape: [labels.len(), pipeline.channels, h as usize, w as usize],
            images: BatchImages::Host(images),
            labels,
            indices,
        }))
    }

    /// A batch for the device to decode: each sample's file read and checked, its crop drawn
    /// from its own RNG as the host path draws it; formats the device does not decode are
    /// decoded here.
    fn read_device_batch(&self, chunk: &[usize]) -> Result<Option<ReadBatch>> {
        let Producer { dataset, pipeline, epoch, config, skips, times } = self;
        let dataset = &**dataset;
        let items: Vec<(usize, Result<CropResize>)> = chunk
            .par_iter()
            .map(|&index| {
                let t = Instant::now();
                let item = device_item(dataset, index, pipeline, &mut sample_rng(config.seed, *epoch, index), times);
                times.decode_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                (index, item)
            })
            .collect();
        let (mut images, mut labels, mut indices) = (Vec::new(), Vec::new(), Vec::new());
        for (index, item) in items {
            match item {
                Ok(c) => {
                    images.push(c);
                    labels.push(dataset.label(index) as i64);
                    indices.push(index);
                }
                Err(e) if !config.strict => skips.record(dataset.describe(index), &e),
                Err(e) => return Err(e),
            }
        }
        if images.is_empty() {
            return Ok(None);
        }
        times.images.fetch_add(labels.len() as u64, Ordering::Relaxed);
        let (w, h) = pipeline.output_size((1, 1));
        let norm = Normalize {
            mean: [pipeline.mean[0], pipeline.mean[1], pipeline.mean[2]],
            std: [pipeline.std[0], pipeline.std[1], pipeline.std[2]],
        };
        let shape = [labels.len(), 3, h as usize, w as usize];
        Ok(Some(ReadBatch { images, norm, shape, labels, indices }))
    }
}

/// Sends `batches` to `tx` in order, skipping `None`s; stops after the first error (sent too)
/// or when the receiver is gone.
fn send_in_order<T>(batches: impl Iterator<Item = Result<Option<T>>>, tx: &SyncSender<Result<T>>) {
    for batch in batches {
        let failed = batch.is_err();
        let Some(batch) = batch.transpose() else { continue };
        if tx.send(batch).is_err() || failed {
            return;
        }
    }
}

/// A device batch read and checked, its decode not yet started.
struct ReadBatch {
    images: Vec<CropResize>,
    norm: Normalize,
    shape: [usize; 4],
    labels: Vec<i64>,
    indices: Vec<usize>,
}

impl ReadBatch {
    /// The batch, handed to `decoder` (on a GPU its decode starts now).
    fn start(self, decoder: &DeviceDecoder) -> Result<Batch> {
        let ReadBatch { images, norm, shape, labels, indices } = self;
        let images = BatchImages::Device(decoder.start(images, [shape[2], shape[3]], norm)?);
        Ok(Batch { shape, images, labels, indices })
    }
}

/// One sample for the device: its JPEG bytes when the device decodes them, its RGB pixels
/// otherwise, with the crop `pipeline` draws for it.
fn device_item(
    dataset: &dyn Dataset,
    index: usize,
    pipeline: &Pipeline,
    rng: &mut ChaCha8Rng,
    times: &StageTimes,
) -> Result<CropResize> {
    let bad = |reason: String| Error::BadImage { path: dataset.describe(index).into(), reason };
    let img = match dataset.read_bytes(index).transpose()? {
        Some(bytes) => {
            if let Some(frame) = jpeg::device_decodable(&bytes) {
                jpeg::check_whole(&bytes).map_err(bad)?;
                let (w, h) = (frame.width, frame.height);
                let plan =
                    pipeline.crop_plan((w, h), rng).ok_or_else(|| bad(format!("{w}×{h} is too small to crop")))?;
                return Ok(CropResize {
                    pixels: Pixels::Jpeg(bytes),
                    size: [w, h],
                    region: plan.region,
                    flip: plan.flip,
                    ops: plan.ops,
                });
            }
            // Decoded from the bytes already read, as `Dataset::load` would from the file.
            super::folder::decode_bytes(bytes).map_err(bad)?
        }
        None => dataset.load(index)?,
    }
    .into_rgb8();
    times.host_decoded.fetch_add(1, Ordering::Relaxed);
    let (w, h) = img.dimensions();
    let plan = pipeline.crop_plan((w, h), rng).ok_or_else(|| bad(format!("{w}×{h} is too small to crop")))?;
    Ok(CropResize {
        pixels: Pixels::Rgb(img.into_raw()),
        size: [w, h],
        region: plan.region,
        flip: plan.flip,
        ops: plan.ops,
    })
}

impl Iterator for Loader {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.rx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::IdxDataset;
    use crate::data::transform::IMAGENET_STD;

    fn dataset(n: usize) -> Arc<dyn Dataset> {
        let mut images = vec![0, 0, 8, 3];
        for d in [n as u32, 4, 4] {
            images.extend_from_slice(&d.to_be_bytes());
        }
        images.extend((0..n * 16).map(|i| (i % 251) as u8));
        let mut labels = vec![0, 0, 8, 1];
        labels.extend_from_slice(&(n as u32).to_be_bytes());
        labels.extend((0..n).map(|i| (i % 3) as u8));
        Arc::new(IdxDataset::from_bytes(&images, &labels, "mem", vec![]).unwrap())
    }

    fn config(batch_size: usize, drop_last: bool) -> LoaderConfig {
        LoaderConfig { batch_size, drop_last, prefetch: 2, seed: 1, strict: false, device_decode: None }
    }

    #[test]
    fn batches_cover_the_order_in_sequence() {
        let order: Vec<usize> = (0..10).rev().collect();
        let pipe = Pipeline::grayscale(4, 0.0, 1.0, &crate::data::Augment::default());
        let loader = Loader::new(dataset(10), order.clone(), pipe.clone(), 0, config(4, false), Arc::default());
        assert_eq!(loader.len(), 3);
        let batches: Vec<Batch> = loader.map(Result::unwrap).collect();
        assert_eq!(batches.iter().map(|b| b.shape[0]).collect::<Vec<_>>(), [4, 4, 2]);
        assert_eq!(batches.iter().flat_map(|b| b.indices.clone()).collect::<Vec<_>>(), order);
        assert_eq!(batches[0].labels, [0, 2, 1, 0]);
        assert_eq!(batches[0].images.host().unwrap().len(), 4 * 16);
        let dropped = Loader::new(dataset(10), order, pipe, 0, config(4, true), Arc::default());
        assert_eq!(dropped.count(), 2);
    }

    /// The ViT recipe's augmentation on the device path (made here by the deferred decoder's
    /// host twin on burn-flex: the arithmetic the GPU kernels match) against the host path:
    /// the same crops and operations drawn per sample, the same pixels but for the resize's
    /// rounding to bytes.
    #[test]
    fn an_augmented_device_batch_is_the_host_paths_batch() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        for i in 0..6u32 {
            let img = image::RgbImage::from_fn(64, 48, |x, y| {
                image::Rgb([(x * 4 + i * 9) as u8, (y * 5) as u8, ((x * y + i * 31) % 200) as u8])
            });
            img.save(dir.path().join(format!("a/{i}.png"))).unwrap();
        }
        let data: Arc<dyn Dataset> = Arc::new(crate::data::FolderDataset::open(dir.path()).unwrap());
        let vit = crate::data::Augment {
            color_jitter: 0.4,
            random_erasing: 0.5,
            rand_augment_ops: 2,
            ..crate::data::Augment::default()
        };
        let pipe = Pipeline::imagenet_train_with(24, &vit);
        let order: Vec<usize> = (0..6).collect();
        let device = LoaderConfig { device_decode: Some(DeviceDecoder::deferred()), ..config(6, false) };
        let batch =
            Loader::new(data.clone(), order.clone(), pipe.clone(), 2, device, Arc::default()).next().unwrap().unwrap();
        let BatchImages::Device(decoding) = batch.images else { panic!("a host batch") };
        let ops: Vec<_> = decoding.deferred().expect("deferred").0.iter().map(|c| c.ops.clone()).collect();
        assert!(ops.iter().map(|o| o.ops.len()).sum::<usize>() >= 6 * 3, "every image has operations");
        let made =
            decoding.to_device::<burn_flex::Flex>(&Default::default()).unwrap().into_data().into_vec::<f32>().unwrap();
        let host = Loader::new(data, order, pipe, 2, config(6, false), Arc::default()).next().unwrap().unwrap();
        let host = host.images.host().unwrap().to_vec();
        let per = 3 * 24 * 24;
        for i in 0..6 {
            let levels = (0..per)
                .map(|k| (made[i * per + k] - host[i * per + k]).abs() * IMAGENET_STD[k / (24 * 24)] * 255.0)
                .sum::<f32>()
                / per as f32;
            assert!(levels < 0.8, "image {i} ({:?}): mean difference {levels} levels", ops[i]);
        }
    }

    /// A device-decoded batch: baseline JPEGs travel as their bytes, other formats decoded
    /// here, a cut JPEG skipped and counted as on the host path, every crop the host path's.
    #[test]
    fn device_batches_carry_jpeg_bytes_and_host_decode_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let img = image::RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8 * 6, y as u8 * 8, 77]));
        let jpeg = {
            let mut out = std::io::Cursor::new(Vec::new());
            image::DynamicImage::ImageRgb8(img.clone()).write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
            out.into_inner()
        };
        std::fs::write(dir.path().join("a/0.jpg"), &jpeg).unwrap();
        img.save(dir.path().join("a/1.png")).unwrap();
        std::fs::write(dir.path().join("a/2.jpg"), &jpeg[..jpeg.len() / 2]).unwrap();
        let data: Arc<dyn Dataset> = Arc::new(crate::data::FolderDataset::open(dir.path()).unwrap());
        let pipe = Pipeline::imagenet_train(16);
        let skips = Arc::new(SkipLog::default());
        let device = LoaderConfig { device_decode: Some(DeviceDecoder::deferred()), ..config(3, false) };
        let mut loader = Loader::new(data.clone(), vec![0, 1, 2], pipe.clone(), 4, device, skips.clone());
        let batch = loader.next().unwrap().unwrap();
        assert_eq!((batch.shape, batch.indices.clone(), skips.count()), ([2, 3, 16, 16], vec![0, 1], 1));
        let BatchImages::Device(decoding) = batch.images else { panic!("a host batch") };
        let (images, out_hw, norm) = decoding.deferred().expect("a deferred decoder starts nothing");
        assert_eq!((norm.mean, out_hw), (crate::data::transform::IMAGENET_MEAN, [16, 16]));
        assert_eq!((&images[0].pixels, images[0].size), (&Pixels::Jpeg(jpeg), [40, 30]));
        assert_eq!((&images[1].pixels, images[1].size), (&Pixels::Rgb(img.into_raw()), [40, 30]));
        assert_eq!(loader.stage_times().host_decoded(), 1);
        for (i, c) in images.iter().enumerate() {
            let plan = pipe.crop_plan((40, 30), &mut sample_rng(1, 4, i)).unwrap();
            assert_eq!((c.region, c.flip, &c.ops), (plan.region, plan.flip, &plan.ops), "sample {i}");
        }
        let host = Loader::new(data, vec![0, 1], pipe, 4, config(2, false), Arc::default()).next().unwrap().unwrap();
        assert!(host.images.host().is_some(), "device_decode off: decoded on the host");
    }

    /// Device batches come from two threads (one reads, one starts the decode): in order, a
    /// strict loader's error after the batches before it and then nothing, and a loader
    /// dropped early returns.
    #[test]
    fn device_batches_keep_their_order_and_errors_through_both_threads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        for i in 0..9u32 {
            let img = image::RgbImage::from_fn(20, 20, |x, y| image::Rgb([(x + i) as u8, y as u8, 9]));
            img.save(dir.path().join(format!("a/{i}.png"))).unwrap();
        }
        std::fs::write(dir.path().join("a/4.png"), b"not a png").unwrap();
        let data: Arc<dyn Dataset> = Arc::new(crate::data::FolderDataset::open(dir.path()).unwrap());
        let pipe = Pipeline::imagenet_train(8);
        let device =
            |strict| LoaderConfig { device_decode: Some(DeviceDecoder::deferred()), strict, ..config(2, false) };
        let order: Vec<usize> = (0..9).rev().collect();
        let batches: Vec<Vec<usize>> =
            Loader::new(data.clone(), order.clone(), pipe.clone(), 0, device(false), Arc::default())
                .map(|b| b.unwrap().indices)
                .collect();
        assert_eq!(batches, [vec![8, 7], vec![6, 5], vec![3], vec![2, 1], vec![0]]);
        let mut strict = Loader::new(data.clone(), order.clone(), pipe.clone(), 0, device(true), Arc::default());
        assert_eq!(strict.next().unwrap().unwrap().indices, [8, 7]);
        assert_eq!(strict.next().unwrap().unwrap().indices, [6, 5]);
        let error = strict.next().unwrap().unwrap_err().to_string();
        assert!(error.contains("4.png"), "{error}");
        assert!(strict.next().is_none());
        let mut early =
            Loader::new(data, order, pipe, 0, LoaderConfig { prefetch: 1, ..device(false) }, Arc::default());
        assert!(early.next().unwrap().is_ok());
        drop(early);
    }

    #[test]
    fn augmentation_is_reproducible_per_epoch() {
        let pipe = Pipeline::grayscale(4, 0.0, 1.0, &crate::data::Augment::default());
        let run = |epoch| -> Vec<f32> {
            Loader::new(dataset(32), (0..32).collect(), pipe.clone(), epoch, config(8, false), Arc::default())
                .flat_map(|b| b.unwrap().images.host().unwrap().to_vec())
                .collect()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }
}
